"""The pieces every training loop repeats, once: AdamW with linear warm-up, prompt sampling, rollout metrics over
all processes, mini-batches and micro-batches, gradient averaging over processes, the optimizer step (averaged,
clipped) and the mean of the update's statistics. What defines an algorithm stays in its script; the command line
and its checks are common/config.py's (parse_cli, exit_on_bad_config), the run's lifecycle common/run.py's."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

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


def micro_batches(steps: Any, mb_inds: torch.Tensor, size: int) -> List[Any]:
    """A mini-batch's rows of `steps` as micro-batches of `size` rows (gradient accumulation)."""
    return [steps.take(mb_inds[s:s + size]) for s in range(0, len(mb_inds), size)]


def average_gradients(accelerator: Any, params: Sequence[torch.nn.Parameter]) -> None:
    """Mean of every process's gradients through accelerate, in one reduction (missing grads count as zeros); for a
    policy sharded by train.strategy=fsdp the same mean, each process keeping its shard's slice (common/fsdp.py)."""
    owners = fsdp.sharded_owners(params)
    if owners:
        return fsdp.average_sharded(accelerator, params, owners)
    if accelerator.num_processes == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), reduction="mean")
    offset = 0
    for p, g in zip(params, grads):
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
