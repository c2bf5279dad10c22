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
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from envs import EnvConfig
from base.config_fields import ConfigError
from models.action_tokenizer import ACTION_DIM

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
    demos = [{**{k: arrays[k][end - n:end] for k in _KEYS}, **m} for n, end, m in zip(lengths, ends, meta)]
    for i, d in enumerate(demos):
        check_demo(d, f"{path}: demo {i}")
    return demos


def check_demo(demo: Dict[str, Any], where: str) -> None:
    """ValueError (one line naming `where` and the field) unless the demo is as the module docstring says: actions
    (T, 7) finite, state (T, 8) finite, images (T, H, W, 3) uint8."""
    actions, state = np.asarray(demo["actions"]), np.asarray(demo["state"])
    steps = len(actions)
    if actions.shape != (steps, ACTION_DIM) or steps == 0 or not np.isfinite(actions).all():
        raise ValueError(f"{where}: actions must be a non-empty ({steps or 'T'}, {ACTION_DIM}) array of finite values "
                         f"(shape {actions.shape}); fix or drop that demo")
    if state.shape != (steps, 8) or not np.isfinite(state).all():
        raise ValueError(f"{where}: state must be ({steps}, 8) finite values (shape {state.shape}); fix or drop that "
                         f"demo")
    for view in ("agentview", "wrist"):
        image = demo.get(view)
        if image is not None and (image.dtype != np.uint8 or image.ndim != 4 or len(image) != steps):
            raise ValueError(f"{where}: {view} must be ({steps}, H, W, 3) uint8 images (got {image.dtype} "
                             f"{image.shape}); fix or drop that demo")


def select_task_demos(files: Sequence[Tuple[str, List[Dict[str, Any]]]], task_names: Dict[int, str],
                      num_per_task: int = 0, key: str = "sft.demo_paths") -> List[Dict[str, Any]]:
    """The demos of the trained tasks from `files` ((path, its demos) pairs), at most `num_per_task` per task in file
    order (0 = all), each with `task_id` set to the trained task whose name it carries (`task_names`: task id ->
    LIBERO task name of the run's suite, so a same-numbered task of another suite never passes). ConfigError in one
    line, naming `key`, when a file holds no trained task's demos or a trained task has none."""
    by_name = {name: t for t, name in task_names.items()}
    selected: Dict[int, List[Dict[str, Any]]] = {t: [] for t in task_names}
    for path, demos in files:
        names = sorted({str(d["task_name"]) for d in demos})
        if not any(n in by_name for n in names):
            raise ConfigError(f"{key}: {path} holds demos of {', '.join(repr(n) for n in names)}, not of the trained "
                              f"task(s) {', '.join(f'{t} ({task_names[t]!r})' for t in task_names)}: give those "
                              f"tasks' *_demo.hdf5 files or train the file's task")
        for d in demos:
            t = by_name.get(str(d["task_name"]))
            if t is not None and (num_per_task <= 0 or len(selected[t]) < num_per_task):
                selected[t].append({**d, "task_id": t})
    missing = [t for t, ds in selected.items() if not ds]
    if missing:
        raise ConfigError(f"{key}: no demo of task(s) {', '.join(f'{t} ({task_names[t]!r})' for t in missing)} in "
                          f"{', '.join(p for p, _ in files)}: add each trained task's *_demo.hdf5 file")
    return [d for t in task_names for d in selected[t]]


def load_hdf5_demos(paths: Sequence[str], env_cfg: EnvConfig, num_per_task: int = 0, key: str = "sft.demo_paths",
                    images: bool = True) -> List[Dict[str, Any]]:
    """LIBERO-layout HDF5 demos (LIBERO's released files or record_demos.py's) of the tasks
    `env_cfg.task_ids` of `env_cfg.suite`, at most `num_per_task` per task (0 = all), images upright at
    `env_cfg.image_size` (or none with `images=False`). ConfigError in one line naming `key` for a missing file, a
    file not in LIBERO's layout (what is missing), a file of another task, or a trained task without demos."""
    import envs
    from envs.libero import load_libero_demos

    files = []
    for path in paths:
        try:
            # a LIBERO file holds one task's demos: the first num_per_task are all the selection can keep
            files.append((path, load_libero_demos(path, env_cfg.image_size, images=images, limit=num_per_task)))
        except FileNotFoundError:
            raise ConfigError(f"{key}: demo file {path} does not exist") from None
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
    tasks = envs.suite_tasks(env_cfg)
    return select_task_demos(files, {int(t): str(tasks[int(t)]["name"]) for t in env_cfg.task_ids}, num_per_task,
                             key)


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


# ------------------------------------------------------------------------------- demos as rows of an RL batch (LUFFY)

def tokenize_demo_actions(actions: Sequence[np.ndarray], tokenizer: Any, chunk: int
                          ) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Demo episodes as a token policy would have acted them: `actions[i]` (L_i, 7) cut into ceil(L_i / chunk) policy
    steps of `chunk` actions, the last one padded by repeating the final action (as `demos_to_samples` pads SFT
    targets), each action tokenised with the policy's `tokenizer` (256 bins).

    -> tokens (B, T, chunk*7) int64, executed (B, T, chunk, 7) float32 (the decoded tokens: what the simulator gets),
    valid_steps (B,) int64; T = the longest episode's steps, zeros after an episode's last step."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    arrays = [np.asarray(a, dtype=np.float32) for a in actions]
    for i, a in enumerate(arrays):
        if a.ndim != 2 or a.shape[1] != 7 or len(a) == 0:
            raise ValueError(f"demo {i}: actions must be a non-empty (L, 7) array, got shape {a.shape}")
    valid_steps = np.array([-(-len(a) // chunk) for a in arrays], dtype=np.int64)
    T = int(valid_steps.max()) if arrays else 0
    tokens = np.zeros((len(arrays), T, chunk * ACTION_DIM), dtype=np.int64)
    executed = np.zeros((len(arrays), T, chunk, ACTION_DIM), dtype=np.float32)
    for i, a in enumerate(arrays):
        padded = a[np.minimum(np.arange(valid_steps[i] * chunk), len(a) - 1)]  # repeat the last action
        tok = tokenizer.encode(padded).cpu().numpy().reshape(valid_steps[i], chunk * ACTION_DIM)
        tokens[i, :valid_steps[i]] = tok
        executed[i, :valid_steps[i]] = tokenizer.decode(tok.reshape(valid_steps[i], chunk, ACTION_DIM))
    return tokens, executed, valid_steps


def rollout_demos(vec_env, tokenizer: Any, chunk: int, task_ids: Sequence[int], trial_ids: Sequence[int],
                  demo_actions: Optional[Sequence[np.ndarray]] = None,
                  reset_options: Optional[Dict[str, Sequence[Any]]] = None):
    """Demonstrations executed in the simulator exactly as a token policy acts, as rows of a `RolloutBatch`.

    Each row starts from (task_ids[i], trial_ids[i]) (plus `reset_options`' i-th entries, e.g. LIBERO "init_states")
    and steps in chunks: the observation at each chunk start is recorded with the chunk's tokens, and the decoded
    tokens are what the simulator executes, so replaying the row's tokens reproduces its episode. With `demo_actions`
    None the tabletop scripted expert acts closed-loop (`vec_env.expert_action()`, tokenised step by step); else row i
    replays `demo_actions[i]` (L_i, 7) open-loop (`tokenize_demo_actions`). After the episode ends the chunk is padded
    with its last action. `complete` is the simulator's verdict (a demo's success is checked, not assumed);
    `old_log_probs` are zeros (a demonstrator has no log-prob under the policy); `extras["prefix_mask"]` (B, T, chunk*7)
    is True on every token of the valid steps (LUFFY's off-policy tokens)."""
    from common.rollout import OBS_KEYS, RolloutBatch, scatter_calls

    total, n_env, A = len(task_ids), vec_env.num_envs, chunk * ACTION_DIM
    if demo_actions is not None:
        if len(demo_actions) != total:
            raise ValueError(f"demo_actions has {len(demo_actions)} episodes for {total} (task, trial) starts")
        plan_tokens, plan_executed, _ = tokenize_demo_actions(demo_actions, tokenizer, chunk)
        lengths = np.array([len(a) for a in demo_actions])
    elif not hasattr(vec_env, "expert_action"):
        raise ValueError("rollout_demos without demo_actions needs an env with a scripted expert (env.suite=tabletop)")
    calls: List[Dict[str, Any]] = []
    complete, truncated, invalid = np.zeros(total, bool), np.zeros(total, bool), np.zeros(total, bool)
    finish_step, valid_steps = np.zeros(total, np.int64), np.zeros(total, np.int64)
    names, instructions = [""] * total, [""] * total
    last_obs: Dict[str, np.ndarray] = {}
    env_steps = 0
    for start in range(0, total, n_env):
        ep = np.arange(start, min(start + n_env, total))
        k, pad = len(ep), n_env - len(ep)
        options = {"task_ids": [int(task_ids[i]) for i in ep] + [int(task_ids[ep[0]])] * pad,
                   "trial_ids": [int(trial_ids[i]) for i in ep] + [int(trial_ids[ep[0]])] * pad}
        for key, values in (reset_options or {}).items():
            options[key] = [values[i] for i in ep] + [values[ep[0]]] * pad
        obs, info = vec_env.reset(options=options)
        for j in range(k):
            names[ep[j]], instructions[ep[j]] = str(info["task_name"][j]), str(info["task_description"][j])
        live = np.zeros(n_env, bool)
        live[:k] = True
        t = 0
        while live.any():
            rows = np.flatnonzero(live)
            call = {"rows": ep[rows], "t": t, **{key: obs[key][rows] for key in OBS_KEYS}}
            tokens = np.zeros((n_env, A), np.int64)
            actions = np.zeros((n_env, chunk, ACTION_DIM), np.float32)
            if demo_actions is not None:  # open-loop replay of the recorded actions, tokenised
                tokens[rows], actions[rows] = plan_tokens[ep[rows], t], plan_executed[ep[rows], t]
            reward, ended, last = np.zeros(n_env, np.float32), np.zeros(n_env, bool), live.copy()
            for s in range(chunk):
                if demo_actions is None:  # closed-loop expert, each action tokenised as the policy's own are
                    tok = tokenizer.encode(vec_env.expert_action()).cpu().numpy()
                    if s:  # a row that ended inside the chunk repeats its last action (the padding)
                        tok = np.where(last[:, None], tok, tokens[:, (s - 1) * 7:s * 7])
                    tokens[:, s * 7:(s + 1) * 7] = tok
                    actions[:, s] = tokenizer.decode(tok)
                obs, rew, term, trunc, info = vec_env.step(actions[:, s])
                reward += np.where(last, rew, 0.0)
                finish_step[ep[last[:k]]] += 1
                done = last & (np.asarray(term) | np.asarray(trunc))
                if demo_actions is not None:  # the recorded actions ran out: the demo did not finish the task
                    out = np.zeros(n_env, bool)
                    out[:k] = finish_step[ep] >= lengths[ep]
                    done |= last & out
                for j in np.flatnonzero(done[:k]):
                    complete[ep[j]] = bool(info["success"][j])
                    truncated[ep[j]] = not complete[ep[j]]
                    if "invalid" in info:
                        invalid[ep[j]] = bool(np.asarray(info["invalid"])[j])
                    for key in OBS_KEYS:
                        last_obs.setdefault(key, np.zeros((total,) + obs[key].shape[1:], obs[key].dtype))
                        last_obs[key][ep[j]] = obs[key][j]
                ended |= done
                last &= ~done
            call.update(tokens=tokens[rows], actions=actions[rows], rewards=reward[rows], dones=ended[rows])
            calls.append(call)
            valid_steps[ep[rows]] += 1
            live = last
            t += 1
        env_steps += int(finish_step[ep].sum())
    T = int(valid_steps.max()) if total else 0

    def gather(key: str, shape: tuple, dtype) -> np.ndarray:
        return scatter_calls(calls, key, (total, T) + shape, dtype)

    step_mask = np.arange(T)[None, :] < valid_steps[:, None]
    return RolloutBatch(
        task_ids=np.asarray(task_ids, np.int64), trial_ids=np.asarray(trial_ids, np.int64),
        group_ids=np.arange(total, dtype=np.int64), task_names=names, instructions=instructions, complete=complete,
        finish_step=finish_step, valid_steps=valid_steps, invalid=invalid, truncated=truncated, last_obs=last_obs,
        actions=gather("actions", (chunk, ACTION_DIM), np.float32), rewards=gather("rewards", (), np.float32),
        dones=gather("dones", (), bool), obs={key: gather(key, calls[0][key].shape[1:], calls[0][key].dtype)
                                             for key in OBS_KEYS} if calls else {},
        tokens=gather("tokens", (A,), np.int64), old_log_probs=np.zeros((total, T, A), np.float32),
        extras={"prefix_mask": np.repeat(step_mask[:, :, None], A, axis=2)},
        stats={"rollout/env_steps": float(env_steps)})
