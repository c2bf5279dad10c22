"""FlowSAR ablations (the FlowSAR write-up's axes) from the same flow SFT checkpoint with the same seeds, on the
embedded suite.

Arms (every arm sets all three keys, so the comparison does not depend on configs/flowsar.yaml's choices; each
differs from `base`, the seed's quickstart, in one key):
    base         softplus_kl, mse energy, linear EMA
    mse_branch   loss_variant=mse_branch   (DiffusionNFT-style loss vs pi-StepNFT's softplus)
    sde          energy_type=sde           (energies / 2t; the seed expects it to be worse)
    fixed_ema    ema_schedule=fixed        (beta 0.995; the seed expects linear to be better)
    shipped      mse_branch + fixed EMA             (configs/flowsar.yaml's choice for the tiny PI0)
Prints held-out greedy success (configs/flowsar.yaml eval.*: trials 30-49) against env steps per arm and seed, the mean
of the first and the last evaluations, and seconds per iteration; writes plots/flowsar_ablation.png.

    python benchmarks/flowsar_ablation.py --task-id 0 --iterations 40 --seeds 1 2
    python benchmarks/flowsar_ablation.py --arms base sde --iterations 10 -- rollout.n=2   # reduced; extra overrides
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.arms import curve  # noqa: E402

def arm(loss_variant: str, energy: str, schedule: str) -> List[str]:
    return [f"algorithm.loss_variant={loss_variant}", f"algorithm.energy_type={energy}",
            f"algorithm.ema_schedule={schedule}"]


ARMS = {
    "base": arm("softplus_kl", "mse", "linear"),
    "mse_branch": arm("mse_branch", "mse", "linear"),
    "sde": arm("softplus_kl", "sde", "linear"),
    "fixed_ema": arm("softplus_kl", "mse", "fixed"),
    "shipped": arm("mse_branch", "mse", "fixed"),  # configs/flowsar.yaml's choice for the tiny PI0
}


def start(arm: str, seed: int, args: argparse.Namespace) -> subprocess.Popen:
    name = f"bench_{arm}_s{seed}"
    cmd = [sys.executable, "train_flowsar.py", "--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb",
           "init.mode=checkpoint", f"init.path={args.sft}", f"train.iterations={args.iterations}",
           f"eval.every={args.eval_every}", f"log.output_dir={args.out}", f"log.run_name={name}",
           f"log.plots_dir={args.out}/plots", "log.checkpoint_every=1000", *ARMS[arm], *args.overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    with open(os.path.join(args.out, f"{name}.log"), "w") as log:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))


def read_rows(arm: str, seed: int, args: argparse.Namespace) -> List[Dict[str, float]]:
    with open(os.path.join(args.out, f"bench_{arm}_s{seed}", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--sft", default=None, help="flow SFT checkpoint; default: checkpoints/sft_flow_tabletop_task<id>, "
                                                "trained with train_sft.py policy.type=flow if missing")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--metric", default="val/success_rate", help="val/success_rate | val/sampled_success_rate")
    p.add_argument("--last", type=int, default=3, help="evaluations averaged at the end")
    p.add_argument("--reuse", action="store_true", help="skip runs whose metrics.jsonl already exists")
    p.add_argument("--jobs", type=int, default=2, help="training runs at a time (one thread each)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_flowsar_ablation"))
    p.add_argument("overrides", nargs="*", help="train_flowsar.py overrides for every arm (after --)")
    args = p.parse_args()
    if args.sft is None:
        args.sft = os.path.join(ROOT, "checkpoints", f"sft_flow_tabletop_task{args.task_id}")
        if not os.path.isdir(args.sft):  # the start configs/flowsar.yaml's auto_sft makes (its init.sft_args)
            from common.config import load_config
            from common.policy_start import sft_command
            from train_flowsar import Config

            cfg = load_config(Config, os.path.join(ROOT, "configs", "flowsar.yaml"),
                              [f"env.task_ids=[{args.task_id}]", "log.wandb=false"])
            subprocess.run(sft_command(cfg, args.sft, "flow"), cwd=ROOT, check=True)

    os.makedirs(args.out, exist_ok=True)
    jobs = [(arm, seed) for seed in args.seeds for arm in args.arms]
    if args.reuse:
        jobs = [(a, s) for a, s in jobs
                if not os.path.exists(os.path.join(args.out, f"bench_{a}_s{s}", "metrics.jsonl"))]
    procs: List[subprocess.Popen] = []
    for job in jobs:  # at most args.jobs at once; logs in <out>/bench_<arm>_s<seed>.log
        while sum(p.poll() is None for p in procs) >= args.jobs:
            time.sleep(1.0)
        procs.append(start(*job, args))
    if any(p.wait() != 0 for p in procs):
        sys.exit(f"error: a training run failed; see the logs in {args.out}")
    results = {arm: [read_rows(arm, seed, args) for seed in args.seeds] for arm in args.arms}

    print(f"\n{args.metric} on the evaluation trials vs env steps (task {args.task_id}, seeds {args.seeds}, "
          f"{args.iterations} iterations, from {args.sft})")
    for arm, runs in results.items():
        for seed, rows in zip(args.seeds, runs):
            xs, ys = curve(rows, args.metric)
            print(f"  {arm:10s} seed {seed}: " + " ".join(f"{int(x)}:{y:.2f}" for x, y in zip(xs, ys)))
    print(f"\n| arm | first evaluation | mean of the last {args.last} | change | env steps | s / iteration |")
    print("|---|---|---|---|---|---|")
    for arm, runs in results.items():
        ys = [curve(rows, args.metric)[1] for rows in runs]
        first, last = np.mean([y[0] for y in ys]), np.mean([y[-args.last:].mean() for y in ys])
        steps = np.mean([rows[-1]["charts/env_steps"] for rows in runs])
        sec = np.mean([r["time/iteration"] for rows in runs for r in rows if "time/iteration" in r])
        print(f"| {arm} | {first:.2f} | {last:.2f} | {last - first:+.2f} | {int(steps)} | {sec:.1f} |")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for (arm, runs), color in zip(results.items(), ("tab:blue", "tab:orange", "tab:green", "tab:red",
                                                           "tab:purple")):
        for i, rows in enumerate(runs):
            ax.plot(*curve(rows, args.metric), color=color, alpha=0.8, label=arm if i == 0 else None)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(args.metric)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"FlowSAR ablations, tabletop task {args.task_id}")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.join(ROOT, "plots"), exist_ok=True)
    fig.savefig(os.path.join(ROOT, "plots", "flowsar_ablation.png"), dpi=90)
    print("\nplot: plots/flowsar_ablation.png")
