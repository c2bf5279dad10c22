"""The pieces every training loop repeats, once: AdamW with linear warm-up, prompt sampling, rollout metrics over
all processes, the update's context (train.strategy=fsdp: sharded weights, as many micro-batches on every process),
mini-batches and micro-batches, gradient averaging over processes, the optimizer step (averaged, clipped) and the mean
of the update's statistics. What defines an algorithm stays in its script; the command line
and its checks are common/config.py's (parse_cli, exit_on_bad_config), the run's lifecycle common/run.py's."""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from common import fsdp


def adamw(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float = 0.0,
          betas: Tuple[float, float] = (0.9, 0.999)) -> torch.optim.AdamW:
    """AdamW as every script builds it (`betas`: train.adam_beta1, train.adam_beta2; torch's defaults 0.9, 0.999):
    fused on CUDA (the multi-tensor version's temporaries hold a second copy of the moments: OpenVLA-OFT 7B full
    fine-tuning ran out of memory on a 141 GB GPU in its first step), the for-loop version elsewhere (CPU numerics
    as before)."""
    params = list(params)
    on_cuda = bool(params) and all(p.is_cuda and p.dtype.is_floating_point for p in params)
    betas = (float(betas[0]), float(betas[1]))
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True) if on_cuda else \
        torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, foreach=False)


def adam_betas(train: Any) -> Tuple[float, float]:
    """(train.adam_beta1, train.adam_beta2) of a script's train section."""
    return train.adam_beta1, train.adam_beta2


def adamw_with_warmup(params: Sequence[torch.nn.Parameter], lr: float, weight_decay: float, warmup_steps: int,
                      betas: Tuple[float, float] = (0.9, 0.999)
                      ) -> Tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW and its warm-up: lr * min(1, (step + 1) / warmup_steps) (verl's lr_warmup_steps); a decay over the
    iterations is `optimizer_step`'s lr_scale."""
    optimizer = adamw(params, lr, weight_decay, betas)
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


def outcomes(batch: Any) -> Any:
    """The per-episode outcomes `rollout_metrics` reads (task_ids, complete, finish_step, truncated, invalid), without
    observations or frames: what a refilled iteration keeps of every round for its metrics."""
    return SimpleNamespace(task_ids=batch.task_ids, complete=batch.complete, finish_step=batch.finish_step,
                           truncated=batch.truncated, invalid=batch.invalid)


def rollout_metrics(run: Any, batch: Any, metrics: Dict[str, float]) -> None:
    """rollout/success_rate, mean_length, truncated_fraction, invalid and success_task{t} over every process;
    `batch`: a RolloutBatch, or a list of them (the rounds of a refilled iteration)."""
    batches = batch if isinstance(batch, (list, tuple)) else [batch]
    rows = run.gather([row for b in batches for row in zip(b.task_ids.tolist(), b.complete.tolist(),
                                                           b.finish_step.tolist(), b.truncated.tolist(),
                                                           b.invalid.tolist())])
    task, complete, length, truncated, invalid = (np.array(c) for c in zip(*rows)) if rows else [np.zeros(0)] * 5
    metrics["rollout/success_rate"] = float(np.mean(complete.tolist()))
    metrics["rollout/mean_length"] = float(np.mean(length.tolist()))
    metrics["rollout/truncated_fraction"] = float(np.mean(truncated.tolist()))
    metrics["rollout/invalid"] = float(invalid.sum())
    for t in np.unique(task):
        ok = (task == t) & ~invalid.astype(bool)
        metrics[f"rollout/success_task{int(t)}"] = float(complete[ok].mean()) if ok.any() else math.nan


MINI_BATCH_UNITS = ("step", "trajectory")


def minibatches(num_local: int, mini_batch_size: int, epochs: int, gather: Callable[[List], List],
                episodes: Optional[np.ndarray] = None) -> Iterator[torch.Tensor]:
    """Shuffled index sets of this process's `num_local` rows, `epochs` times; every process gets the same number
    of mini-batches (the largest share decides; a process that runs out yields empty ones, contributing zeros).

    train.mini_batch_unit=step (`episodes` None): `mini_batch_size` rows (policy steps) shuffled across episodes.
    trajectory (`episodes`: each row's episode, e.g. PolicySteps.episode): the episodes are shuffled and each
    mini-batch takes `mini_batch_size` whole episodes, their rows episode by episode in step order (siiRL and
    SimpleVLA-RL split a batch of trajectories into mini-batches of trajectories: siiRL embodied_actor.py:393@af00a77,
    SimpleVLA-RL dp_rob.py:416@7c51662); the count of mini-batches is the largest process's episodes / size."""
    if episodes is None:
        steps = max(1, math.ceil(max(gather([num_local])) / mini_batch_size))
        for _ in range(epochs):
            perm = torch.randperm(num_local)
            for k in range(steps):
                yield perm[k * mini_batch_size:(k + 1) * mini_batch_size]
        return
    episodes = np.asarray(episodes)
    if len(episodes) != num_local:
        raise ValueError(f"minibatches: {len(episodes)} episode ids for {num_local} rows")
    ids, first = np.unique(episodes, return_index=True)
    ids = ids[np.argsort(first)]  # in order of appearance
    rows_of = [np.flatnonzero(episodes == e) for e in ids]
    steps = max(1, math.ceil(max(gather([len(ids)])) / mini_batch_size))
    for _ in range(epochs):
        perm = torch.randperm(len(ids)).tolist()
        for k in range(steps):
            chosen = perm[k * mini_batch_size:(k + 1) * mini_batch_size]
            yield torch.as_tensor(np.concatenate([rows_of[i] for i in chosen]) if chosen else np.zeros(0, np.int64),
                                  dtype=torch.int64)


def grid_minibatches(slots: np.ndarray, grid_rows: int, mini_batch_size: int, epochs: int,
                     gather: Callable[[List], List]) -> Iterator[torch.Tensor]:
    """train.mini_batch_unit=grid: mini-batches of a padded episode x policy-step grid, as RLinf splits its rollout
    (rlinf/workers/actor/embodied_fsdp_actor_worker.py:507-533@a3816b5: every env's n_chunk_steps rows, valid or
    past its episode's end, shuffled and cut into rollout_size / batch_size mini-batches). `slots`: each row's grid
    position (episode x steps per episode + t), `grid_rows`: this process's grid size (episodes x
    ceil(env.max_steps / chunk)). Each epoch shuffles the grid and yields, per `mini_batch_size` grid positions, the
    rows that hold a valid step (padding positions add nothing); so an update always takes ceil(largest process's
    grid / mini_batch_size) x epochs optimizer steps, however short the episodes were."""
    slots = np.asarray(slots, dtype=np.int64)
    if len(slots) and (slots.min() < 0 or slots.max() >= grid_rows):
        raise ValueError(f"grid_minibatches: slots must lie in [0, {grid_rows}), got {slots.min()}..{slots.max()}")
    row_of = np.full(grid_rows, -1, np.int64)
    row_of[slots] = np.arange(len(slots))
    steps = max(1, math.ceil(max(gather([grid_rows])) / mini_batch_size))
    for _ in range(epochs):
        perm = torch.randperm(grid_rows).numpy()
        for k in range(steps):
            rows = row_of[perm[k * mini_batch_size:(k + 1) * mini_batch_size]]
            yield torch.as_tensor(rows[rows >= 0], dtype=torch.int64)


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
    """A mini-batch's micro-batches, iterated as (rows, weight) pairs: this process's own, each weighted by its share
    of the mini-batch's loss (`shares`, summing to 1: a script backpropagates loss x weight; None: 1.0 each, the
    caller divides, e.g. by `count`), then under fsdp as many padding ones (`Padding.row`, weight 0.0: a loss times 0
    gives exactly zero gradient) as make its count the largest process's, so every process runs the same forwards
    and backwards. `count`: the number of this process's own micro-batches (at least 1); `rows`: its rows. Under fsdp
    it tells FSDP before each backward whether to reduce-scatter (common/fsdp.py `sync_gradients`)."""

    def __init__(self, parts: List[Any], pad: Optional[Padding], shares: Optional[List[float]] = None,
                 traj_weight: bool = False):
        self.parts, self.pad, self.traj_weight = parts, pad, traj_weight
        self.count = max(1, len(parts))
        self.rows = sum(len(p) for p in parts)
        self.shares = list(shares) if shares is not None else [1.0] * len(parts)
        self.total = len(parts) if pad is None else max(pad.gather([len(parts)]))  # collective under fsdp

    def __iter__(self) -> Iterator[Tuple[Any, float]]:
        for k in range(self.total):
            if self.pad is not None:
                fsdp.sync_gradients(self.pad.policy, k == self.total - 1)
            yield (self.parts[k], self.shares[k]) if k < len(self.parts) else (self._padding_row(), 0.0)
        if self.pad is not None:
            fsdp.sync_gradients(self.pad.policy, True)

    def _padding_row(self) -> Any:
        """fsdp's padding row; under traj-token-mean with a zero traj_weight (the key its loss reads)."""
        row = self.pad.row
        if self.traj_weight and "traj_weight" not in row.data:
            row = row.take(slice(None))
            row.data["traj_weight"] = np.zeros(len(row), np.float32)
        return row


def micro_batches(steps: Any, mb_inds: torch.Tensor, size: int, pad: Optional[Padding] = None,
                  loss_agg_mode: Optional[str] = None, mask_key: str = "mask",
                  grid_rows: Optional[int] = None) -> MicroBatches:
    """A mini-batch's rows of `steps` as micro-batches of `size` rows (gradient accumulation); `pad` (fsdp, from
    `sharded_update`): padded to the same number on every process (MicroBatches).

    Each micro-batch's weight makes the sum over micro-batches of (its loss x weight) the loss of the whole
    mini-batch under `loss_agg_mode` (algorithm.loss_agg_mode; `mask_key`: the rows' (N, L) token mask):
    - token-mean: its share of the mini-batch's valid tokens (the token mean of a micro-batch x its tokens / the
      mini-batch's tokens = its part of the mini-batch's token mean, whatever the micro-batches' sizes);
    - traj-token-mean: 1, and each row gets data["traj_weight"] = 1 / (valid tokens of its episode in the mini-batch
      x episodes in the mini-batch); agg_loss(..., "traj-token-mean") sums loss x mask x traj_weight, so the sum over
      micro-batches is the mean over the mini-batch's episodes of each one's token mean, even when an episode's steps
      fall in several micro-batches;
    - episode-ratio (RLinf's masked_mean_ratio, rlinf/utils/utils.py:352-356@a3816b5): 1, and each row gets
      data["traj_weight"] = data["episode_weight"] (max episode length / its episode's length, the script's) / (rows
      x mask elements per row), rows = `grid_rows` (the mini-batch's grid positions, padding included, as RLinf's
      mean over its padded rows) or else the mini-batch's rows; agg_loss sums loss x mask x traj_weight;
    - row-mean (a loss that is a mean over a micro-batch's rows: FlowSAR's, a value loss): its share of the rows;
    - the seq-mean modes: 1 / count, the mean over them (as before);
    - None: 1.0 each (the caller divides: LUFFY's own loss by `count`)."""
    parts = [steps.take(mb_inds[s:s + size]) for s in range(0, len(mb_inds), size)]
    shares = None if loss_agg_mode is None else [1.0 / max(1, len(parts))] * len(parts)
    if parts and loss_agg_mode == "token-mean":
        tokens = [float(np.asarray(p.data[mask_key], dtype=np.float64).sum()) for p in parts]
        total = sum(tokens)
        shares = [t / total for t in tokens] if total > 0 else shares
    elif parts and loss_agg_mode == "row-mean":
        shares = [len(p) / len(mb_inds) for p in parts]
    elif loss_agg_mode == "traj-token-mean":
        shares = [1.0] * len(parts)
        if parts:
            episodes = np.concatenate([p.episode for p in parts])
            tokens = np.concatenate([np.asarray(p.data[mask_key], dtype=np.float64).reshape(len(p), -1).sum(-1)
                                     for p in parts])
            ids, inverse = np.unique(episodes, return_inverse=True)
            per_episode = np.bincount(inverse, weights=tokens, minlength=len(ids))
            counted = max(1, int((per_episode > 0).sum()))  # episodes with valid tokens
            weight = np.where(per_episode[inverse] > 0, 1.0 / np.maximum(per_episode[inverse], 1e-12) / counted, 0.0)
            offset = 0
            for p in parts:
                p.data["traj_weight"] = weight[offset:offset + len(p)].astype(np.float32)
                offset += len(p)
    elif loss_agg_mode == "episode-ratio":
        shares = [1.0] * len(parts)
        rows = grid_rows if grid_rows is not None else len(mb_inds)
        for p in parts:
            per_row = int(np.prod(np.asarray(p.data[mask_key]).shape[1:]))
            p.data["traj_weight"] = (np.asarray(p.data["episode_weight"], np.float64) / max(1, rows * per_row)
                                     ).astype(np.float32)
    return MicroBatches(parts, pad, shares, traj_weight=loss_agg_mode in ("traj-token-mean", "episode-ratio"))


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
                   scheduler: Any, max_norm: float, lr_scale: float = 1.0,
                   policy: Optional[torch.nn.Module] = None) -> torch.Tensor:
    """Average the gradients over processes (a process that ran out of rows adds zeros), clip them to `max_norm`,
    step at the schedule's lr times `lr_scale` (a decay over the iterations, e.g. `cosine_decay` of the iteration this
    step belongs to); returns the gradient norm before clipping (a tensor: read it after the update). `policy`: the
    policy whose (sharded, train.strategy=fsdp) weights `params` are: its gathered weights are refreshed after the
    step (fsdp.after_step)."""
    if policy is None and any(fsdp.is_dtensor(p) for p in params):
        raise ValueError("optimizer_step: params are fsdp shards; pass policy= so its gathered weights follow the step")
    average_gradients(run.accelerator, params)
    grad_norm = fsdp.full_tensor(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if lr_scale != 1.0:
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr * lr_scale
    optimizer.step()
    if policy is not None:
        fsdp.after_step(policy)  # fsdp: the gathered weights from the new shards
    scheduler.step()  # the next step's warm-up lr
    return grad_norm


def mean_stats(stats: Dict[str, List[Any]]) -> Dict[str, float]:
    """train/<name>: the mean of each statistic collected during the update (detached tensors, read here once: no
    host sync inside the loop); empty lists are left out."""
    return {f"train/{k}": float(np.mean(torch.stack(v).tolist() if torch.is_tensor(v[0]) else v))
            for k, v in stats.items() if v}
