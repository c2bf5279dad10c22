"""evaluate.py as a subprocess: per-task table, results.json, bar chart PNG and episode GIF; policy type detection."""
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import torch

from evaluate import load_policy, policy_type, resolve_policy_dir
from models.flow_policy import FlowPolicy, FlowPolicyConfig
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


def test_load_policy_detects_type_and_layout(tmp_path):
    torch.manual_seed(0)
    FlowPolicy(FlowPolicyConfig(**TINY, expert_dim=32, expert_layers=1, expert_heads=2)).save(
        str(tmp_path / "run" / "best"))
    assert resolve_policy_dir(str(tmp_path / "run")).endswith("best")
    assert policy_type(str(tmp_path / "run" / "best")) == "flow"
    policy = load_policy(str(tmp_path / "run"))
    assert isinstance(policy, FlowPolicy) and not policy.training
    try:
        load_policy(str(tmp_path / "nothing"))
    except FileNotFoundError as e:
        assert "train_sft.py" in str(e)
    else:
        raise AssertionError("a missing checkpoint must raise FileNotFoundError")
