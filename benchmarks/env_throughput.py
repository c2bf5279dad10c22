"""Embedded-suite throughput: single-env and vectorised steps/s at 64 px, and the scripted expert's success per task.

With --rollout, the rollout loop's overhead instead: `collect_rollouts` vs stepping the raw vector env with the same
actions, in one run. The policy cost is excluded twice over: a constant-time random policy is used, and the seconds
spent inside it (timed by collect_rollouts) are subtracted. Also prints the tiny token policy's rollout throughput for
reference. Goal: the loop's own overhead <= 10% of the raw env time.

    python benchmarks/env_throughput.py [--seconds 2] [--image-size 64]
    python benchmarks/env_throughput.py --rollout [--num-envs 16] [--episodes 64]
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

from common.rollout import collect_rollouts  # noqa: E402
from envs import EnvConfig, make_vector_env  # noqa: E402
from envs.tabletop import NUM_TASKS, NUM_TRIALS, TabletopEnv, TabletopVectorEnv  # noqa: E402
from models import TokenPolicy, TokenPolicyConfig  # noqa: E402
from models.policy import PolicyFamily  # noqa: E402


def vector_steps_per_s(n: int, image_size: int, seconds: float) -> float:
    env = TabletopVectorEnv(n, image_size, seed=0)
    rng = np.random.default_rng(0)
    tasks = rng.integers(0, NUM_TASKS, n).tolist()
    trials = rng.integers(0, NUM_TRIALS, n).tolist()
    env.reset(options={"task_ids": tasks, "trial_ids": trials})
    actions = rng.uniform(-1, 1, (256, n, 7)).astype(np.float32)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if env.core.done.any():  # keep every env live so each step counts N real env-steps
            env.reset(options={"task_ids": tasks, "trial_ids": trials})
        env.step(actions[steps % 256])
        steps += 1
    return steps * n / (time.perf_counter() - t0)


def single_steps_per_s(image_size: int, seconds: float) -> float:
    env = TabletopEnv(image_size)
    env.reset(options={"task_id": 0, "trial_id": 0})
    rng = np.random.default_rng(0)
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        _, _, term, trunc, _ = env.step(rng.uniform(-1, 1, 7).astype(np.float32))
        if term or trunc:
            env.reset(options={"task_id": 0, "trial_id": 0})
        steps += 1
    return steps / (time.perf_counter() - t0)


def expert_success(noise: float, image_size: int) -> list:
    env = TabletopVectorEnv(NUM_TRIALS, image_size, expert_noise=noise, seed=0)
    rates = []
    for t in range(NUM_TASKS):
        env.reset(options={"task_ids": [t] * NUM_TRIALS, "trial_ids": list(range(NUM_TRIALS))})
        while not env.core.done.all():
            env.step(env.expert_action())
        rates.append((env.core.success.mean(), env.core.steps[env.core.success].mean()))
    return rates


def throughput(args) -> None:
    single = single_steps_per_s(args.image_size, args.seconds)
    print(f"tabletop @ {args.image_size}px (agentview + wrist rendered every step)")
    print(f"  single env (gymnasium.Env):   {single:9.0f} steps/s")
    for n in (1, 8, 32, 64):
        sps = vector_steps_per_s(n, args.image_size, args.seconds)
        print(f"  vector N={n:<3d}                {sps:9.0f} env-steps/s  ({sps / single:5.1f}x single)")
    for noise in (0.0, 0.1):
        rates = expert_success(noise, args.image_size)
        print(f"  expert success, noise {noise}: " + " ".join(f"t{t}={r:.2f}" for t, (r, _) in enumerate(rates))
              + f"  mean episode length {np.mean([l for _, l in rates]):.1f} steps")


class RandomPolicy(PolicyFamily):  # a token family: PolicyFamily.rollout_step calls act
    """Uniform random action chunks: costs almost nothing, so the loop's own work is what remains."""

    kind, model_space_samples = "token", False  # the policy interface (models/policy.py)

    def __init__(self, chunk: int, seed: int = 0):
        self.action_chunk = chunk
        self.rng = np.random.default_rng(seed)

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        b = len(instructions)
        a = self.rng.uniform(-1, 1, (b, self.action_chunk, 7)).astype(np.float32)
        return a, torch.zeros(b, self.action_chunk * 7, dtype=torch.long), torch.zeros(b, self.action_chunk * 7)


def raw_env_seconds(cfg: EnvConfig, episodes: int, chunk: int) -> tuple:
    """Step the vector env through the same number of episodes with random chunks, no bookkeeping."""
    env = make_vector_env(cfg, seed=0)
    rng = np.random.default_rng(0)
    steps, t0 = 0, time.perf_counter()
    for start in range(0, episodes, env.num_envs):
        env.reset(options={"task_ids": [0] * env.num_envs, "trial_ids": list(range(env.num_envs))})
        done = np.zeros(env.num_envs, dtype=bool)
        while not done.all():
            a = rng.uniform(-1, 1, (env.num_envs, chunk, 7)).astype(np.float32)
            for k in range(chunk):
                _, _, term, trunc, _ = env.step(a[:, k])
                steps += int((~done).sum())
                done |= term | trunc
                if done.all():
                    break
    return time.perf_counter() - t0, steps


def rollout_overhead(args) -> None:
    torch.set_num_threads(args.threads)
    cfg = EnvConfig(num_envs=args.num_envs)
    chunk = cfg.action_chunk
    raw_s, raw_steps = raw_env_seconds(cfg, args.episodes, chunk)
    env = make_vector_env(cfg, seed=0)
    print(f"tabletop, {args.num_envs} envs, {args.episodes} episodes, chunk {chunk}")
    print(f"  raw env stepping:        {raw_steps:6d} steps  {raw_s:6.2f} s  {raw_steps / raw_s:8.0f} steps/s")
    for keep_frames in (False, True):
        t0 = time.perf_counter()
        batch = collect_rollouts(env, RandomPolicy(chunk), [0] * (args.episodes // 8),
                                 list(range(args.episodes // 8)), n_samples=8, keep_frames=keep_frames, progress=False)
        loop_s = time.perf_counter() - t0
        policy_s = batch.stats["time/rollout_policy_s"]
        steps = batch.stats["rollout/env_steps"]
        overhead = 100 * (((loop_s - policy_s) / steps) / (raw_s / raw_steps) - 1)
        print(f"  collect_rollouts, frames {'kept' if keep_frames else 'off '}: {int(steps):6d} steps  {loop_s:6.2f} s "
              f"(policy {policy_s:.3f} s) -> loop overhead excluding the policy {overhead:+.1f}% (goal <= 10%)")

    policy = TokenPolicy(TokenPolicyConfig()).eval()
    t0 = time.perf_counter()
    batch = collect_rollouts(env, policy, [0] * (args.episodes // 8), list(range(args.episodes // 8)), n_samples=8,
                             progress=False)
    total = time.perf_counter() - t0
    print(f"  tiny token policy rollout: {batch.stats['rollout/env_steps'] / total:8.0f} env-steps/s "
          f"({100 * batch.stats['time/rollout_policy_s'] / total:.0f}% of the time inside the policy)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--rollout", action="store_true", help="the rollout loop's overhead instead (collect_rollouts)")
    p.add_argument("--num-envs", type=int, default=16, help="--rollout: vector env size")
    p.add_argument("--episodes", type=int, default=64, help="--rollout: episodes per measurement")
    p.add_argument("--threads", type=int, default=1, help="--rollout: torch threads")
    args = p.parse_args()
    if args.rollout:
        rollout_overhead(args)
    else:
        throughput(args)
