"""The training scripts run as a user runs them (CleanRL-style subprocess tests), shared by every script's tests."""
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")


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


def read_metrics(run_dir: str) -> List[dict]:
    """The rows of a run's metrics.jsonl."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def golden_image(seed: int, size: int) -> np.ndarray:
    """The OpenVLA-OFT golden scripts' test image (the reference ran on the same pixels): 8x8 blocks of random colours
    plus noise."""
    rs = np.random.RandomState(seed)
    base = rs.randint(0, 256, (size // 8, size // 8, 3)).astype(np.uint8)
    img = np.kron(base, np.ones((8, 8, 1), np.uint8))
    return (img.astype(np.int32) + rs.randint(-20, 21, img.shape)).clip(0, 255).astype(np.uint8)
