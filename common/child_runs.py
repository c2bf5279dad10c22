"""Runs of this repository's scripts made by another script (a benchmark's chain of runs): one started in a subprocess
from the repository root with its output in a log, several at a time, and its run folder found again (the one run
under a folder, the first that reached its end, the newest that can continue from a checkpoint). Read by
benchmarks/libero_learning.py, tabletop_default.py, compare_algorithms.py, robustness.py, sft_bench.py and
libero_loop.py."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from common.config import ROOT
from common.metrics_log import read_rows
from common.scripts import INTERRUPTED

ONE_THREAD = {"OMP_NUM_THREADS": "1", "WANDB_SILENT": "true"}  # a run beside others: one torch thread, wandb quiet


def run_logged(cmd: Sequence[str], log_path: str, env: Optional[Dict[str, str]] = None,
               append: bool = False) -> Tuple[int, float]:
    """`cmd` in a subprocess from the repository root, `env` added to the environment; the command is a line of
    `log_path` and the output follows it (`append`: after what the log holds, else the log starts anew). -> (exit
    code, wall seconds)."""
    t0 = time.time()
    with open(log_path, "a" if append else "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(list(cmd), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, **(env or {})))
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C: the terminal sent it to the child too, which stops at its next safe
            # point (a training run saves the iteration under way); wait for that rather than kill it, as
            # subprocess.call would 0.25 s later (a second Ctrl-C reaches the child too: a run then stops at once)
            print(f"\nCtrl-C: waiting for {os.path.basename(cmd[1])} (pid {proc.pid}) to stop; its output: "
                  f"{log_path}", file=sys.stderr, flush=True)
            while proc.poll() is None:
                try:
                    proc.wait()
                except KeyboardInterrupt:
                    pass
            raise
    return code, time.time() - t0


def run_or_exit(cmd: Sequence[str], log_path: str, env: Optional[Dict[str, str]] = None) -> float:
    """run_logged; a run that fails exits in one message with the end of its log, and one stopped by Ctrl-C with
    exit code 130 once it has stopped (what it saved is kept: the same command continues). -> wall seconds."""
    try:
        code, wall = run_logged(cmd, log_path, env)
    except KeyboardInterrupt:
        code = INTERRUPTED
    if code == INTERRUPTED:  # Ctrl-C here, or a signal to the run alone (it saved and exited 130)
        print(f"interrupted: {os.path.basename(cmd[1])} stopped (its output: {log_path}); run the same command "
              f"again to continue", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED) from None
    if code:
        with open(log_path) as f:
            tail = f.read()[-2000:]
        sys.exit(f"error: {os.path.basename(cmd[1])} failed (exit {code}), its output in {log_path}:\n{tail}")
    return wall


def run_pool(fn: Callable, jobs: Sequence[tuple], workers: int, again: str = "run this again") -> List:
    """[fn(*job) for job in jobs], `workers` at a time (threads that each wait on one subprocess). Ctrl-C reaches the
    running children too (they stop and exit); the jobs not started yet are dropped, and the exit says `again`."""
    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(lambda job: fn(*job), jobs))
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        raise SystemExit(f"interrupted; {again}") from None
    finally:
        pool.shutdown()


def only_run(folder: str, prefix: str = "") -> str:
    """The one run folder under `folder` whose name starts with `prefix` (ValueError when there is none or several)."""
    (run_dir,) = [d for d in glob.glob(os.path.join(folder, prefix + "*")) if os.path.isdir(d)]
    return run_dir


def first_run_reaching(runs: str, reached: Callable[[List[dict]], bool]) -> Optional[str]:
    """The first run folder under `runs` (in name order) whose metrics rows are `reached`, else None."""
    for run_dir in sorted(glob.glob(os.path.join(runs, "*"))):
        if os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) and reached(read_rows(run_dir)):
            return run_dir
    return None


def newest_resumable(runs: str, prefix: str = "") -> Optional[str]:
    """The newest run folder under `runs` (whose name starts with `prefix`) that holds a complete checkpoint: a run
    that stopped early, or a finished one to extend; else None."""
    from common.checkpoint import latest_checkpoint

    for run_dir in sorted(glob.glob(os.path.join(runs, prefix + "*")), reverse=True):
        if latest_checkpoint(run_dir) is not None:
            return run_dir
    return None
