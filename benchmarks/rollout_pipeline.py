"""The full rollout loop on real LIBERO (`collect_rollouts`) with a stand-in policy of set latency: env steps/s against
the number of workers and the policy's latency, sequential vs pipelined (env.pipeline), as ratios in one run.

    python benchmarks/rollout_pipeline.py                          # workers 1 2 4, latency 0 and "physics"
    python benchmarks/rollout_pipeline.py --workers 1 2 --latency-ms 0 --repeats 5   # how workers scale
    python benchmarks/rollout_pipeline.py --workers 2 4 --latency-ms 0 100 physics --blocks 2
    python benchmarks/rollout_pipeline.py --video --workers 2 --size 64     # what SRPO's episode videos cost

--video (formerly benchmarks/srpo_video.py): at --workers[0] pipelined workers and latency 0, the rollout with no
frames (GRPO's), every frame rendered (SRPO's before 2026-11-29) and the video sampled at --frames, only those
rendered (`video_frames`, SRPO's now); env steps/s, the median of --repeats runs in turns, as ratios to no frames.

The stand-in policy draws small random actions from the rollout's per-episode generators and sleeps its latency per
call (like a policy on a GPU it takes no CPU from the simulator; the rollout calls it once per half of the envs per
chunk). `physics` = half the time one round of chunks takes at latency 0 with that many workers, so that the policy's
two calls per round take as long as the physics of the round. steps/s counts env steps over the wall-clock of whole
`collect_rollouts` calls (resets included), the median of --repeats runs taken in turns with the other mode; each
worker count builds its simulators once, outside the timing. Episodes of 160 steps by default (LIBERO's are 220-520):
with much shorter ones the reset, which nothing overlaps, weighs on every ratio (24-step episodes read 1.45x where
160-step ones read 1.8-1.9x at 4 workers).
Needs real LIBERO (pip install -r requirements-libero.txt, which brings its assets).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, List

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.config import EnvConfig  # noqa: E402
from common.rollout import collect_rollouts  # noqa: E402
from envs import make_vector_env  # noqa: E402
from models.policy import PolicyFamily  # noqa: E402


class SleepPolicy(PolicyFamily):  # a token family: PolicyFamily.rollout_step calls act
    """Random small arm motions, gripper open (no episode ends early), after sleeping `latency` seconds."""

    kind, model_space_samples = "token", False  # the policy interface (models/policy.py)

    def __init__(self, chunk: int, latency: float = 0.0):
        self.action_chunk, self.latency = chunk, latency

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        b = len(instructions)
        a = torch.stack([(torch.rand(self.action_chunk, 7, generator=g) - 0.5) * 0.6 for g in generators or [None] * b])
        a[..., 6] = -1.0
        time.sleep(self.latency)
        n = self.action_chunk * 7
        return a, torch.zeros(b, n, dtype=torch.long), torch.zeros(b, n)


def measure(env, policy, workers: int, blocks: int, pipeline: bool) -> Dict[str, float]:
    """steps/s of `blocks` full rounds of `workers` episodes (one collect_rollouts call); the policy acts per half of
    the envs either way, overlapped with the other half's physics when `pipeline`."""
    t0 = time.perf_counter()
    batch = collect_rollouts(env, policy, [0] * workers * blocks, list(range(workers * blocks)), progress=False,
                             pipeline=True, overlap=pipeline)
    wall = time.perf_counter() - t0
    steps = batch.stats["rollout/env_steps"]
    return {"steps_per_s": steps / wall, "wall_s": wall, "steps": steps}


VIDEO_MODES = {"no frames (GRPO)": {"keep_frames": False},
               "every frame (SRPO before)": {"keep_frames": True},
               "sampled video (SRPO now)": {"keep_frames": True, "video_frames": None}}  # None: --frames


def video(env, args) -> None:
    """--video: each of VIDEO_MODES in turns (a change in the machine's load hits every mode alike), one table."""
    workers, policy = args.workers[0], SleepPolicy(args.chunk)
    runs: Dict[str, List[float]] = {mode: [] for mode in VIDEO_MODES}
    collect_rollouts(env, policy, [0] * workers, list(range(workers)), progress=False)  # builds
    for _ in range(args.repeats):
        for mode, kwargs in VIDEO_MODES.items():
            kwargs = {k: (args.frames if v is None else v) for k, v in kwargs.items()}
            t0 = time.perf_counter()
            batch = collect_rollouts(env, policy, [0] * workers, list(range(workers)), progress=False, pipeline=True,
                                     **kwargs)
            runs[mode].append(batch.stats["rollout/env_steps"] / (time.perf_counter() - t0))
    base = float(np.median(runs["no frames (GRPO)"]))
    print("| rollout | env steps/s (median) | vs no frames |\n|---|---|---|")
    for mode, values in runs.items():
        print(f"| {mode} | {np.median(values):.1f} | {np.median(values) / base:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--latency-ms", nargs="+", default=["0", "physics"], help="per policy call: ms or 'physics'")
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--fast-render", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=160, help="episode length (env steps)")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=1, help="rounds of `workers` episodes per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per setting (median reported)")
    parser.add_argument("--backend", default="egl", choices=["egl", "osmesa"])
    parser.add_argument("--video", action="store_true", help="the cost of keeping episode videos instead (SRPO)")
    parser.add_argument("--frames", type=int, default=16, help="--video: the encoder's frames (reward.encoder."
                                                                "num_frames)")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"# {args.suite} task 0, {args.size} px, fast render {bool(args.fast_render)}, episodes of {args.max_steps} "
          f"steps, chunk {args.chunk}, {args.blocks} round(s) of episodes per measurement, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start"
          + (f"; --video: {args.workers[0]} workers, {args.frames} frames" if args.video else ""), flush=True)
    if args.video:
        env = make_vector_env(EnvConfig(suite=args.suite, task_ids=[0], image_size=args.size,
                                        render_backend=args.backend, fast_render=bool(args.fast_render),
                                        max_steps=args.max_steps, num_envs=args.workers[0], action_chunk=args.chunk))
        try:
            video(env, args)
        finally:
            env.close()
        print(f"# load average {os.getloadavg()[0]:.1f} at end")
        return
    print("| workers | policy ms/call | sequential steps/s | pipelined steps/s | pipelined / sequential "
          "| sequential vs 1 worker at 0 ms | load |")
    print("|---|---|---|---|---|---|---|")
    base: List[float] = []
    for workers in args.workers:
        cfg = EnvConfig(suite=args.suite, task_ids=[0], image_size=args.size,
                        render_backend=args.backend, fast_render=bool(args.fast_render), max_steps=args.max_steps,
                        num_envs=workers, action_chunk=args.chunk)
        env = make_vector_env(cfg)
        try:
            warm = SleepPolicy(args.chunk)
            collect_rollouts(env, warm, [0] * workers, list(range(workers)), progress=False)  # builds, JIT warm-up
            physics_ms = None
            for latency in args.latency_ms:
                if latency == "physics":
                    if physics_ms is None:
                        zero = measure(env, warm, workers, args.blocks, False)
                        rounds = args.blocks * -(-args.max_steps // args.chunk)
                        physics_ms = 1000 * zero["wall_s"] / rounds / 2
                    ms = physics_ms
                else:
                    ms = float(latency)
                policy = SleepPolicy(args.chunk, ms / 1000)
                runs = {False: [], True: []}
                for _ in range(args.repeats):  # interleaved, so a change in the machine's load hits both alike
                    for pipeline in (False, True):
                        runs[pipeline].append(measure(env, policy, workers, args.blocks, pipeline)["steps_per_s"])
                seq, pipe = ({"steps_per_s": float(np.median(runs[p]))} for p in (False, True))
                if ms == 0 and not base:
                    base.append(seq["steps_per_s"])
                scale = f"{seq['steps_per_s'] / base[0]:.2f}x" if ms == 0 and base else ""
                print(f"| {workers} | {ms:.0f}{' (physics)' if latency == 'physics' else ''} "
                      f"| {seq['steps_per_s']:.1f} | {pipe['steps_per_s']:.1f} "
                      f"| {pipe['steps_per_s'] / seq['steps_per_s']:.2f}x | {scale} | {os.getloadavg()[0]:.1f} |",
                      flush=True)
        finally:
            env.close()
    print(f"# load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
