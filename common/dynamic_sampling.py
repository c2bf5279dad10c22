"""Dynamic sampling, shared by SRPO and LUFFY: keep a group of rollouts only if it carries a learning signal (its
success rate within bounds, optionally none truncated: siiRL's filter), count what was kept for the logs, and with
rollout.refill roll out further rounds until the kept groups reach the quota, then train on the first quota of them
(siiRL, SimpleVLA-RL)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Sequence, Tuple, Union

import numpy as np
import torch

from common.train import outcomes, rollout_metrics

ArrayOrTensor = Union[np.ndarray, torch.Tensor]


def _to_numpy(x: ArrayOrTensor | Sequence) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def filter_groups(success: ArrayOrTensor | Sequence[bool], truncated: ArrayOrTensor | Sequence[bool], n_samples: int,
                  filter_accuracy: bool = True, filter_truncated: bool = False, accuracy_lower_bound: float = 0.1,
                  accuracy_upper_bound: float = 0.9) -> torch.Tensor:
    """siiRL's _filter_batch as a row mask: keep a group of n_samples consecutive rows if lower <= mean
    success <= upper (inclusive) and, with filter_truncated, none of its rows was truncated (RolloutBatch.truncated:
    cut at its task's max_steps without success; siiRL tests finish_step >= max_steps, which also drops a group with
    a success on exactly the last allowed step)."""
    device = success.device if isinstance(success, torch.Tensor) else torch.device("cpu")
    success = torch.as_tensor(_to_numpy(success)).to(torch.float64)
    truncated = torch.as_tensor(_to_numpy(truncated)).to(torch.bool)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if success.ndim != 1 or truncated.shape != success.shape or success.shape[0] % n_samples != 0:
        raise ValueError(f"need success (B,) and truncated (B,) with B a multiple of n_samples={n_samples}, got "
                         f"success {tuple(success.shape)}, truncated {tuple(truncated.shape)}")
    if not 0.0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1.0:
        raise ValueError(f"need 0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1, got "
                         f"{accuracy_lower_bound}, {accuracy_upper_bound}")
    num_groups = success.shape[0] // n_samples
    keep = torch.ones(num_groups, dtype=torch.bool)
    if filter_accuracy:
        accuracy = success.reshape(num_groups, n_samples).mean(dim=-1)
        keep &= (accuracy >= accuracy_lower_bound) & (accuracy <= accuracy_upper_bound)
    if filter_truncated:
        keep &= ~truncated.reshape(num_groups, n_samples).any(dim=-1)
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


@dataclass
class SampledRounds:
    """One iteration's dynamic sampling: what each round kept and saw, and the counts for the logs."""

    kept: List[Any] = field(default_factory=list)  # per round, its kept episodes (RolloutBatch.select)
    seen: List[Tuple[Any, np.ndarray]] = field(default_factory=list)  # per round, (its outcomes, keep mask)
    group_rounds: List[int] = field(default_factory=list)  # per kept group, in order, the round it was rolled in
    rounds: int = 0  # rounds rolled out and filtered
    env_steps: float = 0.0  # env steps of those rounds, all processes
    metrics: Dict[str, float] = field(default_factory=dict)  # the last round's run.count_env_steps metrics
    seconds: float = 0.0  # wall time of the rounds

    def log_metrics(self, run: Any, metrics: Dict[str, float], n_samples: int) -> None:
        """The rounds' logs into `metrics`: time, env steps, SPS and rounds, the rollout's outcomes over every round
        seen (common.train.rollout_metrics) and the filter's counts over every process (filter_metrics)."""
        metrics["time/rollout"] = self.seconds
        metrics.update(self.metrics)  # charts/env_steps: the run's total after the last round
        metrics["rollout/env_steps"] = self.env_steps
        metrics["charts/SPS"] = self.env_steps / max(self.seconds, 1e-9)
        metrics["sampling/rounds"] = float(self.rounds)
        rollout_metrics(run, [b for b, _ in self.seen], metrics)
        complete_all, keep_all = zip(*run.gather([row for b, k in self.seen
                                                  for row in zip(b.complete.tolist(), k.tolist())]))
        metrics.update(filter_metrics(torch.as_tensor(complete_all), torch.as_tensor(keep_all), n_samples))


def group_offset(run: Any, round_index: int, quota: int) -> int:
    """What to add to the group ids (0 .. quota - 1) of round `round_index` on this process: unique over the
    processes and rounds of an iteration."""
    return (round_index * run.world + run.rank) * quota


def sample_rounds(run: Any, roll_out: Callable[[int], Tuple[Any, Any]], n_samples: int, quota: int,
                  max_rounds: int, refill: bool, **filters: Any) -> SampledRounds:
    """Roll out rounds until the kept groups reach the quota (SRPO's and LUFFY's rollout + dynamic sampling).
    `roll_out(r)` rolls out round r's quota prompts x n_samples and returns (the batch to filter, the batch whose
    env steps count: the same or more, e.g. with demonstrations). Each round: group ids offset (`group_offset`), env
    steps counted, a safe stop point (`run.should_stop()`: the rounds end there, that round not filtered), groups
    kept by `filter_groups(complete, truncated, n_samples, **filters)` less the episodes of a crashed simulator
    worker (`invalid`), which never enter an update. Without rollout.refill one round; with it, further rounds until
    every process's kept groups together reach quota x processes, at most `max_rounds` (`refill_more`)."""
    out = SampledRounds()
    t0 = time.perf_counter()
    while True:
        batch, counted = roll_out(out.rounds)
        batch.group_ids = batch.group_ids + group_offset(run, out.rounds, quota)
        out.metrics = {}
        run.count_env_steps(counted, out.metrics, time.perf_counter() - t0)
        if run.should_stop():  # a safe stop point per round
            break
        out.env_steps += out.metrics["rollout/env_steps"]
        keep = filter_groups(torch.as_tensor(batch.complete), torch.as_tensor(batch.truncated), n_samples,
                             **filters).numpy() & ~batch.invalid
        out.seen.append((outcomes(batch), keep))  # every round's outcomes, for the metrics
        out.kept.append(batch.select(keep))
        out.rounds += 1
        out.group_rounds += [out.rounds - 1] * len(np.unique(out.kept[-1].group_ids))
        if not refill_more(run.gather, len(out.group_rounds), quota, out.rounds, max_rounds, refill):
            break
    out.seconds = time.perf_counter() - t0
    return out


__all__ = ["filter_groups", "filter_metrics", "group_offset", "refill_more", "sample_rounds", "SampledRounds",
           "trim_to_quota"]
