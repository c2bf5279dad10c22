"""The OpenVLA-OFT family (tiny model in the published layout) through the scripts as a user runs them: the three
token-action RL scripts start from the published folder (`policy.type=openvla_oft init.path=<folder>`), train, save
and resume; evaluate.py and train_sft.py read it; FlowSAR refuses it in one line. One iteration on real LIBERO per script: tests/test_train_{srpo,gae_ppo,luffy}.py
run the shipped configs/*_libero.yaml (whose family this is) on the same folder."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.scripts import ROOT, read_metrics, run_script

TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")
OFT = ["--task-id", "0", "--no-wandb", f"init.path={TINY}", "policy.type=openvla_oft", "policy.lora_rank=4",
       "env.num_envs=8", "env.max_steps=16", "eval.every=1", "eval.trials_per_task=2", "log.checkpoint_every=1",
       "log.keep_checkpoints=5"]
SRPO = ["rollout.n=4", "rollout.prompts_per_iteration=2", "eval.samples_per_trial=2", "reward.encoder.num_frames=4",
        "algorithm.filter_accuracy=false", "algorithm.entropy_coeff=0.01", "train.lr=1e-3"]  # entropy: a gradient
# even when every episode fails (all advantages 0)


def runs(folder):
    return [os.path.join(folder, "runs", d) for d in sorted(os.listdir(os.path.join(folder, "runs")))]


def lora(run_dir, iteration):
    return load_file(os.path.join(run_dir, "checkpoints", f"iter_{iteration:06d}", "policy",
                                  "lora_adapter.safetensors"))


@pytest.mark.slow
def test_srpo_trains_the_published_folder_with_lora_and_resumes_bitwise(tmp_path):
    """Two iterations from the published folder: fresh LoRA r=4 on every linear layer but lm_head, the update moves
    the adapters (lora_B starts at zero), the saved config says what ran; interrupted after 2 and resumed to 3 equals
    3 in one go (metrics and adapter weights). A constant step: under the default cosine the cut run's second
    iteration follows a 2-iteration curve, so only the constant step makes the two runs the same run."""
    constant = [*OFT, *SRPO, "train.lr_schedule=constant"]
    run_script("train_srpo.py", [*constant, "train.iterations=3", "log.run_name=full"], tmp_path)
    run_script("train_srpo.py", [*constant, "train.iterations=2", "log.run_name=cut"], tmp_path)
    full, cut = os.path.join(tmp_path, "runs", "full"), os.path.join(tmp_path, "runs", "cut")
    run_script("train_srpo.py", ["--resume", cut, "train.iterations=3"], tmp_path)
    with open(os.path.join(full, "config.yaml")) as f:
        text = f.read()
    assert "type: openvla_oft" in text and f"init_path: {TINY}" in text and "image_pipeline: resize" in text
    saved = json.load(open(os.path.join(full, "checkpoints", "iter_000001", "policy", "policy_config.json")))
    assert saved["lora_rank"] == 4 and saved["type"] == "openvla_oft"
    start, one = lora(full, 1), lora(full, 3)
    names = [k for k in one if "lora_B" in k]
    assert names and not any("lm_head" in k for k in one)
    assert max(float(np.abs(one[k]).max()) for k in names) > 0  # lora_B is zero at the start: the updates moved it
    assert any(not np.array_equal(start[k], one[k]) for k in names)
    rows_full, rows_cut = read_metrics(full), read_metrics(cut)
    assert [r["iteration"] for r in rows_full] == [0, 1, 2, 3] == [r["iteration"] for r in rows_cut]
    for key in ("train/pg_loss", "train/grad_norm", "val/success_rate"):
        assert rows_full[-1][key] == rows_cut[-1][key], key
    assert rows_full[1]["train/grad_norm"] > 0
    resumed = lora(cut, 3)
    assert all(np.array_equal(one[k], resumed[k]) for k in one)


@pytest.mark.slow
def test_gae_ppo_and_luffy_run_the_family_then_evaluate_reads_the_checkpoint(tmp_path):
    """GAE-PPO's value head reads the family's hidden state (the LM width of the folder, 32); LUFFY tokenises the
    expert demos with the checkpoint's statistics and bins; evaluate.py loads the RL checkpoint by its folder."""
    run_script("train_gae_ppo.py", [*OFT, "rollout.prompts_per_iteration=8", "eval.samples_per_trial=2",
                                    "train.lr_warmup_steps=1", "train.iterations=2", "log.run_name=gae"], tmp_path)
    run_script("train_luffy.py", [*OFT, "env.max_steps=32", "rollout.n=4", "rollout.prompts_per_iteration=2",
                                  "eval.samples_per_trial=0", "train.mini_batch_size=16",
                                  "train.micro_batch_size=8", "train.iterations=2", "log.run_name=luffy"], tmp_path)
    gae = read_metrics(os.path.join(tmp_path, "runs", "gae"))
    assert [r["iteration"] for r in gae] == [0, 1, 2]
    assert all(np.isfinite(r["train/value_loss"]) and r["train/value_loss"] > 0 for r in gae[1:])
    luffy = read_metrics(os.path.join(tmp_path, "runs", "luffy"))
    assert [r["iteration"] for r in luffy] == [0, 1, 2]
    assert all(0 < r["train/off_policy_prob"] < 1 for r in luffy[1:])  # the demos' tokens under the policy
    out = run_script("evaluate.py", ["--checkpoint", os.path.join(tmp_path, "runs", "gae"), "--task-ids", "0",
                                     "--trials", "2", "--out-dir", str(tmp_path / "eval")], None)
    results = json.load(open(tmp_path / "eval" / "results.json"))
    assert results["policy_type"] == "openvla_oft" and results["iteration"] == 2, out.stdout[-500:]


@pytest.mark.slow
def test_sft_fine_tunes_the_published_folder_and_rl_starts_from_its_output(tmp_path):
    """train_sft.py policy.init_path=<published folder>: cross-entropy on the checkpoint's own bins falls; its output
    (same layout + policy_config.json) is an RL start."""
    export = tmp_path / "export"
    run_script("train_sft.py", ["--task-id", "0", "--no-wandb", f"policy.init_path={TINY}", "sft.num_demos=2",
                                "sft.steps=6", "sft.eval_every=3", "sft.eval_trials=2", "sft.log_every=3",
                                "sft.lr=3e-3", "env.num_envs=4", "log.run_name=sft", f"sft.output_path={export}"],
               tmp_path)
    rows = [r for r in read_metrics(os.path.join(tmp_path, "runs", "sft")) if "sft/loss" in r]
    assert rows[-1]["sft/loss"] < rows[0]["sft/loss"]
    assert json.load(open(export / "policy_config.json"))["type"] == "openvla_oft"
    run_script("train_srpo.py", [*OFT[:3], f"init.path={export}", *OFT[4:], *SRPO, "train.iterations=1",
                                 "log.run_name=rl"], tmp_path)
    assert [r["iteration"] for r in read_metrics(os.path.join(tmp_path, "runs", "rl"))] == [0, 1]


@pytest.mark.parametrize("args,message", [
    (["policy.type=openvla_oft"], "this script trains policies with flow actions (policy.type: flow); openvla_oft "
                                  "policies have token actions: train them with train_srpo.py"),
    ([f"init.path={TINY}"], "holds a policy of family openvla_oft (token actions): train it with train_srpo.py"),
])
def test_flowsar_refuses_the_family_in_one_line(tmp_path, args, message):
    out = run_script("train_flowsar.py", ["--task-id", "0", "--no-wandb", *args], tmp_path, check=False)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")  # no run folder left behind


@pytest.mark.parametrize("args,message", [
    (["policy.type=openvla_oft", "init.mode=scratch"], "starts from a published checkpoint, not from scratch"),
    (["policy.type=openvla_oft", "policy.preset=tiny"], "unknown key 'policy.preset'"),
    (["policy.type=pi05"], "policy.type='pi05': unknown policy family; use one of flow, openvla_oft, "
                                "openvla_oft_l1, token"),
    ([f"init.path={TINY}"], "holds a policy of family openvla_oft but policy.type=token: set policy.type=openvla_oft"),
    (["init.mode=sft"], "init.mode='sft': use checkpoint"),
    (["policy.type=openvla_oft", "init.path=/nonexistent/oft"], "no openvla_oft checkpoint at /nonexistent/oft"),
])
def test_bad_family_settings_stop_in_one_line(tmp_path, args, message):
    out = run_script("train_srpo.py", ["--task-id", "0", "--no-wandb", *args], tmp_path, check=False)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr[-800:]
