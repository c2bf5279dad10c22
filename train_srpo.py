"""SRPO: Self-Referential Policy Optimization for VLA models (siiRL's embodied_srpo_pipeline), one file.

Each iteration: rollout (prompts x n samples) -> dynamic sampling (keep groups with 0.1 <= success <= 0.9) ->
world-model progress reward (successes 1, failures by latent distance to this batch's successes) -> GRPO
advantages -> old and reference log-probs -> PPO epochs with asymmetric + dual clip -> logging and checkpoints.
`reward.mode=binary` gives plain GRPO with everything else equal.

    python train_srpo.py --task-id 0                      # embedded tabletop suite, tiny policy, CPU is fine
    python train_srpo.py --config configs/srpo_libero.yaml --task-id 0 --gpu 0
    accelerate launch --multi_gpu --num_processes 2 train_srpo.py --task-ids 0 1   # N processes (CPU or GPUs)
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Union

from common import memory_plan
from common.config import (RESUMABLE, ConfigError, EvalConfig, InitConfig, LogConfig, check_run_config,
                           exit_on_bad_config, parse_cli, ranged)
from envs import EnvConfig
from models.configs import EncoderConfig, TokenPolicyConfig


@dataclass
class RolloutConfig:
    n: int = ranged(8, "[1, 1024]")  # group size: samples per (task, trial) prompt (actor_rollout_ref.rollout.n)
    prompts_per_iteration: int = ranged(8, "[1, 65536]")  # (task, trial) prompts per iteration and process,
                                                          # x rollout.n episodes each
    temperature: float = ranged(1.0, "(0, inf)")  # rollout sampling temperature, log-probs use the
                                                  # same (siiRL's LIBERO recipe: 1.6 for OpenVLA-OFT;
                                                  # the tiny policy is sharper, docs/results.md)
    train_trials: int = ranged(30, "[1, 100000]")  # trials 0..train_trials-1 are practised;
                                                   # eval.trial_start on are held out
    refill: bool = False  # dynamic sampling refill: roll out further rounds of fresh prompts until the kept groups
                          # reach prompts_per_iteration (the quota; surplus dropped), as siiRL and SimpleVLA-RL
    max_rounds: int = ranged(  # refill: at most this many rounds per iteration (then the update trains on what was kept)
        10, "[1, 1000]", "rollout.refill's cap on rollout rounds per iteration (1 = no refill)")


@dataclass
class RewardConfig:
    mode: str = "srpo"  # srpo (world-model progress reward) | binary (plain GRPO: success 1, failure 0)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)  # vjepa2 (default) or pixels
    dbscan_eps: float = ranged(0.5, "(0, inf)")  # DBSCAN radius over a task's standardised success embeddings
    dbscan_min_samples: int = ranged(2, "[1, inf)")  # DBSCAN: successes needed to form a cluster
    sigmoid_steepness: float = ranged(10.0, "(0, inf)")  # k in a failure's reward max_failure_reward * sigmoid(k
                                                         # (offset - d))
    sigmoid_offset: float = 0.5  # offset in that sigmoid: the normalised distance d to the nearest success cluster at
                                 # which it is 1/2
    max_failure_reward: float = ranged(0.6, "[0, 1]")  # the most a failed episode can earn (a success earns 1)
    scope: str = "pooled"  # whose kept episodes form a task's success clusters and distance range: pooled (all of
                           # the update's, every round and process) | round (one rollout round on one process, as
                           # siiRL computes the reward per step and rank: siirl/execution/dag/builtin_pipelines.py:
                           # 258-275, dag_worker/dagworker.py:523-535@af00a77)
    shuffle: bool = False  # control arm (no signal): each kept group's scores permuted at random among its episodes
                           # before the advantages, so the update moves the policy as far (the same advantages, group
                           # by group) but toward no outcome (seeded; resumes exactly)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "grpo"  # grpo | step_grpo | advanced_grpo
    norm_adv_by_std_in_grpo: bool = True  # False = Dr.GRPO (no division by the group std)
    filter_accuracy: bool = True  # dynamic sampling: keep prompts with lower <= mean success <= upper
    accuracy_lower_bound: float = ranged(0.1, "[0, 1]")  # dynamic sampling: drop prompts whose mean success is below
                                                         # this
    accuracy_upper_bound: float = ranged(0.9, "[0, 1]")  # dynamic sampling: drop prompts whose mean success is above
                                                         # this
    filter_truncated: bool = False  # drop a prompt if any of its samples was truncated (max_steps, no success)
    clip_ratio_low: float = ranged(0.2, "[0, 1)")  # PPO clip: the ratio is kept >= 1 - clip_ratio_low
    clip_ratio_high: float = ranged(0.28, "[0, inf)")  # PPO clip: the ratio is kept <= 1 + clip_ratio_high (DAPO's
                                                       # clip-higher)
    clip_ratio_c: float = ranged(  # dual clip for negative advantages
        3.0, "(1, inf)", "the dual clip bounds a negative advantage's ratio at c, above 1 + clip")
    loss_agg_mode: str = "traj-token-mean"  # each episode's token mean, then the mean over the mini-batch's
                                            # episodes (siiRL's embodied actor) | token-mean | seq-mean-token-sum |
                                            # seq-mean-token-mean | seq-mean-token-sum-norm. With token-mean a long
                                            # failure outweighs a short success, so the update pushes executed
                                            # tokens down more than up and the policy spreads (docs/results.md
                                            # "Does the embedded default hold what it learns?")
    entropy_coeff: float = ranged(0.0, "[0, inf)")  # loss -= entropy_coeff * entropy of the action tokens
    use_kl_loss: bool = False  # KL to the policy RL started from (LoRA adapters off); needs policy.lora_rank > 0
    kl_loss_coef: float = ranged(0.01, "[0, inf)")  # with use_kl_loss: loss += kl_loss_coef * KL
    kl_loss_type: str = "low_var_kl"  # low_var_kl | kl | abs | mse


@dataclass
class TrainConfig:
    iterations: int = ranged(120, "[1, inf)")  # held-out success plateaus by ~100 on tabletop (docs/results.md)
    total_timesteps: Optional[int] = ranged(None, "[1, inf)")  # --timesteps: also stop at the end of the iteration
                                                                # that reaches this many env steps (all processes)
    lr: float = ranged(1e-4, "[0, inf)")  # siiRL: 5e-6 for a 7B model (configs/srpo_libero.yaml);
                                          # the tiny policy needs a larger step
    lr_warmup_steps: int = ranged(50, "[0, inf)")  # linear warmup over the first N optimizer steps (verl's
                                                   # lr_warmup_steps): Adam's first steps move every weight by
                                                   # about lr, enough to knock a sharp SFT policy off its skill
    lr_schedule: str = "cosine"  # constant | cosine: lr * (1 + cos(pi * iteration / iterations)) / 2, after warmup;
                                 # the decay keeps late steps from undoing what early ones found (docs/results.md:
                                 # the embedded default holds); siiRL's LIBERO recipes are constant
    weight_decay: float = ranged(0.0, "[0, inf)")  # AdamW weight decay
    adam_beta1: float = ranged(0.9, "[0, 1)")  # AdamW beta1 (torch's default)
    adam_beta2: float = ranged(0.999, "[0, 1)")  # AdamW beta2 (torch's default)
    update_epochs: int = ranged(1, "[1, 1000]")  # passes over the iteration's kept episodes
    mini_batch_unit: str = "trajectory"  # trajectory: mini-batches of whole episodes (siiRL, SimpleVLA-RL) | step:
                                         # of policy steps shuffled across episodes (traj-token-mean then weighs
                                         # the episodes of each mini-batch alike, not of the whole batch)
    mini_batch_size: int = ranged(8, "[1, 1048576]")  # per optimizer step: episodes (64 per iteration: ~6-8
                                                          # steps after the filter), or policy steps (observation
                                                          # + its chunk of action tokens) with mini_batch_unit=step
    micro_batch_size: int = ranged(32, "[1, 65536]")  # policy steps per forward/backward (gradient
                                                          # accumulation inside a mini-batch)
    grad_clip: float = ranged(1.0, "(0, inf)")  # clip the gradient's global norm to this
    threads: int = ranged(0, "[0, 4096]")  # torch CPU threads per process; 0 = auto (common/threads.py: its cores
                                         # / processes; 1 on a GPU); config.yaml keeps the count chosen
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)
    recompute_old_log_prob: bool = False  # True = siiRL's actor_old_log_prob node, a second forward over every
                                          # step. The rollout's own log-probs come from the same module and weights:
                                          # they differ from a recompute by <1e-6, as much as the recompute differs
                                          # from the update's own forward (tests/test_rollout.py), so False
                                          # saves that forward (~20% of an iteration) and changes nothing else


@dataclass
class Config:
    seed: int = ranged(1, "[0, inf)")  # seeds torch, numpy and the rollout's sampling (--seed)
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: Any = field(default_factory=TokenPolicyConfig)  # policy.type (token (default) | openvla_oft) picks its keys
    init: InitConfig = field(default_factory=InitConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def memory_parts(self, world: int) -> memory_plan.Parts:
        """What the memory plan counts (common/memory_plan.py): the policy, the update's batches and, with
        reward.mode=srpo, the V-JEPA 2 reward encoder beside the policy."""
        return memory_plan.rl_parts(self, world, "train_srpo.py", extras=lambda *_: memory_plan.encoder_extra(
            self.reward.encoder) if self.reward.mode == "srpo" else [])


# the command line before the imports below: --help and a malformed line answer in ~1 s (torch and transformers
# take ~10 s to load); the values are checked (check_config) once they have loaded
if __name__ == "__main__":
    cfg = parse_cli(Config, "configs/srpo.yaml", __doc__, script="srpo",
                    resumable=RESUMABLE + ("train.total_timesteps",), flags={
                        "--timesteps": dict(type=int, key="train.total_timesteps",
                                            help="stop after this many env steps (or train.iterations, if first)")})
    memory_plan.dry_run(cfg)  # --dry-run: print the memory plan and exit (nothing loads)

import numpy as np
import torch
from scipy.spatial.distance import cdist
from scipy.special import expit
from sklearn.cluster import DBSCAN
from sklearn.preprocessing import StandardScaler

from common.advantages import compute_advantage, make_action_mask, shuffle_within_groups
from common.dynamic_sampling import sample_rounds, trim_to_quota
from common.losses import LOSS_AGG_MODES, agg_loss, compute_policy_loss_vanilla, kl_penalty
from common.masking import masked_mean
from common.rollout import RolloutBatch, collect_rollouts, flatten_steps
from common.fsdp import shard_policy
from common.policy_start import initial_policy
from common.run import EvalSettings, start_run
from common.train import (adam_betas, adamw_with_warmup, cosine_decay, mean_stats, micro_batches, minibatches,
                          optimizer_step, sample_prompts, sharded_update)
from models import ACTION_DIM, make_trajectory_encoder


# ---------------------------------------------------------------------------------------------------------------------
# SRPO's world-model progress reward (siiRL's compute_embodied_reward): what defines the algorithm
# ---------------------------------------------------------------------------------------------------------------------
ArrayOrTensor = Union[np.ndarray, torch.Tensor]


def _to_numpy(x: ArrayOrTensor | Sequence) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def compute_embodied_reward(completes: ArrayOrTensor | Sequence[bool], embeddings: ArrayOrTensor,
                            task_names: Sequence[str], dbscan_eps: float = 0.5, dbscan_min_samples: int = 2,
                            sigmoid_steepness: float = 10.0, sigmoid_offset: float = 0.5,
                            max_failure_reward: float = 0.6) -> np.ndarray:
    """siiRL's compute_embodied_reward: success 1; failure max_failure_reward * expit(k (offset - d_norm)),
    d = distance to the nearest DBSCAN cluster of the task's successes; zero embedding or no success/failure -> 0."""
    completes = _to_numpy(completes).astype(bool)
    embeddings = _to_numpy(embeddings).astype(np.float64)
    batch = completes.shape[0] if completes.ndim == 1 else -1
    if completes.ndim != 1 or embeddings.ndim != 2 or embeddings.shape[0] != batch or len(task_names) != batch:
        raise ValueError(f"need completes (B,), embeddings (B, D), B task_names; got completes {completes.shape}, "
                         f"embeddings {embeddings.shape}, {len(task_names)} task_names")

    rewards = np.zeros(batch, dtype=np.float64)
    valid = ~np.all(embeddings == 0, axis=1)  # an all-zero embedding marks a row whose video failed to embed
    by_task: Dict[str, list] = {}
    for i in np.flatnonzero(valid):
        by_task.setdefault(task_names[i], []).append(i)

    for indices in by_task.values():
        indices = np.asarray(indices)
        success, fail = indices[completes[indices]], indices[~completes[indices]]
        rewards[success] = 1.0
        if len(success) == 0 or len(fail) == 0:
            continue
        # centres of the DBSCAN clusters of the (standardised) success embeddings, in raw embedding space
        succ = embeddings[success]
        scaler = StandardScaler()
        scaled = scaler.fit_transform(succ)
        labels = DBSCAN(eps=dbscan_eps, min_samples=dbscan_min_samples).fit(scaled).labels_
        centres = [scaler.inverse_transform(scaled[labels == c].mean(axis=0, keepdims=True)).ravel()
                   for c in sorted(set(labels) - {-1})]
        if not centres:
            centres = [succ.mean(axis=0)]
        # min-max normalised distance of each failure to its nearest centre -> sigmoid reward
        dists = cdist(embeddings[fail], np.asarray(centres), "euclidean").min(axis=1)
        span = dists.max() - dists.min()
        d_norm = np.full_like(dists, 0.5) if span < 1e-6 else (dists - dists.min()) / span
        rewards[fail] = max_failure_reward * expit(sigmoid_steepness * (sigmoid_offset - d_norm))
    return rewards


def reward_scope_names(task_names: Sequence[str], group_ids: np.ndarray, prompts: int, scope: str) -> List[str]:
    """The names compute_embodied_reward groups episodes by, for reward.scope: pooled, the task names themselves
    (one cluster set per task over the whole update); round, the task within its rollout round on its process
    (`group_ids // prompts`: the script numbers groups (round x processes + rank) x prompts + g, so that is the
    (round, process) they came from)."""
    if scope == "pooled":
        return list(task_names)
    return [f"{name}|{int(g) // prompts}" for name, g in zip(task_names, np.asarray(group_ids).tolist())]


def check_config(cfg: Config) -> None:
    """Errors a researcher would otherwise meet minutes into a run, as one line with the fix."""
    check_run_config(cfg)
    if cfg.rollout.n < 2:
        raise ConfigError(f"rollout.n={cfg.rollout.n}: GRPO needs n >= 2 samples per prompt to form a group baseline")
    if cfg.reward.mode not in ("srpo", "binary"):
        raise ConfigError(f"reward.mode={cfg.reward.mode!r}: use srpo or binary")
    if cfg.reward.scope not in ("pooled", "round"):
        raise ConfigError(f"reward.scope={cfg.reward.scope!r}: use pooled (all kept episodes of the update) or round "
                          f"(each rollout round on each process, siiRL's)")
    if cfg.algorithm.adv_estimator not in ("grpo", "step_grpo", "advanced_grpo"):
        raise ConfigError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r}: use grpo, step_grpo or "
                          f"advanced_grpo (gae is train_gae_ppo.py's, grpo_split train_luffy.py's)")
    if cfg.algorithm.use_kl_loss and cfg.policy.lora_rank <= 0:
        raise ConfigError("algorithm.use_kl_loss needs policy.lora_rank > 0: the reference policy is the same model "
                          "with its LoRA adapters disabled")
    if cfg.algorithm.loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"algorithm.loss_agg_mode={cfg.algorithm.loss_agg_mode!r}: use one of "
                          f"{', '.join(LOSS_AGG_MODES)}")
    if cfg.train.lr_schedule not in ("constant", "cosine"):
        raise ConfigError(f"train.lr_schedule={cfg.train.lr_schedule!r}: use constant or cosine")


def cosine_resume_note(run_dir: str, iterations: int) -> Optional[str]:
    """A note when a resumed cosine run gets a new length: the decay spans train.iterations, so from here on the
    step follows the new length's curve (a run extended from 2 to 4 is not the uninterrupted 4-iteration run)."""
    from common import yaml_safe

    planned = yaml_safe.load_file(os.path.join(run_dir, "config.yaml"))["train"]["iterations"]  # parse_cli read it
    if planned == iterations:
        return None
    return (f"note: train.lr_schedule=cosine decays over train.iterations: resumed with {iterations} instead of "
            f"{planned}, the step follows the {iterations}-iteration curve from here on (at iteration {planned} it was "
            f"going to 0); train.lr_schedule=constant runs continue unchanged")


if __name__ == "__main__":
    cfg = exit_on_bad_config(check_config, cfg)  # values checked; eval.protocol resolved: its changes printed
    note = cfg.resume and cfg.train.lr_schedule == "cosine" and cosine_resume_note(cfg.resume, cfg.train.iterations)
    if note:
        print(note, flush=True)
    # ===== PLUMBING (common/): run folder, policy, optimizer, resume; nothing of the algorithm ==========
    with start_run(cfg, "srpo") as run:
        device = run.device
        policy = shard_policy(run, initial_policy(run, "token"))  # train.strategy
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer, scheduler = adamw_with_warmup(params, cfg.train.lr, cfg.train.weight_decay,
                                                 cfg.train.lr_warmup_steps, adam_betas(cfg.train))
        encoder = make_trajectory_encoder(cfg.reward.encoder, str(device)) if cfg.reward.mode == "srpo" else None
        if cfg.reward.shuffle:  # the control arm's permutations: its own stream, saved and restored with checkpoints
            shuffle_rng = run.rngs["shuffle"] = np.random.default_rng([cfg.seed, run.rank, 1])
        run.attach(policy, {"actor": optimizer}, {"actor": scheduler},
                   evaluation=EvalSettings(temperature=cfg.rollout.temperature), banner=f" | reward {cfg.reward.mode}"
                   + (" shuffled within groups (control)" if cfg.reward.shuffle else "")
                   + (f" | stops at {cfg.train.total_timesteps:,} env steps" if cfg.train.total_timesteps else ""))
        A = policy.action_chunk * ACTION_DIM  # action tokens per policy step
        temp, mb = cfg.rollout.temperature, cfg.train.micro_batch_size
        P, agg, budget = cfg.rollout.prompts_per_iteration, cfg.algorithm.loss_agg_mode, cfg.train.total_timesteps

        # ===== ALGORITHM: rollout, advantages, update (the run.* calls inside are bookkeeping: counts, stops) ==
        for iteration in run.iterations():
            if budget and run.state["env_steps"] >= budget:  # a resumed run that had already spent its budget
                break
            t_iter = time.perf_counter()
            metrics = run.begin_iteration(iteration)

            # 1. rollout: prompts (task, trial) x n samples, temperature sampling; 2. dynamic sampling: keep prompts
            #    whose group success lies in [lower, upper] (binary success). With rollout.refill, further rounds of
            #    fresh prompts until every process's kept groups together reach the quota (prompts_per_iteration per
            #    process), at most rollout.max_rounds; then the first quota groups in the order (round, process)
            def roll_out(round_index: int):
                tasks, trials = sample_prompts(run, P)
                policy.eval()
                batch = collect_rollouts(run.envs, policy, tasks, trials, n_samples=cfg.rollout.n, temperature=temp,
                                         keep_frames=cfg.reward.mode == "srpo", progress=run.is_main,
                                         video_frames=cfg.reward.encoder.num_frames,  # what the encoder reads
                                         desc=f"rollout {iteration}" + (f" round {round_index + 1}" if round_index
                                                                        else ""))
                return batch, batch  # filtered, counted

            sampled = sample_rounds(run, roll_out, cfg.rollout.n, P, cfg.rollout.max_rounds, cfg.rollout.refill,
                                    filter_accuracy=cfg.algorithm.filter_accuracy,
                                    filter_truncated=cfg.algorithm.filter_truncated,
                                    accuracy_lower_bound=cfg.algorithm.accuracy_lower_bound,
                                    accuracy_upper_bound=cfg.algorithm.accuracy_upper_bound)
            if run.stopped:  # Ctrl-C / SIGTERM at a round's safe point: every process stops (last iteration saved)
                break
            sampled.log_metrics(run, metrics, cfg.rollout.n)  # time, env steps, SPS, rounds, outcomes, the filter's counts
            batch = RolloutBatch.concat(sampled.kept) if len(sampled.kept) > 1 else sampled.kept[0]
            if cfg.rollout.refill:  # the surplus of the last round over the quota is dropped
                trained = trim_to_quota(run.gather, run.rank, sampled.group_rounds, P)
                groups = [g for g in dict.fromkeys(batch.group_ids.tolist())]  # kept groups in round order
                batch = batch.select(np.isin(batch.group_ids, np.array(groups, dtype=np.int64)[trained]))
                metrics["sampling/trained_groups"] = float(sum(run.gather([int(trained.sum())])))
            kept_counts = run.gather([len(batch)])  # kept episodes per process
            metrics["train/skipped_update"] = float(sum(kept_counts) == 0)  # all groups filtered: nothing to learn

            # 3. progress reward: world-model embeddings of the kept episodes, pooled per task over all processes
            t0 = time.perf_counter()
            offset = sum(kept_counts[:run.rank])  # this process's rows in the gathered order
            if cfg.reward.mode == "srpo":
                emb = encoder.embed(batch.frames) if len(batch) else np.zeros((0, encoder.dim), np.float32)
                names = reward_scope_names(batch.task_names, batch.group_ids, P, cfg.reward.scope)
                gathered = run.gather(list(zip(batch.complete.tolist(), emb, names)))
                complete_all = np.array([g[0] for g in gathered], dtype=bool)
                scores_all = compute_embodied_reward(
                    complete_all,
                    np.stack([g[1] for g in gathered]) if gathered else np.zeros((0, encoder.dim), np.float32),
                    [g[2] for g in gathered], cfg.reward.dbscan_eps, cfg.reward.dbscan_min_samples,
                    cfg.reward.sigmoid_steepness, cfg.reward.sigmoid_offset, cfg.reward.max_failure_reward)
            else:
                complete_all = np.array(run.gather(batch.complete.tolist()), dtype=bool)
                scores_all = complete_all.astype(np.float64)
            scores = scores_all[offset:offset + len(batch)]
            metrics["time/reward"] = time.perf_counter() - t0
            if len(scores_all):  # over every process's kept episodes
                failures = scores_all[~complete_all]
                metrics["reward/mean"] = float(scores_all.mean())
                metrics["reward/failure_mean"] = float(failures.mean()) if failures.size else math.nan
                metrics["reward/failure_max"] = float(failures.max()) if failures.size else math.nan
            if cfg.reward.shuffle:  # control arm: each group's scores permuted among its episodes (logged: the true)
                scores = shuffle_within_groups(scores, batch.group_ids, shuffle_rng)

            # 4. advantages: GRPO over each group, broadcast to the tokens of the actions the env executed (finish_step
            #    x 7: a chunk cut by success or max_steps keeps only its executed actions); then the valid policy
            #    steps as rows (an observation with its chunk of A action tokens)
            steps = None
            by_trajectory = cfg.train.mini_batch_unit == "trajectory"  # mini-batches of episodes, else of steps
            units = run.gather([len(batch) if by_trajectory else int(batch.valid_steps.sum())])  # per process
            on_policy = cfg.train.update_epochs == 1 and \
                max(units) <= cfg.train.mini_batch_size  # one optimizer step: see 5.
            if len(batch):
                T = batch.num_steps
                response_mask = make_action_mask(batch.finish_step, T, policy.action_chunk)  # (B, T*A)
                advantages, _ = compute_advantage(
                    cfg.algorithm.adv_estimator, torch.as_tensor(scores, dtype=torch.float32), response_mask,
                    batch.group_ids.tolist(), step_mask=torch.as_tensor(batch.step_mask),
                    norm_adv_by_std_in_grpo=cfg.algorithm.norm_adv_by_std_in_grpo)
                steps = flatten_steps(batch, advantages=advantages.view(len(batch), T, A),
                                      mask=response_mask.view(len(batch), T, A).float())
                metrics["train/advantage_abs_mean"] = float(masked_mean(steps.tensor("advantages").abs(),
                                                                        steps.tensor("mask")))
                # the signed token mean: what token-mean's update pushes on net (< 0: executed tokens pushed down
                # more than up, which spreads the policy; traj-token-mean weighs each episode's mean alike instead)
                metrics["train/advantage_token_mean"] = float(masked_mean(steps.tensor("advantages"),
                                                                          steps.tensor("mask")))

                # 5. old log-probs: the rollout's (same weights), or a recompute with train.recompute_old_log_prob;
                #    with one epoch of one mini-batch the update's own forward, detached (verl's on-policy case).
                #    Reference log-probs (adapters off: the RL start) for the KL loss
                def log_probs(rows: slice) -> torch.Tensor:
                    part = steps.take(rows)
                    return policy.log_prob(part.obs, part.instructions, part.tensor("tokens"), temp)[0]

                t0 = time.perf_counter()
                with torch.no_grad():
                    chunks = [slice(s, s + mb) for s in range(0, len(steps), mb)]
                    if cfg.train.recompute_old_log_prob and not on_policy:
                        steps.data["old_log_probs"] = torch.cat([log_probs(c) for c in chunks]).cpu().numpy()
                    if cfg.algorithm.use_kl_loss:
                        with policy.reference():
                            steps.data["ref_log_probs"] = torch.cat([log_probs(c) for c in chunks]).cpu().numpy()
                metrics["time/old_log_prob"] = time.perf_counter() - t0

            # 6. PPO update: epochs -> shuffled mini-batches of policy steps, or of whole episodes (train.
            #    mini_batch_unit=trajectory) -> micro-batches of policy steps (gradient accumulation, each weighted by
            #    its share of the mini-batch's loss under algorithm.loss_agg_mode), at the warm-up's lr times
            #    train.lr_schedule's decay over the iterations
            t0 = time.perf_counter()
            lr_scale = cosine_decay(iteration, cfg.train.iterations) if cfg.train.lr_schedule == "cosine" else 1.0
            policy.train()
            stats = {k: [] for k in ("pg_loss", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "entropy", "kl_loss",
                                     "grad_norm")}
            if sum(kept_counts) > 0:
                with sharded_update(run, policy, steps) as pad:  # fsdp: sharded weights, as many micro-batches
                    for mb_inds in minibatches(len(steps) if steps else 0, cfg.train.mini_batch_size,
                                               cfg.train.update_epochs, run.gather,
                                               episodes=steps.episode if by_trajectory and steps else None):
                        optimizer.zero_grad(set_to_none=True)
                        micro = micro_batches(steps, mb_inds, mb, pad, agg)
                        for part, weight in micro:  # weight 0: fsdp's padding (a row that adds zero gradient)
                            log_prob, entropy = policy.log_prob(part.obs, part.instructions, part.tensor("tokens"),
                                                                temp)
                            if not cfg.algorithm.entropy_coeff:
                                entropy = entropy.detach()  # logged only: no backward through it (its gradient is 0)
                            old_log_prob = log_prob.detach() if on_policy else part.tensor("old_log_probs", device)
                            executed, adv = part.tensor("mask", device), part.tensor("advantages", device)
                            mask = executed  # traj-token-mean: each token weighted by 1 / (its episode's tokens x
                            if agg == "traj-token-mean":  # episodes), so each micro-batch's loss is its partial sum
                                mask = executed * part.tensor("traj_weight", device)[:, None]
                            pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower = compute_policy_loss_vanilla(
                                old_log_prob, log_prob, adv, mask, clip_ratio_low=cfg.algorithm.clip_ratio_low,
                                clip_ratio_high=cfg.algorithm.clip_ratio_high, clip_ratio_c=cfg.algorithm.clip_ratio_c,
                                loss_agg_mode=cfg.algorithm.loss_agg_mode)
                            entropy_loss = agg_loss(entropy, mask, cfg.algorithm.loss_agg_mode)
                            loss = pg_loss - cfg.algorithm.entropy_coeff * entropy_loss
                            if cfg.algorithm.use_kl_loss:
                                kl = kl_penalty(log_prob, part.tensor("ref_log_probs", device),
                                                cfg.algorithm.kl_loss_type)
                                kl_loss = agg_loss(kl, mask, cfg.algorithm.loss_agg_mode)
                                loss = loss + cfg.algorithm.kl_loss_coef * kl_loss
                            (loss * weight).backward()  # weight: this micro-batch's share of the mini-batch's loss
                            if not weight:
                                continue  # padding: no statistics
                            # logged: the mini-batch's loss (the mean over its micro-batches of loss x weight x
                            # their count) and the executed tokens' mean entropy, comparable across loss_agg_modes
                            for k, v in (("pg_loss", pg_loss * weight * micro.count),
                                         ("pg_clipfrac", pg_clipfrac), ("ppo_kl", ppo_kl),
                                         ("pg_clipfrac_lower", pg_clipfrac_lower),
                                         ("entropy", masked_mean(entropy.detach(), executed))):
                                stats[k].append(v.detach())  # read once after the update: no host sync here
                            if cfg.algorithm.use_kl_loss:
                                stats["kl_loss"].append(kl_loss.detach())
                        stats["grad_norm"].append(optimizer_step(run, params, optimizer, scheduler,
                                                                 cfg.train.grad_clip, lr_scale, policy))
            metrics["time/update"] = time.perf_counter() - t0
            metrics["train/lr"] = scheduler.get_last_lr()[0] * lr_scale
            metrics.update(mean_stats(stats))
            metrics["train/optimizer_steps"] = float(len(stats["grad_norm"]))  # this update's policy optimizer steps

            # 7. end of iteration: evaluation when due, logging, checkpoint; stop on the env-step budget
            last = iteration + 1 == cfg.train.iterations or bool(budget and run.state["env_steps"] >= budget)
            metrics["time/iteration"] = time.perf_counter() - t_iter
            # ===== PLUMBING: evaluation, metrics row, checkpoint (a safe stop point) =====
            if run.end_iteration(iteration, metrics, ["charts/SPS", "rollout/success_rate", "val/success_rate",
                                                      "val/sampled_success_rate", "sampling/kept_fraction",
                                                      "reward/failure_mean", "train/pg_loss", "train/pg_clipfrac",
                                                      "train/ppo_kl", "train/grad_norm", "time/iteration"], last=last):
                break  # Ctrl-C / SIGTERM: every process stops (this iteration saved)
            if last:
                break
