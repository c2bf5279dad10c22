"""Peak memory of one full fine-tuning update under each train.strategy (docs/scale.md): a random Qwen2 decoder
(`layers` sharded one by one, as common/fsdp.py shards a policy) on N CPU processes over gloo, AdamW through the
scripts' own path (shard_policy, Run's register, the update mode `fsdp.sharded`, optimizer_step).

    python benchmarks/fsdp_memory.py                      # ddp, fsdp, fsdp+offload on 2 processes, one table
    python benchmarks/fsdp_memory.py --hidden 1024 --layers 12
    python benchmarks/fsdp_memory.py --micro 4            # 4 micro-batches per step (CPU fsdp accumulates full size)
    python benchmarks/fsdp_memory.py --micro 4 --reduce-every-micro-batch  # fsdp as on GPUs: fp32 gradient shards

Per process it reports the peak resident memory (ru_maxrss, includes ~0.4 GiB of python + torch), the parameter
bytes held at rest (the shards under fsdp) and the optimizer state bytes. CPU figures: on one host "offload" moves
nothing (the shards are on the CPU already); on GPUs it moves the shards and the AdamW step off the device.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import sys
from types import SimpleNamespace

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _local_bytes(t: torch.Tensor) -> int:
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


def worker(rank: int, world: int, port: int, strategy: str, offload: bool, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
    from accelerate import Accelerator
    from transformers import Qwen2Config, Qwen2Model

    from common import fsdp
    from common.train import adamw_with_warmup, optimizer_step

    accelerator = Accelerator(cpu=True)
    fsdp.REDUCE_EVERY_MICRO_BATCH = True if args.reduce_every_micro_batch else None
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.hidden // 64, num_key_value_heads=2, vocab_size=args.vocab)
    model = Qwen2Model(cfg)
    run = SimpleNamespace(accelerator=accelerator, device=torch.device("cpu"), world=world,
                          cfg=SimpleNamespace(train=SimpleNamespace(strategy=strategy, fsdp_offload=offload)))
    model = fsdp.shard_policy(run, model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = adamw_with_warmup(params, lr=1e-4, weight_decay=0.0, warmup_steps=1)
    fsdp.register(model, [optimizer])
    at_rest = sum(_local_bytes(p) for p in params)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=torch.Generator().manual_seed(rank))
    with fsdp.sharded(model):  # the update mode (ddp: nothing); `--micro` micro-batches per step, as the scripts
        for _ in range(args.steps):
            optimizer.zero_grad(set_to_none=True)
            for k in range(args.micro):
                fsdp.sync_gradients(model, k == args.micro - 1)  # fsdp: reduce-scatter in the last backward
                (model(input_ids=ids).last_hidden_state.float().pow(2).mean() / args.micro).backward()
            optimizer_step(run, params, optimizer, scheduler, max_norm=1.0, policy=model)
    opt_bytes = sum(_local_bytes(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    results[rank] = dict(peak_rss_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
                         params_at_rest_gib=at_rest / 2 ** 30, optimizer_state_gib=opt_bytes / 2 ** 30)
    torch.distributed.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--micro", type=int, default=1, help="micro-batches per step (gradient accumulation)")
    ap.add_argument("--reduce-every-micro-batch", action="store_true",
                    help="fsdp: a reduce-scatter in every micro-batch's backward (the GPU default) instead of the last")
    args = ap.parse_args()
    rows = []
    for strategy, offload in (("ddp", False), ("fsdp", False), ("fsdp", True)):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(worker, args=(args.processes, port, strategy, offload, args, results), nprocs=args.processes)
            per = dict(results)
        row = {"strategy": strategy + ("+offload" if offload else ""),
               **{k: max(r[k] for r in per.values()) for k in per[0]}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    n = sum(p.numel() for p in __import__("transformers").Qwen2Model(__import__("transformers").Qwen2Config(
        hidden_size=args.hidden, intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64, num_key_value_heads=2, vocab_size=args.vocab)).parameters())
    print(f"{n / 1e6:.0f}M parameters, {args.processes} processes, batch {args.batch} x {args.seq} tokens per process, "
          f"{args.micro} micro-batch(es) per step" + (", fsdp reduce-scatters every micro-batch"
                                                       if args.reduce_every_micro_batch else ""))
    print("| strategy | peak RSS / process (GiB) | params at rest (GiB) | AdamW state (GiB) |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['strategy']} | {r['peak_rss_gib']:.2f} | {r['params_at_rest_gib']:.3f} | "
              f"{r['optimizer_state_gib']:.3f} |")


if __name__ == "__main__":
    main()
