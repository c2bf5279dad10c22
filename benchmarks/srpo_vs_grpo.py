"""SRPO vs plain GRPO (`reward.mode=binary`) from the same SFT checkpoint with the same seeds, on the embedded suite.

Prints held-out success (configs/srpo.yaml: trials 30-49, 8 sampled episodes each; `--metric val/success_rate` for
greedy) against environment steps for both (as numbers and a text plot), the env steps each needs to reach target
successes (default 0.5 and 0.9), and seconds per iteration split by phase (rollout, reward, update, eval). Runs the two
arms in parallel processes (one thread each). Writes the curves to plots/srpo_vs_grpo.png.

    python benchmarks/srpo_vs_grpo.py --task-id 0 --iterations 60 --seeds 1 2
    python benchmarks/srpo_vs_grpo.py --sft checkpoints/sft_tabletop_task0 -- rollout.n=8   # extra overrides
    python benchmarks/srpo_vs_grpo.py --task-id 4 --srpo-args algorithm.accuracy_lower_bound=0   # SRPO arm only
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

from common.arms import curve, steps_to_reach  # noqa: E402


def start(mode: str, seed: int, args: argparse.Namespace) -> subprocess.Popen:
    name = f"bench_{mode}_s{seed}"
    cmd = [sys.executable, "train_srpo.py", "--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb",
           f"reward.mode={mode}", "init.mode=checkpoint", f"init.path={args.sft}",
           f"train.iterations={args.iterations}", f"eval.every={args.eval_every}", f"log.output_dir={args.out}",
           f"log.run_name={name}", f"log.plots_dir={os.path.join(args.out, 'plots')}", "log.checkpoint_every=1000",
           *args.overrides, *(args.srpo_args if mode == "srpo" else args.grpo_args)]
    print("$", " ".join(cmd[1:]), flush=True)
    with open(os.path.join(args.out, f"{name}.log"), "w") as log:  # the child keeps its own handle
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))


def read_rows(mode: str, seed: int, args: argparse.Namespace) -> List[Dict[str, float]]:
    with open(os.path.join(args.out, f"bench_{mode}_s{seed}", "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def text_plot(series: Dict[str, tuple], height: int = 21, width: int = 60) -> str:
    """Success (0..1, rows) vs env steps (columns) as text: one marker per series, '*' where markers overlap."""
    x_max = max(max(xs) for xs, _ in series.values() if len(xs)) or 1.0
    grid = [[" "] * (width + 1) for _ in range(height)]
    for marker, (xs, ys) in series.items():
        for x, y in zip(xs, ys):
            r, c = height - 1 - int(round(y * (height - 1))), int(round(x / x_max * width))
            grid[r][c] = marker if grid[r][c] in (" ", marker) else "*"
    lines = [f"{1 - i / (height - 1):4.2f} |" + "".join(row) for i, row in enumerate(grid)]
    lines.append("     +" + "-" * (width + 1))
    lines.append(f"      0{'env steps':^{width - 10}}{x_max / 1000:.0f}k")
    return "\n".join(lines)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--sft", default=None, help="SFT checkpoint; default: train the weak recipe (configs/sft.yaml)")
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--metric", default="val/sampled_success_rate", help="val/sampled_success_rate | val/success_rate")
    p.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.9],
                   help="success levels to report env steps for")
    p.add_argument("--hold", type=int, default=2,
                   help="a target counts as reached at the first of this many evaluations in a row at or above it")
    p.add_argument("--reuse", action="store_true", help="skip training runs whose metrics.jsonl already exists")
    p.add_argument("--jobs", type=int, default=2, help="training runs at a time (one thread each)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_srpo_vs_grpo"))
    p.add_argument("--srpo-args", nargs="+", default=[], metavar="KEY=VALUE",
                   help="train_srpo.py overrides for the SRPO arm only (e.g. algorithm.accuracy_lower_bound=0: keep "
                        "all-failure groups, which only the progress reward can grade)")
    p.add_argument("--grpo-args", nargs="+", default=[], metavar="KEY=VALUE",
                   help="train_srpo.py overrides for the GRPO arm only")
    p.add_argument("overrides", nargs="*", help="train_srpo.py overrides for both arms (after --)")
    args = p.parse_args()
    if args.sft is None:
        args.sft = os.path.join(ROOT, "checkpoints", f"sft_tabletop_task{args.task_id}")
        if not os.path.isdir(args.sft):
            subprocess.run([sys.executable, "train_sft.py", "--task-id", str(args.task_id), "--no-wandb",
                            f"sft.output_path={args.sft}"], cwd=ROOT, check=True)

    os.makedirs(args.out, exist_ok=True)
    jobs = [(mode, seed) for seed in args.seeds for mode in ("srpo", "binary")]
    procs: List[subprocess.Popen] = []
    if args.reuse:
        jobs = [(m, s) for m, s in jobs
                if not os.path.exists(os.path.join(args.out, f"bench_{m}_s{s}", "metrics.jsonl"))]
    for job in jobs:  # at most args.jobs at once; logs in <out>/bench_<mode>_s<seed>.log
        while sum(p.poll() is None for p in procs) >= args.jobs:
            time.sleep(1.0)
        procs.append(start(*job, args))
    if any(p.wait() != 0 for p in procs):
        sys.exit(f"error: a training run failed; see the logs in {args.out}")
    results = {mode: [read_rows(mode, seed, args) for seed in args.seeds] for mode in ("srpo", "binary")}

    print(f"\n{args.metric} on the evaluation trials vs env steps (task {args.task_id}, seeds {args.seeds}; "
          f"trials from configs/srpo.yaml eval.*, held out unless overridden)")
    label = {"srpo": "SRPO", "binary": "GRPO"}
    for mode, runs in results.items():
        for seed, rows in zip(args.seeds, runs):
            xs, ys = curve(rows, args.metric)
            print(f"  {label[mode]:4s} seed {seed}: " + " ".join(f"{int(x)}:{y:.2f}" for x, y in zip(xs, ys)))
    for target in args.targets:
        print(f"\nenv steps to reach {target:.0%} evaluation success ({args.hold} evaluations in a row)")
        reach = {}
        for mode, runs in results.items():
            reach[mode] = [steps_to_reach(rows, args.metric, target, args.hold) for rows in runs]
            shown = ", ".join("not reached" if s is None else f"{int(s)}" for s in reach[mode])
            print(f"  {label[mode]}: {shown}")
        ok = [(a, b) for a, b in zip(reach["srpo"], reach["binary"]) if a is not None and b is not None]
        if ok:
            print(f"  GRPO / SRPO env steps: {np.mean([b / a for a, b in ok]):.2f}x (goal >= 1.5x)")
        else:
            print("  ratio: needs both arms to reach the target in the same seed (raise --iterations)")

    means = {}
    for mode, runs in results.items():  # mean over seeds at each evaluation (all seeds evaluate at the same iterations)
        pts = [curve(rows, args.metric) for rows in runs]
        k = min(len(xs) for xs, _ in pts)
        means[label[mode][0]] = (np.mean([xs[:k] for xs, _ in pts], 0), np.mean([ys[:k] for _, ys in pts], 0))
    print(f"\n{args.metric}, mean over seeds (S = SRPO, G = GRPO)\n" + text_plot(means))

    print("\nseconds per iteration by phase (mean over iterations and seeds)")
    for mode, runs in results.items():
        rows = [r for run_rows in runs for r in run_rows]
        parts = {k: np.mean([r[k] for r in rows if k in r]) for k in
                 ("time/rollout", "time/reward", "time/update", "time/eval", "time/iteration")}
        print(f"  {label[mode]}: " + " | ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in parts.items()))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, color in (("srpo", "tab:blue"), ("binary", "tab:orange")):
        for i, rows in enumerate(results[mode]):
            xs, ys = curve(rows, args.metric)
            ax.plot(xs, ys, color=color, alpha=0.8, label=label[mode] if i == 0 else None)
    for target in args.targets:
        ax.axhline(target, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(args.metric)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"SRPO vs GRPO, tabletop task {args.task_id}")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.join(ROOT, "plots"), exist_ok=True)
    fig.savefig(os.path.join(ROOT, "plots", "srpo_vs_grpo.png"), dpi=90)
    print("\nplot: plots/srpo_vs_grpo.png")
