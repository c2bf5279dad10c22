"""Every LIBERO RL config issue 57 changed, run on the real simulator for two iterations on the CPU with a tiny policy:
the overrides make the policy, images, envs, episodes and batch counts small and keep each config's update structure
(mini-batch unit, loss aggregation, refill, ratio / GAE unit, Adam betas, weight decay, epochs), so the update the
config ships is the one that runs. Each run asserts its env steps, its optimizer steps per update (hand-computed from
episodes, steps and mini-batch sizes), its refill rounds and finite losses. One parametrized test, short episodes."""
import math
import os
import time

import pytest
import yaml

from tests.scripts import ROOT, read_metrics, run_script

OFT_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")  # OpenVLA-OFT in the published layout
COMMON = ["--task-id", "0", "--no-wandb", "env.num_envs=2", "env.fast_render=true", "eval.protocol=heldout",
          "train.iterations=2", "eval.every=0", "log.checkpoint_every=1000"]
OFT = ["init.mode=checkpoint", f"init.path={OFT_TINY}", "policy.bf16_weights=false", "policy.unnorm_key=libero_10",
       "env.image_size=64"]
OFT_L1 = ["init.mode=checkpoint", f"init.path={os.path.join(ROOT, 'tests', 'fixtures', 'tiny_openvla_oft_l1')}",
          "policy.bf16_weights=false", "policy.unnorm_key=libero_10", "env.image_size=64"]  # the official layout
TOKEN = ["init.mode=scratch", "policy.hidden_size=64", "policy.num_layers=1"]  # the tiny token policy, untrained
STRUCTURE = {"mini_batch_unit", "loss_agg_mode", "refill", "ratio_unit", "gae_unit", "adam_beta1", "adam_beta2",
             "weight_decay", "update_epochs", "update_epochs", "clip_ratio_c", "clip_ratio_high", "loss_remove_clip",
             "n", "loss_variant", "value_loss", "huber_delta", "value_loss_coef",
             "grad_clip_mode", "advantage_scale", "scope", "advantage_clamp", "log_ratio_clamp", "value_input",
             "activation", "init",
             "negative_clip_band", "loss_skip_above", "bc_warmup_env_steps"}  # the update-structure keys no override here touches (n: FlowSAR's 1)
KEEP_ALL = "algorithm.accuracy_lower_bound=0.0"  # an untrained policy fails every group: keep them so the update runs


def pi0_folder(tmp_path):
    """A tiny pi0 in RLinf's layout (horizon 10, 5 executed) and its byte tokenizer: the init arguments."""
    from models.text_tokenizer import ByteTokenizer
    from tests.test_models_pi0_checkpoint import tiny_pi0, write_openpi

    folder = write_openpi(tmp_path / "pi0", tiny_pi0(chunk=10))
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    return ["init.mode=checkpoint", f"init.path={folder}", f"policy.tokenizer_path={tmp_path}/tok",
            "env.image_size=64"]


def tiny_flow(tmp_path):
    """A tiny flow policy as libero_learning.py --family flow's SFT saves one (flow-SDE, 4 denoising steps, 64 px,
    8-action chunks), untrained: the init arguments."""
    from models.configs import FlowPolicyConfig
    from models.flow_policy import FlowPolicy

    FlowPolicy(FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, noise_method="flow_sde",
                                num_steps=4)).save(str(tmp_path / "flow"))
    return ["init.mode=checkpoint", f"init.path={tmp_path}/flow"]


def luffy_demos(tmp_path):
    """Two HDF5 demos of libero_spatial task 0 from LIBERO's own starts (12 open-gripper no-ops: replayed, they fail
    and are dropped, as tests/test_train_luffy.py's): the demos argument."""
    from tests.test_train_luffy import write_noop_libero_demos

    path = write_noop_libero_demos(tmp_path)
    return [f"demos.paths=[{path}]"]


# config -> (script, start builder, overrides, expected {metric: value} per iteration). Episodes are 32 env steps
# (8-action chunks: 4 policy steps) or 20 (pi0's 5 executed: 4 policy steps). Optimizer steps per update:
# trajectory unit: episodes / mini-batch episodes x epochs; step unit: ceil(policy steps / mini-batch) x epochs.
CASES = {
    # 2 prompts x n 2 = 4 episodes in mini-batches of 2 trajectories: 2 steps; refill on (1 round: all kept)
    "srpo_libero.yaml": ("train_srpo.py", None, [*OFT, "env.max_steps=32", "rollout.n=2",
                                                 "rollout.prompts_per_iteration=2", "rollout.max_rounds=2", KEEP_ALL,
                                                 "reward.encoder.kind=pixels",
                                                 "train.mini_batch_size=2", "train.micro_batch_size=4"],
                         {"rollout/env_steps": 128, "sampling/rounds": 1, "train/optimizer_steps": 2}),
    "srpo_libero_cpu.yaml": ("train_srpo.py", None, [*TOKEN, "env.max_steps=32", "rollout.n=2",
                                                     "rollout.prompts_per_iteration=2", "rollout.max_rounds=2",
                                                     KEEP_ALL],
                             {"rollout/env_steps": 128, "sampling/rounds": 1, "train/optimizer_steps": 2}),
    # the accuracy filter kept: every all-failure group dropped, refill rolls out to its cap and the update is skipped
    "srpo_libero_grpo_cpu.yaml": ("train_srpo.py", None, [*TOKEN, "env.max_steps=32", "rollout.n=2",
                                                          "rollout.prompts_per_iteration=1", "rollout.max_rounds=2"],
                                  {"rollout/env_steps": 128, "sampling/rounds": 2, "sampling/kept_groups": 0,
                                   "train/skipped_update": 1, "train/optimizer_steps": 0}),
    # 2 episodes x 4 policy steps in mini-batches of 2 steps, 10 epochs: 40 actor steps (ratio per step, wd 0.01)
    "gae_ppo_libero.yaml": ("train_gae_ppo.py", None, [*OFT_L1, "policy.lora_rank=4", "env.max_steps=32"],
                            {"rollout/env_steps": 64, "train/optimizer_steps": 40}),
    "gae_ppo_libero_cpu.yaml": ("train_gae_ppo.py", None, [*TOKEN, "env.max_steps=32"],
                                {"rollout/env_steps": 64, "train/optimizer_steps": 40}),
    # the padded grid: 2 episodes x 4 chunk-steps (20 / 5) = 8 rows in one mini-batch of 8 (the config's 2048 scaled),
    # 4 epochs: 4 steps however short the episodes (beta2 0.95, episode-ratio, Huber, no dual clip, joint clip)
    "gae_ppo_libero_pi0.yaml": ("train_gae_ppo.py", pi0_folder, ["env.max_steps=20", "rollout.prompts_per_iteration=2",
                                                                  "train.mini_batch_size=8",
                                                                  "train.micro_batch_size=4"],
                                {"rollout/env_steps": 40, "train/optimizer_steps": 4}),
    # the padded grid: 2 prompts x n 1 (RLinf's group size 1) x 4 chunk-steps = 8 rows in mini-batches of 4, 4
    # epochs: 8 steps however short the episodes
    "flowsar_libero.yaml": ("train_flowsar.py", pi0_folder, ["env.max_steps=20", "rollout.prompts_per_iteration=2",
                                                             "train.mini_batch_size=4", "train.micro_batch_size=4"],
                            {"rollout/env_steps": 40, "train/optimizer_steps": 8}),
    "flowsar_libero_rlinf.yaml": ("train_flowsar.py", pi0_folder, ["env.max_steps=20",
                                                                   "rollout.prompts_per_iteration=2",
                                                                   "train.mini_batch_size=4",
                                                                   "train.micro_batch_size=4"],
                                  {"rollout/env_steps": 40, "train/optimizer_steps": 8}),
    # the CPU arm (tiny flow policy): 2 prompts x n 1 x 4 chunk-steps (32 / 8) = 8 grid rows in mini-batches of 4, 4
    # epochs: 8 steps (the config's 800 rows / 267 scaled); flow-SDE exploration at 0.5
    "flowsar_libero_cpu.yaml": ("train_flowsar.py", tiny_flow, ["env.max_steps=32", "rollout.prompts_per_iteration=2",
                                                                "train.mini_batch_size=4", "train.micro_batch_size=4"],
                                {"rollout/env_steps": 64, "train/optimizer_steps": 8}),
    # 2 demo prompts x (2 rollouts + 1 demo, dropped: it fails on replay) = 4 trajectories in mini-batches of 2
    "luffy_libero.yaml": ("train_luffy.py", luffy_demos, [*OFT, "policy.lora_rank=4", "env.max_steps=32",
                                                          "rollout.n=3", "rollout.prompts_per_iteration=2",
                                                          "train.mini_batch_size=2",
                                                          "train.micro_batch_size=4"],
                          {"rollout/env_steps": 2 * 2 * 32 + 2 * 12, "demos/dropped": 2,
                           "train/optimizer_steps": 2}),
    # the CPU arm (tiny token policy): the same, in its own mini-batches of 2 trajectories (the config's 16 scaled)
    "luffy_libero_cpu.yaml": ("train_luffy.py", luffy_demos, [*TOKEN, "env.max_steps=32", "rollout.n=3",
                                                              "rollout.prompts_per_iteration=2",
                                                              "train.mini_batch_size=2"],
                              {"rollout/env_steps": 2 * 2 * 32 + 2 * 12, "demos/dropped": 2,
                               "train/optimizer_steps": 2}),
}


@pytest.mark.real_libero
@pytest.mark.parametrize("config", sorted(CASES))
def test_libero_config_two_iterations_with_its_update_structure(config, tmp_path):
    script, start, overrides, expected = CASES[config]
    args = ["--config", f"configs/{config}", *COMMON, *(start(tmp_path) if start else []), *overrides]
    t0 = time.perf_counter()
    run_script(script, args, outputs=tmp_path, timeout=900)
    print(f"{config}: {time.perf_counter() - t0:.1f} s")
    (run,) = os.listdir(tmp_path / "runs")
    rows = read_metrics(str(tmp_path / "runs" / run))
    assert [r["iteration"] for r in rows] == [1, 2]
    with open(tmp_path / "runs" / run / "config.yaml") as f:
        saved = yaml.safe_load(f)
    with open(os.path.join(ROOT, "configs", config)) as f:
        shipped = yaml.safe_load(f)
    structure = [(section, key) for section, values in shipped.items() if isinstance(values, dict) for key in values
                 if key in STRUCTURE]
    assert structure and all(saved[s][k] == shipped[s][k] for s, k in structure), (config, structure)  # kept
    for row in rows:
        got = {k: row.get(k) for k in expected}
        assert got == pytest.approx(expected), (config, got)
        losses = [v for k, v in row.items() if k.startswith("train/") and k.endswith("_loss")]
        assert all(math.isfinite(v) for v in losses), (config, row)
        if not row.get("train/skipped_update"):
            assert losses and math.isfinite(row["train/grad_norm"]), (config, row)

