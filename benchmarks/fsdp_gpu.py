"""OpenVLA-OFT 7B (random weights) trained through common/fsdp.py on one GPU (train.strategy=fsdp, one process):
LoRA r=32, and full fine-tuning with train.fsdp_offload (fp32 shards + AdamW on the host). One JSON line per figure:
peak GPU memory, peak host RSS, seconds per update (`--part lora` measured on an H200: docs/gpu.md).

    python benchmarks/fsdp_gpu.py --part lora
    python benchmarks/fsdp_gpu.py --part full_offload
"""
import argparse
import json
import os
import resource
import sys
import time
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.gpu_check import oft_folder, timed_updates  # noqa: E402


def emit(**row):
    row["host_peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20, 2)
    print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("lora", "full_offload"), required=True)
    ap.add_argument("--micro", type=int, default=4)
    args = ap.parse_args()
    from accelerate import Accelerator

    from common import fsdp
    from common.train import adamw_with_warmup, optimizer_step
    from models.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy

    lora = args.part == "lora"
    cfg = OpenVLAOFTConfig(init_path=oft_folder(), lora_rank=32 if lora else 0, bf16_weights=lora,
                           gradient_checkpointing=True)
    t0 = time.perf_counter()
    with torch.device("cpu" if not lora else "cuda"):  # full FT: fp32 weights built on the host, sharded to it
        policy = OpenVLAOFTPolicy(cfg, _load_weights=False)
    run = SimpleNamespace(accelerator=Accelerator(), device=torch.device("cuda"), world=1,
                          cfg=SimpleNamespace(train=SimpleNamespace(strategy="fsdp", fsdp_offload=not lora)))
    policy = fsdp.shard_policy(run, policy)
    params = [p for p in policy.parameters() if p.requires_grad]
    opt, sched = adamw_with_warmup(params, lr=1e-6, weight_decay=0.0, warmup_steps=1)
    fsdp.register(policy, [opt])
    torch.cuda.synchronize()
    emit(part=f"fsdp_{args.part}_build", seconds=round(time.perf_counter() - t0, 1),
         params=sum(p.numel() for p in policy.parameters()), trainable=sum(p.numel() for p in params),
         gpu_allocated_gib=round(torch.cuda.memory_allocated() / 2 ** 30, 2))
    def step():
        optimizer_step(run, params, opt, sched, max_norm=1.0)
        opt.zero_grad(set_to_none=True)

    with fsdp.sharded(policy):  # the update mode: layers gathered one by one in forward and backward
        for i, fwd_bwd, stepped in timed_updates(policy, args.micro, step):
            emit(part=f"fsdp_{args.part}_update", step=i, micro_batch=args.micro, fwd_bwd_s=round(fwd_bwd, 2),
                 step_s=round(stepped, 2), gpu_peak_gib=round(torch.cuda.max_memory_allocated() / 2 ** 30, 2))


if __name__ == "__main__":
    main()
