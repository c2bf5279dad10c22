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
from dataclasses import dataclass, field, fields, replace
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

    Token policies are called as `policy.act(obs, instructions, temperature, greedy, generators=...)`; flow policies
    (no `act`) as `policy.sample(obs, instructions, flow_steps, flow_noise_level, generators=...)`. Each call returns a
    chunk of actions that the envs execute (`vec_env.step_chunk_async/wait`); envs that finish stop being fed.
    Without `pipeline` (default: `vec_env.pipeline`, set from env.pipeline; off on the embedded suite) the episodes run
    in blocks of N (all envs reset together, the block runs until its last episode ends) and the policy acts once per
    chunk for all active envs, drawing from torch's global RNG (`generators=None`). With it the episodes are streamed
    (`stream_episodes` below): an env that frees is reset to the next episode in its worker while the others step, no
    block barrier; the policy acts for the two halves of the envs in separate calls, every episode drawing from its
    own torch Generator (`episode_generators`), and `overlap` (default) serves each half as soon as its workers answer,
    its chunk stepping while the policy computes the other half's; `overlap=False` makes the same calls on the same
    inputs in rounds, so the episodes, actions and log-probs are identical bit for bit (on any device): only the clock
    changes. `stats` holds the collection's timings: its wall time, the policy's calls, the waits for the envs and the
    workers' own seconds stepping (physics + render), resetting and, of that, building a task's simulator.
    `keep_hidden` stores the policy's pooled hidden state of every step in `extras["hidden"]` (token policies: `act`'s,
    flow policies: the sample's prefix features). `keep_chain` (flow policies, flow-SDE sampling) stores what PPO needs
    to recompute each step's log-prob: `extras["sde_step"]` (B, T) int64, `extras["x_t"]` and `extras["x_next"]`
    (B, T, horizon, D), and the step's log-density in `old_log_probs` (B, T, 1).
    `reset_options` adds per-prompt reset options (key -> one value per prompt, e.g. LIBERO "init_states" of demos).
    `keep_frames` keeps each episode's agent views (the reset view, then one per env step) in `frames`; with
    `video_frames` n only its n frames at base.video.sample_frame_indices (what the trajectory encoders read of a
    video: the same embeddings), which LIBERO's workers alone render (`renders_sampled_video`: ~16 renders per episode
    instead of one per step); other envs keep every frame and the rollout samples them.
    """
    prompts = make_prompts(task_ids, trial_ids, n_samples)
    n_env = vec_env.num_envs
    chunk = policy.action_chunk
    total = len(prompts)
    pipeline = bool(getattr(vec_env, "pipeline", False)) if pipeline is None else bool(pipeline)
    sampled = keep_frames and video_frames > 0 and getattr(vec_env, "renders_sampled_video", False)
    chunk_kwargs = {"video_frames": video_frames} if sampled else {}  # the workers sample and render the videos
    groups = np.array_split(np.arange(n_env), min(2, n_env)) if pipeline else [np.arange(n_env)]  # policy batches
    generators = episode_generators(total) if pipeline else None
    calls: List[Dict[str, np.ndarray]] = []  # one record per policy call: episode rows, their step index, arrays
    step_of = np.zeros(total, dtype=np.int64)  # policy calls made so far per episode
    frames: List[np.ndarray] = [np.zeros((0,), np.uint8)] * total
    complete = np.zeros(total, dtype=bool)
    truncated = np.zeros(total, dtype=bool)
    invalid = np.zeros(total, dtype=bool)
    last_obs: Dict[str, np.ndarray] = {}
    finish_step = np.zeros(total, dtype=np.int64)
    names: List[str] = [""] * total
    instructions: List[str] = [""] * total
    t_policy = t_env = 0.0
    env_steps = 0
    def policy_call(sub: Dict[str, np.ndarray], sub_instr: List[str], rows_e: np.ndarray) -> Dict[str, Any]:
        """The policy's chunk for episodes `rows_e` seeing observations `sub` (its call record, in `calls`)."""
        nonlocal t_policy
        gens = None if generators is None else [generators[r] for r in rows_e]
        t0 = time.perf_counter()
        act, record = policy.rollout_step(sub, sub_instr, temperature=temperature, greedy=greedy, generators=gens,
                                          flow_steps=flow_steps, flow_noise_level=flow_noise_level,
                                          keep_hidden=keep_hidden, keep_chain=keep_chain)  # the family's record
        act = act.float().cpu().numpy() if torch.is_tensor(act) else np.asarray(act, dtype=np.float32)
        t_policy += time.perf_counter() - t0
        call = {"rows": rows_e, "t": step_of[rows_e].copy(), "actions": act}
        step_of[rows_e] += 1
        if keep_obs:
            call.update(sub)
        call["record"] = record
        calls.append(call)
        return call

    def end_episode(e: int, res: Dict[str, Any], j: int, env_obs: Dict[str, np.ndarray], i: int) -> None:
        """Episode `e` ended in row j of a chunk's result `res`, on env i (its last observation in env_obs[key][i])."""
        complete[e] = bool(res["success"][j])
        truncated[e] = bool(res["truncated"][j]) and not bool(res["terminated"][j])
        invalid[e] = bool(res["invalid"][j])
        if keep_obs:
            for key in OBS_KEYS:
                if key not in last_obs:
                    last_obs[key] = np.zeros((total,) + env_obs[key].shape[1:], env_obs[key].dtype)
                last_obs[key][e] = env_obs[key][i]

    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False, unit="ep")

    def stream_episodes() -> float:
        """env.pipeline: run every episode as soon as an env frees, no round barrier; returns the seconds spent
        waiting for the envs. The envs form groups (`groups`: two halves), each acting in its own policy calls, every
        episode drawing from its own generator. A group takes rows from a queue: one shared queue when every group is
        one env (an episode then never shares a policy call, so which env runs it changes nothing), else rows dealt
        to the groups in turn. A group's env whose episode ends is reset to the group's next row in its worker while
        the other groups go on stepping; the group acts again once its resets are in, for every env with an episode
        (so which episodes share a call is fixed by the rows, not by the clock). With `overlap` a group is served as
        soon as its envs answer; without it all groups go in rounds (act, step, wait for all): the same calls on the
        same inputs, so the same episodes, bit for bit."""
        n_groups = len(groups)
        if all(len(m) == 1 for m in groups):
            queues = [deque(range(total))] * n_groups  # one queue object, shared
        else:
            queues = [deque(range(g, total, n_groups)) for g in range(n_groups)]
        slot_row = np.full(n_env, -1, dtype=np.int64)  # the episode each env runs (-1: none)
        state: List[Optional[str]] = [None] * n_env  # what is in flight in each env: "reset", "chunk" or None
        slot_obs: Dict[str, np.ndarray] = {}
        row_frames: List[List[np.ndarray]] = [[] for _ in range(total)]
        in_flight: Dict[int, Any] = {}  # group -> its chunk's call record, or the envs it is resetting
        done = [False] * n_groups
        waited = 0.0

        def collect(g: int) -> None:
            """Take group g's results: its chunk's outcome or its envs' resets."""
            nonlocal waited, env_steps
            what = in_flight.pop(g)
            t0 = time.perf_counter()
            if isinstance(what, dict):  # a chunk
                idx = what.pop("idx")
                res = vec_env.step_chunk_wait(idx)
                waited += time.perf_counter() - t0
                busy["physics"] += float(np.sum(res["busy_s"]))
                rows_e = slot_row[idx]
                for key in OBS_KEYS:
                    slot_obs[key][idx] = res["obs"][key]
                finish_step[rows_e] += res["steps"]
                env_steps += int(np.sum(res["steps"]))
                ended = res["terminated"] | res["truncated"]
                what["rewards"], what["dones"] = res["reward"].astype(np.float32), ended
                for j, i in enumerate(idx):
                    state[i] = None
                    e = rows_e[j]
                    if keep_frames and (ended[j] or not sampled):  # sampled: the video comes with its end
                        row_frames[e].append(np.array(res["frames"][j]))  # a copy, never a view into a buffer
                    if not ended[j]:
                        continue
                    end_episode(e, res, j, slot_obs, i)
                    slot_row[i] = -1
                    bar.update(1)
            else:  # resets
                idx = what
                got, info = vec_env.reset_envs_wait(idx)
                waited += time.perf_counter() - t0
                busy["reset"] += float(np.sum(info["reset_s"]))
                busy["build"] += float(np.sum(info["build_s"]))
                for key in OBS_KEYS:
                    if key not in slot_obs:
                        slot_obs[key] = np.zeros((n_env,) + got[key].shape[1:], got[key].dtype)
                    slot_obs[key][idx] = got[key]
                for j, i in enumerate(idx):
                    state[i] = None
                    e = slot_row[i]
                    names[e], instructions[e] = str(info["task_name"][j]), str(info["task_description"][j])
                    if keep_frames and not sampled:  # the reset view (a copy: slot_obs is overwritten by every chunk)
                        row_frames[e].append(got["agentview"][j][None].copy())

        def advance(g: int) -> Optional[Any]:
            """Group g's next move: resets of its free envs to the next rows, else a policy call for its envs with an
            episode; returns what to send (None: the group is done)."""
            members = groups[g]
            free = []
            for i in members:
                if slot_row[i] < 0 and queues[g]:
                    slot_row[i] = queues[g].popleft()
                    free.append(i)
            if free:
                return np.array(free, dtype=np.int64)
            idx = members[slot_row[members] >= 0]
            if not len(idx):
                return None
            call = policy_call({key: slot_obs[key][idx] for key in OBS_KEYS}, [instructions[e] for e in slot_row[idx]],
                               slot_row[idx].copy())
            call["idx"] = idx
            return call

        def send(g: int, what: Any) -> None:
            if what is None:
                done[g] = True
                return
            in_flight[g] = what
            if isinstance(what, dict):
                vec_env.step_chunk_async(what["idx"], what["actions"], keep_frames, **chunk_kwargs)
            else:
                rows_e = slot_row[what]
                options = {"task_ids": prompts[rows_e, 0].tolist(), "trial_ids": prompts[rows_e, 1].tolist()}
                for key, values in (reset_options or {}).items():  # per prompt -> per env being reset
                    options[key] = [values[p] for p in prompts[rows_e, 2]]
                vec_env.reset_envs_async(what, options)
            for i in (what["idx"] if isinstance(what, dict) else what):
                state[i] = "chunk" if isinstance(what, dict) else "reset"

        if overlap:
            for g in range(n_groups):
                send(g, advance(g))
            while not all(done):
                served = False
                for g in range(n_groups):
                    if done[g]:
                        continue
                    busy_envs = [i for i in groups[g] if state[i] is not None]
                    if not vec_env.envs_ready(busy_envs).all():
                        continue
                    collect(g)
                    send(g, advance(g))
                    served = True
                if not served:  # every group is waiting for its workers: sleep until one of those answers
                    t0 = time.perf_counter()
                    pending = [i for i in range(n_env) if state[i] is not None]
                    vec_env.wait_envs(np.asarray(pending)[~vec_env.envs_ready(pending)])
                    waited += time.perf_counter() - t0
        else:
            while not all(done):
                moves = [(g, advance(g)) for g in range(n_groups) if not done[g]]
                for g, what in moves:
                    send(g, what)
                for g in list(in_flight):
                    collect(g)
        if keep_frames:  # an episode's frames: the reset view, then one per env step it took (or its sampled video)
            for e in range(total):
                frames[e] = np.concatenate(row_frames[e])
        return waited

    t_rollout = time.perf_counter()
    if hasattr(vec_env, "drain"):
        vec_env.drain()  # chunks and resets a stopped rollout left in flight
    busy = {"physics": 0.0, "reset": 0.0, "build": 0.0}  # the workers' seconds stepping chunks, resetting (of it:
    # building a task's simulator)
    if pipeline:
        threads = torch.get_num_threads()
        torch.set_num_threads(policy_threads(vec_env, policy, threads))
        try:
            t_env = stream_episodes()
        finally:
            torch.set_num_threads(threads)
    else:  # blocks of N episodes: every env reset together, the block runs until its last episode ends
        for start in range(0, total, n_env):
            rows = prompts[start:start + n_env]
            k = len(rows)
            ep = np.arange(start, start + k)
            pad = n_env - k  # the last block may not fill every env: the spare envs replay row 0 and are ignored
            tasks = rows[:, 0].tolist() + [int(rows[0, 0])] * pad
            trials = rows[:, 1].tolist() + [int(rows[0, 1])] * pad
            t0 = time.perf_counter()
            options = {"task_ids": tasks, "trial_ids": trials}
            for key, values in (reset_options or {}).items():  # per prompt -> per env of this block (spares: row 0's)
                options[key] = [values[g] for g in rows[:, 2]] + [values[rows[0, 2]]] * pad
            vec_env.reset_envs_async(np.arange(n_env), options)
            obs, info = vec_env.reset_envs_wait(np.arange(n_env))
            obs = {key: obs[key] for key in OBS_KEYS}
            busy["reset"] += float(np.sum(info["reset_s"]))
            busy["build"] += float(np.sum(info["build_s"]))
            t_env += time.perf_counter() - t0
            desc_list = [str(s) for s in info["task_description"]]
            for j in range(k):
                names[ep[j]] = str(info["task_name"][j])
                instructions[ep[j]] = desc_list[j]
            # copies: `obs` is overwritten in place by every chunk (`finish`), so a view would show the last
            # observation as frame 0
            block_frames = [[] if sampled else [obs["agentview"][j][None].copy()] for j in range(k)] if keep_frames \
                else []  # sampled: the whole (sampled) video comes with the episode's end
            block_steps = np.zeros(k, dtype=np.int64)
            running = np.zeros(n_env, dtype=bool)
            running[:k] = True  # spare envs never run

            def act_for(idx: np.ndarray) -> Dict[str, Any]:
                """The policy's chunk for envs `idx` (its call record)."""
                call = policy_call({key: obs[key][idx] for key in OBS_KEYS}, [desc_list[i] for i in idx], ep[idx])
                call["idx"] = idx
                return call

            def finish(call: Dict[str, Any]) -> None:
                """Wait for the chunk of `call` and record its outcome."""
                nonlocal t_env
                idx = call.pop("idx")
                t0 = time.perf_counter()
                res = vec_env.step_chunk_wait(idx)
                t_env += time.perf_counter() - t0
                for key in OBS_KEYS:
                    obs[key][idx] = res["obs"][key]
                block_steps[idx] += res["steps"]
                busy["physics"] += float(np.sum(res["busy_s"]))
                ended = res["terminated"] | res["truncated"]
                call["rewards"], call["dones"] = res["reward"].astype(np.float32), ended
                for j, i in enumerate(idx):
                    if keep_frames and (ended[j] or not sampled):  # sampled: the video comes with its end
                        block_frames[i].append(np.array(res["frames"][j]))  # a copy, never a view into a buffer
                    if not ended[j]:
                        continue
                    running[i] = False
                    e = ep[i]
                    end_episode(e, res, j, obs, i)

            # The policy acts for all running envs, then they step their chunks (in parallel workers), waited for.
            while running.any():
                call = act_for(np.flatnonzero(running))
                vec_env.step_chunk_async(call["idx"], call["actions"], keep_frames, **chunk_kwargs)
                finish(call)
            finish_step[ep] = block_steps
            env_steps += int(block_steps.sum())
            if keep_frames:  # an episode's frames: the reset view, then one per env step it took
                for j in range(k):
                    frames[ep[j]] = np.concatenate(block_frames[j])
            bar.update(k)
    bar.close()
    if keep_frames and video_frames > 0 and not sampled:  # envs that keep every frame: the sampled video here
        frames = [f[sample_frame_indices(len(f), video_frames)] if len(f) else f for f in frames]
    wall = time.perf_counter() - t_rollout
    valid_steps = step_of
    T = int(valid_steps.max()) if total else 0

    def gather(key: str, shape: tuple, dtype) -> np.ndarray:
        return scatter_calls(calls, key, (total, T) + shape, dtype)

    batch = RolloutBatch(
        task_ids=prompts[:, 0].copy(), trial_ids=prompts[:, 1].copy(), group_ids=prompts[:, 2].copy(),
        task_names=names, instructions=instructions, complete=complete, finish_step=finish_step,
        valid_steps=valid_steps, invalid=invalid, truncated=truncated, last_obs=last_obs,
        actions=gather("actions", (chunk, ACTION_DIM), np.float32),
        rewards=gather("rewards", (), np.float32),
        dones=gather("dones", (), bool),
        frames=frames if keep_frames else None,
        stats={"rollout/env_steps": float(env_steps), "time/rollout_policy_s": t_policy, "time/rollout_env_s": t_env,
               "time/rollout_s": wall, "time/rollout_physics_s": busy["physics"], "time/rollout_reset_s": busy["reset"],
               "time/rollout_build_s": busy["build"], "rollout/envs": float(n_env)},
    )
    if keep_obs and calls:
        for key in OBS_KEYS:
            first = calls[0][key]
            batch.obs[key] = gather(key, first.shape[1:], first.dtype)
    for key, first in (calls[0]["record"].items() if calls else ()):  # the family's record of every call:
        # tokens, old_log_probs and noise are RolloutBatch fields, anything else (hidden, x0, a flow-SDE chain) extras
        per_step = scatter_calls([{"rows": c["rows"], "t": c["t"], key: c["record"][key]} for c in calls], key,
                                 (total, T) + first.shape[1:],
                                 np.int64 if np.issubdtype(first.dtype, np.integer) else np.float32)
        if key in ("tokens", "old_log_probs", "noise"):
            setattr(batch, key, per_step)
        else:
            batch.extras[key] = per_step
    return batch


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


