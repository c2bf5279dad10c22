"""Dynamic sampling, shared by SRPO and LUFFY: keep a group of rollouts only if it carries a learning signal (its
success rate within bounds, optionally none truncated: siiRL's filter), count what was kept for the logs, and with
rollout.refill roll out further rounds until the kept groups reach the quota, then train on the first quota of them
(siiRL, SimpleVLA-RL)."""
from __future__ import annotations

from typing import Callable, Dict, List, Sequence, Union

import numpy as np
import torch

ArrayOrTensor = Union[np.ndarray, torch.Tensor]


def _to_numpy(x: ArrayOrTensor | Sequence) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def filter_groups(success: ArrayOrTensor | Sequence[bool], finish_step: ArrayOrTensor | Sequence[int], n_samples: int,
                  max_steps: int, filter_accuracy: bool = True, filter_truncated: bool = False,
                  accuracy_lower_bound: float = 0.1, accuracy_upper_bound: float = 0.9) -> torch.Tensor:
    """siiRL's _filter_batch as a row mask: keep a group of n_samples consecutive rows if lower <= mean
    success <= upper (inclusive) and, with filter_truncated, none of its rows has finish_step >= max_steps."""
    device = success.device if isinstance(success, torch.Tensor) else torch.device("cpu")
    success = torch.as_tensor(_to_numpy(success)).to(torch.float64)
    finish_step = torch.as_tensor(_to_numpy(finish_step))
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if success.ndim != 1 or finish_step.shape != success.shape or success.shape[0] % n_samples != 0:
        raise ValueError(f"need success (B,) and finish_step (B,) with B a multiple of n_samples={n_samples}, got "
                         f"success {tuple(success.shape)}, finish_step {tuple(finish_step.shape)}")
    if not 0.0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1.0:
        raise ValueError(f"need 0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1, got "
                         f"{accuracy_lower_bound}, {accuracy_upper_bound}")
    num_groups = success.shape[0] // n_samples
    keep = torch.ones(num_groups, dtype=torch.bool)
    if filter_accuracy:
        accuracy = success.reshape(num_groups, n_samples).mean(dim=-1)
        keep &= (accuracy >= accuracy_lower_bound) & (accuracy <= accuracy_upper_bound)
    if filter_truncated:
        keep &= ~(finish_step.reshape(num_groups, n_samples) >= max_steps).any(dim=-1)
    return keep.repeat_interleave(n_samples).to(device)


def filter_metrics(success: ArrayOrTensor | Sequence[bool], keep: torch.Tensor, n_samples: int) -> Dict[str, float]:
    """Counts for logging the dynamic-sampling step: groups seen/kept, all-success and all-failure groups."""
    success = torch.as_tensor(_to_numpy(success)).to(torch.float64)
    if success.ndim != 1 or tuple(keep.shape) != tuple(success.shape) or success.shape[0] % max(n_samples, 1) != 0:
        raise ValueError(f"need success (B,) and keep (B,) with B a multiple of n_samples={n_samples}, got "
                         f"success {tuple(success.shape)}, keep {tuple(keep.shape)}")
    accuracy = success.reshape(-1, n_samples).mean(dim=-1)
    num_groups = accuracy.shape[0]
    kept = int(keep.reshape(-1, n_samples)[:, 0].sum()) if num_groups else 0
    return {
        "sampling/groups": float(num_groups),
        "sampling/kept_groups": float(kept),
        "sampling/kept_fraction": kept / num_groups if num_groups else 0.0,
        "sampling/all_success_groups": float((accuracy == 1).sum()),
        "sampling/all_failure_groups": float((accuracy == 0).sum()),
        "sampling/success_rate": float(success.mean()) if success.numel() else 0.0,
    }


def refill_more(gather: Callable[[List], List], kept_groups: int, quota: int, rounds: int, max_rounds: int,
                refill: bool) -> bool:
    """Dynamic sampling with refill (rollout.refill): whether to roll out another round of fresh prompts. Collective
    (every process gets the same answer from the gathered kept counts): refill is on, the kept groups of all
    processes so far fall short of quota x processes (rollout.prompts_per_iteration per process), and fewer than
    `max_rounds` rounds ran (rollout.max_rounds; at the cap the update trains on the groups kept so far).

    The references refill without a cap: siiRL's DataCoordinator returns nothing until the filtered samples reach
    train_batch_size x n (siirl/data_coordinator/data_buffer.py:180-183@af00a77) and the step is rolled out again
    (siirl/dag_worker/dagworker.py:296-305); SimpleVLA-RL loops `while len(valid_batch) < batch_size * n_samples`
    (verl/trainer/ppo/ray_trainer.py:513@7c51662) until the epoch's prompts run out, then skips the step (:594)."""
    counts = gather([int(kept_groups)])
    return bool(refill) and sum(counts) < quota * len(counts) and rounds < max_rounds


def trim_to_quota(gather: Callable[[List], List], rank: int, group_rounds: Sequence[int], quota: int) -> np.ndarray:
    """Which of this process's kept groups (`group_rounds`: the round each was rolled out in, in this process's
    order) the update keeps: the first quota x processes of all processes' kept groups in the order (round, process,
    group), the surplus of the last round dropped, as the references keep the first train_batch_size groups and drop
    the rest: siiRL's coordinator takes potential_items[:global_batch_size] (data_buffer.py:183@af00a77) and clears
    its queue after the step (dagworker.py:398, reset_cache); SimpleVLA-RL's add_to_buffer keeps the first
    batch_size groups (ray_trainer.py:596-597, 818-829@7c51662; its buffer is commented out). Collective."""
    mine = [(int(r), rank, i) for i, r in enumerate(group_rounds)]
    everyone = gather(mine)
    processes = len(gather([0]))
    kept = {(r, p, i) for r, p, i in sorted(everyone)[:quota * processes]}
    return np.array([(r, p, i) in kept for r, p, i in mine], dtype=bool)


__all__ = ["filter_groups", "filter_metrics", "refill_more", "trim_to_quota"]
