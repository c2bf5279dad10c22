"""Advantage estimators: GRPO and its variants (siiRL's SRPO, verl's Advanced GRPO, LUFFY), GAE (the OpenVLA GAE-PPO
reference). FlowSAR's credit assignment lives in train_flowsar.py.

Token tensors are (B, L): one trajectory per row, L = T_steps * tokens_per_step. Everything here is a pure function.
"""
from __future__ import annotations

from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from common.masking import as_float, check_ndim, check_same_shape

ArrayOrTensor = Union[np.ndarray, torch.Tensor]


def make_response_mask(valid_steps: ArrayOrTensor | Sequence[int], num_steps: int,
                       tokens_per_step: int) -> torch.Tensor:
    """Bool (B, L) mask `arange(L) < valid_steps[b] * tokens_per_step`, L = num_steps * tokens_per_step."""
    valid_steps = torch.as_tensor(valid_steps)
    if valid_steps.ndim != 1:
        raise ValueError(f"valid_steps must be 1-D (B,), got shape {tuple(valid_steps.shape)}")
    if num_steps < 0 or tokens_per_step < 1:
        raise ValueError(f"need num_steps >= 0 and tokens_per_step >= 1, got {num_steps} and {tokens_per_step}")
    if valid_steps.numel() and (valid_steps.min() < 0 or valid_steps.max() > num_steps):
        raise ValueError(f"valid_steps must lie in [0, {num_steps}], got min {int(valid_steps.min())} "
                         f"max {int(valid_steps.max())} (pass policy steps, not env steps)")
    positions = torch.arange(num_steps * tokens_per_step, device=valid_steps.device)
    return positions.unsqueeze(0) < (valid_steps.long() * tokens_per_step).unsqueeze(1)


def make_action_mask(finish_step: ArrayOrTensor | Sequence[int], num_steps: int, chunk: int,
                     action_dim: int = 7) -> torch.Tensor:
    """Bool (B, L) mask of the action tokens whose action the env executed, L = num_steps * chunk * action_dim:
    position p (policy step p // (chunk*action_dim), action p // action_dim overall) is kept iff
    p < finish_step[b] * action_dim, finish_step = env steps taken (SimpleVLA-RL dp_rob.py:435-438; siiRL's actor
    loss, siirl/engine/actor/embodied_actor.py:411-415 @af00a77). A success or truncation in the middle of a chunk
    leaves that chunk's later actions unexecuted: their tokens get no advantage and no loss. Tokens must be
    action-major within a step (action a's dims at a*action_dim .. a*action_dim + action_dim - 1), as every token
    policy here lays them out."""
    finish_step = torch.as_tensor(finish_step)
    if finish_step.ndim != 1:
        raise ValueError(f"finish_step must be 1-D (B,), got shape {tuple(finish_step.shape)}")
    if num_steps < 0 or chunk < 1 or action_dim < 1:
        raise ValueError(f"need num_steps >= 0, chunk >= 1 and action_dim >= 1, got {num_steps}, {chunk}, {action_dim}")
    if finish_step.numel() and (finish_step.min() < 0 or finish_step.max() > num_steps * chunk):
        raise ValueError(f"finish_step must lie in [0, {num_steps * chunk}] (env steps of {num_steps} policy steps of "
                         f"{chunk} actions), got min {int(finish_step.min())} max {int(finish_step.max())}")
    positions = torch.arange(num_steps * chunk * action_dim, device=finish_step.device)
    return positions.unsqueeze(0) < (finish_step.long() * action_dim).unsqueeze(1)


def executed_actions(finish_step: ArrayOrTensor | Sequence[int], num_steps: int, chunk: int) -> np.ndarray:
    """(B, T) int64: how many of policy step t's `chunk` actions the env executed (chunk before the episode's last
    step, finish_step - t * chunk in it, 0 after): the chunk-level counterpart of `make_action_mask`."""
    finish_step = np.asarray(finish_step, dtype=np.int64).reshape(-1, 1)
    return np.clip(finish_step - np.arange(num_steps)[None, :] * chunk, 0, chunk)


def _group_ids(index: Sequence[Hashable] | ArrayOrTensor, batch_size: int,
               device: torch.device | str = "cpu") -> Tuple[torch.Tensor, int]:
    """Map each row's group id (any hashable; tensor/numpy scalars by value) to 0..G-1, in order of appearance."""
    keys = [k.item() if isinstance(k, (torch.Tensor, np.generic)) else k for k in index]
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} rows")
    ids: Dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(k, len(ids)) for k in keys], dtype=torch.long, device=device), len(ids)


def _weighted_group_stats(scores: torch.Tensor, counts: torch.Tensor, groups: torch.Tensor,
                          num_groups: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-row mean and population std of its group when row b's score is repeated counts[b] times."""
    mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    for g in range(num_groups):
        rows = groups == g
        n = counts[rows].sum()
        if n > 0:  # a group without any valid sample keeps mean 0, std 1 (its advantages are masked to 0 anyway)
            mu = (counts[rows] * scores[rows]).sum() / n
            mean[rows] = mu
            std[rows] = ((counts[rows] * (scores[rows] - mu) ** 2).sum() / n).sqrt()
    return mean, std


# ---------------------------------------------------------------------------------------------------------------------
# GRPO family
# ---------------------------------------------------------------------------------------------------------------------
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                   index: Sequence[Hashable] | ArrayOrTensor, epsilon: float = 1e-6,
                                   norm_adv_by_std_in_grpo: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (siiRL's SRPO, verl): A = (s - mean_g) / (std_g + eps), unbiased std, a one-row group uses
    mean 0 / std 1; Dr.GRPO (norm_adv_by_std_in_grpo=False) drops the division. Returns (advantages, returns)."""
    check_ndim(2, token_level_rewards=token_level_rewards, response_mask=response_mask)
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    groups, num_groups = _group_ids(index, token_level_rewards.shape[0], token_level_rewards.device)
    with torch.no_grad():
        scores = token_level_rewards.to(torch.float64).sum(dim=-1)  # float64: equal scores give 0, not noise / eps
        mean, std = torch.zeros_like(scores), torch.ones_like(scores)
        for g in range(num_groups):
            rows = groups == g
            if int(rows.sum()) > 1:
                mean[rows] = scores[rows].mean()
                std[rows] = scores[rows].std()
        adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        adv = (adv.unsqueeze(-1) * response_mask).to(as_float(token_level_rewards).dtype)
    return adv, adv


def compute_step_grpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                index: Sequence[Hashable] | ArrayOrTensor, step_mask: torch.Tensor,
                                epsilon: float = 1e-6,
                                norm_adv_by_std_in_grpo: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """The Advanced GRPO write-up's "standard" GRPO: every valid step is a sample carrying its trajectory's score;
    mean and population std (the write-up's example: std 0.5, A = +-1) over the group's valid steps, broadcast to
    each step's tokens."""
    check_ndim(2, token_level_rewards=token_level_rewards, response_mask=response_mask, step_mask=step_mask)
    check_same_shape(token_level_rewards=token_level_rewards, response_mask=response_mask)
    batch, length = token_level_rewards.shape
    num_steps = step_mask.shape[1]
    if step_mask.shape[0] != batch or num_steps == 0 or length % num_steps != 0:
        raise ValueError(f"step_mask (B, T_steps) must have B = {batch} rows and T_steps > 0 dividing L = {length}, "
                         f"got step_mask {tuple(step_mask.shape)}, "
                         f"token_level_rewards {tuple(token_level_rewards.shape)}")
    groups, num_groups = _group_ids(index, batch, token_level_rewards.device)
    with torch.no_grad():
        scores = token_level_rewards.to(torch.float64).sum(dim=-1)  # float64: equal scores give 0, not noise / eps
        step_weights = step_mask.to(device=scores.device, dtype=scores.dtype)
        mean, std = _weighted_group_stats(scores, step_weights.sum(dim=-1), groups, num_groups)
        adv = (scores - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else scores - mean
        step_adv = adv.unsqueeze(-1) * step_weights
        adv = step_adv.repeat_interleave(length // num_steps, dim=1) * response_mask
        adv = adv.to(as_float(token_level_rewards).dtype)
    return adv, adv


def compute_advanced_grpo_outcome_advantage(episode_rewards: torch.Tensor, response_mask: torch.Tensor,
                                            index: Sequence[Hashable] | ArrayOrTensor, epsilon: float = 1e-6,
                                            norm_adv_by_std_in_grpo: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's Advanced GRPO: each valid token carries its episode reward; A = (r - mu) / (sigma + eps), mean and
    population std over all valid tokens of the group, so a group's token advantages sum to 0."""
    check_ndim(1, episode_rewards=episode_rewards)
    check_ndim(2, response_mask=response_mask)
    if episode_rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(f"episode_rewards {tuple(episode_rewards.shape)} and response_mask "
                         f"{tuple(response_mask.shape)} must have the same number of rows")
    groups, num_groups = _group_ids(index, episode_rewards.shape[0], episode_rewards.device)
    with torch.no_grad():
        rewards = episode_rewards.to(torch.float64)  # float64 stats: equal rewards give 0, not noise / eps
        mask = response_mask.to(device=rewards.device, dtype=rewards.dtype)
        mean, std = _weighted_group_stats(rewards, mask.sum(dim=-1), groups, num_groups)
        adv = (rewards - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else rewards - mean
        adv = (adv.unsqueeze(-1) * mask).to(as_float(episode_rewards).dtype)
    return adv, adv


def compute_grpo_outcome_advantage_split(token_level_rewards: torch.Tensor, eos_mask: torch.Tensor,
                                         index: Sequence[Hashable] | ArrayOrTensor, on_policy_mask: torch.Tensor,
                                         epsilon: float = 1e-6,
                                         use_std: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """LUFFY's GRPO: mean / unbiased std of each group's on-policy rows only (one row -> 0 / 1, std 0 -> 1),
    applied to all its rows; a group with no on-policy row (LUFFY raises) uses 0 / 1."""
    check_ndim(2, token_level_rewards=token_level_rewards, eos_mask=eos_mask)
    check_same_shape(token_level_rewards=token_level_rewards, eos_mask=eos_mask)
    on_policy_mask = torch.as_tensor(on_policy_mask)
    if tuple(on_policy_mask.shape) != (token_level_rewards.shape[0],):
        raise ValueError(f"on_policy_mask must be ({token_level_rewards.shape[0]},), got {tuple(on_policy_mask.shape)}")
    groups, num_groups = _group_ids(index, token_level_rewards.shape[0], token_level_rewards.device)
    on_policy = on_policy_mask.bool().to(token_level_rewards.device)
    with torch.no_grad():
        scores = token_level_rewards.to(torch.float64).sum(dim=-1)  # float64: equal scores give 0, not noise / eps
        mean, std = torch.zeros_like(scores), torch.ones_like(scores)
        for g in range(num_groups):
            rows = groups == g
            on_scores = scores[rows & on_policy]
            if on_scores.numel() > 1:
                mean[rows] = on_scores.mean()
                group_std = on_scores.std()
                std[rows] = torch.where(group_std == 0, torch.ones_like(group_std), group_std)
        adv = (scores - mean) / (std + epsilon) if use_std else scores - mean
        adv = (adv.unsqueeze(-1) * eos_mask).to(as_float(token_level_rewards).dtype)
    return adv, adv


# ---------------------------------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------------------------------
def _clean(x: ArrayOrTensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(x).detach().to(device=device, dtype=dtype)
    return torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0)


def compute_gae(rewards: ArrayOrTensor, values: ArrayOrTensor, dones: ArrayOrTensor, gamma: float = 0.99,
                gae_lambda: float = 0.95, normalize_advantages: bool = True,
                last_value: float | ArrayOrTensor = 0.0) -> Tuple[ArrayOrTensor, ArrayOrTensor]:
    """GAE (Schulman et al. 2015): d_t = r_t + g V_{t+1} (1-done_t) - V_t, A_t = d_t + g l (1-done_t) A_{t+1},
    returns = A + V; numpy or torch, (T,) or (N, T); NaN/inf -> 0; then optionally A <- (A - mean) / (std + 1e-8)."""
    as_numpy = not isinstance(rewards, torch.Tensor)
    if as_numpy:
        out_dtype = np.result_type(np.asarray(rewards).dtype, np.asarray(values).dtype, np.float32)
        dtype, device = (torch.float64 if out_dtype == np.float64 else torch.float32), torch.device("cpu")
    else:
        dtype = torch.promote_types(rewards.dtype, torch.as_tensor(values).dtype)
        dtype, device = (dtype if dtype.is_floating_point else torch.get_default_dtype()), rewards.device
    r, v, d = (_clean(x, dtype, device) for x in (rewards, values, dones))
    check_same_shape(rewards=r, values=v, dones=d)
    if r.ndim not in (1, 2):
        raise ValueError(f"rewards must be (T,) or (N, T), got shape {tuple(r.shape)}")
    one_d = r.ndim == 1
    if one_d:
        r, v, d = r.unsqueeze(0), v.unsqueeze(0), d.unsqueeze(0)
    num_rows, horizon = r.shape
    next_value = _clean(last_value, dtype, device)
    if next_value.numel() not in (1, num_rows):
        raise ValueError(f"last_value must be a scalar or have {num_rows} entries, got shape {tuple(next_value.shape)}")
    next_value = next_value.reshape(-1).expand(num_rows)

    not_done = 1.0 - d
    advantages = torch.zeros_like(r)
    last_adv = torch.zeros(num_rows, dtype=dtype, device=device)
    for t in reversed(range(horizon)):
        delta = r[:, t] + gamma * next_value * not_done[:, t] - v[:, t]
        last_adv = delta + gamma * gae_lambda * not_done[:, t] * last_adv
        advantages[:, t] = last_adv
        next_value = v[:, t]
    returns = advantages + v
    if normalize_advantages and advantages.numel() > 0:
        advantages = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-8)

    if one_d:
        advantages, returns = advantages[0], returns[0]
    if as_numpy:
        return advantages.numpy().astype(out_dtype), returns.numpy().astype(out_dtype)
    return advantages, returns


# ---------------------------------------------------------------------------------------------------------------------
# the one adapter the scripts call: algorithm.adv_estimator -> estimator
# ---------------------------------------------------------------------------------------------------------------------
def episode_to_token_rewards(episode_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) token_level_rewards with each episode reward on its row's last valid token (token 0 if none is valid)."""
    check_ndim(1, episode_rewards=episode_rewards)
    check_ndim(2, response_mask=response_mask)
    if episode_rewards.shape[0] != response_mask.shape[0] or response_mask.shape[1] == 0:
        raise ValueError(f"episode_rewards {tuple(episode_rewards.shape)} needs one row of response_mask "
                         f"{tuple(response_mask.shape)} (with L > 0) per episode")
    rewards = as_float(episode_rewards)
    last = (response_mask.to(torch.long).sum(dim=-1) - 1).clamp(min=0)
    token_rewards = torch.zeros(response_mask.shape, dtype=rewards.dtype, device=rewards.device)
    return token_rewards.scatter(1, last.unsqueeze(1).to(rewards.device), rewards.unsqueeze(1))


def compute_advantage(name: str, episode_rewards: torch.Tensor, response_mask: torch.Tensor,
                      index: Sequence[Hashable] | ArrayOrTensor, step_mask: Optional[torch.Tensor] = None,
                      **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """Run the GRPO-family estimator named by `algorithm.adv_estimator` from (B,) episode rewards; kwargs go to it
    (grpo_split needs `on_policy_mask`; `norm_adv_by_std_in_grpo` is passed to it as `use_std`)."""
    if name == "advanced_grpo":
        return compute_advanced_grpo_outcome_advantage(episode_rewards, response_mask, index, **kwargs)
    if name not in ("grpo", "step_grpo", "grpo_split"):
        if name == "gae":
            raise ValueError("adv_estimator 'gae' needs per-step rewards, values and dones: call compute_gae directly")
        raise ValueError(f"unknown adv_estimator {name!r}; valid: grpo, step_grpo, advanced_grpo, grpo_split (and gae "
                         f"through compute_gae)")
    token_level_rewards = episode_to_token_rewards(episode_rewards, response_mask)
    if name == "grpo":
        return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, **kwargs)
    if name == "step_grpo":
        if step_mask is None:
            raise ValueError("adv_estimator 'step_grpo' needs step_mask (B, T_steps)")
        return compute_step_grpo_advantage(token_level_rewards, response_mask, index, step_mask, **kwargs)
    if "on_policy_mask" not in kwargs:
        raise ValueError("adv_estimator 'grpo_split' needs on_policy_mask=(B,) bool")
    if "norm_adv_by_std_in_grpo" in kwargs:
        kwargs["use_std"] = kwargs.pop("norm_adv_by_std_in_grpo")
    return compute_grpo_outcome_advantage_split(token_level_rewards, response_mask, index, **kwargs)


def shuffle_within_groups(scores: np.ndarray, group_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """reward.shuffle, the control arm (train_srpo.py: GRPO's groups; train_flowsar.py: a task's episodes of the
    update): a copy of `scores` with each group's scores permuted among its episodes by `rng`. Each group keeps its
    scores, so GRPO's group mean and std, and the advantages as a set, are those of the true scores; only which
    episode gets which is random."""
    out = np.array(scores, dtype=np.float64, copy=True)
    for g in dict.fromkeys(np.asarray(group_ids).tolist()):  # groups in order of first appearance: seeded, stable
        rows = np.flatnonzero(group_ids == g)
        out[rows] = out[rows[rng.permutation(len(rows))]]
    return out


__all__: List[str] = [
    "compute_advanced_grpo_outcome_advantage", "compute_advantage",
    "compute_gae", "compute_grpo_outcome_advantage", "compute_grpo_outcome_advantage_split",
    "compute_step_grpo_advantage", "episode_to_token_rewards", "executed_actions", "make_action_mask",
    "make_response_mask", "shuffle_within_groups",
]

