"""Expert demonstrations: scripted-expert demos on the embedded suite (cached on disk) and (obs, chunk) SFT samples.

A demo is a dict with `agentview` (T,H,W,3) uint8, `wrist` (T,H,W,3) uint8, `state` (T,8) float32, `actions` (T,7)
float32 (the action taken at each observation), `task_id`, `trial_id`, `task_description`, `task_name` — the same
fields as `envs.libero.load_libero_demos(path)` returns for LIBERO HDF5 files — and `demo_start` (True when
`trial_id` numbers the suite's separate demo starts rather than an evaluation trial).
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from common.config import EnvConfig

DEMO_CACHE_DIR = os.path.join("cache", "demos")
_KEYS = ("agentview", "wrist", "state", "actions")


def demo_trials(num_demos: int, num_trials: int, demo_starts: bool = False) -> List[int]:
    """Start ids of the demos of one task: 0..num_demos-1 (demo starts are unbounded; trial ids wrap around past the
    suite's number of trials)."""
    return list(range(num_demos)) if demo_starts else [k % num_trials for k in range(num_demos)]


def generate_expert_demos(env_cfg: EnvConfig, task_ids: Sequence[int], num_demos_per_task: int, noise: float = 0.0,
                          seed: int = 0, cache_dir: Optional[str] = DEMO_CACHE_DIR, verbose: bool = True,
                          record: str = "clean", demo_starts: bool = True) -> List[Dict[str, Any]]:
    """Roll out the tabletop scripted expert from starts 0..num_demos-1 of each task; keep successful episodes only.

    `demo_starts=True`: the suite's demo starts, disjoint from the evaluation trials (as LIBERO's demos are; each
    demo then has `demo_start: True` and `trial_id` = its start id); False: the evaluation trials themselves.

    `noise`: std of Gaussian noise on the executed xyz deltas. `record="clean"` stores the expert's noise-free action
    at every visited state (DART: noisy visits, clean labels — best for SFT); `"executed"` stores the noisy action
    actually taken (an exactly replayable trajectory). Cached in `<cache_dir>/<hash of the settings and of
    envs/tabletop.py>.npz` (None = no cache).
    """
    if record not in ("clean", "executed"):
        raise ValueError(f"record must be 'clean' or 'executed', got {record!r}")
    if env_cfg.suite != "tabletop":
        raise ValueError(f"scripted-expert demos exist only for env.suite=tabletop (got '{env_cfg.suite}'); "
                         f"for LIBERO give HDF5 files in sft.demo_paths")
    import envs
    from envs import tabletop

    settings = {"tasks": [int(t) for t in task_ids], "num_demos": int(num_demos_per_task), "noise": float(noise),
                "seed": int(seed), "record": record, "demo_starts": bool(demo_starts), "image_size": env_cfg.image_size,
                "max_steps": env_cfg.max_steps}
    with open(tabletop.__file__, "rb") as f:
        code_hash = hashlib.sha256(f.read()).hexdigest()[:12]
    key = hashlib.sha256(json.dumps({**settings, "code": code_hash}, sort_keys=True).encode()).hexdigest()[:16]
    cache_path = os.path.join(cache_dir, f"{key}.npz") if cache_dir else None
    if cache_path and os.path.isfile(cache_path):
        try:
            return load_demos_npz(cache_path)
        except (OSError, ValueError, KeyError) as e:  # a cache file cut short: regenerate it
            print(f"[demos] ignoring unreadable cache {cache_path} ({e}); regenerating")

    episodes = [(int(t), j) for t in task_ids
                for j in demo_trials(num_demos_per_task, envs.num_trials(env_cfg), demo_starts)]
    cfg = EnvConfig(**{**env_cfg.__dict__, "expert_noise": 0.0})  # noise is added here, so labels can stay clean
    rng = np.random.default_rng(seed)
    demos: List[Dict[str, Any]] = []
    batch = 64
    for start in range(0, len(episodes), batch):
        chunk = episodes[start:start + batch]
        vec = envs.make_vector_env(cfg, len(chunk))
        obs, info = vec.reset(options={"task_ids": [t for t, _ in chunk], "trial_ids": [j for _, j in chunk],
                                       "demo": demo_starts})
        steps: Dict[str, List[np.ndarray]] = {k: [] for k in _KEYS}
        alive = np.ones(len(chunk), dtype=bool)
        lengths = np.zeros(len(chunk), dtype=np.int64)
        success = np.zeros(len(chunk), dtype=bool)
        while alive.any():
            clean = vec.expert_action()
            executed = clean.copy()
            if noise > 0:
                executed[:, :3] = np.clip(clean[:, :3] + rng.normal(0.0, noise, size=(len(chunk), 3)), -1.0, 1.0)
            for k in ("agentview", "wrist", "state"):
                steps[k].append(obs[k])
            steps["actions"].append((clean if record == "clean" else executed).astype(np.float32))
            lengths += alive
            obs, _, terminated, truncated, info = vec.step(executed)
            success |= np.asarray(info["success"], dtype=bool)
            alive &= ~(terminated | truncated)
        stacked = {k: np.stack(v, axis=1) for k, v in steps.items()}  # (N, T_max, ...)
        for i, (task, trial) in enumerate(chunk):
            if success[i]:
                demos.append({**{k: stacked[k][i, : lengths[i]] for k in _KEYS}, "task_id": task, "trial_id": trial,
                              "demo_start": bool(demo_starts),
                              "task_description": tabletop.task_description(task), "task_name": tabletop.task_name(task)})
        vec.close()
    if verbose:
        print(f"[demos] scripted expert (noise {noise}): {len(demos)}/{len(episodes)} successful episodes kept "
              f"({len(demos) / max(len(episodes), 1):.0%}), {sum(len(d['actions']) for d in demos)} steps")
    if cache_path:
        save_demos_npz(demos, cache_path)
    return demos


def save_demos_npz(demos: List[Dict[str, Any]], path: str) -> None:
    """All demos in one compressed .npz (episodes concatenated + lengths); written to a temp file, then renamed."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    arrays = {k: np.concatenate([d[k] for d in demos]) if demos else np.zeros((0,)) for k in _KEYS}
    meta = [{"task_id": int(d["task_id"]), "trial_id": int(d["trial_id"]), "demo_start": bool(d.get("demo_start")),
             "task_description": d["task_description"], "task_name": d["task_name"]} for d in demos]
    tmp = f"{path}.tmp{os.getpid()}.npz"
    np.savez_compressed(tmp, lengths=np.array([len(d["actions"]) for d in demos], dtype=np.int64),
                        meta=np.array(json.dumps(meta)), **arrays)
    os.replace(tmp, path)


def load_demos_npz(path: str) -> List[Dict[str, Any]]:
    """Inverse of `save_demos_npz`."""
    with np.load(path) as data:
        lengths = data["lengths"]
        meta = json.loads(str(data["meta"]))
        arrays = {k: data[k] for k in _KEYS} if len(lengths) else {}
    ends = np.cumsum(lengths)
    return [{**{k: arrays[k][end - n:end] for k in _KEYS}, **m} for n, end, m in zip(lengths, ends, meta)]


def demos_to_samples(demos: List[Dict[str, Any]], chunk: int) -> Dict[str, Any]:
    """One SFT sample per demo timestep t: the observation at t and actions[t:t+chunk], padded by repeating the last
    action (OpenVLA-OFT). -> agentview/wrist (M,H,W,3) uint8, state (M,8), actions (M,chunk,7), instructions (M,)
    object array, task_ids (M,)."""
    if not demos:
        raise ValueError("no demos to train on (all expert episodes failed, or the demo files were empty)")
    out: Dict[str, List[np.ndarray]] = {"agentview": [], "wrist": [], "state": [], "actions": [], "instructions": [],
                                        "task_ids": []}
    for d in demos:
        a = np.asarray(d["actions"], dtype=np.float32)
        t_len = len(a)
        idx = np.minimum(np.arange(t_len)[:, None] + np.arange(chunk)[None, :], t_len - 1)  # repeat the last action
        out["actions"].append(a[idx])
        for k in ("agentview", "wrist", "state"):
            out[k].append(np.asarray(d[k]))
        out["instructions"].append(np.array([d["task_description"]] * t_len, dtype=object))
        out["task_ids"].append(np.full(t_len, int(d["task_id"]), dtype=np.int64))
    samples = {k: np.concatenate(v) for k, v in out.items()}
    samples["state"] = samples["state"].astype(np.float32)
    return samples


def demos_for_trial(demos: List[Dict[str, Any]], task_id: int, trial_id: int) -> Optional[Dict[str, Any]]:
    """The first demo of (task_id, trial_id), or None (used for off-policy guidance on the same initial state)."""
    for d in demos:
        if int(d["task_id"]) == int(task_id) and int(d["trial_id"]) == int(trial_id):
            return d
    return None
