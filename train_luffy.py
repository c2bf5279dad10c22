"""LUFFY: Learning to reason Under oFF-policY guidance for VLA policies, one file.

Each iteration: prompts (task, start) -> n - n_off on-policy rollouts + n_off expert demonstrations of that same start,
executed in the simulator exactly as the policy acts (same chunks, same 256-bin tokens; a demo that fails is dropped
and counted) -> dynamic sampling on the on-policy rows -> GRPO advantages over the whole group (or LUFFY's split
baseline from on-policy rows only) -> on-policy old log-probs -> mixed-policy loss: PPO on on-policy tokens, the
shaped probability f(p) = p / (p + 0.1) on demo tokens (policy shaping: low-probability expert actions get the
largest gradient) -> logging and checkpoints. `algorithm.use_sft_multitask_loss=true` gives the paper's "RL w/ SFT
loss" baseline instead (PPO on on-policy tokens + NLL on the demo tokens).

Demonstrations: on tabletop the scripted expert acting closed-loop from the trial's own initial state; on real LIBERO
the HDF5 demos of `demos.paths`, the simulator reset to each demo's first state (prompts are drawn from the demos).

    python train_luffy.py --task-id 0                     # embedded tabletop suite, tiny policy, CPU is fine
    python train_luffy.py --config configs/luffy_libero.yaml --task-id 0 demos.paths=[libero_spatial/x_demo.hdf5]
    accelerate launch --multi_gpu --num_processes 2 train_luffy.py --task-ids 0 1
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from common import memory_plan
from common.config import (RESUMABLE, ConfigError, EvalConfig, InitConfig, LogConfig, check_run_config,
                           exit_on_bad_config, parse_cli, ranged)
from envs import EnvConfig, max_steps
from models.configs import TokenPolicyConfig


@dataclass
class RolloutConfig:
    n: int = ranged(8, "[1, 1024]")  # group size: samples per prompt, on-policy
                                     # rollouts + demonstrations (LUFFY: n 8 ...)
    n_off: int = ranged(1, "[0, 1024]")  # ... of which off-policy expert demonstrations of
                                         # the same start (LUFFY: 1; copies of one demo)
    prompts_per_iteration: int = ranged(8, "[1, 65536]")  # prompts per iteration and process
    temperature: float = ranged(1.0, "(0, inf)")  # rollout sampling temperature; log-probs use the same
    train_trials: int = ranged(10, "[1, 100000]")  # tabletop: trials 0..train_trials-1 train,
                                                   # the rest are held out (LIBERO: demo starts)
    refill: bool = False  # dynamic sampling refill: roll out further rounds of fresh prompts until the kept groups
                          # reach prompts_per_iteration (the quota; surplus dropped), as siiRL and SimpleVLA-RL
    max_rounds: int = ranged(  # refill: at most this many rounds per iteration (then the update trains on what was kept)
        10, "[1, 1000]", "rollout.refill's cap on rollout rounds per iteration (1 = no refill)")


@dataclass
class DemoConfig:
    paths: List[str] = field(default_factory=list)  # LIBERO HDF5 demo files (robomimic layout; data/demo_i/states
                                                    # gives the start); tabletop uses its scripted expert instead


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo: statistics over all n rows (LUFFY's recipe) | grpo_split: on-policy rows only
    norm_adv_by_std_in_grpo: bool = False  # LUFFY: use_std false (A = r - mean)
    filter_accuracy: bool = True  # dynamic sampling on the ON-POLICY rows' success: keep lower <= mean <= upper
    accuracy_lower_bound: float = ranged(0.0, "[0, 1]")  # 0: keep all-failure groups, which only
                                                         # the demo can teach (LUFFY's point)
    accuracy_upper_bound: float = ranged(0.9, "[0, 1]")  # drop groups whose on-policy samples
                                                         # all succeeded (no signal left)
    filter_truncated: bool = False  # drop a prompt if any on-policy sample was truncated (max_steps, no success)
    clip_ratio: float = ranged(0.2, "(0, 1)")  # on-policy PPO clip range (cliprange)
    clip_upper_bound: float = ranged(100.0, "[1, inf)")  # upper clip = max(clip_upper_bound, 1 + clip_ratio)
    on_policy_reshape: str = "no_reshape"  # no_reshape | logp | p_logp | square_root | pow | p_div_p_0.1 | p_div_p_0.5
    on_policy_reshape_weight: float = 1.0  # w in on_policy_reshape=p_logp: ratio + w * log-ratio
    on_policy_reshape_pow_exp: float = 0.5  # e in on_policy_reshape=pow: ratio ** e
    off_policy_reshape: str = "p_div_p_0.1"  # no_reshape | logp | p_logp | square_root | pow | p_div_p_0.1|0.3|0.5
    off_policy_reshape_weight: float = 1.0  # w in off_policy_reshape=logp | p_logp: w * log p (+ p)
    off_policy_reshape_pow_exp: float = 0.5  # e in off_policy_reshape=pow: p ** e
    off_max_clip: Optional[float] = None  # clamp of the off-policy ratio (null = none)
    off_min_clip: Optional[float] = None  # lower clamp of the off-policy ratio (null = none)
    all_max_clip: Optional[float] = None  # tokens with p > this leave the loss (null = none)
    off_policy_target_probs: bool = False  # off ratio p / target_probs with target 1 (a deterministic demonstrator)
    loss_remove_token_mean: bool = True  # sum over tokens / tokens per step, instead of the token mean
    loss_remove_clip: bool = False  # true = no PPO clip on rollout tokens: LUFFY's recipe, with ~2 optimizer steps
                                    # per batch (configs/luffy_libero.yaml); here ~7 per iteration keep the clip
    entropy_coeff: float = ranged(0.001, "[0, inf)")  # loss -= entropy_coeff * entropy of the action tokens
    use_sft_multitask_loss: bool = False  # "RL w/ SFT loss": PPO on on-policy tokens + sft_loss_coef * NLL of demos
    sft_loss_coef: float = ranged(1.0, "[0, inf)")  # with use_sft_multitask_loss: weight of the demos' NLL


@dataclass
class TrainConfig:
    iterations: int = ranged(60, "[1, inf)")  # at most this many iterations
    total_timesteps: Optional[int] = ranged(None, "[1, inf)")  # --timesteps: also stop at the end of the iteration
                                                                # that reaches this many env steps (all processes)
    lr: float = ranged(1e-4, "[0, inf)")  # AdamW learning rate (the tiny policy's)
    lr_warmup_steps: int = ranged(50, "[0, inf)")  # linear warmup over the first N optimizer steps
    weight_decay: float = ranged(0.0, "[0, inf)")  # AdamW weight decay
    adam_beta1: float = ranged(0.9, "[0, 1)")  # AdamW beta1 (torch's default)
    adam_beta2: float = ranged(0.999, "[0, 1)")  # AdamW beta2 (torch's default)
    update_epochs: int = ranged(1, "[1, 1000]")  # passes over the iteration's policy steps
    mini_batch_unit: str = "step"  # step: mini-batches of policy steps shuffled across episodes | trajectory: of
                                   # whole episodes (LUFFY's mini-batches of responses)
    mini_batch_size: int = ranged(64, "[1, 1048576]")  # per optimizer step: policy steps, or episodes
                                                           # with train.mini_batch_unit=trajectory
    micro_batch_size: int = ranged(32, "[1, 65536]")  # policy steps per forward/backward (gradient accumulation)
    grad_clip: float = ranged(1.0, "(0, inf)")  # clip the gradient's global norm to this
    threads: int = ranged(0, "[0, 4096]")  # torch CPU threads per process; 0 = auto (common/threads.py: its cores
                                         # / processes; 1 on a GPU); config.yaml keeps the count chosen
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)
    recompute_old_log_prob: bool = True  # on-policy rows (demo rows have none); False = the rollout's log-probs


@dataclass
class Config:
    seed: int = ranged(1, "[0, inf)")  # seeds torch, numpy and the rollout's sampling (--seed)
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: Any = field(default_factory=TokenPolicyConfig)  # policy.type (token (default) | openvla_oft) picks its keys
    init: InitConfig = field(default_factory=InitConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    demos: DemoConfig = field(default_factory=DemoConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def memory_parts(self, world: int) -> memory_plan.Parts:
        """What the memory plan counts (common/memory_plan.py): the policy and the update's batches (no other model)."""
        return memory_plan.rl_parts(self, world, "train_luffy.py")


# the command line before the imports below: --help and a malformed line answer in ~1 s (torch and transformers
# take ~10 s to load); the values are checked (check_config) once they have loaded
if __name__ == "__main__":
    cfg = parse_cli(Config, "configs/luffy.yaml", __doc__, script="luffy",
                    resumable=RESUMABLE + ("train.total_timesteps",), flags={
                        "--timesteps": dict(type=int, key="train.total_timesteps",
                                            help="stop after this many env steps (or train.iterations, if first)")})
    memory_plan.dry_run(cfg)  # --dry-run: print the memory plan and exit (nothing loads)

import numpy as np
import torch

from common.advantages import compute_advantage, make_action_mask
from common.demos import load_hdf5_demos, rollout_demos
from common.dynamic_sampling import group_offset, sample_rounds, trim_to_quota
from common.losses import agg_loss
from common.masking import check_same_shape, masked_mean, masked_sum, on_host
from common.rollout import RolloutBatch, collect_rollouts, flatten_steps
from common.fsdp import shard_policy
from common.policy_start import initial_policy
from common.run import EvalSettings, start_run
from common.train import (adam_betas, adamw_with_warmup, mean_stats, micro_batches, minibatches, optimizer_step,
                          sample_prompts, sharded_update)
from models import ACTION_DIM


# ---------------------------------------------------------------------------------------------------------------------
# LUFFY's mixed-policy loss (its mix_core_alg.py): the objective that defines the algorithm
# ---------------------------------------------------------------------------------------------------------------------
def _nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.zeros_like(x), x)


def _on_policy_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, reshape: str, weight: float,
                     pow_exp: float) -> torch.Tensor:
    delta = log_prob - old_log_prob
    if reshape == "no_reshape":
        return torch.exp(delta)
    if reshape == "logp":
        return delta
    if reshape == "p_logp":
        return torch.exp(delta) + weight * delta
    if reshape == "square_root":
        return torch.sqrt(torch.exp(delta))
    if reshape == "pow":
        return torch.pow(torch.exp(delta), pow_exp)
    if reshape in ("p_div_p_0.1", "p_div_p_0.5"):
        gamma = float(reshape.rsplit("_", 1)[1])
        prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
        return (prob / (prob + gamma)) / (old_prob / (old_prob + gamma))
    raise ValueError(f"invalid on_policy_reshape {reshape!r}; valid: no_reshape, logp, p_logp, square_root, pow, "
                     f"p_div_p_0.1, p_div_p_0.5")


def _off_policy_ratio(log_prob: torch.Tensor, reshape: str, weight: float, pow_exp: float) -> torch.Tensor:
    prob = torch.exp(log_prob)
    if reshape == "no_reshape":
        return prob
    if reshape == "logp":
        return log_prob * weight
    if reshape == "p_logp":
        return log_prob * weight + prob
    if reshape == "square_root":
        return torch.sqrt(prob)
    if reshape in ("p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5"):
        gamma = float(reshape.rsplit("_", 1)[1])
        return prob / (prob + gamma)
    if reshape == "pow":
        return torch.pow(prob, pow_exp)
    raise ValueError(f"invalid off_policy_reshape {reshape!r}; valid: no_reshape, logp, p_logp, square_root, "
                     f"p_div_p_0.1, p_div_p_0.3, p_div_p_0.5, pow")


def compute_token_on_off_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    cliprange: float,
    clip_upper_bound: float,
    prefix_mask: torch.Tensor,
    off_max_clip: Optional[float] = None,
    off_min_clip: Optional[float] = None,
    all_max_clip: Optional[float] = None,
    off_policy_reshape: str = "no_reshape",
    off_policy_reshape_weight: float = 1.0,
    off_policy_reshape_pow_exp: float = 0.5,
    on_policy_reshape: str = "no_reshape",
    on_policy_reshape_weight: float = 1.0,
    on_policy_reshape_pow_exp: float = 0.5,
    target_probs: Optional[torch.Tensor] = None,
    loss_remove_token_mean: bool = False,
    loss_remove_clip: bool = False,
) -> Dict[str, torch.Tensor]:
    """LUFFY's mixed-policy loss: PPO clip on on-policy tokens, reshaped p (or p / target_probs) on prefix
    tokens; dict of 11 scalars. (LUFFY's off_cliprange, off_normalize and off_abs_cliprange, which it ignores, are not
    taken.)"""
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, eos_mask=eos_mask,
                     prefix_mask=prefix_mask)
    if prefix_mask.dtype != torch.bool:
        raise ValueError(f"prefix_mask must be a bool tensor (it is negated with ~), got dtype {prefix_mask.dtype}")
    # exp(inf) in the unused on-policy branch would give NaN gradients
    if on_host(old_log_prob) and not bool(torch.isfinite(old_log_prob).all()):
        raise ValueError("old_log_prob must be finite on every token; for off-policy (prefix) tokens pass the policy's "
                         "log-prob under the old weights, as LUFFY does")
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    on_mask = (~prefix_mask) * eos_mask
    off_mask = prefix_mask * eos_mask

    # on-policy: (reshaped) importance ratio with PPO clip
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-negative_approx_kl, eos_mask)
    ratio = _on_policy_ratio(log_prob, old_log_prob, on_policy_reshape, on_policy_reshape_weight,
                             on_policy_reshape_pow_exp)
    on_pg_losses = -advantages * ratio
    if loss_remove_clip:
        on_pg_clipfrac = zero
    else:
        upper_bound = max(clip_upper_bound, 1.0 + cliprange)
        on_pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, upper_bound)
        on_pg_clipfrac = masked_mean((on_pg_losses2 > on_pg_losses).float(), eos_mask)
        on_pg_losses = torch.maximum(on_pg_losses, on_pg_losses2)
    on_pg_loss = masked_mean(on_pg_losses, on_mask)

    # off-policy: the current policy's (reshaped) token probability, no old policy
    if target_probs is None:
        off_ratio = _off_policy_ratio(log_prob, off_policy_reshape, off_policy_reshape_weight,
                                      off_policy_reshape_pow_exp)
    else:
        check_same_shape(target_probs=target_probs, log_prob=log_prob)
        off_ratio = torch.exp(log_prob) / (target_probs + 1e-6) * prefix_mask
    off_ratio_max_clip_frac, off_ratio_min_clip_frac = zero, zero
    if off_max_clip is not None:
        off_ratio = torch.clamp(off_ratio, max=off_max_clip)
        off_ratio_max_clip_frac = masked_mean((off_ratio == off_max_clip).float(), off_mask)
    if off_min_clip is not None:
        off_ratio = torch.clamp(off_ratio, min=off_min_clip)
        off_ratio_min_clip_frac = masked_mean((off_ratio == off_min_clip).float(), off_mask)
    off_ratio_mean = _nan_to_zero(masked_mean(off_ratio, off_mask))
    off_pg_losses = -advantages * off_ratio
    off_pg_loss = _nan_to_zero(masked_mean(off_pg_losses, off_mask))
    off_pg_clipfrac = zero

    # combine per token: P * L_off + (1 - P) * L_on (torch.where, so an unused side can never inject NaN)
    pg_losses = torch.where(prefix_mask, off_pg_losses, on_pg_losses)
    off_policy_prob = _nan_to_zero(masked_mean(torch.exp(log_prob), off_mask))
    on_policy_prob = _nan_to_zero(masked_mean(torch.exp(old_log_prob), on_mask))

    loss_mask = eos_mask
    if all_max_clip is not None:  # tokens the policy already gives p > all_max_clip leave the loss and its mask
        keep = torch.exp(log_prob) <= all_max_clip
        loss_mask = eos_mask * keep
        pg_losses = torch.where(keep, pg_losses, torch.zeros_like(pg_losses))
    if loss_remove_token_mean:
        pg_loss = masked_sum(pg_losses, loss_mask) / max(loss_mask.shape[-1], 1)
    else:
        pg_loss = masked_mean(pg_losses, loss_mask)

    return {
        "pg_loss": pg_loss,
        "off_pg_loss": off_pg_loss,
        "on_pg_loss": on_pg_loss,
        "off_pg_clipfrac": off_pg_clipfrac,
        "on_pg_clipfrac": on_pg_clipfrac,
        "ppo_kl": ppo_kl,
        "off_policy_prob": off_policy_prob,
        "on_policy_prob": on_policy_prob,
        "off_ratio_mean": off_ratio_mean,
        "off_ratio_max_clip_frac": off_ratio_max_clip_frac,
        "off_ratio_min_clip_frac": off_ratio_min_clip_frac,
    }


def compute_sft_pure_loss(log_prob: torch.Tensor, eos_mask: torch.Tensor) -> torch.Tensor:
    """LUFFY's SFT loss: masked_mean(-log_prob, eos_mask)."""
    check_same_shape(log_prob=log_prob, eos_mask=eos_mask)
    return masked_mean(-log_prob, eos_mask)


LOSS_KEYS = ("pg_loss", "off_pg_loss", "on_pg_loss", "off_pg_clipfrac", "on_pg_clipfrac", "ppo_kl", "off_policy_prob",
             "on_policy_prob", "off_ratio_mean", "off_ratio_max_clip_frac", "off_ratio_min_clip_frac")


def check_config(cfg: Config) -> None:
    """Errors a researcher would otherwise meet minutes into a run, as one line with the fix."""
    check_run_config(cfg)
    r, a = cfg.rollout, cfg.algorithm
    if r.n_off >= r.n:  # (n_off >= 0: its range)
        raise ConfigError(f"rollout.n_off={r.n_off} with rollout.n={r.n}: need 0 <= n_off < n (a group is n - n_off "
                          f"on-policy rollouts plus n_off demonstrations; LUFFY uses n=8, n_off=1)")
    if r.n < 2:
        raise ConfigError(f"rollout.n={r.n}: need n >= 2 (a group)")
    if a.adv_estimator not in ("grpo", "grpo_split"):
        raise ConfigError(f"algorithm.adv_estimator={a.adv_estimator!r}: use grpo (LUFFY's recipe) or grpo_split")
    if a.use_sft_multitask_loss and r.n_off == 0:
        raise ConfigError("algorithm.use_sft_multitask_loss needs demonstrations in the groups: set rollout.n_off >= 1")
    one = torch.zeros(1, 1)
    try:  # the loss names its valid reshapes; ask it now rather than at the first update
        compute_token_on_off_policy_loss(one, one, one, one + 1, 0.2, 100.0, one.bool(),
                                         off_policy_reshape=a.off_policy_reshape,
                                         on_policy_reshape=a.on_policy_reshape)
    except ValueError as e:
        raise ConfigError(f"algorithm.{str(e).split()[1]}: {e}") from None
    if cfg.env.suite != "tabletop" and not cfg.demos.paths:
        raise ConfigError(f"env.suite={cfg.env.suite} needs demonstrations: set demos.paths=[<task>_demo.hdf5, ...] "
                          f"(LIBERO's HDF5 demos of the trained tasks; the scripted expert exists only on tabletop)")


def luffy_loss(alg: AlgorithmConfig, log_prob: torch.Tensor, entropy: torch.Tensor, old_log_prob: torch.Tensor,
               advantages: torch.Tensor, mask: torch.Tensor, prefix: torch.Tensor):
    """The objective of one micro-batch of policy steps (rows x action tokens): LUFFY's mixed-policy loss (PPO on
    on-policy tokens, shaped p on the demo tokens `prefix`) minus the entropy bonus; or, with use_sft_multitask_loss,
    the same PPO loss on on-policy tokens only plus sft_loss_coef x NLL of the demo tokens. -> (loss, scalars)."""
    # demo tokens have no old policy: their "old" log-prob is the current one (the off branch never reads it; ppo_kl 0)
    old_log_prob = torch.where(prefix, log_prob.detach(), old_log_prob)
    rl_mask, rl_prefix = (mask * ~prefix, torch.zeros_like(prefix)) if alg.use_sft_multitask_loss else (mask, prefix)
    out = compute_token_on_off_policy_loss(
        old_log_prob, log_prob, advantages, rl_mask, alg.clip_ratio, alg.clip_upper_bound, rl_prefix,
        off_max_clip=alg.off_max_clip, off_min_clip=alg.off_min_clip, all_max_clip=alg.all_max_clip,
        off_policy_reshape=alg.off_policy_reshape, off_policy_reshape_weight=alg.off_policy_reshape_weight,
        off_policy_reshape_pow_exp=alg.off_policy_reshape_pow_exp, on_policy_reshape=alg.on_policy_reshape,
        on_policy_reshape_weight=alg.on_policy_reshape_weight, on_policy_reshape_pow_exp=alg.on_policy_reshape_pow_exp,
        target_probs=torch.ones_like(log_prob) if alg.off_policy_target_probs else None,
        loss_remove_token_mean=alg.loss_remove_token_mean, loss_remove_clip=alg.loss_remove_clip)
    out["entropy"] = agg_loss(entropy, mask, "token-mean")
    loss = out["pg_loss"] - alg.entropy_coeff * out["entropy"]
    if alg.use_sft_multitask_loss:
        out["sft_loss"] = compute_sft_pure_loss(log_prob, mask * prefix)
        loss = loss + alg.sft_loss_coef * out["sft_loss"]
    return loss, out


def load_libero_prompts(cfg: Config) -> List[dict]:
    """LIBERO demos of the trained tasks that know their start (data/demo_i/states, or a trial_id attribute)."""
    demos = load_hdf5_demos(cfg.demos.paths, cfg.env, key="demos.paths", images=False)  # train_sft.py's checks
    demos = [d for d in demos if d["init_state"] is not None or d["trial_id"] >= 0]
    if not demos:
        raise ConfigError(f"demos.paths {cfg.demos.paths}: no demo of tasks {list(cfg.env.task_ids)} with a recorded "
                          f"start (data/demo_i/states or a trial_id attribute); record them with states, or check the "
                          f"files belong to env.suite={cfg.env.suite}")
    return [{"task": d["task_id"], "trial": max(d["trial_id"], 0), "init_state": d["init_state"],
             "actions": d["actions"]} for d in demos]


if __name__ == "__main__":
    cfg = exit_on_bad_config(check_config, cfg)  # values checked; eval.protocol resolved: its changes printed
    # ===== PLUMBING (common/): run folder, policy, optimizer, resume; nothing of the algorithm ==========
    with start_run(cfg, "luffy") as run:
        device = run.device
        libero_prompts = load_libero_prompts(cfg) if cfg.env.suite != "tabletop" else None
        policy = shard_policy(run, initial_policy(run, "token"))  # train.strategy
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer, scheduler = adamw_with_warmup(params, cfg.train.lr, cfg.train.weight_decay,
                                                 cfg.train.lr_warmup_steps, adam_betas(cfg.train))
        temp = cfg.rollout.temperature
        run.attach(policy, {"actor": optimizer}, {"actor": scheduler}, evaluation=EvalSettings(temperature=temp),
                   banner=f" | {cfg.rollout.n - cfg.rollout.n_off} on-policy + {cfg.rollout.n_off} demo per group"
                          + (f" | {len(libero_prompts)} HDF5 demos" if libero_prompts else ""))
        task_max_steps = {t: max_steps(cfg.env, t) for t in cfg.env.task_ids}
        A = policy.action_chunk * ACTION_DIM  # action tokens per policy step
        mb, alg = cfg.train.micro_batch_size, cfg.algorithm
        P, n_on, n_off = cfg.rollout.prompts_per_iteration, cfg.rollout.n - cfg.rollout.n_off, cfg.rollout.n_off
        warned_short = False  # env.max_steps too short for the demos: said once

        budget = cfg.train.total_timesteps
        # ===== ALGORITHM: rollout, advantages, update (the run.* calls inside are bookkeeping: counts, stops) ==
        for iteration in run.iterations():
            if budget and run.state["env_steps"] >= budget:  # a resumed run that had already spent its budget
                break
            t_iter = time.perf_counter()
            metrics = run.begin_iteration(iteration)

            # 1.-3. in rounds: prompts, rollouts and demonstrations, dynamic sampling. With rollout.refill, further
            #    rounds of fresh prompts until every process's kept groups together reach the quota (P per process),
            #    at most rollout.max_rounds; then the first quota groups in the order (round, process)
            demos = []  # per round, its demonstrations (group ids offset as the round's)

            def roll_out(round_index: int):
                # 1. prompts: tabletop (task, practice trial); LIBERO a demo (its task, reset to its first state)
                if libero_prompts is None:
                    tasks, trials = sample_prompts(run, P)
                    reset_options, demo_actions = None, None
                else:
                    picked = [libero_prompts[i] for i in run.prompt_rng.integers(0, len(libero_prompts), P)]
                    tasks, trials = [d["task"] for d in picked], [d["trial"] for d in picked]
                    reset_options = {"init_states": [d["init_state"] for d in picked]}
                    demo_actions = [d["actions"] for d in picked]

                # 2. rollout: n - n_off on-policy samples per prompt, and the prompt's demonstration executed as the
                #    policy acts (tokens, chunks, padding), its success verified in the simulator
                policy.eval()
                on_batch = collect_rollouts(run.envs, policy, tasks, trials, n_samples=n_on, temperature=temp,
                                            progress=run.is_main, reset_options=reset_options,
                                            desc=f"rollout {iteration}" + (f" round {round_index + 1}" if round_index
                                                                           else ""))
                on_batch.extras["prefix_mask"] = np.zeros(on_batch.tokens.shape, dtype=bool)
                if not n_off:
                    return on_batch, on_batch  # filtered, counted
                demo_batch = rollout_demos(run.envs, policy.action_tokenizer, policy.action_chunk, tasks, trials,
                                           demo_actions, reset_options)
                demo_batch.group_ids = demo_batch.group_ids + group_offset(run, round_index, P)
                demos.append(demo_batch)
                return on_batch, RolloutBatch.concat([on_batch, demo_batch])

            # 3. dynamic sampling on the on-policy rows' binary success (their groups are n_on consecutive rows)
            sampled = sample_rounds(run, roll_out, n_on, P, cfg.rollout.max_rounds, cfg.rollout.refill,
                                    filter_accuracy=alg.filter_accuracy, filter_truncated=alg.filter_truncated,
                                    accuracy_lower_bound=alg.accuracy_lower_bound,
                                    accuracy_upper_bound=alg.accuracy_upper_bound)
            if run.stopped:  # Ctrl-C / SIGTERM at a round's safe point: every process stops (last iteration saved)
                break
            kept, kept_demo, demo_ok, demo_bad = sampled.kept, [], [], 0
            for on_kept, demo_batch in zip(kept, demos):  # keep n_off copies of each verified demo of a kept group;
                ok = demo_batch.complete & ~demo_batch.invalid  # drop failed ones
                demo_ok += ok.tolist()
                limit = np.array([task_max_steps[int(t)] for t in demo_batch.task_ids])
                demo_bad += int((~ok & ~demo_batch.invalid & (demo_batch.finish_step >= limit)).sum())
                kept_demo.append(demo_batch.select(np.repeat(np.flatnonzero(
                    ok & np.isin(demo_batch.group_ids, on_kept.group_ids)), n_off)))
            sampled.log_metrics(run, metrics, n_on)  # time, env steps, SPS, rounds, outcomes, the filter's counts
            if n_off:
                metrics["demos/success_rate"] = float(np.mean(run.gather(demo_ok)))
                metrics["demos/dropped"] = float(sum(run.gather([len(demo_ok) - int(np.sum(demo_ok))])))
                cut = sum(run.gather([demo_bad]))
                if cut and not warned_short and run.is_main:  # once: dropped demos silently turn LUFFY into GRPO
                    print(f"[luffy] warning: {cut} demonstration(s) reached env.max_steps={cfg.env.max_steps} before "
                          f"succeeding and were dropped; raise env.max_steps (null = the suite's limit) so the "
                          f"demos fit, or LUFFY learns without them (plain GRPO)", flush=True)
                warned_short = warned_short or cut > 0
            batch = RolloutBatch.concat(kept + kept_demo) if len(kept + kept_demo) > 1 else kept[0]
            is_demo = np.arange(len(batch)) >= sum(len(b) for b in kept)  # demo rows come last
            if cfg.rollout.refill:  # the surplus of the last round over the quota is dropped
                trained = trim_to_quota(run.gather, run.rank, sampled.group_rounds, P)
                groups = list(dict.fromkeys(np.concatenate([b.group_ids for b in kept]).tolist()))  # round order
                rows = np.isin(batch.group_ids, np.array(groups, dtype=np.int64)[trained])
                batch, is_demo = batch.select(rows), is_demo[rows]
                metrics["sampling/trained_groups"] = float(sum(run.gather([int(trained.sum())])))
            metrics["demos/in_update"] = float(sum(run.gather([int(is_demo.sum())])))  # demo episodes trained on
            kept_counts = run.gather([len(batch)])
            metrics["train/skipped_update"] = float(sum(kept_counts) == 0)

            # 4. advantages: binary reward (a demo is a verified success), GRPO over each group's n rows or with the
            #    on-policy baseline only; broadcast to the tokens of the actions the env executed (finish_step x 7),
            #    then policy steps as rows
            steps = None
            if len(batch):
                T = batch.num_steps
                response_mask = make_action_mask(batch.finish_step, T, policy.action_chunk)  # (B, T*A): executed
                split = {"on_policy_mask": torch.as_tensor(~is_demo)} if alg.adv_estimator == "grpo_split" else {}
                rewards = torch.as_tensor(batch.complete, dtype=torch.float32)
                advantages, _ = compute_advantage(alg.adv_estimator, rewards, response_mask, batch.group_ids.tolist(),
                                                  norm_adv_by_std_in_grpo=alg.norm_adv_by_std_in_grpo, **split)
                steps = flatten_steps(batch, advantages=advantages.view(len(batch), T, A),
                                      mask=response_mask.view(len(batch), T, A).float())
                metrics["train/advantage_abs_mean"] = float(masked_mean(steps.tensor("advantages").abs(),
                                                                        steps.tensor("mask")))
                if is_demo.any():
                    metrics["train/demo_advantage_mean"] = float(advantages[torch.as_tensor(is_demo)][:, 0].mean())
                metrics["train/demo_step_fraction"] = float(steps.data["prefix_mask"][:, 0].mean())

                # 5. old log-probs of the on-policy rows (forward only); demo rows have none
                if cfg.train.recompute_old_log_prob:
                    on_rows = np.flatnonzero(~steps.data["prefix_mask"][:, 0])
                    chunks = []  # kept on the device: one copy to the host after the loop
                    with torch.no_grad():
                        for s in range(0, len(on_rows), mb):
                            part = steps.take(on_rows[s:s + mb])
                            chunks.append(policy.log_prob(part.obs, part.instructions, part.tensor("tokens"), temp)[0])
                    if chunks:
                        steps.data["old_log_probs"][on_rows] = torch.cat(chunks).cpu().numpy()

            # 6. update: epochs -> shuffled mini-batches of policy steps, or of whole episodes (train.mini_batch_unit=
            #    trajectory) -> micro-batches of policy steps (gradient accumulation, the mean over them)
            t0 = time.perf_counter()
            policy.train()
            stats = {k: [] for k in LOSS_KEYS + ("entropy", "sft_loss", "grad_norm")}
            if sum(kept_counts) > 0:
                with sharded_update(run, policy, steps) as pad:  # fsdp: sharded weights, as many micro-batches
                    by_trajectory = cfg.train.mini_batch_unit == "trajectory"
                    for mb_inds in minibatches(len(steps) if steps else 0, cfg.train.mini_batch_size,
                                               cfg.train.update_epochs, run.gather,
                                               episodes=steps.episode if by_trajectory and steps else None):
                        optimizer.zero_grad(set_to_none=True)
                        micro = micro_batches(steps, mb_inds, mb, pad)
                        for part, weight in micro:  # weight 0: fsdp's padding (a row that adds zero gradient)
                            log_prob, entropy = policy.log_prob(part.obs, part.instructions, part.tensor("tokens"),
                                                                temp)
                            loss, out = luffy_loss(alg, log_prob, entropy, part.tensor("old_log_probs", device),
                                                   part.tensor("advantages", device), part.tensor("mask", device),
                                                   part.tensor("prefix_mask", device))
                            (loss * weight / micro.count).backward()  # the mean over this process's micro-batches
                            for k in LOSS_KEYS + ("entropy", "sft_loss"):
                                if k in out and weight:
                                    stats[k].append(out[k].detach())  # read once after the update: no host sync
                        stats["grad_norm"].append(optimizer_step(run, params, optimizer, scheduler,
                                                                 cfg.train.grad_clip, policy=policy))
            metrics["time/update"] = time.perf_counter() - t0
            metrics["train/lr"] = scheduler.get_last_lr()[0]
            metrics.update(mean_stats(stats))
            metrics["train/optimizer_steps"] = float(len(stats["grad_norm"]))  # this update's policy optimizer steps

            # 7. end of iteration: evaluation when due, logging, checkpoint; stop on the env-step budget
            last = iteration + 1 == cfg.train.iterations or bool(budget and run.state["env_steps"] >= budget)
            metrics["time/iteration"] = time.perf_counter() - t_iter
            # ===== PLUMBING: evaluation, metrics row, checkpoint (a safe stop point) =====
            if run.end_iteration(iteration, metrics, ["charts/SPS", "rollout/success_rate", "demos/success_rate",
                                                      "val/success_rate", "val/sampled_success_rate",
                                                      "sampling/kept_fraction", "train/off_pg_loss", "train/on_pg_loss",
                                                      "train/off_policy_prob", "train/grad_norm", "time/iteration"],
                                 last=last):
                break  # Ctrl-C / SIGTERM: every process stops (this iteration saved)
