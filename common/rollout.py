"""Episode collection following siiRL's SRPO rollout loop: reset envs to (task, trial), repeat each prompt n times for
GRPO groups, step in action chunks with per-env active masks, one batched policy call over all active envs per chunk.

Per policy step the batch keeps what the updates need (observations as uint8, token ids, old log-probs, actions,
rewards, dones, and per-step `extras` such as the policy's pooled hidden state for a value head); per episode
`complete`, `truncated`, `finish_step` (env steps), `valid_steps` (policy steps), the observation after the last step
(`last_obs`, for bootstrapping a truncated episode), task names, group ids and, when asked, the agent-view video for
the world-model reward. `flatten_steps` turns the valid policy steps into the rows an update iterates over.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from tqdm import tqdm

from base.video import sample_frame_indices
from models.action_tokenizer import ACTION_DIM

OBS_KEYS = ("agentview", "wrist", "state")


@dataclass
class RolloutBatch:
    """B episodes, padded to T policy steps. Rows of one GRPO group are consecutive and share `group_ids`."""

    task_ids: np.ndarray  # (B,) int
    trial_ids: np.ndarray  # (B,) int
    group_ids: np.ndarray  # (B,) int: the prompt (task, trial) index; n samples share it
    task_names: List[str]  # (B,)
    instructions: List[str]  # (B,)
    complete: np.ndarray  # (B,) bool: the task succeeded
    finish_step: np.ndarray  # (B,) int: env steps taken (== max_steps when truncated)
    valid_steps: np.ndarray  # (B,) int: policy calls made (ceil(finish_step / chunk))
    invalid: np.ndarray  # (B,) bool: a simulator worker died; exclude from updates
    actions: np.ndarray  # (B, T, chunk, ACTION_DIM) float32 executed actions
    rewards: np.ndarray  # (B, T) float32 env reward summed over the chunk
    dones: np.ndarray  # (B, T) bool: the episode ended inside this policy step
    obs: Dict[str, np.ndarray] = field(default_factory=dict)  # key -> (B, T, ...) observation at each policy call
    tokens: Optional[np.ndarray] = None  # (B, T, chunk*7) int64 (token policies)
    old_log_probs: Optional[np.ndarray] = None  # (B, T, chunk*7) float32 (token policies)
    noise: Optional[np.ndarray] = None  # (B, T, chunk, ACTION_DIM) float32 initial ODE noise (flow policies)
    extras: Dict[str, np.ndarray] = field(default_factory=dict)  # key -> (B, T, ...) per-step extras (hidden, values,
                                                                 # prefix masks, ...): selected and flattened with the rest
    truncated: Optional[np.ndarray] = None  # (B,) bool: cut at max_steps (not a terminal state: bootstrap it)
    last_obs: Dict[str, np.ndarray] = field(default_factory=dict)  # key -> (B, ...) observation after the last step
    frames: Optional[List[np.ndarray]] = None  # B agent-view videos (T_i, H, W, 3) uint8, one frame per env step
    # (after the reset view), or the video_frames sampled of them
    stats: Dict[str, float] = field(default_factory=dict)  # timing and counts of the collection

    def __len__(self) -> int:
        return len(self.task_ids)

    @property
    def num_steps(self) -> int:
        return self.actions.shape[1]

    @property
    def step_mask(self) -> np.ndarray:
        """(B, T) bool: policy steps that happened."""
        return np.arange(self.num_steps)[None, :] < self.valid_steps[:, None]

    def select(self, rows: np.ndarray) -> "RolloutBatch":
        """The episodes at `rows` (bool mask or indices), e.g. after the dynamic-sampling filter. Every per-episode
        field is indexed (arrays, lists, and dicts of arrays), so new fields need no edit here."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        return replace(self, **{f.name: _pick(getattr(self, f.name), rows) for f in fields(self) if f.name != "stats"},
                       stats=dict(self.stats))

    @staticmethod
    def concat(batches: Sequence["RolloutBatch"]) -> "RolloutBatch":
        """Episodes of several batches in one (e.g. policy rollouts + demonstrations), per-step arrays zero-padded to
        the longest T. Fields missing (None) in any batch are dropped."""
        T = max(b.num_steps for b in batches)
        out: Dict[str, Any] = {}
        for f in fields(RolloutBatch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "stats":
                out[f.name] = {k: sum(float(v.get(k, 0.0)) for v in values) for k in values[0]}
            elif any(v is None for v in values):
                out[f.name] = None
            elif isinstance(values[0], dict):
                keys = set.intersection(*(set(v) for v in values))
                per_step = f.name in ("obs", "extras")
                out[f.name] = {k: np.concatenate([_pad_steps(v[k], T) if per_step else v[k] for v in values])
                               for k in sorted(keys)}
            elif isinstance(values[0], list):
                out[f.name] = [x for v in values for x in v]
            else:
                per_step = f.name in STEP_FIELDS
                out[f.name] = np.concatenate([_pad_steps(v, T) if per_step else v for v in values])
        return RolloutBatch(**out)


STEP_FIELDS = ("actions", "rewards", "dones", "tokens", "old_log_probs", "noise")  # (B, T, ...) arrays


def _pick(x: Any, rows: np.ndarray) -> Any:
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: v[rows] for k, v in x.items()}
    if isinstance(x, list):
        return [x[i] for i in rows]
    return x[rows]


def _pad_steps(x: np.ndarray, T: int) -> np.ndarray:
    """Zero-pad axis 1 of a (B, T', ...) array to T."""
    if x.shape[1] == T:
        return x
    pad = [(0, 0)] * x.ndim
    pad[1] = (0, T - x.shape[1])
    return np.pad(x, pad)


@dataclass
class PolicySteps:
    """The valid policy steps of a batch, one row each: episode `episode[i]` at policy step `t[i]`."""

    episode: np.ndarray  # (N,) row of the RolloutBatch
    t: np.ndarray  # (N,) policy step within the episode
    obs: Dict[str, np.ndarray]  # key -> (N, ...)
    instructions: List[str]  # (N,)
    data: Dict[str, np.ndarray]  # every (B, T, ...) array of the batch and the caller's, flattened to (N, ...)

    def __len__(self) -> int:
        return len(self.episode)

    def take(self, rows: Union[slice, Sequence[int], np.ndarray, torch.Tensor]) -> "PolicySteps":
        """The rows `rows` (a slice, indices or an index tensor) as a smaller PolicySteps."""
        if isinstance(rows, torch.Tensor):
            rows = rows.cpu().numpy()
        idx = np.arange(len(self))[rows]
        return PolicySteps(self.episode[idx], self.t[idx], {k: v[idx] for k, v in self.obs.items()},
                           [self.instructions[i] for i in idx], {k: v[idx] for k, v in self.data.items()})

    def tensor(self, key: str, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
        """`data[key]` as a tensor on `device`."""
        return torch.as_tensor(self.data[key], device=device)


def flatten_steps(batch: RolloutBatch, **per_step: Union[np.ndarray, torch.Tensor]) -> PolicySteps:
    """The valid policy steps of `batch` (its step_mask) as rows: observations, instructions, the batch's per-step
    arrays (tokens, old_log_probs, noise, actions, rewards, dones, extras) and the caller's (B, T, ...) arrays
    (advantages, masks, ...)."""
    b_idx, t_idx = np.nonzero(batch.step_mask)
    arrays: Dict[str, Any] = {k: getattr(batch, k) for k in STEP_FIELDS if getattr(batch, k) is not None}
    arrays.update(batch.extras)
    arrays.update(per_step)
    data = {}
    for k, v in arrays.items():
        v = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        if v.shape[:2] != batch.step_mask.shape:
            raise ValueError(f"flatten_steps: {k} has shape {v.shape}; expected (B, T, ...) = {batch.step_mask.shape}")
        data[k] = v[b_idx, t_idx]
    return PolicySteps(b_idx, t_idx, {k: v[b_idx, t_idx] for k, v in batch.obs.items()},
                       [batch.instructions[b] for b in b_idx], data)


def make_prompts(task_ids: Sequence[int], trial_ids: Sequence[int], n_samples: int) -> np.ndarray:
    """(P*n, 3) rows of (task, trial, group id): each (task, trial) prompt repeated n times, consecutively."""
    if len(task_ids) != len(trial_ids):
        raise ValueError(f"task_ids ({len(task_ids)}) and trial_ids ({len(trial_ids)}) must have the same length")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    groups = np.arange(len(task_ids))
    rows = np.stack([np.asarray(task_ids), np.asarray(trial_ids), groups], axis=1)
    return np.repeat(rows, n_samples, axis=0).astype(np.int64)


def episode_generators(num_episodes: int) -> List[torch.Generator]:
    """One CPU torch.Generator per episode, seeded from a single draw of torch's global RNG: an episode's samples
    depend only on that draw and its row, not on which envs share its policy calls or in what order they run."""
    base = int(torch.randint(0, 2**62, (1,)).item())
    seeds = np.random.SeedSequence(base).generate_state(num_episodes, np.uint64)
    return [torch.Generator().manual_seed(int(x)) for x in seeds]


@dataclass(frozen=True)
class Sampling:
    """How the policy draws each chunk: the knobs of `policy.rollout_step` (models/policy.py). A token family reads
    `temperature` and `greedy`; a flow family `flow_steps` (None: its config's) and `flow_noise_level` (0: the
    deterministic ODE). `keep_hidden` records each step's pooled hidden state (extras["hidden"]: token families
    `act`'s, flow families the prefix's features); `keep_chain` (flow-SDE sampling) what PPO needs to recompute a
    step's log-prob: extras["sde_step"] (B, T) int64, extras["x_t"] and ["x_next"] (B, T, horizon, D), and the step's
    log-density in old_log_probs (B, T, 1)."""

    temperature: float = 1.0
    greedy: bool = False
    flow_steps: Optional[int] = None
    flow_noise_level: float = 0.0
    keep_hidden: bool = False
    keep_chain: bool = False


class EpisodeRecorder:
    """The episodes of one collection as they happen, whichever loop runs them (`run_blocks`, `stream_episodes`).
    Per episode: its task name and instruction and first frame at its reset (`begin`), its frames and env steps per
    chunk (`record_chunk`), and at its end `complete`, `truncated`, `invalid` and the last observation
    (`end_episode`). Per policy call (`act`): the episodes' rows, their step index, the actions, the observations and
    the family's record. `batch()` lays it all out as a RolloutBatch; `seconds` and `env_steps` are its stats."""

    def __init__(self, prompts: np.ndarray, policy, sampling: Sampling, generators: Optional[List[torch.Generator]],
                 reset_options: Optional[Dict[str, Sequence[Any]]], keep_obs: bool, keep_frames: bool, sampled: bool,
                 bar: tqdm):
        total = len(prompts)
        self.prompts, self.policy, self.sampling, self.generators = prompts, policy, sampling, generators
        self.extra_options = reset_options or {}  # key -> one value per prompt
        self.keep_obs, self.keep_frames, self.sampled, self.bar = keep_obs, keep_frames, sampled, bar
        self.calls: List[Dict[str, Any]] = []  # one record per policy call: episode rows, their step index, arrays
        self.step_of = np.zeros(total, dtype=np.int64)  # policy calls made so far per episode
        self.finish_step = np.zeros(total, dtype=np.int64)
        self.complete = np.zeros(total, dtype=bool)
        self.truncated = np.zeros(total, dtype=bool)
        self.invalid = np.zeros(total, dtype=bool)
        self.last_obs: Dict[str, np.ndarray] = {}
        self.names: List[str] = [""] * total
        self.instructions: List[str] = [""] * total
        self.frames: List[List[np.ndarray]] = [[] for _ in range(total)]  # each episode's video, in parts
        self.env_steps = 0
        # the policy's calls, the waits for the envs, and the workers' own seconds stepping chunks (physics +
        # render), resetting and, of that, building a task's simulator
        self.seconds = {"policy": 0.0, "env": 0.0, "physics": 0.0, "reset": 0.0, "build": 0.0}

    def reset_options(self, rows: np.ndarray) -> Dict[str, list]:
        """The reset options for envs starting episodes `rows` (one entry per env): their (task, trial) and the
        caller's per-prompt options (e.g. LIBERO "init_states" of demos)."""
        p = self.prompts[rows]
        options = {"task_ids": p[:, 0].tolist(), "trial_ids": p[:, 1].tolist()}
        for key, values in self.extra_options.items():
            options[key] = [values[g] for g in p[:, 2]]
        return options

    def begin(self, e: int, info: Dict[str, Any], j: int, reset_obs: Dict[str, np.ndarray]) -> None:
        """Episode `e` was reset in row j of a reset's result (`info`, observations `reset_obs`)."""
        self.names[e], self.instructions[e] = str(info["task_name"][j]), str(info["task_description"][j])
        if self.keep_frames and not self.sampled:  # sampled: the whole (sampled) video comes with the episode's end
            # a copy: the loops overwrite their observation buffers with every chunk (a view would show the last
            # observation as frame 0)
            self.frames[e].append(reset_obs["agentview"][j][None].copy())

    def count_reset(self, info: Dict[str, Any]) -> None:
        self.seconds["reset"] += float(np.sum(info["reset_s"]))
        self.seconds["build"] += float(np.sum(info["build_s"]))

    def act(self, obs: Dict[str, np.ndarray], rows: np.ndarray) -> Dict[str, Any]:
        """The policy's chunk for episodes `rows` seeing observations `obs`: its call record (kept in `calls`)."""
        gens = None if self.generators is None else [self.generators[r] for r in rows]
        t0 = time.perf_counter()
        act, record = self.policy.rollout_step(obs, [self.instructions[e] for e in rows], generators=gens,
                                               **asdict(self.sampling))  # the family's record
        act = act.float().cpu().numpy() if torch.is_tensor(act) else np.asarray(act, dtype=np.float32)
        self.seconds["policy"] += time.perf_counter() - t0
        call = {"rows": rows, "t": self.step_of[rows].copy(), "actions": act}
        self.step_of[rows] += 1
        if self.keep_obs:
            call.update(obs)
        call["record"] = record
        self.calls.append(call)
        return call

    def record_chunk(self, call: Dict[str, Any], idx: np.ndarray, res: Dict[str, Any],
                     env_obs: Dict[str, np.ndarray]) -> np.ndarray:
        """The chunk of `call` ran on envs `idx` with result `res`: copy the envs' observations into the loop's
        buffer `env_obs`, count the steps, keep rewards, dones and frames, end the episodes that ended (returned:
        a bool per env of idx)."""
        for key in OBS_KEYS:
            env_obs[key][idx] = res["obs"][key]
        self.finish_step[call["rows"]] += res["steps"]
        self.env_steps += int(np.sum(res["steps"]))
        self.seconds["physics"] += float(np.sum(res["busy_s"]))
        ended = res["terminated"] | res["truncated"]
        call["rewards"], call["dones"] = res["reward"].astype(np.float32), ended
        for j, (i, e) in enumerate(zip(idx, call["rows"])):
            if self.keep_frames and (ended[j] or not self.sampled):  # sampled: the video comes with its end
                self.frames[e].append(np.array(res["frames"][j]))  # a copy, never a view into a buffer
            if ended[j]:
                self.end_episode(e, res, j, env_obs, i)
        return ended

    def end_episode(self, e: int, res: Dict[str, Any], j: int, env_obs: Dict[str, np.ndarray], i: int) -> None:
        """Episode `e` ended in row j of a chunk's result `res`, on env i (its last observation in env_obs[key][i])."""
        self.complete[e] = bool(res["success"][j])
        self.truncated[e] = bool(res["truncated"][j]) and not bool(res["terminated"][j])
        self.invalid[e] = bool(res["invalid"][j])
        if self.keep_obs:
            for key in OBS_KEYS:
                if key not in self.last_obs:
                    self.last_obs[key] = np.zeros((len(self.prompts),) + env_obs[key].shape[1:], env_obs[key].dtype)
                self.last_obs[key][e] = env_obs[key][i]
        self.bar.update(1)

    def batch(self, chunk: int, n_env: int, video_frames: int, wall: float) -> RolloutBatch:
        """The recorded episodes as a RolloutBatch (per-step arrays padded to the longest episode's policy steps)."""
        total, calls = len(self.prompts), self.calls
        T = int(self.step_of.max()) if total else 0
        frames = None
        if self.keep_frames:  # an episode's frames: the reset view, then one per env step it took (or its sampled
            frames = [np.concatenate(parts) for parts in self.frames]  # video)
            if video_frames > 0 and not self.sampled:  # envs that keep every frame: the sampled video here
                frames = [f[sample_frame_indices(len(f), video_frames)] if len(f) else f for f in frames]

        def gather(key: str, shape: tuple, dtype) -> np.ndarray:
            return scatter_calls(calls, key, (total, T) + shape, dtype)

        s = self.seconds
        batch = RolloutBatch(
            task_ids=self.prompts[:, 0].copy(), trial_ids=self.prompts[:, 1].copy(),
            group_ids=self.prompts[:, 2].copy(), task_names=self.names, instructions=self.instructions,
            complete=self.complete, finish_step=self.finish_step, valid_steps=self.step_of, invalid=self.invalid,
            truncated=self.truncated, last_obs=self.last_obs,
            actions=gather("actions", (chunk, ACTION_DIM), np.float32),
            rewards=gather("rewards", (), np.float32),
            dones=gather("dones", (), bool),
            frames=frames,
            stats={"rollout/env_steps": float(self.env_steps), "time/rollout_policy_s": s["policy"],
                   "time/rollout_env_s": s["env"], "time/rollout_s": wall, "time/rollout_physics_s": s["physics"],
                   "time/rollout_reset_s": s["reset"], "time/rollout_build_s": s["build"],
                   "rollout/envs": float(n_env)},
        )
        if self.keep_obs and calls:
            for key in OBS_KEYS:
                first = calls[0][key]
                batch.obs[key] = gather(key, first.shape[1:], first.dtype)
        for key, first in (calls[0]["record"].items() if calls else ()):  # the family's record of every call:
            # tokens, old_log_probs and noise are RolloutBatch fields, anything else (hidden, x0, a flow-SDE chain)
            # extras
            per_step = scatter_calls([{"rows": c["rows"], "t": c["t"], key: c["record"][key]} for c in calls], key,
                                     (total, T) + first.shape[1:],
                                     np.int64 if np.issubdtype(first.dtype, np.integer) else np.float32)
            if key in ("tokens", "old_log_probs", "noise"):
                setattr(batch, key, per_step)
            else:
                batch.extras[key] = per_step
        return batch


def run_blocks(vec_env, rec: EpisodeRecorder, chunk_kwargs: Dict[str, Any]) -> None:
    """The blocked loop (env.pipeline off): the episodes in blocks of N, one per env, every env reset together; the
    policy acts once per chunk for all running envs (one call, torch's global RNG), then they step their chunks (in
    parallel workers), waited for; the block runs until its last episode ends. The last block may not fill every
    env: the spare envs replay the block's first episode and are ignored."""
    n_env, total = vec_env.num_envs, len(rec.prompts)
    for start in range(0, total, n_env):
        k = min(n_env, total - start)
        ep = np.arange(start, start + k)  # the block's episodes, env i runs ep[i]
        t0 = time.perf_counter()
        spares = np.full(n_env - k, start, dtype=np.int64)
        vec_env.reset_envs_async(np.arange(n_env), rec.reset_options(np.concatenate([ep, spares])))
        obs, info = vec_env.reset_envs_wait(np.arange(n_env))
        obs = {key: obs[key] for key in OBS_KEYS}  # the envs' observations, overwritten by every chunk
        rec.count_reset(info)
        rec.seconds["env"] += time.perf_counter() - t0
        for j in range(k):
            rec.begin(ep[j], info, j, obs)
        running = np.arange(n_env) < k  # spare envs never run
        while running.any():
            idx = np.flatnonzero(running)
            call = rec.act({key: obs[key][idx] for key in OBS_KEYS}, ep[idx])
            vec_env.step_chunk_async(idx, call["actions"], rec.keep_frames, **chunk_kwargs)
            t0 = time.perf_counter()
            res = vec_env.step_chunk_wait(idx)
            rec.seconds["env"] += time.perf_counter() - t0
            running[idx[rec.record_chunk(call, idx, res, obs)]] = False


class StreamedEnvs:
    """The envs of a streamed collection (env.pipeline) and what each runs. The envs form groups (two halves), each
    acting in its own policy calls. A group takes episodes from a queue: one shared queue when every group is one env
    (an episode then never shares a policy call, so which env runs it changes nothing), else rows dealt to the
    groups in turn. A group's next move (`advance`) is to reset its free envs to its next episodes, else a policy
    call for every env of it with an episode (so which episodes share a call is fixed by the rows, not by the
    clock); `send` starts it in the workers, `collect` takes its results."""

    def __init__(self, vec_env, rec: EpisodeRecorder, chunk_kwargs: Dict[str, Any]):
        n_env, total = vec_env.num_envs, len(rec.prompts)
        self.vec_env, self.rec, self.chunk_kwargs = vec_env, rec, chunk_kwargs
        self.groups = np.array_split(np.arange(n_env), min(2, n_env))
        n_groups = len(self.groups)
        if all(len(m) == 1 for m in self.groups):
            self.queues = [deque(range(total))] * n_groups  # one queue object, shared
        else:
            self.queues = [deque(range(g, total, n_groups)) for g in range(n_groups)]
        self.slot_row = np.full(n_env, -1, dtype=np.int64)  # the episode each env runs (-1: none)
        self.busy = np.zeros(n_env, dtype=bool)  # a chunk or a reset is in flight in the env
        self.slot_obs: Dict[str, np.ndarray] = {}  # the envs' observations
        self.in_flight: Dict[int, Any] = {}  # group -> its chunk's call record, or the envs it is resetting
        self.done = [False] * n_groups

    def advance(self, g: int) -> Optional[Any]:
        """Group g's next move: resets of its free envs to the next rows, else a policy call for its envs with an
        episode; returns what to send (None: the group is done)."""
        members, queue = self.groups[g], self.queues[g]
        free = []
        for i in members:
            if self.slot_row[i] < 0 and queue:
                self.slot_row[i] = queue.popleft()
                free.append(i)
        if free:
            return np.array(free, dtype=np.int64)
        idx = members[self.slot_row[members] >= 0]
        if not len(idx):
            return None
        call = self.rec.act({key: self.slot_obs[key][idx] for key in OBS_KEYS}, self.slot_row[idx].copy())
        call["idx"] = idx
        return call

    def send(self, g: int, what: Any) -> None:
        """Start group g's move in the workers: a chunk (a call record) or resets (env ids); None: it is done."""
        if what is None:
            self.done[g] = True
            return
        self.in_flight[g] = what
        if isinstance(what, dict):
            idx = what["idx"]
            self.vec_env.step_chunk_async(idx, what["actions"], self.rec.keep_frames, **self.chunk_kwargs)
        else:
            idx = what
            self.vec_env.reset_envs_async(idx, self.rec.reset_options(self.slot_row[idx]))
        self.busy[idx] = True

    def ready(self, g: int) -> bool:
        """Group g's workers have answered."""
        members = self.groups[g]
        return bool(self.vec_env.envs_ready(members[self.busy[members]]).all())

    def collect(self, g: int) -> None:
        """Take group g's results: its chunk's outcome or its envs' resets."""
        what = self.in_flight.pop(g)
        t0 = time.perf_counter()
        if isinstance(what, dict):  # a chunk
            idx = what.pop("idx")
            res = self.vec_env.step_chunk_wait(idx)
            self.rec.seconds["env"] += time.perf_counter() - t0
            ended = self.rec.record_chunk(what, idx, res, self.slot_obs)
            self.slot_row[idx[ended]] = -1
        else:  # resets
            idx = what
            got, info = self.vec_env.reset_envs_wait(idx)
            self.rec.seconds["env"] += time.perf_counter() - t0
            self.rec.count_reset(info)
            for key in OBS_KEYS:
                if key not in self.slot_obs:
                    self.slot_obs[key] = np.zeros((len(self.busy),) + got[key].shape[1:], got[key].dtype)
                self.slot_obs[key][idx] = got[key]
            for j, i in enumerate(idx):
                self.rec.begin(self.slot_row[i], info, j, got)
        self.busy[idx] = False

    def wait_any(self) -> None:
        """Sleep until one of the envs with something in flight answers."""
        t0 = time.perf_counter()
        pending = np.flatnonzero(self.busy)
        self.vec_env.wait_envs(pending[~self.vec_env.envs_ready(pending)])
        self.rec.seconds["env"] += time.perf_counter() - t0


def stream_episodes(vec_env, rec: EpisodeRecorder, overlap: bool, chunk_kwargs: Dict[str, Any]) -> None:
    """The streamed loop (env.pipeline): every episode runs as soon as an env frees, no block barrier; a group's env
    whose episode ends is reset to the group's next episode in its worker while the other groups go on stepping
    (StreamedEnvs). With `overlap` a group is served as soon as its envs answer; without it all groups go in rounds
    (act, step, wait for all): the same calls on the same inputs, so the same episodes, bit for bit."""
    envs = StreamedEnvs(vec_env, rec, chunk_kwargs)
    n_groups = len(envs.groups)
    if overlap:
        for g in range(n_groups):
            envs.send(g, envs.advance(g))
        while not all(envs.done):
            served = False
            for g in range(n_groups):
                if envs.done[g] or not envs.ready(g):
                    continue
                envs.collect(g)
                envs.send(g, envs.advance(g))
                served = True
            if not served:  # every group is waiting for its workers: sleep until one of those answers
                envs.wait_any()
    else:
        while not all(envs.done):
            moves = [(g, envs.advance(g)) for g in range(n_groups) if not envs.done[g]]
            for g, what in moves:
                envs.send(g, what)
            for g in list(envs.in_flight):
                envs.collect(g)


@torch.no_grad()
def collect_rollouts(vec_env, policy, task_ids: Sequence[int], trial_ids: Sequence[int], n_samples: int = 1,
                     temperature: float = 1.0, greedy: bool = False, keep_frames: bool = False,
                     video_frames: int = 0, keep_obs: bool = True, flow_steps: Optional[int] = None,
                     flow_noise_level: float = 0.0,
                     keep_hidden: bool = False, keep_chain: bool = False, progress: bool = True,
                     desc: str = "rollout",
                     reset_options: Optional[Dict[str, Sequence[Any]]] = None,
                     pipeline: Optional[bool] = None, overlap: bool = True) -> RolloutBatch:
    """Roll out every (task, trial) prompt `n_samples` times on `vec_env` (N envs at a time) with `policy`.

    Each policy call is `policy.rollout_step(obs, instructions, generators=..., **Sampling)`: a chunk of actions
    that the envs execute (`vec_env.step_chunk_async/wait`) and the family's record of the call (`Sampling` holds
    temperature, greedy, flow_steps, flow_noise_level, keep_hidden and keep_chain, and says what each does). Envs
    that finish stop being fed; an `EpisodeRecorder` keeps what happens and lays it out as the batch.
    Without `pipeline` (default: `vec_env.pipeline`, set from env.pipeline; off on the embedded suite) the episodes
    run in blocks of N (`run_blocks`), the policy drawing from torch's global RNG. With it they are streamed
    (`stream_episodes`): an env that frees is reset to the next episode in its worker while the others step; the
    policy acts for the two halves of the envs in separate calls, every episode drawing from its own torch Generator
    (`episode_generators`), and `overlap` (default) serves each half as soon as its workers answer; `overlap=False`
    makes the same calls on the same inputs in rounds, so the episodes, actions and log-probs are identical bit for
    bit (on any device): only the clock changes. `stats` holds the collection's timings: its wall time, the policy's
    calls, the waits for the envs and the workers' own seconds stepping (physics + render), resetting and, of that,
    building a task's simulator.
    `reset_options` adds per-prompt reset options (key -> one value per prompt, e.g. LIBERO "init_states" of demos).
    `keep_obs` keeps the observation of every policy call (`obs`) and after each episode's end (`last_obs`).
    `keep_frames` keeps each episode's agent views (the reset view, then one per env step) in `frames`; with
    `video_frames` n only its n frames at base.video.sample_frame_indices (what the trajectory encoders read of a
    video: the same embeddings), which LIBERO's workers alone render (`renders_sampled_video`: ~16 renders per episode
    instead of one per step); other envs keep every frame and the rollout samples them.
    """
    prompts = make_prompts(task_ids, trial_ids, n_samples)
    pipeline = bool(getattr(vec_env, "pipeline", False)) if pipeline is None else bool(pipeline)
    sampled = keep_frames and video_frames > 0 and getattr(vec_env, "renders_sampled_video", False)
    chunk_kwargs = {"video_frames": video_frames} if sampled else {}  # the workers sample and render the videos
    generators = episode_generators(len(prompts)) if pipeline else None  # streamed: one per episode
    sampling = Sampling(temperature, greedy, flow_steps, flow_noise_level, keep_hidden, keep_chain)
    t_rollout = time.perf_counter()
    if hasattr(vec_env, "drain"):
        vec_env.drain()  # chunks and resets a stopped rollout left in flight
    with tqdm(total=len(prompts), desc=desc, disable=not progress, leave=False, unit="ep") as bar:
        rec = EpisodeRecorder(prompts, policy, sampling, generators, reset_options, keep_obs, keep_frames, sampled,
                              bar)
        if pipeline:
            threads = torch.get_num_threads()
            torch.set_num_threads(policy_threads(vec_env, policy, threads))
            try:
                stream_episodes(vec_env, rec, overlap, chunk_kwargs)
            finally:
                torch.set_num_threads(threads)
        else:
            run_blocks(vec_env, rec, chunk_kwargs)
    return rec.batch(policy.action_chunk, vec_env.num_envs, video_frames, time.perf_counter() - t_rollout)


def policy_threads(vec_env, policy, threads: int) -> int:
    """torch's CPU threads for the policy while a streamed rollout runs: when the envs step in worker processes on
    this machine's cores and the policy computes on the CPU, the cores the workers leave (at least 1), so the policy's
    thread pool does not fight the simulators for the cores (on 2 cores with 2 workers a tiny policy's call took
    100-250 ms with 2 threads instead of 6 ms with 1: docs/results.md, "How fast is it?"). The update keeps every
    thread. Other cases: `threads` unchanged."""
    params = next(iter(policy.parameters()), None) if hasattr(policy, "parameters") else None
    if not hasattr(vec_env, "processes") or params is None or params.device.type != "cpu":
        return threads
    from common.threads import choose_threads, usable_cores  # the run's thread rule (its cores less the workers)

    return min(threads, choose_threads(usable_cores(), workers=vec_env.num_envs)[0])


def scatter_calls(calls: List[Dict[str, np.ndarray]], key: str, shape: tuple, dtype) -> np.ndarray:
    """A (B, T, ...) array of `shape` filled from per-policy-call records {"rows", "t", key} (zeros where no call
    was made, i.e. after an episode's end)."""
    out = np.zeros(shape, dtype=dtype)
    for c in calls:
        out[c["rows"], c["t"]] = c[key]
    return out


