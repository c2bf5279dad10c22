"""Episode collection following seed 000's rollout loop: reset envs to (task, trial), repeat each prompt n times for
GRPO groups, step in action chunks with per-env active masks, one batched policy call over all active envs per chunk.

Per policy step the batch keeps what the updates need (observations as uint8, token ids, old log-probs, actions,
rewards, dones); per episode `complete`, `finish_step` (env steps), `valid_steps` (policy steps), task names, group
ids and, when asked, the agent-view video for the world-model reward.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from tqdm import tqdm

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
    actions: np.ndarray  # (B, T, chunk, 7) float32 executed actions
    rewards: np.ndarray  # (B, T) float32 env reward summed over the chunk
    dones: np.ndarray  # (B, T) bool: the episode ended inside this policy step
    obs: Dict[str, np.ndarray] = field(default_factory=dict)  # key -> (B, T, ...) observation at each policy call
    tokens: Optional[np.ndarray] = None  # (B, T, chunk*7) int64 (token policies)
    old_log_probs: Optional[np.ndarray] = None  # (B, T, chunk*7) float32 (token policies)
    noise: Optional[np.ndarray] = None  # (B, T, chunk, 7) float32 initial ODE noise (flow policies)
    frames: Optional[List[np.ndarray]] = None  # B agent-view videos (T_i, H, W, 3) uint8, one frame per env step
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
        """The episodes at `rows` (bool mask or indices), e.g. after the dynamic-sampling filter."""
        rows = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows, dtype=np.int64)
        pick = lambda x: None if x is None else x[rows]  # noqa: E731
        return RolloutBatch(
            task_ids=self.task_ids[rows], trial_ids=self.trial_ids[rows], group_ids=self.group_ids[rows],
            task_names=[self.task_names[i] for i in rows], instructions=[self.instructions[i] for i in rows],
            complete=self.complete[rows], finish_step=self.finish_step[rows], valid_steps=self.valid_steps[rows],
            invalid=self.invalid[rows], actions=self.actions[rows], rewards=self.rewards[rows], dones=self.dones[rows],
            obs={k: v[rows] for k, v in self.obs.items()}, tokens=pick(self.tokens),
            old_log_probs=pick(self.old_log_probs), noise=pick(self.noise),
            frames=None if self.frames is None else [self.frames[i] for i in rows], stats=dict(self.stats),
        )


def make_prompts(task_ids: Sequence[int], trial_ids: Sequence[int], n_samples: int) -> np.ndarray:
    """(P*n, 3) rows of (task, trial, group id): each (task, trial) prompt repeated n times, consecutively."""
    if len(task_ids) != len(trial_ids):
        raise ValueError(f"task_ids ({len(task_ids)}) and trial_ids ({len(trial_ids)}) must have the same length")
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    groups = np.arange(len(task_ids))
    rows = np.stack([np.asarray(task_ids), np.asarray(trial_ids), groups], axis=1)
    return np.repeat(rows, n_samples, axis=0).astype(np.int64)


@torch.no_grad()
def collect_rollouts(vec_env, policy, task_ids: Sequence[int], trial_ids: Sequence[int], n_samples: int = 1,
                     temperature: float = 1.0, greedy: bool = False, keep_frames: bool = False,
                     keep_obs: bool = True, flow_steps: Optional[int] = None, flow_noise_level: float = 0.0,
                     progress: bool = True, desc: str = "rollout") -> RolloutBatch:
    """Roll out every (task, trial) prompt `n_samples` times on `vec_env` (N envs at a time) with `policy`.

    Token policies are called as `policy.act(obs, instructions, temperature, greedy)`; flow policies (no `act`) as
    `policy.sample(obs, instructions, flow_steps, flow_noise_level)`. Each call returns a chunk of actions that is
    executed step by step; envs that finish stop being fed (their remaining steps are absorbed by the env).
    """
    prompts = make_prompts(task_ids, trial_ids, n_samples)
    n_env = vec_env.num_envs
    is_token = hasattr(policy, "act")
    chunk = policy.action_chunk
    total = len(prompts)
    calls: List[Dict[str, np.ndarray]] = []  # one record per policy call: episode rows, their step index, arrays
    step_of = np.zeros(total, dtype=np.int64)  # policy calls made so far per episode
    frames: List[np.ndarray] = [np.zeros((0,), np.uint8)] * total
    complete = np.zeros(total, dtype=bool)
    invalid = np.zeros(total, dtype=bool)
    finish_step = np.zeros(total, dtype=np.int64)
    names: List[str] = [""] * total
    instructions: List[str] = [""] * total
    t_policy = t_env = 0.0
    env_steps = 0
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False, unit="ep")
    for start in range(0, total, n_env):
        rows = prompts[start:start + n_env]
        k = len(rows)
        ep = np.arange(start, start + k)
        pad = n_env - k  # the last block may not fill every env: the spare envs replay row 0 and are ignored
        tasks = rows[:, 0].tolist() + [int(rows[0, 0])] * pad
        trials = rows[:, 1].tolist() + [int(rows[0, 1])] * pad
        t0 = time.perf_counter()
        obs, info = vec_env.reset(options={"task_ids": tasks, "trial_ids": trials})
        t_env += time.perf_counter() - t0
        desc_list = [str(s) for s in info["task_description"]]
        for j in range(k):
            names[ep[j]] = str(info["task_name"][j])
            instructions[ep[j]] = desc_list[j]
        block_frames = [obs["agentview"][:k]] if keep_frames else []  # one (k, H, W, 3) array per env step
        block_steps = np.zeros(k, dtype=np.int64)
        running = np.zeros(n_env, dtype=bool)
        running[:k] = True
        while running.any():
            idx = np.flatnonzero(running)
            sub = {key: obs[key][idx] for key in OBS_KEYS}
            sub_instr = [desc_list[i] for i in idx]
            t0 = time.perf_counter()
            if is_token:
                act, tokens, logp = policy.act(sub, sub_instr, temperature=temperature, greedy=greedy)
                tokens, logp = tokens.cpu().numpy(), logp.float().cpu().numpy()
            else:
                sample = policy.sample(sub, sub_instr, num_steps=flow_steps, noise_level=flow_noise_level)
                act, noise = sample.actions, sample.noise.float().cpu().numpy()
            act = act.float().cpu().numpy() if torch.is_tensor(act) else np.asarray(act, dtype=np.float32)
            t_policy += time.perf_counter() - t0
            rows_e = ep[idx]  # idx only holds envs < k (spare envs never run)
            call = {"rows": rows_e, "t": step_of[rows_e].copy(), "actions": act}
            step_of[rows_e] += 1
            if keep_obs:
                call.update(sub)
            if is_token:
                call.update(tokens=tokens, old_log_probs=logp)
            else:
                call["noise"] = noise
            calls.append(call)
            full = np.zeros((n_env, chunk, 7), dtype=np.float32)
            full[idx] = act
            reward = np.zeros(n_env, dtype=np.float32)
            ended = np.zeros(n_env, dtype=bool)
            live = running.copy()
            t0 = time.perf_counter()
            for s in range(chunk):
                obs, rew, term, trunc, info = vec_env.step(full[:, s])
                reward += np.where(live, rew, 0.0)
                block_steps += live[:k]
                if keep_frames:
                    block_frames.append(obs["agentview"][:k])
                done = live & (np.asarray(term) | np.asarray(trunc))
                if done.any():
                    for i in np.flatnonzero(done[:k]):
                        complete[ep[i]] = bool(info["success"][i])
                        if "invalid" in info:
                            invalid[ep[i]] = bool(np.asarray(info["invalid"])[i])
                    ended |= done
                    live &= ~done
                    if not live.any():
                        break
            t_env += time.perf_counter() - t0
            call["rewards"], call["dones"] = reward[idx], ended[idx]
            running = live
            running[k:] = False
        finish_step[ep] = block_steps
        env_steps += int(block_steps.sum())
        if keep_frames:  # an episode's frames are the first finish_step + 1 of its block (it stops when it ends)
            video = np.stack(block_frames)
            for j in range(k):
                frames[ep[j]] = video[: block_steps[j] + 1, j]
        bar.update(k)
    bar.close()
    valid_steps = step_of
    T = int(valid_steps.max()) if total else 0

    def gather(key: str, shape: tuple, dtype) -> np.ndarray:
        """(B, T, *shape) array filled from every policy call's rows (zeros after an episode's end)."""
        out = np.zeros((total, T) + shape, dtype=dtype)
        for c in calls:
            out[c["rows"], c["t"]] = c[key]
        return out

    batch = RolloutBatch(
        task_ids=prompts[:, 0].copy(), trial_ids=prompts[:, 1].copy(), group_ids=prompts[:, 2].copy(),
        task_names=names, instructions=instructions, complete=complete, finish_step=finish_step,
        valid_steps=valid_steps, invalid=invalid,
        actions=gather("actions", (chunk, 7), np.float32),
        rewards=gather("rewards", (), np.float32),
        dones=gather("dones", (), bool),
        frames=frames if keep_frames else None,
        stats={"rollout/env_steps": float(env_steps), "time/rollout_policy_s": t_policy, "time/rollout_env_s": t_env},
    )
    if keep_obs and calls:
        for key in OBS_KEYS:
            first = calls[0][key]
            batch.obs[key] = gather(key, first.shape[1:], first.dtype)
    if is_token:
        batch.tokens = gather("tokens", (chunk * 7,), np.int64)
        batch.old_log_probs = gather("old_log_probs", (chunk * 7,), np.float32)
    else:
        batch.noise = gather("noise", (chunk, 7), np.float32)
    return batch


def success_by_task(batch: RolloutBatch) -> Dict[int, float]:
    """Mean success per task id over the batch's valid episodes."""
    out: Dict[int, float] = {}
    ok = ~batch.invalid
    for t in np.unique(batch.task_ids):
        m = ok & (batch.task_ids == t)
        out[int(t)] = float(batch.complete[m].mean()) if m.any() else math.nan
    return out
