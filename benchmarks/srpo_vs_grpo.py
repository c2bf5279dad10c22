"""SRPO vs plain GRPO (`reward.mode=binary`) from the same SFT checkpoint with the same seeds, on the embedded suite.

Prints held-out success against environment steps for both, the env steps each needs to reach a target success
(default 0.9), and seconds per iteration split by phase (rollout, reward, update, eval). Writes the curves to
plots/srpo_vs_grpo.png.

    python benchmarks/srpo_vs_grpo.py --task-id 0 --iterations 30 --seeds 1 2
    python benchmarks/srpo_vs_grpo.py --sft checkpoints/sft_tabletop_task0 -- rollout.n=8   # extra overrides
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List, Optional

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(mode: str, seed: int, args: argparse.Namespace, out_dir: str) -> List[Dict[str, float]]:
    name = f"bench_{mode}_s{seed}"
    cmd = [sys.executable, "train_srpo.py", "--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb",
           f"reward.mode={mode}", "init.mode=checkpoint", f"init.path={args.sft}", f"train.iterations={args.iterations}",
           "eval.every=1", f"eval.trials_per_task={args.eval_trials}", f"log.output_dir={out_dir}",
           f"log.run_name={name}", "log.checkpoint_every=1000", *args.overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    quiet = subprocess.DEVNULL if args.quiet else None
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=quiet, stderr=quiet)
    with open(os.path.join(out_dir, name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def steps_to_reach(rows: List[Dict[str, float]], target: float) -> Optional[float]:
    """Cumulative env steps at the first evaluation with val/success_rate >= target (None if never)."""
    for r in rows:
        if r.get("val/success_rate", -1) >= target:
            return r.get("charts/env_steps", 0.0)
    return None


def curve(rows: List[Dict[str, float]]):
    xs = [r.get("charts/env_steps", 0.0) for r in rows if "val/success_rate" in r]
    ys = [r["val/success_rate"] for r in rows if "val/success_rate" in r]
    return np.array(xs), np.array(ys)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--sft", default=None, help="SFT checkpoint; default: train the weak recipe (configs/sft.yaml)")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="+", default=[1])
    p.add_argument("--eval-trials", type=int, default=10)
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_srpo_vs_grpo"))
    p.add_argument("--quiet", action="store_true", help="hide the training scripts' own output")
    p.add_argument("overrides", nargs="*", help="train_srpo.py overrides for both arms (after --)")
    args = p.parse_args()
    if args.sft is None:
        args.sft = os.path.join(ROOT, "checkpoints", f"sft_tabletop_task{args.task_id}")
        if not os.path.isdir(args.sft):
            subprocess.run([sys.executable, "train_sft.py", "--task-id", str(args.task_id), "--no-wandb",
                            f"sft.output_path={args.sft}"], cwd=ROOT, check=True)

    results = {mode: [run(mode, seed, args, args.out) for seed in args.seeds] for mode in ("srpo", "binary")}

    print(f"\ngreedy success on the evaluation trials vs env steps (task {args.task_id}, seeds {args.seeds}, "
          f"{args.eval_trials} trials from eval.trial_start; held out unless overridden)")
    label = {"srpo": "SRPO", "binary": "GRPO"}
    for mode, runs in results.items():
        for seed, rows in zip(args.seeds, runs):
            xs, ys = curve(rows)
            print(f"  {label[mode]:4s} seed {seed}: " + " ".join(f"{int(x)}:{y:.2f}" for x, y in zip(xs, ys)))
    print(f"\nenv steps to reach {args.target:.0%} evaluation success")
    reach = {}
    for mode, runs in results.items():
        steps = [steps_to_reach(rows, args.target) for rows in runs]
        reach[mode] = steps
        shown = ", ".join("not reached" if s is None else f"{int(s)}" for s in steps)
        print(f"  {label[mode]}: {shown}")
    ok = [(a, b) for a, b in zip(reach["srpo"], reach["binary"]) if a is not None and b is not None]
    if ok:
        print(f"  GRPO / SRPO env steps: {np.mean([b / a for a, b in ok]):.2f}x (goal >= 1.5x)")
    else:
        print("  ratio: needs both arms to reach the target in the same seed (raise --iterations)")

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
            xs, ys = curve(rows)
            ax.plot(xs, ys, color=color, alpha=0.8, label=label[mode] if i == 0 else None)
    ax.axhline(args.target, color="gray", ls="--", lw=0.8)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("evaluation success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"SRPO vs GRPO, tabletop task {args.task_id}")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.join(ROOT, "plots"), exist_ok=True)
    fig.savefig(os.path.join(ROOT, "plots", "srpo_vs_grpo.png"), dpi=90)
    print("\nplot: plots/srpo_vs_grpo.png")
