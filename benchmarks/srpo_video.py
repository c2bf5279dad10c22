"""SRPO's rollout on real LIBERO: what keeping the episodes' videos costs. env steps/s of the full rollout loop
(`collect_rollouts`, pipelined workers, a stand-in policy of no latency) with no frames (GRPO's rollout), every frame
rendered (SRPO's rollout before 2026-11-29) and the video sampled at the encoder's frames, only those rendered
(`video_frames`, SRPO's rollout now), the median of --repeats runs taken in turns, as ratios in one run.

    python benchmarks/srpo_video.py                      # 2 workers, 64 px, 160-step episodes, 16 frames
    python benchmarks/srpo_video.py --size 128 --repeats 5

The frames are bit-identical either way (tests/test_libero_video.py); only the renders differ: each step's agent view
with every frame, each chunk's end plus at most --frames per episode with sampling.
Needs real LIBERO (pip install -r requirements-libero.txt, which brings its assets).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from common.config import EnvConfig  # noqa: E402
from common.rollout import collect_rollouts  # noqa: E402
from envs import make_vector_env  # noqa: E402
from rollout_pipeline import SleepPolicy  # noqa: E402

MODES = {"no frames (GRPO)": {"keep_frames": False},
         "every frame (SRPO before)": {"keep_frames": True},
         "sampled video (SRPO now)": {"keep_frames": True, "video_frames": None}}  # None: --frames


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--suite", default="libero_spatial")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=160, help="episode length (env steps; random arm motions)")
    p.add_argument("--frames", type=int, default=16, help="the encoder's frames (reward.encoder.num_frames)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    torch.manual_seed(0)
    cfg = EnvConfig(suite=args.suite, task_ids=[0], image_size=args.size, fast_render=True, max_steps=args.max_steps,
                    num_envs=args.workers, action_chunk=8)
    print(f"# {args.suite} task 0, {args.size} px, fast render, {args.workers} workers, episodes of {args.max_steps} "
          f"steps, chunk 8, {args.frames} frames, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    env = make_vector_env(cfg)
    policy = SleepPolicy(8)
    runs = {mode: [] for mode in MODES}
    try:
        collect_rollouts(env, policy, [0] * args.workers, list(range(args.workers)), progress=False)  # builds
        for _ in range(args.repeats):  # in turns: a change in the machine's load hits every mode alike
            for mode, kwargs in MODES.items():
                kwargs = {k: (args.frames if v is None else v) for k, v in kwargs.items()}
                t0 = time.perf_counter()
                batch = collect_rollouts(env, policy, [0] * args.workers, list(range(args.workers)), progress=False,
                                         pipeline=True, **kwargs)
                runs[mode].append(batch.stats["rollout/env_steps"] / (time.perf_counter() - t0))
    finally:
        env.close()
    base = float(np.median(runs["no frames (GRPO)"]))
    print("| rollout | env steps/s (median) | vs no frames |")
    print("|---|---|---|")
    for mode, values in runs.items():
        print(f"| {mode} | {np.median(values):.1f} | {np.median(values) / base:.2f}x |")
    print(f"# load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
