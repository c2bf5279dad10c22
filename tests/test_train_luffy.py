"""train_luffy.py: hand-computed advantages and gradients of a group whose rollouts all failed plus one demo, the split
baseline, the default dynamic-sampling filter, the "RL w/ SFT loss" switch, bad input in one line, and the script
as a user runs it (2 iterations + exact resume, 2 processes, one short iteration on real LIBERO with HDF5 demos)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.advantages import compute_advantage, make_response_mask
from common.config import ConfigError, load_config
from common.dynamic_sampling import filter_groups
from models import TokenPolicy, TokenPolicyConfig
from train_luffy import Config, check_config, luffy_loss
from tests.scripts import read_metrics, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "luffy.yaml")
OFT_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")  # OpenVLA-OFT in the published layout
FAST = ["init.mode=scratch", "env.num_envs=8", "env.max_steps=32", "rollout.n=4", "rollout.prompts_per_iteration=2",
        "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=0", "train.mini_batch_size=16",
        "train.micro_batch_size=8", "--no-wandb"]


def default_cfg(*overrides):
    return load_config(Config, CONFIG, list(overrides))


# --------------------------------------------------------------------------------------------------- advantages

def test_all_failed_group_plus_demo_gets_nonzero_advantages():
    rewards = torch.tensor([0.0, 0.0, 0.0, 1.0])  # three rollouts failed, the demo (last) succeeded
    mask = make_response_mask(torch.tensor([2, 2, 2, 1]), 2, 3)
    adv, _ = compute_advantage("grpo", rewards, mask, [0, 0, 0, 0], norm_adv_by_std_in_grpo=False)  # LUFFY's recipe
    assert adv[:, 0].tolist() == pytest.approx([-0.25, -0.25, -0.25, 0.75])  # r - mean, mean = 1/4
    assert adv[3].tolist() == pytest.approx([0.75, 0.75, 0.75, 0, 0, 0])  # the demo's 1 valid step only
    on = torch.tensor([True, True, True, False])
    adv, _ = compute_advantage("grpo_split", rewards, mask, [0, 0, 0, 0], on_policy_mask=on,
                               norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0])  # on-policy baseline 0: only the demo moves


def test_off_policy_rows_do_not_move_the_split_baseline():
    mask = torch.ones(4, 2)
    on = torch.tensor([True, True, True, False])
    out = {}
    for demo_reward in (0.0, 1.0):
        rewards = torch.tensor([1.0, 0.0, 0.0, demo_reward])
        out[demo_reward] = compute_advantage("grpo_split", rewards, mask, [7] * 4, on_policy_mask=on,
                                             norm_adv_by_std_in_grpo=True)[0][:, 0]
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # unbiased std of the on-policy rewards [1, 0, 0]
    assert out[1.0].tolist() == pytest.approx([(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std, (2 / 3) / std], abs=1e-5)
    assert out[0.0][:3].tolist() == pytest.approx(out[1.0][:3].tolist())  # on-policy rows: unchanged by the demo
    assert out[0.0][3].item() == pytest.approx(-(1 / 3) / std, abs=1e-5)
    grpo = compute_advantage("grpo", torch.tensor([1.0, 0.0, 0.0, 1.0]), mask, [7] * 4, norm_adv_by_std_in_grpo=True)
    assert grpo[0][0, 0].item() != pytest.approx(out[1.0][0].item())  # plain GRPO: the demo is in the baseline


# --------------------------------------------------------------------------------------------------------- loss

def test_loss_gradient_by_hand_raises_demo_tokens_and_lowers_failed_ones():
    """Default luffy.yaml: p_div_p_0.1 on demo tokens, no clip, sum / tokens-per-step. Row 0 a failed on-policy step
    (A = -1/4, old = current log-prob), row 1 a demo step (A = 3/4); two tokens each."""
    alg = default_cfg().algorithm
    p = torch.tensor([[0.5, 0.2], [0.02, 0.3]])
    log_prob = p.log().requires_grad_(True)
    adv = torch.tensor([[-0.25, -0.25], [0.75, 0.75]])
    prefix = torch.tensor([[False, False], [True, True]])
    loss, out = luffy_loss(alg, log_prob, torch.zeros(2, 2), log_prob.detach().clone(), adv, torch.ones(2, 2), prefix)
    loss.backward()
    # d/dlogp of -A * p/(p + 0.1) = -A * 0.1 p / (p + 0.1)^2; on-policy: -A * ratio with ratio = 1; then / L = 2
    expected = torch.tensor([[0.25 / 2, 0.25 / 2],
                             [-0.75 * 0.1 * 0.02 / 0.12 ** 2 / 2, -0.75 * 0.1 * 0.3 / 0.4 ** 2 / 2]])
    torch.testing.assert_close(log_prob.grad, expected)
    assert out["off_pg_loss"].item() == pytest.approx(-0.75 * (0.02 / 0.12 + 0.3 / 0.4) / 2)
    assert out["on_pg_loss"].item() == pytest.approx(0.25) and out["ppo_kl"].item() == 0.0
    assert out["off_policy_prob"].item() == pytest.approx(0.16) and out["on_policy_prob"].item() == pytest.approx(0.35)
    assert (log_prob.grad[1] < 0).all() and (log_prob.grad[0] > 0).all()  # descent raises demo, lowers failed tokens


def test_one_step_on_a_policy_raises_the_demo_tokens_log_probs():
    import envs
    from envs import EnvConfig

    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2))
    obs, info = envs.make_vector_env(EnvConfig(num_envs=4), seed=0).reset(options={"task_ids": [0] * 4,
                                                                                   "trial_ids": [0] * 4})
    instr = list(info["task_description"])
    with torch.no_grad():
        _, sampled, old = policy.act(obs, instr)
    demo = torch.randint(0, 256, (1, 56))  # any demo chunk: its log-probs must rise
    tokens = torch.cat([sampled[:3], demo])
    prefix = torch.zeros(4, 56, dtype=torch.bool)
    prefix[3] = True
    adv = torch.tensor([-0.25, -0.25, -0.25, 0.75])[:, None].expand(4, 56)
    opt = torch.optim.SGD(policy.parameters(), lr=0.5)
    before, _ = policy.log_prob(obs, instr, tokens)
    log_prob, entropy = policy.log_prob(obs, instr, tokens)
    loss, _ = luffy_loss(default_cfg().algorithm, log_prob, entropy, old.float(), adv, torch.ones(4, 56), prefix)
    loss.backward()
    opt.step()
    after, _ = policy.log_prob(obs, instr, tokens)
    assert (after[3] - before[3]).mean() > 0 and (after[:3] - before[:3]).mean() < 0


def test_sft_multitask_switch_is_ppo_on_rollouts_plus_nll_of_demos():
    alg = default_cfg("algorithm.use_sft_multitask_loss=true", "algorithm.sft_loss_coef=0.5").algorithm
    p = torch.tensor([[0.5, 0.2], [0.02, 0.3]])
    log_prob = p.log()
    adv = torch.tensor([[-0.25, -0.25], [0.75, 0.75]])
    prefix = torch.tensor([[False, False], [True, True]])
    loss, out = luffy_loss(alg, log_prob, torch.zeros(2, 2), log_prob.clone(), adv, torch.ones(2, 2), prefix)
    sft = -(math.log(0.02) + math.log(0.3)) / 2
    assert out["sft_loss"].item() == pytest.approx(sft)
    assert out["off_pg_loss"].item() == 0.0 and out["pg_loss"].item() == pytest.approx(2 * 0.25 / 2)  # rollouts only
    assert loss.item() == pytest.approx(0.25 + 0.5 * sft - 0.001 * 0.0)


# --------------------------------------------------------------------------------------------- filter and input

def test_default_filter_keeps_the_groups_luffy_exists_for():
    a = default_cfg().algorithm
    on_policy_success = torch.tensor([0] * 7 + [1] * 7 + [1] + [0] * 6, dtype=torch.bool)  # 3 groups of 7 rollouts
    keep = filter_groups(on_policy_success, torch.zeros(21), 7, a.filter_accuracy, a.filter_truncated,
                         a.accuracy_lower_bound, a.accuracy_upper_bound)
    assert keep.view(3, 7)[:, 0].tolist() == [True, False, True]  # all failed: kept (the demo teaches); all solved: not


def test_bad_input_one_line_each(tmp_path):
    for overrides, message in [
        (["rollout.n_off=8"], r"rollout.n_off=8 with rollout.n=8: need 0 <= n_off < n"),
        (["algorithm.off_policy_reshape=p_div_p_0.2"],
         r"algorithm.off_policy_reshape: invalid off_policy_reshape 'p_div_p_0.2'; valid: no_reshape, logp"),
        (["algorithm.on_policy_reshape=sqrt"], r"algorithm.on_policy_reshape: invalid on_policy_reshape 'sqrt'"),
        (["algorithm.adv_estimator=gae"], r"use grpo \(LUFFY's recipe\) or grpo_split"),
        (["rollout.n_off=0", "algorithm.use_sft_multitask_loss=true"], r"needs demonstrations in the groups"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_config(default_cfg(*overrides))
    libero = load_config(Config, os.path.join(ROOT, "configs", "luffy_libero.yaml"))
    with pytest.raises(ConfigError, match=r"env.suite=libero_spatial needs demonstrations: set demos.paths="):
        check_config(libero)
    out = run(["--task-id", "0", "rollout.n_off=9"], tmp_path, check=False)
    assert out.returncode != 0 and out.stderr.strip().splitlines() == [
        "error: rollout.n_off=9 with rollout.n=4: need 0 <= n_off < n (a group is n - n_off on-policy rollouts plus "
        "n_off demonstrations; LUFFY uses n=8, n_off=1)"]


# -------------------------------------------------------------------------------------------- the script itself

def run(args, tmp_path, check=True, launcher=(sys.executable,), extra_env=None):
    return run_script("train_luffy.py", [*FAST, *args], tmp_path, check, launcher=launcher, extra_env=extra_env)


def only_run(path):
    runs = os.listdir(path)
    assert len(runs) == 1, runs
    return str(path / runs[0])


def test_smoke_from_scratch_demos_carry_the_all_failed_groups_then_resume_exactly(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(["--task-id", "0", "train.iterations=3"], straight)
    run(["--task-id", "0", "train.iterations=2", "log.checkpoint_every=1"], resumed)
    run_dir = only_run(resumed / "runs")
    assert os.path.isfile(resumed / "plots" / os.path.basename(run_dir) / "training_curves.png")
    out = run(["--task-id", "0", "train.iterations=3", "--resume", run_dir], resumed)
    assert "resumed at iteration 2" in out.stdout
    rows, again = read_metrics(only_run(straight / "runs")), read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [r["iteration"] for r in again] == [0, 1, 2, 3]  # row 0: the start
    for r in rows[1:]:  # a scratch policy fails every rollout; the expert's demo succeeds and carries the group
        assert r["rollout/success_rate"] == 0.0 and r["demos/success_rate"] == 1.0 and r["demos/dropped"] == 0.0
        assert r["sampling/kept_fraction"] == 1.0 and r["sampling/all_failure_groups"] == 2.0
        assert r["train/demo_advantage_mean"] == pytest.approx(0.75)  # 1 - mean(0, 0, 0, 1)
        assert r["train/off_pg_loss"] < 0 and r["train/on_pg_loss"] == pytest.approx(0.25, rel=0.01)  # -A x ~1
        assert all(f"train/{k}" in r for k in ("pg_loss", "off_pg_clipfrac", "on_pg_clipfrac", "off_policy_prob",
                                              "on_policy_prob", "off_ratio_mean", "off_ratio_max_clip_frac",
                                              "off_ratio_min_clip_frac", "entropy", "grad_norm"))
    for a, b in zip(rows, again):  # resume continues the same run: every logged number equal
        assert {k: v for k, v in a.items() if not k.startswith(("time/", "charts/SPS"))} == \
               {k: v for k, v in b.items() if not k.startswith(("time/", "charts/SPS"))}


@pytest.mark.slow
def test_two_processes(tmp_path):
    launcher = (sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                "--main_process_port", "29531")
    out = run(["--task-id", "0", "train.iterations=1", "eval.every=0"], tmp_path, launcher=launcher)
    assert " x2 | tasks [0]" in out.stdout and "policy weights identical on all 2 processes" in out.stdout
    (row,) = read_metrics(only_run(tmp_path / "runs"))
    # each process: 2 prompts x 3 rollouts cut at 32 steps + 2 expert demos (~26 steps); all gathered
    assert 2 * 2 * 3 * 32 < row["rollout/env_steps"] < 2 * 2 * 4 * 32
    assert row["demos/success_rate"] == 1.0 and row["train/demo_advantage_mean"] == pytest.approx(0.75)


def write_noop_libero_demos(tmp_path):
    """An HDF5 file of two demos of libero_spatial task 0 in LIBERO's layout, from LIBERO's own starts 3 and 5: 12
    open-gripper no-ops each (replayed, they do not solve the task); its path."""
    import h5py

    name = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"
    path = tmp_path / f"{name}_demo.hdf5"
    script = ("import sys, numpy as np; from envs import libero; libero.import_libero(); "
              "np.save(sys.argv[1], libero._init_states('libero_spatial', 0)[[3, 5]])")
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "starts.npy")], cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=ROOT), check=True)  # LIBERO's own starts (a subprocess: no GL here)
    starts = np.load(tmp_path / "starts.npy")
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"language_instruction": "pick up the black bowl and place it"})
        data.attrs["bddl_file_name"] = f"/x/libero_spatial/{name}.bddl"
        for i, start in enumerate(starts):
            g = data.create_group(f"demo_{i}")
            g.attrs["task_id"] = 0
            g.create_dataset("actions", data=np.tile([0, 0, 0, 0, 0, 0, -1.0], (12, 1)))
            g.create_dataset("states", data=np.stack([start] * 12))
            for key, shape in (("agentview_rgb", (12, 8, 8, 3)), ("eye_in_hand_rgb", (12, 8, 8, 3)),
                               ("ee_pos", (12, 3)), ("ee_ori", (12, 3)), ("gripper_states", (12, 2))):
                g.create_dataset(f"obs/{key}", data=np.zeros(shape, np.uint8 if "rgb" in key else np.float64))
    return path


@pytest.mark.real_libero
def test_libero_one_short_iteration_with_hdf5_demos(tmp_path):
    """configs/luffy_libero.yaml on the real simulator (tiny policy, 32 px, 2 workers): prompts from an HDF5 file
    written here, the env reset to each demo's first state; the demo (12 no-op steps) does not solve the task, so it is
    replayed, found failing, dropped and counted."""
    path = write_noop_libero_demos(tmp_path)
    out = run(["--config", "configs/luffy_libero.yaml", "--task-id", "0", f"demos.paths=[{path}]", "env.image_size=32",
               "env.num_envs=2", "env.max_steps=16", "env.fast_render=true", "eval.protocol=heldout", "rollout.n=3",
               "rollout.prompts_per_iteration=1", "train.iterations=1", "eval.every=0", "init.mode=checkpoint",
               f"init.path={OFT_TINY}", "policy.lora_rank=4", "policy.bf16_weights=false",
               "policy.unnorm_key=libero_10"],  # the config's OpenVLA-OFT family: demos in its statistics and bins
              tmp_path)
    assert "2 HDF5 demos" in out.stdout
    (row,) = read_metrics(only_run(tmp_path / "runs"))
    assert row["rollout/env_steps"] == 2 * 16 + 12  # two rollouts cut at max_steps, the demo's 12 recorded steps
    assert row["demos/success_rate"] == 0.0 and row["demos/dropped"] == 1.0
    assert row["sampling/kept_fraction"] == 1.0 and "train/pg_loss" in row  # the group still trains (zero advantage)


@pytest.mark.real_libero
def test_libero_cpu_recipe_replays_the_experts_practice_demos(tmp_path):
    """configs/luffy_libero_cpu.yaml (the real-LIBERO LUFFY arm) for one iteration from a tiny token policy, with the
    demos benchmarks/libero_learning.py --arms luffy makes: the scripted expert from practice init states 0 and 1
    (`record_demos.py --record-trials`). Each group starts from its demo's first state and the demo, replayed as the
    policy acts (its tokens, chunks), succeeds in the simulator and is trained on: a demo from a practice state is a
    verified success, not a dropped one."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_SILENT="true")
    demos = tmp_path / "practice_demos"
    rec = subprocess.run([sys.executable, "record_demos.py", "--record-trials", "--trial-start", "0",
                          "--trials", "2", "--suite", "libero_spatial", "--task-ids", "0", "--out", str(demos),
                          "--image-size", "64", "--workers", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert rec.returncode == 0, rec.stderr[-3000:]
    (path,) = [os.path.join(demos, "libero_spatial", f) for f in os.listdir(demos / "libero_spatial")]
    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)).save(
        str(tmp_path / "start"))
    out = run_script("train_luffy.py", ["--config", "configs/luffy_libero_cpu.yaml", "--task-id", "0",
                                        f"demos.paths=[{path}]", f"init.path={tmp_path / 'start'}",
                                        "rollout.prompts_per_iteration=2", "rollout.n=3", "env.max_steps=150",
                                        "train.iterations=1", "eval.every=0", "train.mini_batch_size=3"], tmp_path)
    assert "2 HDF5 demos" in out.stdout
    (row,) = read_metrics(only_run(tmp_path / "runs"))
    assert row["demos/success_rate"] == 1.0 and row["demos/dropped"] == 0.0  # both replays succeed
    assert row["demos/in_update"] == 2.0 and "train/pg_loss" in row  # one demo per group, in the update


def test_the_env_step_budget_stops_the_run(tmp_path):
    """train.total_timesteps (--timesteps), as train_srpo.py: the iteration that reaches the budget is the last,
    evaluated and saved (benchmarks/libero_learning.py --arms luffy runs to an env-step budget)."""
    run(["train.iterations=10", "--timesteps", "1", "eval.every=5", "eval.trials_per_task=1",
         "eval.samples_per_trial=0"], tmp_path)
    run_dir = only_run(tmp_path / "runs")
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1] and "val/success_rate" in rows[1]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000001"]
