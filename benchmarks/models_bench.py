"""Model speed and size: params, forward and forward+backward ms per preset, ODE sampling with/without the prefix
cache, trajectory-encoder throughput, peak memory.

    python benchmarks/models_bench.py                      # tiny presets, batch 16, 1 thread
    python benchmarks/models_bench.py --minivla --minivla-batch 2   # + real-size token policy from random init
    python benchmarks/models_bench.py --pi0                         # + full pi0 (3.5B) flow policy, random init
    python benchmarks/models_bench.py --device cuda --minivla --pi0 --vjepa2-large --minivla-batch 16 --lora 32
                                    # real sizes on a GPU (bf16 autocast), peak GPU memory per model
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Callable, List

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import (EncoderConfig, FlowPolicy, FlowPolicyConfig, TokenPolicy, TokenPolicyConfig,  # noqa: E402
                    count_parameters, make_trajectory_encoder)

INSTR = ["put the red block on the blue plate", "stack the yellow block on the green block",
         "put the bowl on the plate", "open the top drawer of the cabinet"]


DEVICE = torch.device("cpu")


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def timed(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall-clock milliseconds of `fn` over `reps` runs (the minimum is in TIMINGS, for shared machines);
    on CUDA each run ends with a synchronize, so the time is the GPU's too."""
    for _ in range(warmup):
        fn()
    sync()
    times: List[float] = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
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


def reset_peak() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(DEVICE)


def peak_memory() -> str:
    """Peak GPU memory allocated since reset_peak() on CUDA, else the process's peak RSS."""
    if DEVICE.type == "cuda":
        return f"peak GPU {torch.cuda.max_memory_allocated(DEVICE) / 2 ** 30:6.2f} GiB"
    return f"peak RSS {peak_rss_mb():7.0f} MB"


def bench_token(cfg: TokenPolicyConfig, batch: int, reps: int) -> None:
    reset_peak()
    policy = TokenPolicy(cfg).to(DEVICE).eval()
    obs, instr = make_obs(batch, cfg.image_size), [INSTR[i % 4] for i in range(batch)]
    _, tokens, _ = policy.act(obs, instr)
    act_ms = timed(lambda: policy.act(obs, instr), reps)

    def fwd_bwd():
        logp, ent = policy.log_prob(obs, instr, tokens)
        (logp.mean() + 0.001 * ent.mean()).backward()

    fb_ms = timed(fwd_bwd, reps)
    print(f"token/{cfg.preset:8s} params {count_parameters(policy) / 1e6:8.2f}M (trainable "
          f"{count_parameters(policy, True) / 1e6:.2f}M, LoRA r={cfg.lora_rank})  batch {batch:3d}  "
          f"act (forward) {act_ms:9.1f} ms  log_prob fwd+bwd {fb_ms:9.1f} ms  ({mins(2)})  {peak_memory()}",
          flush=True)
    if cfg.lora_rank == 0:
        policy.set_lora_rank(32)
        print(f"token/{cfg.preset:8s} with LoRA r=32: trainable {count_parameters(policy, True) / 1e6:.2f}M")


def bench_flow(cfg: FlowPolicyConfig, batch: int, reps: int) -> None:
    reset_peak()
    policy = FlowPolicy(cfg).to(DEVICE).eval()
    obs, instr = make_obs(batch, cfg.image_size), [INSTR[i % 4] for i in range(batch)]
    with torch.no_grad():
        prefix_ms = timed(lambda: policy.prefix(obs, instr), reps)
        prefix = policy.prefix(obs, instr)
        x = torch.randn(batch, cfg.action_chunk, 7, device=DEVICE)
        vel_ms = timed(lambda: policy.velocity(None, None, x, 0.5, prefix), reps)
    actions = np.random.default_rng(0).uniform(-1, 1, (batch, cfg.action_chunk, 7)).astype(np.float32)
    fb_ms = timed(lambda: policy.flow_matching_loss(obs, instr, actions)[0].backward(), reps)
    print(f"flow/{cfg.preset:9s} params {count_parameters(policy) / 1e6:8.2f}M (trainable "
          f"{count_parameters(policy, True) / 1e6:.2f}M, LoRA r={cfg.lora_rank})  batch {batch:3d}  "
          f"prefix {prefix_ms:8.1f} ms  velocity (cached prefix) {vel_ms:7.1f} ms  "
          f"flow loss fwd+bwd {fb_ms:8.1f} ms  ({mins(3)})", flush=True)
    for steps in (1, 5, 10):
        on = timed(lambda: policy.sample(obs, instr, num_steps=steps), reps)
        off = timed(lambda: policy.sample(obs, instr, num_steps=steps, reuse_prefix=False), max(1, reps // 2), 1)
        print(f"flow/{cfg.preset:9s} sample {steps:2d} steps: prefix cache on {on:8.1f} ms, off {off:8.1f} ms "
              f"({off / on:.1f}x)  ({mins(2)})", flush=True)
    print(f"flow/{cfg.preset:9s} {peak_memory()}", flush=True)


def bench_encoder(cfg: EncoderConfig, episodes: int, reps: int, size: int = 64, name: str = "") -> None:
    reset_peak()
    enc = make_trajectory_encoder(cfg, device=str(DEVICE))
    rng = np.random.default_rng(0)
    videos = [rng.integers(0, 256, (int(t), size, size, 3), dtype=np.uint8) for t in rng.integers(50, 200, episodes)]
    ms = timed(lambda: enc.embed(videos), reps, 1)
    print(f"encoder/{name or cfg.kind:7s} embed {episodes} episodes (50-200 frames, {size} px, {cfg.num_frames} "
          f"sampled, pooling {cfg.pooling}): {ms:8.1f} ms  dim {enc.dim}  {peak_memory()}", flush=True)


def random_vjepa2_large(folder: str) -> str:
    """Save a randomly initialised V-JEPA 2 ViT-L (transformers' VJEPA2Config() defaults: the architecture of
    facebook/vjepa2-vitl-fpc64-256) to `folder`, so it loads through the same from_pretrained path as the real one."""
    from transformers import VJEPA2Config, VJEPA2Model
    VJEPA2Model(VJEPA2Config()).save_pretrained(folder)
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--batch", type=int, default=16, help="batch size for the tiny presets")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions (median reported)")
    ap.add_argument("--minivla", action="store_true", help="also time the real-size architecture (random init)")
    ap.add_argument("--minivla-batch", type=int, default=1, help="batch size for the minivla preset")
    ap.add_argument("--pi0", action="store_true", help="also time the full pi0 architecture (random init, ~14 GB)")
    ap.add_argument("--vjepa2-large", action="store_true",
                    help="also time a random V-JEPA 2 ViT-L (64 frames, 256 px) saved and loaded with from_pretrained")
    ap.add_argument("--lora", type=int, default=0, help="LoRA rank of the real-size policies (0 = full fine-tuning)")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (bf16 autocast, as the training scripts)")
    ap.add_argument("--skip-tiny", action="store_true", help="only the real-size models")
    args = ap.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gpu = f" ({torch.cuda.get_device_name(DEVICE)})" if DEVICE.type == "cuda" else ""
    print(f"torch {torch.__version__}, {args.threads} thread(s), device {DEVICE}{gpu}", flush=True)
    if not args.skip_tiny:
        bench_token(TokenPolicyConfig(), args.batch, args.reps)
        bench_flow(FlowPolicyConfig(), args.batch, args.reps)
        bench_encoder(EncoderConfig(kind="vjepa2"), 16, max(1, args.reps // 3))
        bench_encoder(EncoderConfig(kind="pixels"), 16, max(1, args.reps // 3))
    if args.minivla:
        bench_token(TokenPolicyConfig(preset="minivla", image_size=224, lora_rank=args.lora), args.minivla_batch, 3)
    if args.pi0:
        bench_flow(FlowPolicyConfig(preset="pi0", image_size=224, lora_rank=args.lora), args.minivla_batch, 3)
    if args.vjepa2_large:
        with tempfile.TemporaryDirectory() as folder:
            cfg = EncoderConfig(kind="vjepa2", model_path=random_vjepa2_large(folder), num_frames=64, batch_size=8)
            bench_encoder(cfg, 16, 2, size=224, name="vjepa2-L")
            bench_encoder(EncoderConfig(kind="vjepa2", model_path=folder, num_frames=64, batch_size=8,
                                        pooling="final_spatial"), 16, 2, size=224, name="vjepa2-L")
    print(f"peak RSS (whole run) {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    main()
