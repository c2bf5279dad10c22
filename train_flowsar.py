"""FlowSAR: Self-Annotated credit assignment for flow-matching VLA policies (RLinf's FlowSAR), one file.

Each iteration: rollout with the pi0 flow policy (exploration from the initial noise x_1, optionally flow-SDE noise on
the ODE steps) -> episode reward R in {0, 1} -> self-annotation with the EMA reference theta_old (no grad): the
reconstruction error e of every step's action chunk, and a pre-sampled (t, eps, x_t, v_old(x_t, t)) -> credit
assignment w = softmax(+-e / T) over each episode's steps, label y = 2R - 1 -> mirror update of v_theta(x_t, t)
(mse_branch or softplus_kl, mse or sde energy) -> EMA theta_old <- beta theta_old + (1 - beta) theta -> logging and
checkpoints (theta_old included). Model convention: t = 0 clean, t = 1 noise, target velocity u = eps - a.

    python train_flowsar.py --task-id 0                   # embedded tabletop suite, tiny PI0, CPU is fine
    python train_flowsar.py --config configs/flowsar_libero.yaml --task-id 0 --gpu 0 init.path=<pi0 folder> ...
    accelerate launch --multi_gpu --num_processes 2 train_flowsar.py --task-id 0
    accelerate launch --config_file configs/accelerate/8gpu_fsdp.yaml train_flowsar.py ... train.strategy=fsdp
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from common import memory_plan
from common.config import (RESUMABLE, ConfigError, EvalConfig, InitConfig, LogConfig, check_run_config,
                           exit_on_bad_config, parse_cli, ranged)
from envs import EnvConfig
from models.configs import FlowPolicyConfig


@dataclass
class RolloutConfig:
    n: int = ranged(4, "[1, 1024]")  # episodes per (task, trial) prompt (FlowSAR
                                     # needs no groups; repeats just share a start)
    prompts_per_iteration: int = ranged(8, "[1, 65536]")  # (task, trial) prompts per iteration and process
    train_trials: int = ranged(10, "[1, 100000]")  # trials 0..train_trials-1 train; the
                                                   # rest are held out for evaluation
    flow_steps: Optional[int] = ranged(None, "[1, 1000]")  # Euler steps per action chunk (rollout and
                                                          # evaluation); None = policy.num_steps
    flow_noise_level: float = ranged(0.0, "[0, inf)")  # flow-SDE exploration (RLinf): s *
                                                       # sqrt(dt) * z after each ODE step; 0 = off


@dataclass
class AlgorithmConfig:  # RLinf's FlowSAR write-up, section 5: names and defaults (two differ for the tiny policy, marked)
    beta: float = ranged(1.0, "(0, 1]")  # mirror trust region: v+- = (1 -+ beta) v_old +- beta v_theta
    temperature: float = ranged(0.5, "(0, inf)")  # credit-assignment softmax temperature
                                                           # (smaller = more extreme weights)
    tau_mid: float = ranged(0.5, "(0, 1)")  # self-annotation time tau: x = (1 - tau)
                                                     # a + tau eps, a_hat = x - tau v_old
    ema_schedule: str = "fixed"  # fixed (beta = ema_beta) | linear (min(eta_rate * i, eta_max);
                                          # the seed's default)
    ema_beta: float = ranged(0.995, "[0, 1]")  # fixed schedule only
    ema_eta_rate: float = ranged(0.001, "[0, 1]")  # linear schedule only
    ema_eta_max: float = ranged(0.5, "[0, 1]")  # linear schedule only
    energy_type: str = "mse"  # mse (ODE) | sde (energies / 2t, Mahalanobis)
    loss_variant: str = "mse_branch"  # mse_branch (DiffusionNFT) | softplus_kl (pi-StepNFT; the seed's)
    kl_coeff: float = ranged(1.0, "[0, inf)")  # softplus_kl only: kl_coeff * mean (v_theta - v_old)^2
    t_min: float = ranged(0.2, "(0, 1)")  # training flow time t ~ U[t_min, t_max]
    t_max: float = ranged(0.8, "(0, 1)")  # upper end of the training flow time t
    w_min: float = ranged(0.0, "[0, 1]")  # weight clipping (0 and 1 = no clipping),
                                                   # then renormalised per episode
    w_max: float = ranged(1.0, "[0, 1]")  # upper clip of the credit weights (1 = none)


@dataclass
class RewardConfig:
    shuffle: bool = False  # control arm (no signal): the update's outcomes permuted at random among the episodes of
                           # each task before the credit assignment (FlowSAR's groups are size 1: a task's episodes
                           # are the group), so the update moves the policy as far but toward no outcome (seeded;
                           # resumes exactly)


@dataclass
class TrainConfig:
    GRID_MINI_BATCHES = True  # (a class constant, not a key) train.mini_batch_unit=grid is implemented here
    iterations: int = ranged(80, "[1, inf)")  # at most this many iterations
    total_timesteps: Optional[int] = ranged(None, "[1, inf)")  # --timesteps: also stop at the end of the iteration
                                                                # that reaches this many env steps (all processes)
    lr: float = ranged(3e-4, "[0, inf)")  # the tiny policy's; the seed's pi0 recipe: 1e-6 (configs/flowsar_libero.yaml)
    lr_warmup_steps: int = ranged(0, "[0, inf)")  # linear warmup over the first N optimizer steps
    weight_decay: float = ranged(0.0, "[0, inf)")  # AdamW weight decay
    adam_beta1: float = ranged(0.9, "[0, 1)")  # AdamW beta1 (torch's default)
    adam_beta2: float = ranged(0.999, "[0, 1)")  # AdamW beta2 (torch's default; RLinf: 0.95)
    update_epochs: int = ranged(1, "[1, 1000]")  # passes over the iteration's policy steps
    mini_batch_unit: str = "step"  # step: mini-batches of policy steps (chunk-steps) shuffled across episodes |
                                   # trajectory: of whole episodes | grid: of the padded episodes x ceil(env.max_steps
                                   # / chunk) grid (RLinf's, FlowIPO's): a fixed count of optimizer steps per update
    mini_batch_size: int = ranged(64, "[1, 1048576]")  # per optimizer step: policy steps, episodes
                                                       # (mini_batch_unit=trajectory) or grid rows (grid)
    micro_batch_size: int = ranged(32, "[1, 65536]")  # policy steps per forward/backward (gradient
                                                      # accumulation), also self-annotation
    grad_clip: float = ranged(1.0, "(0, inf)")  # clip the gradient's global norm to this
    threads: int = ranged(0, "[0, 4096]")  # torch CPU threads per process; 0 = auto (common/threads.py: its cores
                                         # / processes; 1 on a GPU); config.yaml keeps the count chosen
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)


@dataclass
class Config:
    seed: int = ranged(1, "[0, inf)")  # seeds torch, numpy and the rollout's sampling (--seed)
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: Any = field(default_factory=FlowPolicyConfig)  # policy.type (flow) picks its keys
    init: InitConfig = field(default_factory=lambda: InitConfig(sft_args=["sft.num_demos=20", "sft.augment_shift=0"]))
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=lambda: EvalConfig(every=5, samples_per_trial=0))
    log: LogConfig = field(default_factory=LogConfig)

    def memory_parts(self, world: int) -> memory_plan.Parts:
        """What the memory plan counts (common/memory_plan.py): the policy, the update's batches and the EMA copy of
        the trainable weights (theta_old) beside it."""
        return memory_plan.rl_parts(self, world, "train_flowsar.py", extras=memory_plan.ema_extra)


# the command line before the imports below: --help and a malformed line answer in ~1 s (torch and transformers
# take ~10 s to load); the values are checked (check_config) once they have loaded
if __name__ == "__main__":
    cfg = parse_cli(Config, "configs/flowsar.yaml", __doc__, script="flowsar",
                    resumable=RESUMABLE + ("train.total_timesteps",), flags={
                        "--timesteps": dict(type=int, key="train.total_timesteps",
                                            help="stop after this many env steps (or train.iterations, if first)")})
    memory_plan.dry_run(cfg)  # --dry-run: print the memory plan and exit (nothing loads)

import numpy as np
import torch
import torch.nn.functional as F

from common import fsdp
from common.advantages import executed_actions, shuffle_within_groups
from common.masking import as_float, check_ndim, check_same_shape, masked_mean, on_host
from common.rollout import collect_rollouts, flatten_steps
from common.policy_start import initial_policy
from common.run import EvalSettings, start_run
from common.train import (adam_betas, adamw_with_warmup, grid_minibatches, mean_stats, micro_batches, minibatches,
                          optimizer_step, rollout_metrics, sample_prompts, sharded_update)
from envs import max_steps
from models import ACTION_DIM


# ---------------------------------------------------------------------------------------------------------------------
# FlowSAR (RLinf's FlowSAR): credit assignment (write-up §2.1), self-annotation and EMA reference (§2.4), mirror
# loss (§2.2): what defines the algorithm
# ---------------------------------------------------------------------------------------------------------------------
def compute_flow_sar_weights(recon_errors: torch.Tensor, rewards: torch.Tensor, temperature: float = 0.5,
                             w_min: float = 0.05, w_max: float = 0.5,
                             step_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """FlowSAR weights (write-up §2.1): over each trajectory's valid steps softmax(e/T) if R = 1 else softmax(-e/T),
    then (if w_min > 0 or w_max < 1) clip and renormalise; labels y = 2R - 1. (n_steps, B), (B,) -> same shapes."""
    check_ndim(2, recon_errors=recon_errors)
    check_ndim(1, rewards=rewards)
    if rewards.shape[0] != recon_errors.shape[1]:
        raise ValueError(f"recon_errors (n_steps, B) {tuple(recon_errors.shape)} and rewards (B,) "
                         f"{tuple(rewards.shape)} disagree on B")
    if step_mask is None:
        step_mask = torch.ones_like(recon_errors, dtype=torch.bool)
    check_same_shape(recon_errors=recon_errors, step_mask=step_mask)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 <= w_min <= w_max or w_max <= 0.0:
        raise ValueError(f"need 0 <= w_min <= w_max and w_max > 0, got w_min {w_min}, w_max {w_max}")
    if not bool(((rewards == 0) | (rewards == 1)).all()):
        raise ValueError(f"rewards must be episode successes in {{0, 1}}, got {rewards.tolist()}")

    errors = as_float(recon_errors).detach()
    labels = 2.0 * rewards.to(errors.dtype) - 1.0
    valid = step_mask.bool()
    logits = (labels.unsqueeze(0) * errors / temperature).masked_fill(~valid, float("-inf"))
    logits = torch.where(valid.any(dim=0, keepdim=True), logits, torch.zeros_like(logits))  # no all -inf column
    weights = torch.softmax(logits, dim=0) * valid
    if w_min > 0.0 or w_max < 1.0:
        weights = weights.clamp(w_min, w_max) * valid
        weights = weights / weights.sum(dim=0, keepdim=True).clamp_min(torch.finfo(weights.dtype).tiny)
    return weights, labels


def compute_flow_sar_self_annotation(actions: torch.Tensor, velocity_fn: Callable[[torch.Tensor, torch.Tensor],
                                                                                 torch.Tensor],
                                     tau_mid: float = 0.5, t_min: float = 0.2, t_max: float = 0.8,
                                     generator: Optional[torch.Generator] = None) -> Dict[str, torch.Tensor]:
    """FlowSAR self-annotation (write-up §2.4, spec §4; t = 0 clean, t = 1 noise), no grad. `actions` a (N, ...)
    normalised action chunks; `velocity_fn(x, t)` the EMA reference's velocity for x (N, ...) at times t (N,).

    Reconstruction: x = (1 - tau) a + tau eps, a_hat = x - tau v_old(x, tau), recon_error = mean over a sample's
    elements of (a - a_hat)^2 (0 when v_old is exactly eps - a). Training draw: t ~ U[t_min, t_max], a fresh eps,
    x_t = (1 - t) a + t eps, v_old = v_old(x_t, t). Returns {recon_error (N,), flow_t (N,), flow_epsilon, x_t, v_old}
    (the last three shaped like `actions`)."""
    if not 0.0 < tau_mid < 1.0:
        raise ValueError(f"tau_mid must lie in (0, 1), got {tau_mid}")
    if not 0.0 <= t_min < t_max <= 1.0:
        raise ValueError(f"need 0 <= t_min < t_max <= 1, got t_min {t_min}, t_max {t_max}")
    a = as_float(actions).detach()
    n = a.shape[0]

    def at(t: torch.Tensor) -> torch.Tensor:  # (N,) -> broadcastable against a
        return t.view((n,) + (1,) * (a.ndim - 1))

    def randn() -> torch.Tensor:
        return torch.randn(a.shape, generator=generator, dtype=a.dtype).to(a.device)

    with torch.no_grad():
        tau = torch.full((n,), float(tau_mid), dtype=a.dtype, device=a.device)
        x = (1.0 - at(tau)) * a + at(tau) * randn()
        a_hat = x - at(tau) * velocity_fn(x, tau).to(a.dtype)
        recon_error = (a - a_hat).square().reshape(n, -1).mean(dim=-1)
        flow_t = (t_min + (t_max - t_min) * torch.rand(n, generator=generator, dtype=a.dtype)).to(a.device)
        flow_epsilon = randn()
        x_t = (1.0 - at(flow_t)) * a + at(flow_t) * flow_epsilon
        v_old = velocity_fn(x_t, flow_t).to(a.dtype)
    return {"recon_error": recon_error, "flow_t": flow_t, "flow_epsilon": flow_epsilon, "x_t": x_t, "v_old": v_old}


def flow_sar_ema_beta(schedule: str, num_updates: int, ema_beta: float = 0.995, eta_rate: float = 0.001,
                      eta_max: float = 0.5) -> float:
    """EMA coefficient of FlowSAR's reference after update number `num_updates` (1, 2, ...; FlowSAR write-up §2.4):
    theta_old <- beta theta_old + (1 - beta) theta. `fixed`: beta = ema_beta; `linear` (DiffusionNFT):
    beta_i = min(eta_rate * i, eta_max), near 0 early (the reference tracks the policy), eta_max later."""
    if num_updates < 0:
        raise ValueError(f"num_updates must be >= 0, got {num_updates}")
    if schedule == "fixed":
        return float(ema_beta)
    if schedule == "linear":
        return float(min(eta_rate * num_updates, eta_max))
    raise ValueError(f"unknown EMA schedule {schedule!r}; use fixed or linear")


def compute_flow_sar_loss(v_theta: torch.Tensor, v_old: torch.Tensor, u_target: torch.Tensor, weights: torch.Tensor,
                          labels: torch.Tensor, beta: float, energy_type: str = "mse",
                          loss_variant: str = "mse_branch", kl_coeff: float = 0.5,
                          flow_t: Optional[torch.Tensor] = None,
                          loss_mask: Optional[torch.Tensor] = None,
                          element_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """FlowSAR mirror loss (write-up §2.2): v+- = (1 -+ b) v_old +- b v_theta, E+- = mean (v+- - u)^2 (sde: / 2t);
    mse_branch w[R E+ + (1-R) E-] or softplus_kl w softplus(y (E+ - E-) / 2) + kl_coeff mean (v_theta - v_old)^2.
    `loss_mask` (*S) drops whole samples; `element_mask` (broadcastable to v_theta) keeps only some of a sample's
    elements in its means (the actions the env executed: a chunk cut short by the episode's end), the others get no
    gradient. The metrics are detached 0-d tensors (read them after the update: no host sync per micro-batch)."""
    check_same_shape(v_theta=v_theta, v_old=v_old, u_target=u_target)
    check_same_shape(weights=weights, labels=labels)
    sample_shape = tuple(weights.shape)
    k = len(sample_shape)
    if k == 0 or v_theta.ndim <= k or tuple(v_theta.shape[:k]) != sample_shape:
        raise ValueError(f"v_theta must be (*S, chunk...) with S = weights.shape {sample_shape} (>= 1-D), "
                         f"got v_theta {tuple(v_theta.shape)}")
    if loss_mask is None:
        loss_mask = torch.ones(sample_shape, dtype=torch.bool, device=weights.device)
    check_same_shape(weights=weights, loss_mask=loss_mask)
    if energy_type not in ("mse", "sde"):
        raise ValueError(f"energy_type must be 'mse' or 'sde', got {energy_type!r}")
    if loss_variant not in ("mse_branch", "softplus_kl"):
        raise ValueError(f"loss_variant must be 'mse_branch' or 'softplus_kl', got {loss_variant!r}")
    if on_host(labels) and not bool(((labels == 1) | (labels == -1)).all()):
        raise ValueError(f"labels must be y = 2R - 1 in {{-1, +1}}, got {labels.tolist()}")

    def sample_mean(x: torch.Tensor) -> torch.Tensor:  # over each sample's (kept) elements
        if element_mask is None:
            return x.flatten(k).mean(dim=-1)
        keep = element_mask.to(device=x.device, dtype=torch.bool).expand_as(x)
        kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).flatten(k).sum(dim=-1)
        return kept / keep.flatten(k).sum(dim=-1).clamp(min=1).to(x.dtype)

    v_pos = (1.0 - beta) * v_old + beta * v_theta
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    e_pos = sample_mean((v_pos - u_target).square())
    e_neg = sample_mean((v_neg - u_target).square())
    if energy_type == "sde":
        if flow_t is None or flow_t.numel() != e_pos.numel():
            raise ValueError(f"energy_type 'sde' needs flow_t with one t per sample {sample_shape}, got "
                             f"{None if flow_t is None else tuple(flow_t.shape)}")
        t = flow_t.reshape(sample_shape).to(e_pos.dtype)
        if on_host(t) and bool((t <= 0).any()):
            raise ValueError(f"flow_t must be > 0 for the 1/(2t) sde scaling, got min {float(t.min())}")
        e_pos, e_neg = e_pos / (2.0 * t), e_neg / (2.0 * t)

    labels = labels.to(e_pos.dtype)
    success = (labels + 1.0) / 2.0
    metrics: Dict[str, Any] = {}
    if loss_variant == "mse_branch":
        per_sample = weights * (success * e_pos + (1.0 - success) * e_neg)
        metrics["flow_sar_success_ratio"] = masked_mean(success, loss_mask).detach()
    else:
        contrastive = weights * F.softplus(0.5 * labels * (e_pos - e_neg))
        penalty = kl_coeff * sample_mean((v_theta - v_old).square())
        per_sample = contrastive + penalty
        metrics["flow_sar_contrastive"] = masked_mean(contrastive.detach(), loss_mask)
        metrics["flow_sar_kl_penalty"] = masked_mean(penalty.detach(), loss_mask)
    loss = masked_mean(per_sample, loss_mask)
    metrics.update({
        "flow_sar_loss": loss.detach(),
        "flow_sar_E_pos": masked_mean(e_pos.detach(), loss_mask),
        "flow_sar_E_neg": masked_mean(e_neg.detach(), loss_mask),
        "flow_sar_weight_mean": masked_mean(weights.detach().to(e_pos.dtype), loss_mask),
    })
    return loss, metrics


LOSS_VARIANTS, ENERGY_TYPES, EMA_SCHEDULES = ("mse_branch", "softplus_kl"), ("mse", "sde"), ("fixed", "linear")


def check_config(cfg: Config) -> None:
    """Errors a researcher would otherwise meet minutes into a run, as one line with the fix."""
    check_run_config(cfg)
    a = cfg.algorithm
    if a.loss_variant not in LOSS_VARIANTS:
        raise ConfigError(f"algorithm.loss_variant={a.loss_variant!r}: use mse_branch or softplus_kl")
    if a.energy_type not in ENERGY_TYPES:
        raise ConfigError(f"algorithm.energy_type={a.energy_type!r}: use mse or sde")
    if a.ema_schedule not in EMA_SCHEDULES:
        raise ConfigError(f"algorithm.ema_schedule={a.ema_schedule!r}: use fixed or linear")
    if not a.t_min < a.t_max:  # (each in (0, 1): its range)
        raise ConfigError(f"algorithm.t_min={a.t_min}, t_max={a.t_max}: need "
                          f"0 <= t_min < t_max <= 1 (t = 0 clean, t = 1 noise; the seed uses 0.2 and 0.8)")
    if a.w_min > a.w_max or a.w_max <= 0:  # (each in [0, 1]: its range)
        raise ConfigError(f"algorithm.w_min={a.w_min}, w_max={a.w_max}: need "
                          f"0 <= w_min <= w_max and w_max > 0 (0 and 1 = no clipping)")


@contextlib.contextmanager
def reference_weights(params: List[torch.nn.Parameter], ema: torch.nn.Module,
                      policy: Optional[torch.nn.Module] = None) -> Iterator[None]:
    """Run the policy with theta_old: the EMA values are copied into the trainable parameters and copied back after
    (the frozen weights are shared; the seed's cpu_weight_swap). Under train.strategy=fsdp `params` and the EMA are
    shards of the same layout: the swap is shard by shard (the copy kept is a shard), and the sharded `policy`'s
    computing weights are gathered from the swapped shards on entry and again on exit (collective: every process
    enters once per iteration)."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, e in zip(params, ema.buffers()):
            p.copy_(e)
    if policy is not None and fsdp.is_sharded(policy):
        fsdp.gather_weights(policy)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)
        if policy is not None and fsdp.is_sharded(policy):
            fsdp.gather_weights(policy)


if __name__ == "__main__":
    cfg = exit_on_bad_config(check_config, cfg)  # values checked; eval.protocol resolved: its changes printed
    # ===== PLUMBING (common/): run folder, policy, optimizer, resume; nothing of the algorithm ==========
    with start_run(cfg, "flowsar") as run:
        device, alg = run.device, cfg.algorithm
        policy = fsdp.shard_policy(run, initial_policy(run, "flow"))  # train.strategy
        named = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        optimizer, scheduler = adamw_with_warmup(params, cfg.train.lr, cfg.train.weight_decay,
                                                 cfg.train.lr_warmup_steps, adam_betas(cfg.train))
        # theta_old: a frozen copy of the trainable weights (LoRA + heads, or all), one buffer per parameter; under
        # fsdp a copy of each process's shards (DTensors like the parameters), saved in the checkpoint's shards/
        ema = torch.nn.Module()
        for n, p in named:
            ema.register_buffer(n.replace(".", "__"), p.detach().clone())
        run.state.setdefault("ema_updates", 0)  # i of the linear schedule (restored on resume)
        flow_kwargs = dict(flow_steps=cfg.rollout.flow_steps, flow_noise_level=cfg.rollout.flow_noise_level)
        if cfg.reward.shuffle:  # the control arm's permutations: its own stream, saved and restored with checkpoints
            shuffle_rng = run.rngs["shuffle"] = np.random.default_rng([cfg.seed, run.rank, 1])
        run.attach(policy, {"actor": optimizer}, {"actor": scheduler}, modules={"ema": ema},
                   evaluation=EvalSettings(**flow_kwargs),
                   banner=f" | {alg.loss_variant}, {alg.energy_type}, "
                          f"{alg.ema_schedule} EMA"
                          + (" | outcomes shuffled within each task (control)" if cfg.reward.shuffle else ""))
        mb = cfg.train.micro_batch_size

        budget = cfg.train.total_timesteps
        # ===== ALGORITHM: rollout, advantages, update (the run.* calls inside are bookkeeping: counts, stops) ==
        for iteration in run.iterations():
            if budget and run.state["env_steps"] >= budget:  # a resumed run that had already spent its budget
                break
            t_iter = time.perf_counter()
            metrics = run.begin_iteration(iteration)

            # 1. rollout: prompts (task, trial) x n episodes; exploration = the initial noise (+ optional SDE noise)
            tasks, trials = sample_prompts(run, cfg.rollout.prompts_per_iteration)
            policy.eval()
            t0 = time.perf_counter()
            batch = collect_rollouts(run.envs, policy, tasks, trials, n_samples=cfg.rollout.n, progress=run.is_main,
                                     desc=f"rollout {iteration}", **flow_kwargs)
            metrics["time/rollout"] = time.perf_counter() - t0
            run.count_env_steps(batch, metrics, metrics["time/rollout"])
            if run.should_stop():  # a safe stop point, before the update
                break
            rollout_metrics(run, batch, metrics)
            batch = batch.select(~batch.invalid)  # episodes of a crashed simulator worker never enter an update
            steps = flatten_steps(batch, executed=executed_actions(batch.finish_step, batch.num_steps,
                                                                   policy.action_chunk))  # one row per policy step

            # 2. self-annotation with theta_old (no grad): reconstruction error e of each step's chunk, and the
            #    pre-sampled training point (t, eps, x_t, v_old(x_t, t)). The annotated action is the executed chunk,
            #    normalised (the seed annotates the rollout's `actions`; here that is what the reward judged: x0
            #    after clipping to the action range and gripper binarisation).
            t0 = time.perf_counter()
            if "x0" in steps.data:  # a pi0 checkpoint's protocol: the model-space sample (horizon x 32), as RLinf
                steps.data["a"] = steps.data["x0"]
            else:
                steps.data["a"] = policy.normalize_actions(steps.data["actions"]).cpu().numpy()
            annotation = {k: [] for k in ("recon_error", "flow_t", "flow_epsilon", "x_t", "v_old")}
            with torch.no_grad(), reference_weights(params, ema, policy):
                for s in range(0, len(steps), mb):
                    part = steps.take(slice(s, s + mb))
                    prefix = policy.prefix(part.obs, part.instructions)  # one prefix, two expert passes
                    out = compute_flow_sar_self_annotation(
                        part.tensor("a", device), lambda x, t: policy.velocity(None, None, x, t, prefix),
                        alg.tau_mid, alg.t_min, alg.t_max)
                    for k, v in out.items():
                        annotation[k].append(v)  # on the device: one copy to the host after the loop
            steps.data.update({k: torch.cat(v).cpu().numpy() for k, v in annotation.items() if v})
            metrics["time/annotation"] = time.perf_counter() - t0

            # 3. credit assignment: per episode, w = softmax(e / T) (success) or softmax(-e / T) (failure) over its
            #    valid steps; y = 2R - 1
            errors = np.zeros(batch.step_mask.shape, np.float32)  # (B, T)
            if len(steps):
                errors[steps.episode, steps.t] = steps.data["recon_error"]
            outcomes = batch.complete.astype(np.float64)  # R in {0, 1} (rollout/success_rate logs the true ones)
            if cfg.reward.shuffle:  # control arm: the outcomes permuted among each task's episodes of the update
                outcomes = shuffle_within_groups(outcomes, np.asarray(batch.task_ids), shuffle_rng)
            rewards = torch.as_tensor(outcomes, dtype=torch.float32)
            weights, labels = compute_flow_sar_weights(torch.as_tensor(errors).T, rewards, alg.temperature,
                                                       alg.w_min, alg.w_max,
                                                       step_mask=torch.as_tensor(batch.step_mask).T)
            steps.data["weights"] = weights.T.numpy()[steps.episode, steps.t]
            steps.data["labels"] = labels.numpy()[steps.episode]
            if len(steps):  # how unevenly the credit is spread over an episode's steps (0: uniform)
                metrics["train/flow_sar_weight_std"] = float(steps.data["weights"].std())
            success_step = batch.complete[steps.episode]  # the true outcomes (a control arm credits shuffled ones)
            for name, m in (("success", success_step), ("failure", ~success_step)):
                if m.any():
                    metrics[f"train/flow_sar_recon_error_{name}"] = float(steps.data["recon_error"][m].mean())

            # 4. mirror update: v_theta(x_t, t | s) with gradient against the stored v_old and u = eps - a;
            #    epochs -> shuffled mini-batches of policy steps, or of whole episodes (train.mini_batch_unit=
            #    trajectory) -> micro-batches of policy steps (gradient accumulation, each weighted by its share of the
            #    mini-batch's rows: the loss is a mean over rows)
            t0 = time.perf_counter()
            policy.train()
            stats = {}
            unit, size = cfg.train.mini_batch_unit, cfg.train.mini_batch_size
            if unit == "grid":  # FlowIPO's padded grid: each episode ceil(episode limit / chunk) rows, valid or not
                per_episode = max(-(-max_steps(cfg.env, t) // policy.action_chunk) for t in cfg.env.task_ids)
                batches = grid_minibatches(steps.episode * per_episode + steps.t, len(batch) * per_episode, size,
                                           cfg.train.update_epochs, run.gather)
            else:
                batches = minibatches(len(steps), size, cfg.train.update_epochs, run.gather,
                                      episodes=steps.episode if unit == "trajectory" else None)
            with sharded_update(run, policy, steps) as pad:  # fsdp: sharded weights, as many micro-batches
                for mb_inds in batches:
                    optimizer.zero_grad(set_to_none=True)
                    micro, logged = micro_batches(steps, mb_inds, mb, pad, "row-mean"), None
                    for part, weight in micro:  # weight 0: fsdp's padding (a row that adds zero gradient)
                        v_theta = policy.velocity(part.obs, part.instructions, part.tensor("x_t", device),
                                                  part.tensor("flow_t", device))
                        u_target = part.tensor("flow_epsilon", device) - part.tensor("a", device)
                        # the executed part only (a pi0 checkpoint: first 5 of 50 steps, 7 of 32 dims, as FlowSAR's
                        # RLinf loss crops it; the whole chunk otherwise), and of a chunk the episode's end cut short
                        # only the actions the env ran
                        ex = (slice(None), slice(0, policy.action_chunk), slice(0, ACTION_DIM))
                        ran = torch.arange(policy.action_chunk, device=device)[None, :, None] < \
                            part.tensor("executed", device)[:, None, None]
                        loss, loss_metrics = compute_flow_sar_loss(
                            v_theta[ex], part.tensor("v_old", device)[ex], u_target[ex], part.tensor("weights", device),
                            part.tensor("labels", device), alg.beta, energy_type=alg.energy_type,
                            loss_variant=alg.loss_variant, kl_coeff=alg.kl_coeff,
                            flow_t=part.tensor("flow_t", device), element_mask=ran)
                        (loss * weight).backward()  # weight: this micro-batch's share of the mini-batch's rows
                        logged = loss_metrics if weight else logged
                    grad_norm = optimizer_step(run, params, optimizer, scheduler, cfg.train.grad_clip, policy=policy)
                    if logged is not None:  # this process's last micro-batch's loss terms and the gradient norm
                        for k, v in {**logged, "grad_norm": grad_norm}.items():
                            stats.setdefault(k, []).append(v)

            # 5. EMA: theta_old <- beta_i theta_old + (1 - beta_i) theta, once per update (fsdp: shard by shard)
            run.state["ema_updates"] += 1
            ema_beta = flow_sar_ema_beta(alg.ema_schedule, run.state["ema_updates"], alg.ema_beta,
                                         alg.ema_eta_rate, alg.ema_eta_max)
            with torch.no_grad():
                for e, p in zip(ema.buffers(), params):
                    e.lerp_(p.detach(), 1.0 - ema_beta)
            metrics["train/flow_sar_ema_beta"] = ema_beta
            metrics["time/update"] = time.perf_counter() - t0
            metrics["train/lr"] = scheduler.get_last_lr()[0]
            metrics.update(mean_stats(stats))
            metrics["train/optimizer_steps"] = float(len(stats.get("grad_norm", [])))  # this update's optimizer steps

            # 6. end of iteration: evaluation when due, logging, checkpoint (theta_old in modules/ema.safetensors;
            #    fsdp: in shards/); stop on the env-step budget
            last = iteration + 1 == cfg.train.iterations or bool(budget and run.state["env_steps"] >= budget)
            metrics["time/iteration"] = time.perf_counter() - t_iter
            # ===== PLUMBING: evaluation, metrics row, checkpoint (a safe stop point) =====
            if run.end_iteration(iteration, metrics, ["charts/SPS", "rollout/success_rate", "val/success_rate",
                                                      "val/sampled_success_rate", "train/flow_sar_loss",
                                                      "train/flow_sar_E_pos", "train/flow_sar_E_neg",
                                                      "train/flow_sar_ema_beta", "train/grad_norm", "time/iteration"],
                                 last=last):
                break  # Ctrl-C / SIGTERM: every process stops (this iteration saved)
