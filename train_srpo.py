"""SRPO: Self-Referential Policy Optimization for VLA models (seed 000, siiRL's embodied_srpo_pipeline), one file.

Each iteration: rollout (prompts x n samples) -> dynamic sampling (keep groups with 0.1 <= success <= 0.9) ->
world-model progress reward (successes 1, failures by latent distance to this batch's successes) -> GRPO
advantages -> old and reference log-probs -> PPO epochs with asymmetric + dual clip -> logging and checkpoints.
`reward.mode=binary` gives plain GRPO with everything else equal.

    python train_srpo.py --task-id 0                      # embedded tabletop suite, tiny policy, CPU is fine
    python train_srpo.py --config configs/srpo_libero.yaml --task-id 0 --gpu 0
    accelerate launch --num_processes 2 train_srpo.py --task-ids 0 1
"""
from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch

from common.advantages import compute_advantage, make_response_mask, masked_mean
from common.checkpoint import latest_checkpoint, load_training_state, save_checkpoint
from common.config import (ConfigError, EnvConfig, LogConfig, default_run_prefix, parse_cli, resolve_run_dir,
                           save_config)
from common.logging import Logger, format_line
from common.losses import agg_loss, compute_policy_loss_vanilla, kl_penalty
from common.rollout import collect_rollouts, success_by_task
from common.srpo import compute_embodied_reward, filter_groups, filter_metrics
from envs import check_task_ids, make_vector_env, num_trials, stale_suite_message, suite_tasks
from models import EncoderConfig, TokenPolicy, TokenPolicyConfig, make_trajectory_encoder


@dataclass
class InitConfig:
    mode: str = "checkpoint"  # checkpoint: load `path` | auto_sft: run train_sft.py first if `path` is missing | scratch
    path: Optional[str] = None  # SFT checkpoint; None = checkpoints/sft_<suite>_task<task ids>
    sft_args: List[str] = field(default_factory=list)  # extra train_sft.py arguments for auto_sft, e.g. ["sft.num_demos=5"]


@dataclass
class RolloutConfig:
    n: int = 8  # group size: samples per (task, trial) prompt (actor_rollout_ref.rollout.n)
    prompts_per_iteration: int = 4  # (task, trial) prompts per iteration and process
    temperature: float = 1.6  # rollout sampling temperature (siiRL recipe); log-probs use the same
    train_trials: int = 40  # trials 0..train_trials-1 train; the rest are held out for evaluation


@dataclass
class RewardConfig:
    mode: str = "srpo"  # srpo (world-model progress reward) | binary (plain GRPO: success 1, failure 0)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # vjepa2 (default) or pixels
    dbscan_eps: float = 0.5
    dbscan_min_samples: int = 2
    sigmoid_steepness: float = 10.0
    sigmoid_offset: float = 0.5
    max_failure_reward: float = 0.6


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | step_grpo | advanced_grpo
    norm_adv_by_std_in_grpo: bool = True  # False = Dr.GRPO (no division by the group std)
    filter_accuracy: bool = True  # dynamic sampling: keep prompts with lower <= mean success <= upper
    accuracy_lower_bound: float = 0.1
    accuracy_upper_bound: float = 0.9
    filter_truncated: bool = False  # drop a prompt if any of its samples hit max_steps
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0  # dual clip for negative advantages
    loss_agg_mode: str = "token-mean"  # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False  # KL to the reference policy (LoRA adapters disabled); needs policy.lora_rank > 0
    kl_loss_coef: float = 0.01
    kl_loss_type: str = "low_var_kl"  # low_var_kl | kl | abs | mse


@dataclass
class TrainConfig:
    iterations: int = 30
    lr: float = 5e-6
    lr_warmup_steps: int = 0  # linear warmup over the first N optimizer steps (verl's lr_warmup_steps): Adam's first
                              # steps move every weight by about lr, enough to knock a sharp SFT policy off its skill
    weight_decay: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 64  # policy steps (observation + its chunk of action tokens) per optimizer step
    ppo_micro_batch_size: int = 32  # policy steps per forward/backward (gradient accumulation inside a mini-batch)
    grad_clip: float = 1.0
    recompute_old_log_prob: bool = True  # seed 000's actor_old_log_prob node; False = use the rollout's log-probs


@dataclass
class EvalConfig:
    every: int = 5  # evaluate every N iterations (and before the first and after the last); 0 = never
    trials_per_task: int = 10  # fixed trials per task: one greedy episode each (val/success_rate)
    trial_start: Optional[int] = None  # first evaluation trial; None = rollout.train_trials (held-out trials)
    samples_per_trial: int = 0  # > 0: also this many episodes per trial at the rollout temperature
                                # (val/sampled_success_rate: the stochastic policy RL trains); 0 = greedy only


@dataclass
class Config:
    seed: int = 1
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: TokenPolicyConfig = field(default_factory=TokenPolicyConfig)  # architecture for init.mode=scratch
    init: InitConfig = field(default_factory=InitConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)


def check_config(cfg: Config) -> None:
    """Errors a researcher would otherwise meet minutes into a run, as one line with the fix."""
    if cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: GRPO needs n >= 2 samples per prompt to form a group baseline")
    if cfg.reward.mode not in ("srpo", "binary"):
        raise ConfigError(f"reward.mode={cfg.reward.mode!r}: use srpo or binary")
    if cfg.algorithm.adv_estimator not in ("grpo", "step_grpo", "advanced_grpo"):
        raise ConfigError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: use grpo, step_grpo or "
                          f"advanced_grpo (gae is train_gae_ppo.py's, grpo_split train_luffy.py's)")
    if cfg.algorithm.use_kl_loss and cfg.policy.lora_rank <= 0:
        raise ConfigError("algorithm.use_kl_loss needs policy.lora_rank > 0: the reference policy is the same model "
                          "with its LoRA adapters disabled")
    if cfg.train.ppo_mini_batch_size % cfg.train.ppo_micro_batch_size:
        raise ConfigError(f"train.ppo_mini_batch_size ({cfg.train.ppo_mini_batch_size}) must be a multiple of "
                          f"train.ppo_micro_batch_size ({cfg.train.ppo_micro_batch_size})")
    if cfg.init.mode not in ("checkpoint", "auto_sft", "scratch"):
        raise ConfigError(f"init.mode={cfg.init.mode!r}: use checkpoint, auto_sft or scratch")
    if not 0 < cfg.rollout.train_trials < num_trials(cfg.env):
        raise ConfigError(f"rollout.train_trials={cfg.rollout.train_trials} must leave held-out trials: the suite has "
                          f"{num_trials(cfg.env)} trials per task")


def sft_command(cfg: Config, path: str) -> List[str]:
    ids = [str(t) for t in cfg.env.task_ids]
    return [sys.executable, "train_sft.py", "--task-ids", *ids, f"env.suite={cfg.env.suite}",
            f"env.image_size={cfg.env.image_size}", f"sft.output_path={path}", f"log.output_dir={cfg.log.output_dir}",
            f"log.plots_dir={cfg.log.plots_dir}", f"log.wandb={str(cfg.log.wandb).lower()}", *cfg.init.sft_args]


def load_initial_policy(cfg: Config, is_main: bool, barrier=lambda: None) -> TokenPolicy:
    """The SFT checkpoint named in the config (or a fresh policy for init.mode=scratch), with the configured LoRA;
    with init.mode=auto_sft the main process first trains it while the others wait at `barrier`."""
    if cfg.init.mode == "scratch":
        torch.manual_seed(cfg.seed)
        return TokenPolicy(cfg.policy)
    path = cfg.init.path or f"checkpoints/sft_{cfg.env.suite}_task{'-'.join(str(t) for t in cfg.env.task_ids)}"
    if not os.path.isdir(path):
        cmd = sft_command(cfg, path)
        if cfg.init.mode == "auto_sft" and is_main:
            print(f"[init] no SFT checkpoint at {path}; running: {' '.join(cmd[1:])}", flush=True)
            subprocess.run(cmd, check=True)
        elif cfg.init.mode != "auto_sft":
            raise SystemExit(f"No SFT checkpoint at {path}. RL starts from a supervised policy; make it with:\n"
                             f"  python {' '.join(cmd[1:])}\n"
                             f"or set init.mode=auto_sft to run that first, or init.path=<dir> to use another one.")
    barrier()
    stale = stale_suite_message(path, cfg.env.suite)
    if stale and is_main:
        print(f"[init] warning: {stale}", flush=True)
    return TokenPolicy.load(path, lora_rank=cfg.policy.lora_rank)


if __name__ == "__main__":
    cfg = parse_cli(Config, "configs/srpo.yaml", description=__doc__.split("\n")[0])
    try:
        check_config(cfg)
        check_task_ids(cfg.env)
    except ValueError as e:  # ConfigError is a ValueError: print the one-line fix, no traceback
        sys.exit(f"error: {e}")
    from accelerate import Accelerator
    from accelerate.utils import gather_object

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    is_main, rank, world = accelerator.is_main_process, accelerator.process_index, accelerator.num_processes
    device = accelerator.device
    if device.type == "cpu":  # one share of the cores per process (OMP_NUM_THREADS wins when set)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, (os.cpu_count() or 1) // world))

    # ---- seeding, run folder, logging
    random.seed(cfg.seed + rank)
    np.random.seed(cfg.seed + rank)
    torch.manual_seed(cfg.seed + rank)
    prompt_rng = np.random.default_rng([cfg.seed, rank])
    prefix = default_run_prefix("srpo", cfg.env.suite, cfg.env.task_ids, cfg.seed)
    run_name, run_dir = resolve_run_dir(cfg.log, prefix, cfg.resume)
    resume_from = latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None and is_main:
        print(f"[resume] no valid checkpoint in {run_dir}: starting from iteration 0", flush=True)

    # ---- policy, optimizer, reward encoder, environments
    policy = (load_initial_policy(cfg, is_main, accelerator.wait_for_everyone) if resume_from is None
              else TokenPolicy.load(os.path.join(resume_from, "policy"))).to(device)
    cfg.policy = policy.cfg  # the architecture actually trained (from the checkpoint) goes into the saved config
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    warmup = max(1, cfg.train.lr_warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    start_iteration, total_env_steps = 0, 0.0
    if resume_from is not None:
        start_iteration, extra = load_training_state(resume_from, {"actor": optimizer}, {"actor": scheduler})
        total_env_steps = float(extra.get("env_steps", 0.0))
        prompt_rng = np.random.default_rng([cfg.seed, rank, start_iteration])
    encoder = make_trajectory_encoder(cfg.reward.encoder, str(device)) if cfg.reward.mode == "srpo" else None
    envs = make_vector_env(cfg.env, seed=cfg.seed + rank)
    tasks_info = suite_tasks(cfg.env)
    max_steps = {t: int(tasks_info[t]["max_steps"]) for t in cfg.env.task_ids}
    A = policy.action_chunk * 7  # action tokens per policy step
    if is_main:
        os.makedirs(run_dir, exist_ok=True)
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
        logger = Logger(run_dir, run_name, cfg, cfg.log)
        print(f"[srpo] run {run_dir} | {sum(p.numel() for p in params):,} trainable params | device {device} x{world}"
              f" | tasks {cfg.env.task_ids} | reward {cfg.reward.mode}" + (f" | resumed at iteration {start_iteration}"
                                                                           if resume_from else ""), flush=True)

    def evaluate(iteration: int) -> dict:
        """Greedy (and, with eval.samples_per_trial > 0, sampled) success on fixed trials of every training task, by
        default held out from the rollout trials (each process takes a share of the trials)."""
        start = cfg.rollout.train_trials if cfg.eval.trial_start is None else cfg.eval.trial_start
        trials = list(range(start, start + cfg.eval.trials_per_task))
        trials = [j for j in trials if j < num_trials(cfg.env)]
        pairs = [(t, j) for t in cfg.env.task_ids for j in trials][rank::world]
        policy.eval()
        out = {}
        for name, n, greedy in [("success", 1, True), ("sampled_success", cfg.eval.samples_per_trial, False)]:
            if n == 0:
                continue
            batch = collect_rollouts(envs, policy, [p[0] for p in pairs], [p[1] for p in pairs], n_samples=n,
                                     temperature=cfg.rollout.temperature, greedy=greedy, keep_obs=False,
                                     progress=is_main, desc=f"eval {iteration} {'greedy' if greedy else 'sampled'}")
            results = gather_object(list(zip(batch.task_ids.tolist(), batch.complete.tolist())))
            out[f"val/{name}_rate"] = float(np.mean([c for _, c in results]))
            out.update({f"val/{name}_task{t}": float(np.mean([c for tt, c in results if tt == t]))
                        for t in cfg.env.task_ids})
        return out

    # ---- the loop
    for iteration in range(start_iteration, cfg.train.iterations):
        t_iter = time.perf_counter()
        metrics = {}
        if cfg.eval.every > 0 and iteration == start_iteration == 0:
            metrics.update(evaluate(iteration))

        # 1. rollout: prompts (task, trial) x n samples, temperature sampling
        tasks = prompt_rng.choice(cfg.env.task_ids, cfg.rollout.prompts_per_iteration).tolist()
        trials = prompt_rng.integers(0, cfg.rollout.train_trials, cfg.rollout.prompts_per_iteration).tolist()
        policy.eval()
        t0 = time.perf_counter()
        batch = collect_rollouts(envs, policy, tasks, trials, n_samples=cfg.rollout.n,
                                 temperature=cfg.rollout.temperature, keep_frames=cfg.reward.mode == "srpo",
                                 progress=is_main, desc=f"rollout {iteration}")
        batch.group_ids = batch.group_ids + rank * cfg.rollout.prompts_per_iteration  # unique across processes
        metrics["time/rollout"] = time.perf_counter() - t0
        all_success = gather_object(batch.complete.tolist())
        metrics["rollout/success_rate"] = float(np.mean(all_success))
        metrics["rollout/mean_length"] = float(np.mean(gather_object(batch.finish_step.tolist())))
        env_steps = sum(gather_object([batch.stats["rollout/env_steps"]]))
        total_env_steps += env_steps
        metrics["rollout/env_steps"] = env_steps
        metrics["charts/env_steps"] = total_env_steps  # cumulative: the x-axis of sample-efficiency plots
        metrics["charts/SPS"] = env_steps / max(metrics["time/rollout"], 1e-9)
        for t, s in success_by_task(batch).items():
            metrics[f"rollout/success_task{t}"] = s

        # 2. dynamic sampling: keep prompts whose group success lies in [lower, upper] (binary success, pre-shaping)
        task_max = np.array([max_steps[int(t)] for t in batch.task_ids])
        horizon = int(task_max.max())  # shift each row so that "hit its own task's max_steps" reads as >= horizon
        keep = filter_groups(torch.as_tensor(batch.complete), torch.as_tensor(batch.finish_step + horizon - task_max),
                             cfg.rollout.n, horizon, cfg.algorithm.filter_accuracy, cfg.algorithm.filter_truncated,
                             cfg.algorithm.accuracy_lower_bound, cfg.algorithm.accuracy_upper_bound).numpy()
        keep &= ~batch.invalid  # episodes of a crashed simulator worker never enter an update
        metrics.update(filter_metrics(torch.as_tensor(batch.complete), torch.as_tensor(keep), cfg.rollout.n))
        metrics["rollout/invalid"] = float(batch.invalid.sum())
        batch = batch.select(keep)

        kept_counts = gather_object([len(batch)])  # kept episodes per process
        num_kept = sum(kept_counts)
        metrics["train/skipped_update"] = float(num_kept == 0)  # every group filtered out: normal, nothing to learn

        # 3. progress reward: world-model embeddings of the kept episodes, pooled per task over all processes
        t0 = time.perf_counter()
        if cfg.reward.mode == "srpo":
            emb = encoder.embed(batch.frames) if len(batch) else np.zeros((0, encoder.dim), np.float32)
            gathered = gather_object([(c, e, n) for c, e, n in zip(batch.complete.tolist(), emb, batch.task_names)])
            scores = compute_embodied_reward(
                np.array([g[0] for g in gathered], dtype=bool),
                np.stack([g[1] for g in gathered]) if gathered else np.zeros((0, encoder.dim), np.float32),
                [g[2] for g in gathered], cfg.reward.dbscan_eps, cfg.reward.dbscan_min_samples,
                cfg.reward.sigmoid_steepness, cfg.reward.sigmoid_offset, cfg.reward.max_failure_reward)
            offset = sum(kept_counts[:rank])  # this process's rows in the gathered order
            scores = scores[offset:offset + len(batch)]
        else:
            scores = batch.complete.astype(np.float64)
        metrics["time/reward"] = time.perf_counter() - t0
        if len(batch):
            failures = scores[~batch.complete]
            metrics["reward/mean"] = float(scores.mean())
            metrics["reward/failure_mean"] = float(failures.mean()) if failures.size else math.nan
            metrics["reward/failure_max"] = float(failures.max()) if failures.size else math.nan

        # 4. advantages: GRPO over each group, broadcast to the valid action tokens (finish_step mask)
        if len(batch):
            T = batch.num_steps
            response_mask = make_response_mask(torch.as_tensor(batch.valid_steps), T, A)  # (B, T*A)
            advantages, _ = compute_advantage(
                cfg.algorithm.adv_estimator, torch.as_tensor(scores, dtype=torch.float32), response_mask,
                batch.group_ids.tolist(), step_mask=torch.as_tensor(batch.step_mask),
                norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
            # flatten the valid policy steps: each one is an observation with its chunk of A action tokens
            b_idx, t_idx = np.nonzero(batch.step_mask)
            b_obs = {k: v[b_idx, t_idx] for k, v in batch.obs.items()}
            b_instr = [batch.instructions[b] for b in b_idx]
            b_tokens = torch.as_tensor(batch.tokens[b_idx, t_idx])
            b_adv = advantages.view(len(batch), T, A)[b_idx, t_idx]
            b_mask = response_mask.view(len(batch), T, A)[b_idx, t_idx].float()
            b_old = torch.as_tensor(batch.old_log_probs[b_idx, t_idx])
            n_samples = len(b_idx)
            mb = cfg.train.ppo_micro_batch_size

            def forward_chunks(fn):
                outs = [fn(slice(s, s + mb)) for s in range(0, n_samples, mb)]
                return torch.cat(outs) if outs else torch.zeros(0, A)

            def step_obs(rows):  # a slice or a list of flattened-step indices
                return {k: v[rows] for k, v in b_obs.items()}

            # 5. old log-probs (forward only) and reference log-probs (adapters disabled)
            with torch.no_grad():
                if cfg.train.recompute_old_log_prob:
                    b_old = forward_chunks(lambda sl: policy.log_prob(step_obs(sl), b_instr[sl], b_tokens[sl],
                                                                      cfg.rollout.temperature)[0].cpu())
                if cfg.algorithm.use_kl_loss:
                    with policy.reference():
                        b_ref = forward_chunks(lambda sl: policy.log_prob(step_obs(sl), b_instr[sl], b_tokens[sl],
                                                                          cfg.rollout.temperature)[0].cpu())
            metrics["train/advantage_abs_mean"] = float(masked_mean(b_adv.abs(), b_mask))

        # 6. PPO update: epochs over shuffled mini-batches of policy steps, micro-batches accumulate gradients
        t0 = time.perf_counter()
        policy.train()
        stats = {k: [] for k in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl_loss",
                                 "grad_norm")}
        if num_kept > 0:
            # every process takes the same number of optimizer steps (its own share of the kept steps)
            local = len(b_idx) if len(batch) else 0
            steps_per_epoch = max(1, math.ceil(max(gather_object([local])) / cfg.train.ppo_mini_batch_size))
            for epoch in range(cfg.train.ppo_epochs):
                perm = torch.randperm(local)
                for k in range(steps_per_epoch):
                    mb_inds = perm[k * cfg.train.ppo_mini_batch_size:(k + 1) * cfg.train.ppo_mini_batch_size]
                    optimizer.zero_grad(set_to_none=True)
                    micro = [mb_inds[s:s + mb] for s in range(0, len(mb_inds), mb)]
                    for inds in micro:
                        inds_l = inds.tolist()
                        log_prob, entropy = policy.log_prob(step_obs(inds_l), [b_instr[i] for i in inds_l],
                                                            b_tokens[inds].to(device), cfg.rollout.temperature)
                        mask, adv, old = b_mask[inds].to(device), b_adv[inds].to(device), b_old[inds].to(device)
                        pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = compute_policy_loss_vanilla(
                            old, log_prob, adv, mask, clip_ratio=cfg.algorithm.clip_ratio,
                            clip_ratio_low=cfg.algorithm.clip_ratio_low, clip_ratio_high=cfg.algorithm.clip_ratio_high,
                            clip_ratio_c=cfg.algorithm.clip_ratio_c, loss_agg_mode=cfg.algorithm.loss_agg_mode)
                        entropy_loss = agg_loss(entropy, mask, cfg.algorithm.loss_agg_mode)
                        loss = pg_loss - cfg.algorithm.entropy_coeff * entropy_loss
                        if cfg.algorithm.use_kl_loss:
                            kl = kl_penalty(log_prob, b_ref[inds].to(device), cfg.algorithm.kl_loss_type)
                            kl_loss = agg_loss(kl, mask, cfg.algorithm.loss_agg_mode)
                            loss = loss + cfg.algorithm.kl_loss_coef * kl_loss
                            stats["kl_loss"].append(kl_loss.item())
                        (loss / len(micro)).backward()
                        stats["pg_loss"].append(pg_loss.item())
                        stats["pg_clipfrac"].append(pg_clipfrac.item())
                        stats["pg_clipfrac_lower"].append(pg_clipfrac_lower.item())
                        stats["ppo_kl"].append(ppo_kl.item())
                        stats["entropy"].append(entropy_loss.item())
                    if not micro:  # this process ran out of samples: contribute zero gradients to the average
                        for p in params:
                            p.grad = torch.zeros_like(p)
                    if world > 1:  # average gradients over processes (the policy is not DDP-wrapped: we call
                        for p in params:  # its act/log_prob methods, not forward)
                            if p.grad is None:
                                p.grad = torch.zeros_like(p)
                            p.grad = accelerator.reduce(p.grad, reduction="mean")
                    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
                    optimizer.step()
                    scheduler.step()
                    stats["grad_norm"].append(float(grad_norm))
        metrics["time/update"] = time.perf_counter() - t0
        metrics["train/lr"] = scheduler.get_last_lr()[0]
        metrics.update({f"train/{k}": float(np.mean(v)) for k, v in stats.items() if v})

        # 7. evaluation, logging, checkpoint
        last = iteration == cfg.train.iterations - 1
        if cfg.eval.every > 0 and ((iteration + 1) % cfg.eval.every == 0 or last):
            t0 = time.perf_counter()
            metrics.update(evaluate(iteration + 1))
            metrics["time/eval"] = time.perf_counter() - t0
        metrics["time/iteration"] = time.perf_counter() - t_iter
        if is_main:
            logger.log(metrics, iteration + 1)
            print(format_line(iteration + 1, metrics, ["charts/SPS", "rollout/success_rate", "val/success_rate",
                                                       "val/sampled_success_rate", "sampling/kept_fraction",
                                                       "reward/failure_mean", "train/pg_loss", "train/pg_clipfrac",
                                                       "train/ppo_kl", "train/grad_norm", "time/iteration"]),
                  flush=True)
            if (iteration + 1) % cfg.log.checkpoint_every == 0 or last:
                save_checkpoint(run_dir, iteration + 1, policy, {"actor": optimizer}, {"actor": scheduler}, config=cfg,
                                extra={"run_name": run_name, "env_steps": total_env_steps},
                                keep_last=cfg.log.keep_checkpoints)
        accelerator.wait_for_everyone()

    if is_main:
        logger.close()
        print(f"[srpo] done: {run_dir} (metrics.jsonl, config.yaml, checkpoints/), plots in "
              f"{os.path.join(cfg.log.plots_dir, run_name)}", flush=True)
    envs.close()
