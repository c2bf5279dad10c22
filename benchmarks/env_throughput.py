"""Embedded-suite throughput: single-env and vectorised steps/s at 64 px, and the scripted expert's success per task.

    python benchmarks/env_throughput.py [--seconds 2] [--image-size 64]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run as a script

from envs.tabletop import NUM_TASKS, NUM_TRIALS, TabletopEnv, TabletopVectorEnv  # noqa: E402


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


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--image-size", type=int, default=64)
    args = p.parse_args()
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
