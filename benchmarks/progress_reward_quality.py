"""Is the SRPO progress reward informative? Rank correlation between the reward each encoder gives failed episodes and
how far those episodes really got, on the embedded suite, from an SFT policy.

SRPO's claim rests on the world model: a failure whose video embeds close to the task's successes should have made
more progress. The tabletop simulator knows the truth, so this script rolls out the policy as train_srpo.py does
(prompts = trials x n samples at the rollout temperature), pools the kept groups per task like one SRPO batch, scores
the failures with `compute_embodied_reward` under each encoder, and compares with the simulator's progress:
  progress = grasped the target block at some step (0/1) + how much closer it ended to its goal (1 - d_end / d_start).
Prints Spearman's rho per encoder (mean over batches; 0 = no signal, 1 = perfect ranking) and the mean reward of
failures that grasped vs never grasped, for each encoder with `mean` pooling (the whole video, as siiRL) and with
`final_spatial` pooling (the final frames, spatially resolved; models/trajectory_encoders.py). Random embeddings
(a fixed Gaussian projection) give the chance level. `--seed` is the rollout seed: pooling was chosen from seed 0.

    python benchmarks/progress_reward_quality.py --sft checkpoints/sft_tabletop_task0 [--batches 10] [--seed 1]
    python benchmarks/progress_reward_quality.py --vjepa2-path facebook/vjepa2-vitl-fpc64-256   # a real world model
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from scipy.stats import spearmanr

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from envs import EnvConfig  # noqa: E402
from common.rollout import collect_rollouts  # noqa: E402
from common.dynamic_sampling import filter_groups  # noqa: E402
from envs import make_vector_env  # noqa: E402
from models.token_policy import TokenPolicy  # noqa: E402
from models.trajectory_encoders import EncoderConfig, make_trajectory_encoder  # noqa: E402
from train_srpo import compute_embodied_reward  # noqa: E402


class ProgressRecorder(gym.vector.VectorWrapper):
    """Reads the tabletop simulator during rollouts: each env's target-to-goal distance at reset, and whether its
    target block has been grasped since."""

    def __init__(self, env):
        super().__init__(env)
        core, step = env.core, env.core.step

        def step_and_read(*args, **kwargs):  # every env step, whether the rollout steps chunks or single actions
            out = step(*args, **kwargs)
            self.grasped |= core.held == core.goals[:, 0, 0]
            return out

        core.step = step_and_read

    def step_chunk_async(self, env_ids, actions, keep_frames=False):  # the rollout loop's chunked stepping
        self.env.step_chunk_async(env_ids, actions, keep_frames)

    def step_chunk_wait(self, env_ids):
        return self.env.step_chunk_wait(env_ids)

    def reset(self, **kwargs):
        out = super().reset(**kwargs)
        self.grasped = np.zeros(self.num_envs, dtype=bool)
        self.d_start = self.goal_distance()
        return out

    def goal_distance(self) -> np.ndarray:
        """xy distance of each env's target block to its goal support, now."""
        core, rows = self.env.core, np.arange(self.num_envs)
        return np.linalg.norm(core.pos[rows, core.goals[:, 0, 0], :2] - core.pos[rows, core.goals[:, 0, 1], :2], axis=1)

    def progress(self) -> np.ndarray:
        """grasped ever (0/1) + how much closer the target ended to its goal (1 - d_end / d_start, in [0, 1])."""
        return self.grasped + np.clip(1.0 - self.goal_distance() / np.maximum(self.d_start, 1e-6), 0.0, 1.0)


@torch.no_grad()
def rollout_group(env: ProgressRecorder, policy, task: int, trial: int, temperature: float):
    """num_envs episodes of one (task, trial) with the training rollout loop (one block of envs, so the simulator
    still holds every final state): the batch, each episode's progress, and whether it grasped the target."""
    batch = collect_rollouts(env, policy, [task], [trial], n_samples=env.num_envs, temperature=temperature,
                             keep_frames=True, keep_obs=False, progress=False)
    return batch, env.progress(), env.grasped.copy()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sft", default=os.path.join(ROOT, "checkpoints", "sft_tabletop_task0"))
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--trials", type=int, default=10, help="practice trials 0..trials-1 (configs/srpo.yaml)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per batch (rollout.prompts_per_iteration)")
    p.add_argument("--n", type=int, default=8, help="group size (rollout.n)")
    p.add_argument("--batches", type=int, default=10)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0,
                   help="rollout seed: the env, the policy's action sampling (torch) and the trials drawn (numpy)")
    p.add_argument("--vjepa2-path", default=None,
                   help="also score a pretrained V-JEPA 2 (path or hub id, e.g. facebook/vjepa2-vitl-fpc64-256)")
    p.add_argument("--pool", choices=["task", "group"], default="task",
                   help="task: cluster successes per task over the batch, as siiRL; group: per (task, trial) group")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", 0)) or max(1, os.cpu_count() or 1))
    if not os.path.isdir(args.sft):
        raise SystemExit(f"No SFT checkpoint at {args.sft}; make one with:\n"
                         f"  python train_sft.py --task-id {args.task_id} sft.output_path={args.sft}")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    policy = TokenPolicy.load(args.sft).eval()
    env = ProgressRecorder(make_vector_env(EnvConfig(task_ids=[args.task_id], num_envs=args.n, image_size=64),
                                           seed=args.seed))
    encoders = {}
    for pooling in ("mean", "final_spatial"):  # mean: the whole video (siiRL); final_spatial: the final frames
        encoders.update({
            f"V-JEPA 2 tiny random, {pooling}": make_trajectory_encoder(EncoderConfig(pooling=pooling), "cpu"),
            f"pixels 8x8, {pooling}": make_trajectory_encoder(EncoderConfig(kind="pixels", pooling=pooling)),
            f"pixels 16x16, {pooling}": make_trajectory_encoder(
                EncoderConfig(kind="pixels", pixel_size=16, pooling=pooling)),
        })
        if args.vjepa2_path:
            encoders[f"V-JEPA 2 {os.path.basename(args.vjepa2_path.rstrip('/'))}, {pooling}"] = \
                make_trajectory_encoder(EncoderConfig(kind="vjepa2", model_path=args.vjepa2_path, pooling=pooling))
    rhos = {name: [] for name in [*encoders, "random embedding (chance)"]}
    by_grasp = {name: ([], []) for name in rhos}
    t0 = time.perf_counter()
    for b in range(args.batches):
        groups = [rollout_group(env, policy, args.task_id, int(j), args.temperature)
                  for j in rng.integers(0, args.trials, args.prompts)]
        videos = [v for g in groups for v in g[0].frames]
        success = np.concatenate([g[0].complete for g in groups])
        progress = np.concatenate([g[1] for g in groups])
        grasped = np.concatenate([g[2] for g in groups])
        truncated = np.concatenate([g[0].truncated for g in groups])
        keep = filter_groups(success, truncated, args.n).numpy()  # accuracy in [0.1, 0.9], as SRPO
        fail = keep & ~success
        print(f"batch {b}: success {success.mean():.2f}, kept groups {keep.sum() // args.n}/{args.prompts}, "
              f"kept failures {fail.sum()} ({grasped[fail].mean() if fail.any() else 0:.2f} grasped)", flush=True)
        if fail.sum() < 3:
            continue
        names = ["task"] * int(keep.sum()) if args.pool == "task" else [str(i // args.n) for i in np.flatnonzero(keep)]
        for name in rhos:
            if name in encoders:
                emb = encoders[name].embed([v for v, k in zip(videos, keep) if k])
            else:
                emb = np.random.default_rng(b).normal(size=(int(keep.sum()), 64))
            reward = compute_embodied_reward(success[keep], emb, names)
            r_fail = reward[~success[keep]]
            rhos[name].append(spearmanr(r_fail, progress[fail]).statistic)
            by_grasp[name][0].extend(r_fail[grasped[fail]])
            by_grasp[name][1].extend(r_fail[~grasped[fail]])

    print(f"\nSRPO failure reward vs simulator progress, task {args.task_id}, {len(next(iter(rhos.values())))} "
          f"batches of {args.prompts} prompts x {args.n} ({time.perf_counter() - t0:.0f} s)")
    print(f"  {'encoder':36s} {'Spearman rho':>16s} {'reward | grasped':>17s} {'reward | never':>15s}")
    for name, values in rhos.items():
        g, ng = by_grasp[name]
        values = [v for v in values if np.isfinite(v)]  # a batch whose failures all made the same progress: no rank
        print(f"  {name:36s} {np.mean(values):7.2f} +- {np.std(values) / max(1, len(values)) ** 0.5:.2f}"
              f" {np.mean(g) if g else float('nan'):17.3f} {np.mean(ng) if ng else float('nan'):15.3f}")
