"""Model speed and size: params, forward and forward+backward ms per preset, ODE sampling with/without the prefix
cache, trajectory-encoder throughput, peak memory.

    python benchmarks/models_bench.py                      # tiny presets, batch 16, 1 thread
    python benchmarks/models_bench.py --minivla --minivla-batch 2   # + real-size token policy from random init
    python benchmarks/models_bench.py --pi0                         # + full pi0 (3.5B) flow policy, random init
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from typing import Callable, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import (EncoderConfig, FlowPolicy, FlowPolicyConfig, TokenPolicy, TokenPolicyConfig,  # noqa: E402
                    count_parameters, make_trajectory_encoder)

INSTR = ["put the red block on the blue plate", "stack the yellow block on the green block",
         "put the bowl on the plate", "open the top drawer of the cabinet"]


def timed(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall-clock milliseconds of `fn` over `reps` runs (the minimum is in TIMINGS, for shared machines)."""
    for _ in range(warmup):
        fn()
    times: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    TIMINGS.append(min(times))
    return statistics.median(times)


TIMINGS: List[float] = []


def mins(n: int) -> str:
    return "min " + ", ".join(f"{t:.1f}" for t in TIMINGS[-n:]) + " ms"


def make_obs(b: int, size: int) -> dict:
    rng = np.random.default_rng(0)
    return {"agentview": rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8),
            "state": rng.normal(size=(b, 8)).astype(np.float32)}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_token(cfg: TokenPolicyConfig, batch: int, reps: int) -> None:
    policy = TokenPolicy(cfg).eval()
    obs, instr = make_obs(batch, cfg.image_size), [INSTR[i % 4] for i in range(batch)]
    _, tokens, _ = policy.act(obs, instr)
    act_ms = timed(lambda: policy.act(obs, instr), reps)

    def fwd_bwd():
        logp, ent = policy.log_prob(obs, instr, tokens)
        (logp.mean() + 0.001 * ent.mean()).backward()

    fb_ms = timed(fwd_bwd, reps)
    print(f"token/{cfg.preset:8s} params {count_parameters(policy) / 1e6:8.2f}M  batch {batch:3d}  "
          f"act (forward) {act_ms:9.1f} ms  log_prob fwd+bwd {fb_ms:9.1f} ms  ({mins(2)})  "
          f"peak RSS {peak_rss_mb():7.0f} MB")
    if cfg.lora_rank == 0:
        policy.set_lora_rank(32)
        print(f"token/{cfg.preset:8s} with LoRA r=32: trainable {count_parameters(policy, True) / 1e6:.2f}M")


def bench_flow(cfg: FlowPolicyConfig, batch: int, reps: int) -> None:
    policy = FlowPolicy(cfg).eval()
    obs, instr = make_obs(batch, cfg.image_size), [INSTR[i % 4] for i in range(batch)]
    with torch.no_grad():
        prefix_ms = timed(lambda: policy.prefix(obs, instr), reps)
        prefix = policy.prefix(obs, instr)
        x = torch.randn(batch, cfg.action_chunk, 7)
        vel_ms = timed(lambda: policy.velocity(None, None, x, 0.5, prefix), reps)
    actions = np.random.default_rng(0).uniform(-1, 1, (batch, cfg.action_chunk, 7)).astype(np.float32)
    fb_ms = timed(lambda: policy.flow_matching_loss(obs, instr, actions)[0].backward(), reps)
    print(f"flow/{cfg.preset:9s} params {count_parameters(policy) / 1e6:8.2f}M  batch {batch:3d}  "
          f"prefix {prefix_ms:8.1f} ms  velocity (cached prefix) {vel_ms:7.1f} ms  "
          f"flow loss fwd+bwd {fb_ms:8.1f} ms  ({mins(3)})")
    for steps in (1, 5, 10):
        on = timed(lambda: policy.sample(obs, instr, num_steps=steps), reps)
        off = timed(lambda: policy.sample(obs, instr, num_steps=steps, reuse_prefix=False), max(1, reps // 2), 1)
        print(f"flow/{cfg.preset:9s} sample {steps:2d} steps: prefix cache on {on:8.1f} ms, off {off:8.1f} ms "
              f"({off / on:.1f}x)  ({mins(2)})")
    print(f"flow/{cfg.preset:9s} peak RSS {peak_rss_mb():.0f} MB")


def bench_encoder(kind: str, episodes: int, reps: int) -> None:
    enc = make_trajectory_encoder(EncoderConfig(kind=kind), device="cpu")
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, (int(t), 64, 64, 3), dtype=np.uint8) for t in rng.integers(50, 200, episodes)]
    ms = timed(lambda: enc.embed(videos), reps, 1)
    print(f"encoder/{kind:7s} embed {episodes} episodes (50-200 frames, 64 px): {ms:8.1f} ms  dim {enc.dim}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--batch", type=int, default=16, help="batch size for the tiny presets")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions (median reported)")
    ap.add_argument("--minivla", action="store_true", help="also time the real-size architecture (random init)")
    ap.add_argument("--minivla-batch", type=int, default=1, help="batch size for the minivla preset")
    ap.add_argument("--pi0", action="store_true", help="also time the full pi0 architecture (random init, ~14 GB)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.threads} thread(s), device cpu")
    bench_token(TokenPolicyConfig(), args.batch, args.reps)
    bench_flow(FlowPolicyConfig(), args.batch, args.reps)
    bench_encoder("vjepa2", 16, max(1, args.reps // 3))
    bench_encoder("pixels", 16, max(1, args.reps // 3))
    if args.minivla:
        bench_token(TokenPolicyConfig(preset="minivla", image_size=224), args.minivla_batch, 2)
    if args.pi0:
        bench_flow(FlowPolicyConfig(preset="pi0", image_size=224), args.minivla_batch, 2)
    print(f"peak RSS (whole run) {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
