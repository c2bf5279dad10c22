"""Shared test set-up: repo root on sys.path, one torch thread, wandb silent and offline, and the session's weak SFT
start (trained once, shared by every learning test)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(scope="session")
def drq_sft(tmp_path_factory):
    """The default SFT recipe (configs/sft.yaml: 10 expert demos from the demo starts, DrQ random shift of 4 px) with
    the 128-wide policy, on tabletop task 0, one thread: 40-55% greedy success on the held-out trials 30-49, depending
    on the CPU's float rounding (the SRPO learning test's start). Path of the policy."""
    out = tmp_path_factory.mktemp("sft_drq")
    env = dict(os.environ, PYTHONPATH=ROOT, WANDB_SILENT="true", OMP_NUM_THREADS="1")  # one thread: bitwise the same
    cmd = [sys.executable, "train_sft.py", "--task-id", "0", "--no-wandb", f"sft.output_path={out}/policy",
           "policy.token.hidden_size=128",  # the 256-wide default takes 15 min in the SRPO test (> 8 min, see there)
           "sft.eval_every=0", "sft.eval_trials=20", f"log.output_dir={out}/runs", f"log.plots_dir={out}/plots"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    return str(out / "policy")


@pytest.fixture(scope="session")
def weak_sft(tmp_path_factory):
    """The SFT recipe before DrQ (configs/sft.yaml with sft.augment_shift=0 and the 128-wide policy: 10 expert demos
    from the demo starts, no augmentation) on tabletop task 0, token policy, one thread: 15-25% greedy success on the
    held-out trials 30-49, depending on the CPU's float rounding (the GAE-PPO learning test's start). Path of the
    exported policy."""
    out = tmp_path_factory.mktemp("sft")
    env = dict(os.environ, PYTHONPATH=ROOT, WANDB_SILENT="true", OMP_NUM_THREADS="1")  # one thread: bitwise the same
    # checkpoint on every run (with 2 threads the float sums differ and the start moves: 30% instead of 15% held-out)
    cmd = [sys.executable, "train_sft.py", "--task-id", "0", "--no-wandb", "sft.augment_shift=0",  # the recipe before DrQ
           "policy.token.hidden_size=128",  # and before the 256-wide default
           f"sft.output_path={out}/policy",
           "sft.eval_every=0", "sft.eval_trials=20", f"log.output_dir={out}/runs", f"log.plots_dir={out}/plots"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    return str(out / "policy")
