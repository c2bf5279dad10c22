"""The training scripts run as a user runs them (CleanRL-style subprocess tests), shared by every script's tests."""
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

from common.child_runs import only_run
from common.metrics_log import read_rows as read_metrics  # noqa: F401  (the tests' name for it)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the folder is not a package), for tests of its tables and helpers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(script: str, args: Sequence[str], outputs=None, check: bool = True, cwd: str = ROOT,
               launcher: Sequence[str] = (sys.executable,), extra_env: Optional[Dict[str, str]] = None,
               timeout: int = 900) -> subprocess.CompletedProcess:
    """`launcher script args` in a subprocess (outputs under `outputs`/runs and /plots when given); with `check`, a
    non-zero exit fails the test with the end of stdout and stderr."""
    paths = [f"log.output_dir={outputs}/runs", f"log.plots_dir={outputs}/plots"] if outputs is not None else []
    out = subprocess.run([*launcher, script, *args, *paths], cwd=cwd, env=dict(ENV, **(extra_env or {})),
                         capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


# The SFT starts of the learning tests (tabletop task 0, one thread: bitwise the same start on one machine):
# drq = configs/sft.yaml's recipe (10 expert demos from the demo starts, DrQ shift) 128 wide (the 256-wide default
# takes 2.5x longer in the SRPO test); weak = the same without DrQ (15-25% held-out); flow = the tiny PI0 on 20 demos.
SFT_STARTS = {
    "drq": ["policy.token.hidden_size=128"],
    "weak": ["policy.token.hidden_size=128", "sft.augment_shift=0"],
    "flow": ["policy.type=flow", "sft.num_demos=20", "sft.augment_shift=0"],
}


def sft_start(kind: str, out) -> str:
    """Train the learning tests' SFT start `kind` (SFT_STARTS) under `out`; the exported policy's path."""
    run_script("train_sft.py", ["--task-id", "0", "--no-wandb", *SFT_STARTS[kind], f"sft.output_path={out}/policy",
                                "sft.eval_every=0", "sft.eval_trials=20"], outputs=out, timeout=1500)
    return os.path.join(str(out), "policy")


def learning_run(script: str, args: Sequence[str], out, timeout: int = 2400) -> List[dict]:
    """A learning test's run (one thread, no wandb, no checkpoints) under `out`: its metrics rows."""
    run_script(script, ["--task-id", "0", "--no-wandb", "log.checkpoint_every=1000", *args], outputs=out,
               timeout=timeout)
    return only_run_metrics(out)


def only_run_metrics(out) -> List[dict]:
    """The metrics rows of the one run under `out`/runs."""
    return read_metrics(only_run(os.path.join(str(out), "runs")))


def golden_image(seed: int, size: int) -> np.ndarray:
    """The OpenVLA-OFT golden scripts' test image (the reference ran on the same pixels): 8x8 blocks of random colours
    plus noise."""
    rs = np.random.RandomState(seed)
    base = rs.randint(0, 256, (size // 8, size // 8, 3)).astype(np.uint8)
    img = np.kron(base, np.ones((8, 8, 1), np.uint8))
    return (img.astype(np.int32) + rs.randint(-20, 21, img.shape)).clip(0, 255).astype(np.uint8)
