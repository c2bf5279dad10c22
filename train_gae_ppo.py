"""GAE-PPO: PPO with a learned value head and GAE advantages on the VLA (the OpenVLA GAE-PPO reference), one file.

Each iteration: rollout (episodes from (task, trial) prompts on the practice trials, the policy's pooled hidden state
kept at every policy step) -> values V(s_t) from the value head, and V(s_last) for episodes cut at max_steps ->
GAE over policy steps (a truncated episode bootstraps, a terminated one does not) -> PPO epochs: clipped policy loss
+ value_loss_coef * value loss - entropy bonus, two AdamW optimizers (actor, critic) with their own gradient clipping
-> evaluation on held-out trials, logging, checkpoints. `algorithm.use_gae=false` is the reference's value-free baseline
(normalised discounted reward-to-go, no value head).

Two action kinds (`policy.type`): token policies (the log-prob of each action token, temperature sampling) and flow
policies (pi0, as RLinf trains it with PPO): the rollout samples with flow-SDE noise on one random denoising step
(rollout.flow_noise_level) and keeps that step's chain data; the PPO log-prob of a policy step is that step's Gaussian
transition density over the executed actions (`transition_log_prob`, one per policy step: RLinf's chunk-level
log-prob); no entropy bonus (the SDE's std is fixed by its schedule); the value head reads PaliGemma's pooled prefix
output; evaluation is the deterministic ODE. Everything else is shared.

    python train_gae_ppo.py --task-id 0                      # embedded tabletop suite, tiny policy, CPU is fine
    python train_gae_ppo.py --task-id 0 --timesteps 100000 --actor-lr 1e-4 --critic-lr 1e-3
    python train_gae_ppo.py --config configs/gae_ppo_libero.yaml --task-id 0 --gpu 0
    python train_gae_ppo.py --config configs/gae_ppo_libero_pi0.yaml --task-id 0 --gpu 0 init.path=<pi0 folder>
    accelerate launch --multi_gpu --num_processes 2 train_gae_ppo.py --task-ids 0 1   # N processes (CPU or GPUs)
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from common import memory_plan
from common.config import (RESUMABLE, ConfigError, EvalConfig, InitConfig, LogConfig, check_run_config,
                           exit_on_bad_config, parse_cli, ranged)
from envs import EnvConfig
from models.configs import TokenPolicyConfig, ValueHeadConfig


@dataclass
class RolloutConfig:
    prompts_per_iteration: int = ranged(64, "[1, 1048576]")  # episodes per iteration and process: one per
                                                             # (task, trial) start, each a random practice one
    temperature: float = ranged(1.0, "(0, inf)")  # rollout sampling temperature; log-probs
                                                  # use the same (token policies)
    flow_noise_level: float = ranged(0.5, "[0, inf)")  # flow policies: the flow-SDE step's
                                                       # sigma scale (RLinf noise_level); > 0
    train_trials: int = ranged(10, "[1, 100000]")  # trials 0..train_trials-1 are practised;
                                                   # the rest are held out for evaluation


@dataclass
class RewardConfig:
    step_penalty: float = 0.0  # optional shaping: minus this per env step (0 = the env's sparse success reward only)


@dataclass
class AlgorithmConfig:
    use_gae: bool = True  # false = the GAE-PPO reference's value-free baseline: discounted reward-to-go, no value head
    gamma: float = ranged(0.99, "[0, 1]")  # discount per policy step (one action chunk),
                                           # or per env action with gae_unit=action
    gae_lambda: float = ranged(0.95, "[0, 1]")  # GAE lambda (1 = Monte-Carlo returns, 0 = one-step TD)
    gae_unit: str = "step"  # step: GAE over policy steps (gamma, lambda per chunk) | action: over env actions, each
                            # with its chunk's value and advantage per action (the GAE-PPO reference's buffer)
    ratio_unit: str = "token"  # token: one PPO ratio per action token | step: one per policy step, from the mean of
                               # its chunk's token log-probs (the GAE-PPO reference)
    normalize_advantages: bool = True  # (A - mean) / (std + 1e-8) over the iteration's policy steps (all processes)
    clip_ratio_low: float = ranged(0.2, "[0, 1)")  # PPO clip: the ratio is kept >= 1 - clip_ratio_low
    clip_ratio_high: float = ranged(0.2, "[0, inf)")  # PPO clip: the ratio is kept <= 1 + clip_ratio_high
    clip_ratio_c: Optional[float] = ranged(  # dual clip for negative advantages (> 1); null = none (RLinf's pi0)
        3.0, "(1, inf)", "the dual clip bounds a negative advantage's ratio at c, above 1 + clip")
    loss_agg_mode: str = "token-mean"  # how the policy (and value) loss averages over action tokens (common/losses.py
                                       # LOSS_AGG_MODES; traj-token-mean: each episode's token mean, then their mean;
                                       # episode-ratio: RLinf's masked_mean_ratio, each row x env.max_steps / its
                                       # episode's env steps, a mean over the mini-batch's (grid) rows, value too)
    entropy_coeff: float = ranged(0.0, "[0, inf)")  # loss -= entropy_coeff * entropy of the action tokens
    value_loss_coef: float = ranged(0.5, "[0, inf)")  # total = policy + value_loss_coef
                                                      # * value - entropy_coeff * entropy
    cliprange_value: Optional[float] = None  # clipped value loss around the rollout's values; null = unclipped
    value_loss: str = "half-mse"  # half-mse: 0.5 (v - R)^2 (verl's) | mse: (v - R)^2 (F.mse_loss, the GAE-PPO
                                  # reference) | huber: Huber(v - R, huber_delta) (RLinf's critic)
    huber_delta: float = ranged(1.0, "(0, inf)")  # value_loss=huber: the quadratic band (RLinf: 10)
    advantage_scale: float = ranged(1.0, "(0, inf)")  # advantages x this in the policy loss (after normalisation;
                                                      # the GAE-PPO reference: 0.5)
    advantage_clamp: Optional[float] = ranged(None, "(0, inf)")  # the scaled advantages clamped to [-c, c] in the
                                                                 # policy loss; null = none (the GAE-PPO reference: 10)
    log_ratio_clamp: float = ranged(20.0, "(0, inf)")  # log r clamped to [-c, c] before exp (verl's 20; the GAE-PPO
                                                       # reference: 5)
    negative_clip_band: str = "same"  # same: the ratio clipped to [1 - clip_ratio_low, 1 + clip_ratio_high] for
                                      # every advantage | swapped: [1 - clip_ratio_high, 1 + clip_ratio_low] where
                                      # A <= 0 (the GAE-PPO reference)
    loss_skip_above: Optional[float] = ranged(None, "(0, inf)")  # a policy-loss element larger than this in size
                                                                 # adds nothing (the mean's count unchanged); null =
                                                                 # none (the GAE-PPO reference: 100)
    freeze_vla_for_critic: bool = False  # detach the hidden state before the value head (the value loss trains the
                                         # head only)


@dataclass
class TrainConfig:
    GRID_MINI_BATCHES = True  # (a class constant, not a key) train.mini_batch_unit=grid is implemented here
    iterations: int = ranged(60, "[1, inf)")  # at most this many iterations
    total_timesteps: Optional[int] = None  # --timesteps: also stop once this many env steps were collected (all procs)
    lr: float = ranged(1e-4, "[0, inf)")  # the tiny policy's; the reference: 1e-5 for
                                                # LoRA on a 7B VLA (configs/gae_ppo_libero.yaml)
    critic_lr: float = ranged(1e-3, "[0, inf)")  # the GAE-PPO reference: 3e-4
    lr_warmup_steps: int = ranged(50, "[0, inf)")  # linear actor-lr warmup over the first N actor steps
    weight_decay: float = ranged(0.0, "[0, inf)")  # AdamW weight decay (actor and critic)
    adam_beta1: float = ranged(0.9, "[0, 1)")  # AdamW beta1 (actor and critic; torch's default)
    adam_beta2: float = ranged(0.999, "[0, 1)")  # AdamW beta2 (actor and critic; torch's default)
    update_epochs: int = ranged(1, "[1, 1000]")  # passes over the iteration's policy steps
    mini_batch_unit: str = "step"  # step: mini-batches of policy steps shuffled across episodes | trajectory: of
                                   # whole episodes | grid: of the padded episodes x ceil(env.max_steps / chunk)
                                   # grid (RLinf's): a fixed count of optimizer steps, padding rows count
    mini_batch_size: int = ranged(64, "[1, 1048576]")  # per optimizer step: policy steps, episodes (train.
                                                           # mini_batch_unit=trajectory) or grid rows (grid)
    micro_batch_size: int = ranged(32, "[1, 65536]")  # policy steps per forward/backward (gradient accumulation)
    grad_clip: float = ranged(1.0, "(0, inf)")  # clip the actor's gradient norm to this
    critic_grad_clip: float = ranged(1.0, "(0, inf)")  # clip the critic's (value head's) gradient norm to this
    grad_clip_mode: str = "separate"  # separate: actor and critic gradients clipped on their own | joint: one norm
                                      # over both, clipped to grad_clip (RLinf's one model)
    threads: int = ranged(0, "[0, 4096]")  # torch CPU threads per process; 0 = auto (common/threads.py: its cores
                                         # / processes; 1 on a GPU); config.yaml keeps the count chosen
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)
    critic_warmup_iterations: int = ranged(0, "[0, inf)")  # first N iterations train the value
                                                           # head only (the actor does not move)
    bc_warmup_env_steps: int = ranged(0, "[0, inf)")  # token policies: while fewer env steps than this were collected
                                                      # (this iteration's included), the update is cross-entropy of
                                                      # the policy on its own rollout's tokens, not PPO, and the
                                                      # critic waits (the GAE-PPO reference's warm-up as its start
                                                      # runs it, no L1 head loaded: 25000)


@dataclass
class Config:
    seed: int = ranged(1, "[0, inf)")  # seeds torch, numpy and the rollout's sampling (--seed)
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: Any = field(default_factory=TokenPolicyConfig)  # policy.type (token (default) | openvla_oft | flow) picks
                                                            # its keys
    value_head: ValueHeadConfig = field(default_factory=lambda: ValueHeadConfig(hidden_dims=[256, 128]))
    init: InitConfig = field(default_factory=InitConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def memory_parts(self, world: int) -> memory_plan.Parts:
        """What the memory plan counts (common/memory_plan.py): the policy, the update's batches and, with
        algorithm.use_gae, the value head."""
        return memory_plan.rl_parts(self, world, "train_gae_ppo.py", extras=lambda model, *_: memory_plan.
                                    value_head_extra(model, self.value_head.hidden_dims) if self.algorithm.use_gae
                                    else [])


# the command line before the imports below: --help and a malformed line answer in ~1 s (torch and transformers
# take ~10 s to load); the values are checked (check_config) once they have loaded
if __name__ == "__main__":
    cfg = parse_cli(Config, "configs/gae_ppo.yaml", __doc__, script="gae_ppo",
                    resumable=RESUMABLE + ("train.total_timesteps",), flags={
                        "--timesteps": dict(type=int, key="train.total_timesteps",
                                            help="stop after this many env steps (or train.iterations, if first)"),
                        "--num-envs": dict(type=int, key="env.num_envs", help="parallel environments"),
                        "--actor-lr": dict(type=float, key="train.lr", help="policy (actor) learning rate"),
                        "--critic-lr": dict(type=float, key="train.critic_lr", help="value head learning rate"),
                        "--log-interval": dict(type=int, key="log.plot_every", help="PNG panels every N updates")})
    memory_plan.dry_run(cfg)  # --dry-run: print the memory plan and exit (nothing loads)

import numpy as np
import torch

from common.advantages import compute_gae, executed_actions, make_action_mask
from common.checkpoint import module_file
from common.masking import masked_mean
from common.losses import (LOSS_AGG_MODES, NEGATIVE_CLIP_BANDS, VALUE_LOSSES, agg_loss, compute_policy_loss_vanilla,
                           compute_value_loss)
from common.rollout import collect_rollouts, flatten_steps
from common import fsdp
from common.fsdp import full_tensor, shard_policy
from common.policy_start import initial_policy
from common.run import EvalSettings, start_run
from common.train import (adam_betas, adamw, adamw_with_warmup, average_gradients, grid_minibatches, mean_stats,
                          micro_batches, minibatches, rollout_metrics, sample_prompts, sharded_update)
from envs import max_steps
from models import ACTION_DIM, ValueHead
from models.policy import action_kind


def check_config(cfg: Config) -> None:
    """Errors a researcher would otherwise meet minutes into a run, as one line with the fix."""
    check_run_config(cfg)
    t, a = cfg.train, cfg.algorithm
    if t.total_timesteps is not None and t.total_timesteps < 1:
        raise ConfigError(f"train.total_timesteps={t.total_timesteps} (--timesteps): must be >= 1 env step "
                          f"(leave it null to stop on train.iterations only)")
    if a.use_gae and (not cfg.value_head.hidden_dims or min(cfg.value_head.hidden_dims) < 1):
        raise ConfigError(f"value_head.hidden_dims={cfg.value_head.hidden_dims}: algorithm.use_gae needs a value head "
                          f"with layers of size >= 1 (the GAE-PPO reference: [1024, 512]), or set algorithm.use_gae=false")
    vh = cfg.value_head
    if vh.activation not in ("gelu", "relu") or vh.init not in ("small_last", "torch", "rlinf"):
        raise ConfigError(f"value_head.activation={cfg.value_head.activation!r}, value_head.init="
                          f"{cfg.value_head.init!r}: use gelu or relu, and small_last, torch or rlinf")
    if a.loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"algorithm.loss_agg_mode={a.loss_agg_mode!r}: use one of {', '.join(LOSS_AGG_MODES)}")
    if a.value_loss not in VALUE_LOSSES:
        raise ConfigError(f"algorithm.value_loss={a.value_loss!r}: use one of {', '.join(VALUE_LOSSES)}")
    if a.negative_clip_band not in NEGATIVE_CLIP_BANDS:
        raise ConfigError(f"algorithm.negative_clip_band={a.negative_clip_band!r}: use one of "
                          f"{', '.join(NEGATIVE_CLIP_BANDS)}")
    if t.grad_clip_mode not in ("separate", "joint"):
        raise ConfigError(f"train.grad_clip_mode={t.grad_clip_mode!r}: use separate or joint")
    if t.grad_clip_mode == "joint" and t.strategy == "fsdp":
        raise ConfigError("train.grad_clip_mode=joint with train.strategy=fsdp: one norm over sharded and replicated "
                          "parameters is not implemented; use train.strategy=ddp or grad_clip_mode=separate")
    if a.gae_unit not in ("step", "action") or a.ratio_unit not in ("token", "step"):
        raise ConfigError(f"algorithm.gae_unit={a.gae_unit!r}, algorithm.ratio_unit={a.ratio_unit!r}: use gae_unit "
                          f"step or action and ratio_unit token or step")
    if a.gae_unit == "action" and action_kind(cfg.policy.type) == "flow":
        raise ConfigError("algorithm.gae_unit=action needs a token policy (one advantage per action's tokens); a flow "
                          "policy has one log-density per chunk: use algorithm.gae_unit=step (RLinf's chunk level)")
    if t.critic_warmup_iterations > 0 and not a.use_gae:
        raise ConfigError(f"train.critic_warmup_iterations={t.critic_warmup_iterations} needs a critic: set "
                          f"algorithm.use_gae=true or critic_warmup_iterations=0")
    if t.bc_warmup_env_steps > 0 and action_kind(cfg.policy.type) == "flow":
        raise ConfigError(f"train.bc_warmup_env_steps={t.bc_warmup_env_steps}: the behaviour-cloning warm-up is a "
                          f"cross-entropy on action tokens; a flow policy has none (set 0)")
    if action_kind(cfg.policy.type) == "flow":  # PPO's log-prob is the flow-SDE step's Gaussian density
        if cfg.policy.noise_method != "flow_sde" or not cfg.rollout.flow_noise_level > 0:
            raise ConfigError(f"policy.noise_method={cfg.policy.noise_method}, rollout.flow_noise_level="
                              f"{cfg.rollout.flow_noise_level}: GAE-PPO on a flow policy needs policy.noise_method="
                              f"flow_sde and rollout.flow_noise_level > 0 (RLinf: 0.5)")
        if a.entropy_coeff != 0:
            raise ConfigError(f"algorithm.entropy_coeff={a.entropy_coeff}: a flow policy's flow-SDE std is fixed by "
                              f"its schedule, so its entropy has no gradient: set algorithm.entropy_coeff=0")


def gae_advantages(rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, step_mask: np.ndarray,
                   truncated: np.ndarray, last_values: np.ndarray, gamma: float, gae_lambda: float,
                   normalize: bool) -> Tuple[np.ndarray, np.ndarray]:
    """`compute_gae` over the valid policy steps of B episodes padded to T: (B, T) rewards, values, dones (true at an
    episode's last step, whether it terminated or was truncated) and step_mask; (B,) truncated and last_values
    V(s_last), the value of the observation after a truncated episode's last step.

    The episodes' valid steps are laid end to end (a done closes each one). A truncated episode is not terminal: its
    last reward gets + gamma * V(s_last), which is exactly delta = r + gamma * V(s_last) - V; a terminated one adds
    nothing. Returns (advantages in the compute dtype, float32 returns = A + V before normalisation), (B, T), zero past
    each episode's end; `normalize` standardises the advantages over the valid steps only."""
    b, t = np.nonzero(step_mask)
    bootstrap = np.where(truncated[b] & dones[b, t], gamma * last_values[b], 0.0)
    adv, ret = compute_gae(rewards[b, t] + bootstrap, values[b, t], dones[b, t], gamma, gae_lambda, normalize)
    advantages, returns = np.zeros(step_mask.shape, adv.dtype), np.zeros(step_mask.shape, np.float32)
    advantages[b, t], returns[b, t] = adv, ret
    return advantages, returns


def per_action(env_rewards: np.ndarray, values: np.ndarray, dones: np.ndarray, step_mask: np.ndarray,
               executed: np.ndarray, chunk: int, step_penalty: float = 0.0
               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """algorithm.gae_unit=action: the (B, T) policy-step arrays as (B, T * chunk) env-action arrays (rewards, values,
    dones, mask of executed actions), for `gae_advantages` with gamma and lambda per env action. Action j of step t
    ran when j < executed[b, t]; each gets -step_penalty, its chunk's value V(s_t), and the chunk's env reward (the
    success at the episode's end) and done land on its last executed action. The GAE-PPO reference stores one entry
    per env action with its chunk's observation, value and log-prob (OpenVLA_PPO.py:1047-1063, 1080-1107@b19d5c0)
    and runs GAE over those entries (ppo/gae_ppo_trainer.py:291-305)."""
    j = np.arange(chunk)[None, None, :]
    mask = (j < executed[:, :, None]) & step_mask[:, :, None]
    last = mask & (j == executed[:, :, None] - 1)
    rewards = np.where(last, env_rewards[:, :, None], 0.0) - step_penalty * mask
    flat = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731
    return (flat(rewards.astype(np.float32)), flat(np.where(mask, values[:, :, None], 0.0).astype(np.float32)),
            flat(last & dones[:, :, None]), flat(mask))


def chunk_mean(log_prob: torch.Tensor) -> torch.Tensor:
    """algorithm.ratio_unit=step: every token's log-prob replaced by its policy step's mean over the chunk's tokens,
    so the PPO ratio exp(mean - old mean) is one per policy step, as the GAE-PPO reference computes it (the mean of
    the chunk's token log-probs at rollout and update: OpenVLA_PPO.py:875, 1320-1353@b19d5c0); each executed token
    then carries the step's ratio with its action's advantage, so token-mean weighs a step by its executed actions as
    the reference's one entry per env action does."""
    return log_prob.mean(-1, keepdim=True).expand_as(log_prob)


@torch.no_grad()
def record_values(policy, value_head: ValueHead, batch, device, chunk_size: int) -> Tuple[np.ndarray, np.ndarray]:
    """V(s_t) at every valid policy step (B, T), from the pooled hidden states the rollout kept (`extras["hidden"]`,
    the state each action chunk was chosen in; zero past an episode's end), and V(s_last) (B,): the value of the
    observation after the last step of a truncated episode (`policy.hidden(batch.last_obs)`), zero for the others."""
    mask, n = batch.step_mask, chunk_size
    values, last_values = np.zeros(mask.shape, np.float32), np.zeros(len(batch), np.float32)
    hidden = batch.extras["hidden"][mask] if len(batch) else np.zeros((0, value_head.in_dim), np.float32)
    b, t = np.nonzero(mask)
    chunks = [value_head(torch.as_tensor(hidden[s:s + n], device=device)) for s in range(0, len(hidden), n)]
    if chunks:  # kept on the device: one copy to the host after the loop
        values[b, t] = torch.cat(chunks).cpu().numpy()
    cut = np.flatnonzero(batch.truncated)
    chunks = [value_head(policy.hidden({k: v[cut[s:s + n]] for k, v in batch.last_obs.items()},
                                       [batch.instructions[i] for i in cut[s:s + n]]).to(device))
              for s in range(0, len(cut), n)]
    if chunks:
        last_values[cut] = torch.cat(chunks).cpu().numpy()
    return values, last_values


def clip_gradients(actor_params: List[torch.nn.Parameter], critic_params: List[torch.nn.Parameter],
                   train: TrainConfig) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Clip the gradients in place; (actor norm, critic norm or None without a critic), before clipping.
    train.grad_clip_mode=separate: each to its own max norm; joint: one norm over both, clipped to
    grad_clip, as RLinf clips its one model holding the policy and the value head
    (rlinf/hybrid_engines/fsdp/strategy/fsdp.py:364-369@a3816b5): both returned norms are that one."""
    if train.grad_clip_mode == "joint" and critic_params:
        joint = torch.nn.utils.clip_grad_norm_(actor_params + critic_params, train.grad_clip)
        return joint, joint
    critic = torch.nn.utils.clip_grad_norm_(critic_params, train.critic_grad_clip) if critic_params else None
    return full_tensor(torch.nn.utils.clip_grad_norm_(actor_params, train.grad_clip)), critic


def explained_variance(y_pred: np.ndarray, y_true: np.ndarray) -> float:
    """CleanRL's 1 - Var(y_true - y_pred) / Var(y_true) (NaN when y_true is constant)."""
    var_y = np.var(y_true)
    return float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y)


def make_optimizers(policy: torch.nn.Module, value_head: Optional[ValueHead], train: TrainConfig
                    ) -> Tuple[List[torch.nn.Parameter], List[torch.nn.Parameter], torch.optim.Optimizer,
                               Optional[torch.optim.Optimizer], Any]:
    """(actor params, critic params, actor AdamW, critic AdamW or None, the actor's warm-up schedule): each
    optimizer holds its own parameters."""
    actor_params = [p for p in policy.parameters() if p.requires_grad]
    critic_params = list(value_head.parameters()) if value_head is not None else []
    actor, actor_sched = adamw_with_warmup(actor_params, train.lr, train.weight_decay, train.lr_warmup_steps,
                                           adam_betas(train))
    critic = adamw(critic_params, train.critic_lr, train.weight_decay, adam_betas(train)) if critic_params else None
    return actor_params, critic_params, actor, critic, actor_sched


def save_update_png(run, done: int) -> None:
    """The GAE-PPO reference's plots/<run>/training_curves_update{N:05d}.png: a copy of the panels the logger just drew."""
    path = run.logger.plot_path if run.logger is not None else ""
    if os.path.isfile(path) and run.cfg.log.plot_every > 0 and done % run.cfg.log.plot_every == 0:
        shutil.copyfile(path, os.path.join(os.path.dirname(path), f"training_curves_update{done:05d}.png"))


if __name__ == "__main__":
    cfg = exit_on_bad_config(check_config, cfg)  # values checked; eval.protocol resolved: its changes printed
    # ===== PLUMBING (common/): run folder, policy, optimizer, resume; nothing of the algorithm ==========
    with start_run(cfg, "gae_ppo") as run:
        device, alg, use_gae = run.device, cfg.algorithm, cfg.algorithm.use_gae
        value_file = module_file("value_head")  # where a checkpoint keeps the value head
        if run.resume_path and use_gae and not os.path.isfile(os.path.join(run.resume_path, value_file)):
            raise ConfigError(f"--resume: checkpoint {run.resume_path} has no value head ({value_file}) "
                              f"but algorithm.use_gae is true: resume a GAE-PPO run, or start a new one")
        flow = action_kind(cfg.policy.type) == "flow"  # the flow-SDE step's density is the log-prob, else tokens'
        policy = shard_policy(run, initial_policy(run, "flow" if flow else "token"))  # train.strategy
        with torch.random.fork_rng(devices=[]):  # the same value head on every process, whatever the policy's init
            torch.manual_seed(cfg.seed)
            value_head = ValueHead(policy.hidden_size, cfg.value_head).to(device) if use_gae else None
        actor_params, critic_params, actor_opt, critic_opt, actor_sched = make_optimizers(policy, value_head, cfg.train)
        run.attach(policy, {"actor": actor_opt, **({"critic": critic_opt} if use_gae else {})}, {"actor": actor_sched},
                   modules={"value_head": value_head} if use_gae else None,
                   evaluation=EvalSettings(temperature=cfg.rollout.temperature,  # (each family reads its own)
                                           flow_noise_level=cfg.rollout.flow_noise_level),
                   banner=f" | {'GAE + value head' if use_gae else 'reward-to-go, no value head'} | stops at "
                          f"{cfg.train.iterations} iterations" + (f" or {cfg.train.total_timesteps:,} env steps"
                                                                  if cfg.train.total_timesteps else ""))
        A = 1 if flow else policy.action_chunk * ACTION_DIM  # log-probs per policy step (flow: the chunk's one)
        temp, mb, budget = cfg.rollout.temperature, cfg.train.micro_batch_size, cfg.train.total_timesteps
        noise = cfg.rollout.flow_noise_level

        # ===== ALGORITHM: rollout, advantages, update (the run.* calls inside are bookkeeping: counts, stops) ==
        for iteration in run.iterations():
            if budget and run.state["env_steps"] >= budget:  # a resumed run that had already spent its budget
                break
            t_iter = time.perf_counter()
            metrics = run.begin_iteration(iteration)

            # 1. rollout: random practice (task, trial) prompts, temperature sampling, hidden state per policy step
            tasks, trials = sample_prompts(run, cfg.rollout.prompts_per_iteration)
            policy.eval()
            t0 = time.perf_counter()
            batch = collect_rollouts(run.envs, policy, tasks, trials, temperature=temp, keep_hidden=use_gae,
                                     flow_noise_level=noise, keep_chain=True, progress=run.is_main,
                                     desc=f"rollout {iteration}")  # keep_chain: what a flow update recomputes
            metrics["time/rollout"] = time.perf_counter() - t0
            run.count_env_steps(batch, metrics, metrics["time/rollout"])
            if run.should_stop():  # a safe stop point, before the update
                break
            rollout_metrics(run, batch, metrics)
            batch = batch.select(~batch.invalid)  # episodes of a crashed simulator worker never enter an update

            # 2. rewards per policy step: the env reward summed over the chunk (+ optional per-step shaping)
            env_steps = executed_actions(batch.finish_step, batch.num_steps, policy.action_chunk)  # per policy step
            rewards = batch.rewards - cfg.reward.step_penalty * env_steps

            # 3. values V(s_t) at every policy step, V(s_last) after a truncated episode's last step (bootstrap)
            t0 = time.perf_counter()
            step_mask = batch.step_mask
            values, last_values = np.zeros(step_mask.shape, np.float32), np.zeros(len(batch), np.float32)
            if use_gae:
                value_head.eval()
                values, last_values = record_values(policy, value_head, batch, device, mb)
            metrics["time/values"] = time.perf_counter() - t0

            # 4. advantages: GAE over policy steps, or over env actions (algorithm.gae_unit=action: each action its
            #    chunk's value, gamma and lambda per action) (gae_lambda=1 with V=0 for the value-free baseline:
            #    discounted reward-to-go), broadcast to the tokens (of each action, or of the step), of which only the
            #    executed actions' count (finish_step x 7; flow: the executed actions of the chunk's log-density);
            #    returns = A + V are the value targets (per action: the mean over the step's executed actions)
            lam = alg.gae_lambda if use_gae else 1.0
            if alg.gae_unit == "action":
                a_rewards, a_values, a_dones, unit_mask = per_action(batch.rewards, values, batch.dones, step_mask,
                                                                     env_steps, policy.action_chunk,
                                                                     cfg.reward.step_penalty)
                advantages, a_returns = gae_advantages(a_rewards, a_values, a_dones, unit_mask, batch.truncated,
                                                       last_values, alg.gamma, lam, normalize=False)
                per_step = a_returns.reshape(len(batch), batch.num_steps, policy.action_chunk).sum(-1)
                returns = np.where(step_mask, per_step / np.maximum(env_steps, 1), 0.0).astype(np.float32)
            else:
                unit_mask = step_mask
                advantages, returns = gae_advantages(rewards, values, batch.dones, step_mask, batch.truncated,
                                                     last_values, alg.gamma, lam, normalize=False)
            if alg.normalize_advantages:  # one mean and std over every process's valid steps (or actions), in
                valid = torch.tensor(run.gather(advantages[unit_mask].tolist()), dtype=torch.float64)  # float64
                if valid.numel():
                    mean, std = valid.mean().item(), valid.std(unbiased=False).item()
                    advantages = np.where(unit_mask, (advantages - mean) / (std + 1e-8), 0.0)
            per = policy.action_chunk if alg.gae_unit == "action" else 1  # advantages per policy step
            advantages = advantages.astype(np.float32).reshape(len(batch), batch.num_steps, per)
            mask = np.ones(step_mask.shape + (1,), np.float32) if flow else \
                make_action_mask(batch.finish_step, batch.num_steps, policy.action_chunk).view(
                    len(batch), batch.num_steps, A).float().numpy()
            # episode-ratio's row weight: the episode limit / the episode's env steps (RLinf's loss_mask_ratio)
            limit = np.array([max_steps(cfg.env, int(task)) for task in batch.task_ids], np.float32) \
                if len(batch) else np.zeros(0, np.float32)
            episode_weight = np.repeat((limit / np.maximum(batch.finish_step, 1))[:, None], batch.num_steps, axis=1)
            steps = flatten_steps(batch, advantages=np.repeat(advantages, A // advantages.shape[-1], axis=2),
                                  returns=returns, values=values, mask=mask, executed=env_steps,
                                  episode_weight=episode_weight.astype(np.float32))
            if flow and len(steps):  # a chunk cut short: its old log-density over the executed actions only (the
                partial = np.flatnonzero(steps.data["executed"] < policy.action_chunk)  # rollout's is the whole chunk)
                with torch.no_grad():
                    for s in range(0, len(partial), mb):
                        part = steps.take(partial[s:s + mb])
                        steps.data["old_log_probs"][partial[s:s + mb], 0] = policy.ppo_log_prob(
                            part.obs, part.instructions, part.tensor, noise_level=noise,
                            executed=part.tensor("executed"))[0][:, 0].cpu().numpy()
            if use_gae:
                gathered = run.gather(list(zip(steps.data["values"].tolist(), steps.data["returns"].tolist())))
                pred, true = np.array(gathered, dtype=np.float64).reshape(-1, 2).T
                metrics["train/explained_variance"] = explained_variance(pred, true)
                metrics["train/value_mean"], metrics["train/return_mean"] = float(pred.mean()), float(true.mean())

            # 5. PPO update: epochs -> shuffled mini-batches of policy steps, or of whole episodes (train.
            #    mini_batch_unit=trajectory) -> micro-batches of policy steps (gradient accumulation, each weighted by
            #    its share of the mini-batch's policy loss under algorithm.loss_agg_mode, and of its rows for the
            #    value loss, a mean over rows)
            t0 = time.perf_counter()
            move_actor = iteration >= cfg.train.critic_warmup_iterations  # critic warm-up: the actor waits
            # behaviour-cloning warm-up (the GAE-PPO reference's first l1_warmup_steps env steps, OpenVLA_PPO.py:
            # 1616-1619@f82c92f): cross-entropy on the rollout's own tokens, the critic untouched
            bc = run.state["env_steps"] < cfg.train.bc_warmup_env_steps
            metrics["train/bc_phase"] = float(bc)
            policy.train()
            if use_gae:
                value_head.train()
            stats = {k: [] for k in ("pg_loss", "value_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy",
                                     "value_clipfrac", "grad_norm", "critic_grad_norm", "bc_loss")}
            unit, size = cfg.train.mini_batch_unit, cfg.train.mini_batch_size
            if unit == "grid":  # RLinf's padded grid: each episode ceil(episode limit / chunk) rows, valid or not
                per_episode = max([math.ceil(max_steps(cfg.env, t) / policy.action_chunk) for t in cfg.env.task_ids])
                batches = grid_minibatches(steps.episode * per_episode + steps.t, len(batch) * per_episode, size,
                                           cfg.train.update_epochs, run.gather)
            else:
                batches = minibatches(len(steps), size, cfg.train.update_epochs, run.gather,
                                      episodes=steps.episode if unit == "trajectory" else None)
            with sharded_update(run, policy, steps) as pad:  # fsdp: sharded weights, as many micro-batches
                for mb_inds in batches:
                    actor_opt.zero_grad(set_to_none=True)
                    if use_gae:
                        critic_opt.zero_grad(set_to_none=True)
                    rows = size if unit == "grid" else len(mb_inds)  # episode-ratio's denominator (padding counts)
                    micro = micro_batches(steps, mb_inds, mb, pad, alg.loss_agg_mode, grid_rows=rows)
                    for part, weight in micro:  # weight 0: fsdp's padding (a row that adds zero gradient)
                        # the family's log-probs of the rollout's actions (tokens: each token's at the temperature,
                        # with entropies; flow: the flow-SDE step's density (B, 1), no entropy: its std is fixed)
                        log_prob, entropy, hidden = policy.ppo_log_prob(part.obs, part.instructions, part.tensor,
                                                                        temperature=temp, noise_level=noise,
                                                                        executed=part.tensor("executed"))
                        adv, old_log_prob = part.tensor("advantages", device), part.tensor("old_log_probs", device)
                        adv = adv * alg.advantage_scale
                        token_log_prob = log_prob  # per token, for the warm-up's cross-entropy
                        if alg.ratio_unit == "step":  # one ratio per policy step, from its chunk's mean log-prob
                            log_prob, old_log_prob = chunk_mean(log_prob), chunk_mean(old_log_prob)
                        token_mask = part.tensor("mask", device)  # executed actions' tokens (flow: 1, the chunk's)
                        mask = token_mask
                        if micro.traj_weight:  # traj-token-mean: tokens weighted 1 / (episode's tokens x episodes);
                            # episode-ratio: limit / episode's env steps / (rows x tokens per row)
                            mask = token_mask * part.tensor("traj_weight", device)[:, None]
                        pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = compute_policy_loss_vanilla(
                            old_log_prob, log_prob, adv, mask, clip_ratio_low=alg.clip_ratio_low,
                            clip_ratio_high=alg.clip_ratio_high, clip_ratio_c=alg.clip_ratio_c,
                            loss_agg_mode=alg.loss_agg_mode, log_ratio_clamp=alg.log_ratio_clamp,
                            advantage_clamp=alg.advantage_clamp, negative_clip_band=alg.negative_clip_band,
                            loss_skip_above=alg.loss_skip_above)
                        actor_loss = pg_loss
                        if entropy is not None:  # token policies: the entropy bonus (flow policies have none)
                            entropy_loss = agg_loss(entropy, mask, alg.loss_agg_mode)
                            actor_loss = pg_loss - alg.entropy_coeff * entropy_loss
                        if bc:  # warm-up: -log p of the executed tokens the policy sampled (the reference's
                            # cross_entropy(logits, own tokens), OpenVLA_PPO.py:1149@f82c92f)
                            actor_loss = bc_loss = agg_loss(-token_log_prob, mask, alg.loss_agg_mode)
                            stats["bc_loss"].append(bc_loss.detach() * weight * micro.count)
                        loss = weight * actor_loss if move_actor else torch.zeros((), device=device)  # its share
                        if use_gae and not bc:  # a mean over the micro-batch's rows: weighted by its share of rows
                            features = hidden.detach() if alg.freeze_vla_for_critic or not move_actor else hidden
                            vpreds = value_head(features)
                            ratio = alg.loss_agg_mode == "episode-ratio"  # the critic's rows weighted as the actor's
                            vf_loss, vf_clipfrac = compute_value_loss(
                                vpreds, part.tensor("returns", device), part.tensor("values", device),
                                part.tensor("episode_weight", device) / rows if ratio else torch.ones_like(vpreds),
                                alg.cliprange_value, "episode-ratio" if ratio else "token-mean", alg.value_loss,
                                alg.huber_delta)
                            row_share = (1.0 if ratio else len(part) / micro.rows) if weight else 0.0  # padding: 0
                            loss = loss + row_share * alg.value_loss_coef * vf_loss
                        loss.backward()  # weight: this micro-batch's share of the mini-batch's policy loss
                        if not weight:
                            continue  # padding: no statistics
                        # logged: the mini-batch's loss (the mean over its micro-batches of loss x weight x their
                        # count) and the executed tokens' mean entropy, comparable across loss_agg_modes
                        for k, v in (("pg_loss", pg_loss * weight * micro.count), ("pg_clipfrac", pg_clipfrac),
                                     ("ppo_kl", ppo_kl),
                                     ("pg_clipfrac_lower", pg_clipfrac_lower)) if not bc else ():
                            stats[k].append(v.detach())  # read once after the update: no host sync here
                        if entropy is not None:
                            stats["entropy"].append(masked_mean(entropy.detach(), token_mask))
                        if use_gae and not bc:
                            stats["value_loss"].append(vf_loss.detach())
                            stats["value_clipfrac"].append(vf_clipfrac.detach())
                    average_gradients(run.accelerator, actor_params + critic_params)  # ran out: contributes zeros
                    actor_norm, critic_norm = clip_gradients(actor_params, critic_params, cfg.train)
                    if use_gae and not bc:
                        stats["critic_grad_norm"].append(critic_norm)
                        critic_opt.step()
                    if move_actor:
                        stats["grad_norm"].append(actor_norm)
                        actor_opt.step()
                        fsdp.after_step(policy)  # fsdp: the gathered weights from the new shards
                        actor_sched.step()
            metrics["time/update"] = time.perf_counter() - t0
            metrics["train/lr"] = actor_sched.get_last_lr()[0]  # the policy's learning rate, as in every script
            metrics.update(mean_stats(stats))
            metrics["train/optimizer_steps"] = float(len(stats["grad_norm"]))  # this update's policy optimizer steps
            metrics["train/advantage_abs_mean"] = float(np.abs(steps.data["advantages"][:, 0]).mean()) \
                if len(steps) else float("nan")

            # 6. end of iteration: evaluation when due, logging, checkpoint; stop on the env-step budget
            last = iteration + 1 == cfg.train.iterations or bool(budget and run.state["env_steps"] >= budget)
            metrics["time/iteration"] = time.perf_counter() - t_iter
            # ===== PLUMBING: evaluation, metrics row, checkpoint (a safe stop point) =====
            if run.end_iteration(iteration, metrics, ["charts/SPS", "charts/env_steps", "rollout/success_rate",
                                                      "val/success_rate", "val/sampled_success_rate", "train/pg_loss",
                                                      "train/value_loss", "train/explained_variance",
                                                      "train/pg_clipfrac", "train/ppo_kl", "time/iteration"],
                                 last=last):
                break  # Ctrl-C / SIGTERM: every process stops (this iteration saved)
            if run.is_main:
                save_update_png(run, iteration + 1)
            if last:
                break
