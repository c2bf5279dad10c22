"""The pieces every training loop repeats, once: AdamW with linear warm-up, prompt sampling, rollout metrics over
all processes, the update's context (train.strategy=fsdp: sharded weights, as many micro-batches on every process),
mini-batches and micro-batches, gradient averaging over processes, the optimizer step (averaged, clipped) and the mean
of the update's statistics. What defines an algorithm stays in its script; the command line
and its checks are common/config.py's (parse_cli, exit_on_bad_config), the run's lifecycle common/run.py's."""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from common import fsdp


def adamw(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW as every script builds it: fused on CUDA (the multi-tensor version's temporaries hold a second copy of
    the moments: OpenVLA-OFT 7B full fine-tuning ran out of memory on a 141 GB GPU in its first step), the
    for-loop version elsewhere (CPU numerics as before)."""
    params = list(params)
    on_cuda = bool(params) and all(p.is_cuda and p.dtype.is_floating_point for p in params)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True) if on_cuda else \
        torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=False)


def adamw_with_warmup(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float, warmup_steps: int
                      ) -> Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its warm-up: lr * min(1, (step + 1) / warmup_steps) (verl's lr_warmup_steps); a decay over the
    iterations is `optimizer_step`'s lr_scale."""
    optimizer = adamw(params, lr, weight_decay)
    warmup = max(1, warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    return optimizer, scheduler


def cosine_decay(iteration: int, iterations: int) -> float:
    """(1 + cos(pi * iteration / iterations)) / 2: 1 at the first iteration, towards 0 at the last."""
    return 0.5 * (1 + math.cos(math.pi * iteration / iterations))


def sample_prompts(run: Any, count: int) -> Tuple[List[int], List[int]]:
    """`count` (task, trial) prompts: a task of env.task_ids and a practice trial 0..rollout.train_trials-1 each."""
    tasks = run.prompt_rng.choice(run.cfg.env.task_ids, count).tolist()
    trials = run.prompt_rng.integers(0, run.cfg.rollout.train_trials, count).tolist()
    return tasks, trials


def rollout_metrics(run: Any, batch: Any, metrics: Dict[str, float]) -> None:
    """rollout/success_rate, mean_length, truncated_fraction, invalid and success_task{t} over every process."""
    rows = run.gather(list(zip(batch.task_ids.tolist(), batch.complete.tolist(), batch.finish_step.tolist(),
                               batch.truncated.tolist(), batch.invalid.tolist())))
    task, complete, length, truncated, invalid = (np.array(c) for c in zip(*rows)) if rows else [np.zeros(0)] * 5
    metrics["rollout/success_rate"] = float(np.mean(complete.tolist()))
    metrics["rollout/mean_length"] = float(np.mean(length.tolist()))
    metrics["rollout/truncated_fraction"] = float(np.mean(truncated.tolist()))
    metrics["rollout/invalid"] = float(invalid.sum())
    for t in np.unique(task):
        ok = (task == t) & ~invalid.astype(bool)
        metrics[f"rollout/success_task{int(t)}"] = float(complete[ok].mean()) if ok.any() else math.nan


def minibatches(num_local: int, mini_batch_size: int, epochs: int, gather: Callable[[List], List]
                ) -> Iterator[torch.Tensor]:
    """Shuffled index sets of this process's `num_local` samples, `epochs` times; every process gets the same number
    of mini-batches (the largest share decides; a process that runs out yields empty ones, contributing zeros)."""
    steps = max(1, math.ceil(max(gather([num_local])) / mini_batch_size))
    for _ in range(epochs):
        perm = torch.randperm(num_local)
        for k in range(steps):
            yield perm[k * mini_batch_size:(k + 1) * mini_batch_size]


class Padding(NamedTuple):
    """train.strategy=fsdp: what a process runs to match the busiest process's number of micro-batches: `row`, one
    row of the update's data (its own first row, or another process's when it has none; None when no process has
    any), with weight 0. `sharded_update` makes it."""
    policy: torch.nn.Module
    row: Any
    gather: Callable[[List], List]


def padding(run: Any, policy: torch.nn.Module, steps: Any) -> Optional[Padding]:
    """The update's Padding under fsdp (collective), None under ddp. `steps`: this process's rows (anything with
    len() and take(index tensor), e.g. common.rollout.PolicySteps; None for none)."""
    if not fsdp.is_sharded(policy):
        return None
    counts = run.gather([len(steps) if steps is not None else 0])
    first = next((rank for rank, n in enumerate(counts) if n), None)
    if first is None:
        return Padding(policy, None, run.gather)
    mine = steps.take(torch.tensor([0])) if counts[run.rank] else None
    if min(counts) == 0:  # a process without rows borrows the first row of the first process that has some
        lent = run.gather([mine] if run.rank == first else [])[0]
        mine = lent if mine is None else mine
    return Padding(policy, mine, run.gather)


@contextlib.contextmanager
def sharded_update(run: Any, policy: torch.nn.Module, steps: Any) -> Iterator[Optional[Padding]]:
    """Every script's update loop runs in it. train.strategy=fsdp: the policy's layers sharded, gathered by FSDP for
    each forward and backward (common/fsdp.py `sharded`), and the Padding that `micro_batches` needs so every process
    runs as many of them; after it, the weights are gathered again for rollouts and evaluation. Collective on entry
    and exit. ddp: yields None, nothing else."""
    pad = padding(run, policy, steps)
    with fsdp.sharded(policy):
        yield pad


class MicroBatches:
    """A mini-batch's micro-batches, iterated as (rows, weight) pairs: this process's own (weight 1.0), then under
    fsdp as many padding ones (`Padding.row`, weight 0.0: a loss times 0 gives exactly zero gradient) as make its
    count the largest process's, so every process runs the same forwards and backwards. `count`: the number of this
    process's own micro-batches (at least 1), the divisor of each script's mean over them. Under fsdp it tells FSDP
    before each backward whether to reduce-scatter (common/fsdp.py `sync_gradients`)."""

    def __init__(self, parts: List[Any], pad: Optional[Padding]):
        self.parts, self.pad = parts, pad
        self.count = max(1, len(parts))
        self.total = len(parts) if pad is None else max(pad.gather([len(parts)]))  # collective under fsdp

    def __iter__(self) -> Iterator[Tuple[Any, float]]:
        for k in range(self.total):
            if self.pad is not None:
                fsdp.sync_gradients(self.pad.policy, k == self.total - 1)
            yield (self.parts[k], 1.0) if k < len(self.parts) else (self.pad.row, 0.0)
        if self.pad is not None:
            fsdp.sync_gradients(self.pad.policy, True)


def micro_batches(steps: Any, mb_inds: torch.Tensor, size: int, pad: Optional[Padding] = None) -> MicroBatches:
    """A mini-batch's rows of `steps` as micro-batches of `size` rows (gradient accumulation); `pad` (fsdp, from
    `sharded_update`): padded to the same number on every process (MicroBatches)."""
    return MicroBatches([steps.take(mb_inds[s:s + size]) for s in range(0, len(mb_inds), size)], pad)


def average_gradients(accelerator: Any, params: Sequence[torch.nn.Parameter]) -> None:
    """Mean of every process's gradients through accelerate, in one reduction (missing grads count as zeros). The
    shards of a policy sharded by train.strategy=fsdp hold that mean already (FSDP reduce-scattered it in the
    mini-batch's last backward, common/fsdp.py); a shard without a gradient gets zeros, as under ddp."""
    if accelerator.num_processes == 1:
        return
    plain = []
    for p in params:
        if fsdp.is_dtensor(p):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        else:
            plain.append(p)
    if not plain:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in plain]
    flat = accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), reduction="mean")
    offset = 0
    for p, g in zip(plain, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()


def optimizer_step(run: Any, params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                   scheduler: Any, max_norm: float, lr_scale: float = 1.0) -> torch.Tensor:
    """Average the gradients over processes (a process that ran out of rows adds zeros), clip them to `max_norm`,
    step at the schedule's lr times `lr_scale` (a decay over the iterations, e.g. `cosine_decay` of the iteration this
    step belongs to); returns the gradient norm before clipping (a tensor: read it after the update)."""
    average_gradients(run.accelerator, params)
    grad_norm = fsdp.full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if lr_scale != 1.0:
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr * lr_scale
    optimizer.step()
    scheduler.step()  # the next step's warm-up lr
    return grad_norm


def mean_stats(stats: Dict[str, List[Any]]) -> Dict[str, float]:
    """train/<name>: the mean of each statistic collected during the update (detached tensors, read here once: no
    host sync inside the loop); empty lists are left out."""
    return {f"train/{k}": float(np.mean(torch.stack(v).tolist() if torch.is_tensor(v[0]) else v))
            for k, v in stats.items() if v}
