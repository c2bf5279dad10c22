"""evaluate.py as a subprocess: per-task table, results.json, bar chart PNG and episode GIF; policy type detection."""
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import pytest
import torch

import evaluate
from common.checkpoint import save_checkpoint
from common.checkpoint import load_saved_policy, resolve_policy_dir
from models.saved import PolicyLoadError, policy_type
from models.token_policy import TokenPolicy, TokenPolicyConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)


def test_evaluate_subprocess_writes_table_json_png_gif(tmp_path):
    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(tmp_path / "policy"))
    out = tmp_path / "eval"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(tmp_path / "policy"), "--task-ids", "0",
                           "3", "--trials", "2", "--trial-start", "40", "--sampled", "--max-steps", "16",
                           "--out-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any(l.split()[:1] == ["0"] and "put the red block on the blue plate" in l for l in lines)
    assert any(l.startswith("mean") and l.count("%") == 2 for l in lines)  # greedy and sampled columns
    results = json.loads((out / "results.json").read_text())
    assert results["policy_type"] == "token" and results["task_ids"] == [0, 3] and results["trial_ids"] == [40, 41]
    assert results["mean_greedy"] == 0.0  # an untrained policy never solves a task by chance
    row = results["per_task"][1]
    assert row["task_id"] == 3 and row["greedy_episodes"]["steps"] == [16, 16]
    assert (out / "success.png").stat().st_size > 5_000
    frames = imageio.mimread(out / "episodes.gif")
    assert frames[0].shape[0] == 128 and len(frames) > 1  # 64 px upscaled x2, an animation of failures


def test_load_policy_finds_the_policy_in_every_layout(tmp_path):
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    policy.save(str(tmp_path / "sft_run" / "best"))
    assert resolve_policy_dir(str(tmp_path / "sft_run")).endswith("best")
    assert policy_type(str(tmp_path / "sft_run" / "best")) == "token"
    opt = torch.optim.AdamW(policy.parameters())
    for it in (1, 2):  # an RL run folder: the newest complete checkpoint's policy
        save_checkpoint(str(tmp_path / "rl_run"), it, policy, {"actor": opt})
    assert resolve_policy_dir(str(tmp_path / "rl_run")).endswith(os.path.join("iter_000002", "policy"))
    loaded = load_saved_policy(str(tmp_path / "rl_run"))
    assert isinstance(loaded, TokenPolicy) and not loaded.training


def bad_input(*argv):
    """evaluate.main's one-line error for a bad --checkpoint."""
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", *argv, "--trials", "1"])
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def test_bad_checkpoints_stop_with_one_line(tmp_path):
    assert "no such file" in bad_input(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "no saved policy" in bad_input(str(tmp_path / "empty"))
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    ckpt = save_checkpoint(str(tmp_path / "run"), 1, policy, {"actor": torch.optim.AdamW(policy.parameters())})
    weights = os.path.join(ckpt, "policy", "model.safetensors")
    with open(weights, "r+b") as f:  # truncated: the manifest says otherwise
        f.truncate(100)
    assert "truncated" in bad_input(ckpt)
    policy.save(str(tmp_path / "garbage"))
    with open(tmp_path / "garbage" / "model.safetensors", "wb") as f:
        f.write(b"not a safetensors file at all" * 10)
    assert "could not load the token policy" in bad_input(str(tmp_path / "garbage"))
    with pytest.raises(PolicyLoadError):
        load_saved_policy(str(tmp_path / "garbage"))
