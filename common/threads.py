"""How many CPU threads torch computes with, so that a run beside other work (a second run, the simulator's workers,
its own other processes) slows by its fair share and no more:

    quiet_waits()                                    # before torch is imported (common/__init__.py does it)
    n, why = choose_threads(cores=2, world=1)        # the pure rule (tested by hand): 2, "auto: 2 cores ..."
    n, why = set_threads(override, world, device)    # the rule on this process, applied; the run header prints `why`

Why: torch's CPU build runs its intra-op work on an OpenMP (libgomp) pool whose threads, after each parallel region,
spin ~3 ms on their core waiting for the next one (libgomp's default when OMP_WAIT_POLICY is unset). Alone that is
free; beside another busy process the spinning threads take the cores the other's threads need, and every parallel
region waits for a descheduled thread: tabletop SFT fell from 37.6 to 6 samples/s with 2 threads instead of 1 under
load (issue 71). OMP_WAIT_POLICY=PASSIVE (a waiting thread sleeps at once) must be in the environment before libgomp
loads, i.e. before `import torch`: common/__init__.py sets it (unless the user set it) since every script imports
common before torch. torch.set_num_interop_threads is left alone: that pool serves torch.jit.fork only, is started
lazily and never spins.

The rule: the cores this process may use (os.sched_getaffinity: a taskset or a container's cpuset, not the machine's
count), shared among the run's processes (`world`), less the simulator worker processes that step while torch
computes (`workers`: a run's workers step only during its rollout, so Run passes 0 and the streamed rollout narrows
the pool by them with this same rule, common/rollout.py policy_threads; the update keeps every thread), at least 1; a run on a GPU computes there, so 1 host thread (its cores go to the simulator and other work). An explicit
count wins: the config key (train.threads > 0, evaluate.py --threads), then OMP_NUM_THREADS; never more threads than
the process's cores. The count chosen is saved with the run (config.yaml's train.threads) and so reused on resume;
a run with one thread is bitwise reproducible (tests/test_run_plumbing.py).
"""
from __future__ import annotations

import os
from typing import Optional, Tuple


def quiet_waits() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless set: libgomp's waiting threads sleep instead of spinning on cores another process
    needs (read once when libgomp loads: before torch is imported)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no affinity call
        return os.cpu_count() or 1


def choose_threads(cores: int, world: int = 1, workers: int = 0, gpu: bool = False, override: int = 0,
                   env: Optional[str] = None, key: str = "train.threads") -> Tuple[int, str]:
    """(threads, why) for one process: `override` (> 0, the config key), else `env` (OMP_NUM_THREADS, when a positive
    integer), else auto: cores // world - workers on a CPU, 1 on a GPU; at least 1, never more than `cores`."""
    if override > 0:
        n, why = override, f"{key}={override}"
    elif env and env.strip().isdigit() and int(env) > 0:
        n, why = int(env), f"OMP_NUM_THREADS={int(env)}"
    elif gpu:
        n, why = 1, "auto: the GPU computes, 1 host thread"
    else:
        share = cores // max(world, 1)
        n = share - workers
        why = f"auto: {cores} cores" + (f" / {world} processes" if world > 1 else "") + \
            (f" - {workers} simulator workers" if workers else "")
    if n > cores:
        n, why = cores, f"{why}, capped at the {cores} cores this process may use"
    return max(1, n), why


def set_threads(override: int = 0, world: int = 1, device: str = "cpu", workers: int = 0,
                key: str = "train.threads") -> Tuple[int, str]:
    """choose_threads for this process (its cores, OMP_NUM_THREADS) applied to torch; (threads, why)."""
    import torch

    n, why = choose_threads(usable_cores(), world, workers, device == "cuda", override,
                            os.environ.get("OMP_NUM_THREADS"), key)
    torch.set_num_threads(n)
    return n, why


def header(n: int, why: str) -> str:
    """The run header's part: 'torch threads 2 (auto: 2 cores; OMP_WAIT_POLICY=PASSIVE)'."""
    return f"torch threads {n} ({why}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset: spins ~3 ms')})"
