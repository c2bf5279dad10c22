"""Environments behind one interface: the embedded numpy `tabletop` suite and real LIBERO (hf-libero).

`make_vector_env(cfg, num_envs)` returns a `gymnasium.vector.VectorEnv` with autoreset disabled:
`reset(options={"task_ids": [...], "trial_ids": [...]})` puts env i at (task_ids[i], trial_ids[i]); `step(actions)`
takes (N, 7) actions; ended episodes are absorbing. `suite_tasks(cfg)` lists the suite's tasks.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from gymnasium.vector import VectorEnv

from common.config import EnvConfig
from envs import tabletop

LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
SUITES = ("tabletop",) + LIBERO_SUITES


def check_suite(suite: str) -> None:
    if suite not in SUITES:
        raise ValueError(f"unknown env.suite '{suite}'; choose one of: {', '.join(SUITES)}")


def suite_tasks(cfg: EnvConfig) -> List[Dict[str, object]]:
    """One dict per task id: name, description (the instruction) and max_steps (after cfg.max_steps)."""
    check_suite(cfg.suite)
    if cfg.suite == "tabletop":
        return [
            {"name": tabletop.task_name(t), "description": tabletop.task_description(t),
             "max_steps": cfg.max_steps or tabletop.TASKS[t][3]}
            for t in range(tabletop.NUM_TASKS)
        ]
    from envs import libero  # imported lazily: needs hf-libero and GL

    return libero.suite_tasks(cfg)


def num_trials(cfg: EnvConfig) -> int:
    """Fixed initial states per task (trial ids are 0..num_trials-1)."""
    check_suite(cfg.suite)
    if cfg.suite == "tabletop":
        return tabletop.NUM_TRIALS
    from envs import libero

    return libero.num_trials(cfg)


def check_task_ids(cfg: EnvConfig, task_ids: Optional[List[int]] = None) -> None:
    """ValueError naming the valid range when a task id is outside the suite."""
    n = len(suite_tasks(cfg))
    for t in cfg.task_ids if task_ids is None else task_ids:
        if not 0 <= int(t) < n:
            raise ValueError(f"task id {t} is out of range: suite '{cfg.suite}' has task ids 0..{n - 1}")


def make_vector_env(cfg: EnvConfig, num_envs: Optional[int] = None, seed: Optional[int] = None) -> VectorEnv:
    """N environments of `cfg.suite` behind gymnasium's VectorEnv API (native numpy batch for tabletop)."""
    check_suite(cfg.suite)
    n = cfg.num_envs if num_envs is None else num_envs
    if cfg.suite == "tabletop":
        return tabletop.TabletopVectorEnv(n, cfg.image_size, cfg.max_steps, cfg.expert_noise, seed)
    from envs import libero

    return libero.make_libero_vector_env(cfg, n)
