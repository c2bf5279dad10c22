"""GAE-PPO (train_gae_ppo.py) vs GRPO (`train_srpo.py reward.mode=binary`) from the same SFT checkpoint,
with the same seeds and the same env-step budget, on the embedded suite.

GRPO runs `--iterations` iterations of configs/srpo.yaml (8 prompts x 8 samples); GAE-PPO (configs/gae_ppo.yaml, 64
episodes per iteration) then runs with `--timesteps` = the env steps GRPO used with the same seed, so both stop at
the same budget (GAE-PPO overshoots by less than one iteration) and both evaluate there. Both evaluate on the same
held-out trials (30-49; 1 greedy + 8 sampled episodes each) every `--eval-every` iterations.
Prints held-out success against env steps (numbers and a text plot), the success at the budget, the env steps to
reach target successes, and seconds per iteration by phase. Writes plots/gae_ppo_vs_grpo.png.

    python benchmarks/gae_ppo_vs_grpo.py --task-id 0 --iterations 60 --seeds 1 2
    python benchmarks/gae_ppo_vs_grpo.py --sft checkpoints/sft_tabletop_task0 --iterations 30 --reuse
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from srpo_vs_grpo import curve, steps_to_reach, text_plot  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABEL = {"grpo": "GRPO", "gae": "GAE-PPO"}
MARK = {"grpo": "G", "gae": "P"}  # text-plot markers
EVAL = ["eval.trial_start=30", "eval.trials_per_task=20", "eval.samples_per_trial=8"]


def run_dir(arm: str, seed: int, args: argparse.Namespace) -> str:
    return os.path.join(args.out, f"bench_{arm}_s{seed}")


def read_rows(arm: str, seed: int, args: argparse.Namespace) -> List[Dict[str, float]]:
    with open(os.path.join(run_dir(arm, seed, args), "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def command(arm: str, seed: int, args: argparse.Namespace) -> List[str]:
    common = ["--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb", "init.mode=checkpoint",
              f"init.path={args.sft}", f"eval.every={args.eval_every}", *EVAL, f"log.output_dir={args.out}",
              f"log.plots_dir={os.path.join(args.out, 'plots')}",
              f"log.run_name={os.path.basename(run_dir(arm, seed, args))}", "log.checkpoint_every=1000"]
    if arm == "grpo":
        return [sys.executable, "train_srpo.py", *common, "reward.mode=binary", f"train.iterations={args.iterations}",
                *args.overrides]
    budget = int(read_rows("grpo", seed, args)[-1]["charts/env_steps"])
    return [sys.executable, "train_gae_ppo.py", *common, "--timesteps", str(budget),
            f"train.iterations={10 * args.iterations}", *args.overrides]


def start(arm: str, seed: int, args: argparse.Namespace) -> subprocess.Popen:
    cmd = command(arm, seed, args)
    print("$", " ".join(cmd[1:]), flush=True)
    with open(run_dir(arm, seed, args) + ".log", "w") as log:  # the child keeps its own handle
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))


def run_all(args: argparse.Namespace) -> None:
    """GRPO runs first (their env steps set GAE-PPO's budgets), at most args.jobs at a time."""
    pending = [(arm, s) for arm in ("grpo", "gae") for s in args.seeds
               if not (args.reuse and os.path.exists(os.path.join(run_dir(arm, s, args), "metrics.jsonl")))]
    running: List[tuple] = []
    while pending or running:
        for job in [j for j in running if j[2].poll() is not None]:
            running.remove(job)
            if job[2].returncode != 0:
                sys.exit(f"error: {LABEL[job[0]]} seed {job[1]} failed; see {run_dir(job[0], job[1], args)}.log")
        grpo_done = lambda s: not any(a == "grpo" and t == s for a, t in pending) and \
            not any(a == "grpo" and t == s for a, t, _ in running)  # noqa: E731
        ready = [j for j in pending if j[0] == "grpo" or grpo_done(j[1])]
        if ready and len(running) < args.jobs:
            pending.remove(ready[0])
            running.append((*ready[0], start(*ready[0], args)))
        else:
            time.sleep(1.0)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--sft", default=None, help="SFT checkpoint; default: train the weak recipe (configs/sft.yaml)")
    p.add_argument("--iterations", type=int, default=60, help="GRPO iterations (they set the env-step budget)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--metric", default="val/sampled_success_rate", help="val/sampled_success_rate | val/success_rate")
    p.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.7])
    p.add_argument("--hold", type=int, default=2,
                   help="a target counts as reached at the first of this many evaluations in a row at or above it")
    p.add_argument("--reuse", action="store_true", help="skip training runs whose metrics.jsonl already exists")
    p.add_argument("--jobs", type=int, default=2, help="training runs at a time (one thread each)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_gae_ppo_vs_grpo"))
    p.add_argument("overrides", nargs="*", help="overrides for both scripts (after --), e.g. env.num_envs=16")
    args = p.parse_args()
    if args.sft is None:
        args.sft = os.path.join(ROOT, "checkpoints", f"sft_tabletop_task{args.task_id}")
        if not os.path.isdir(args.sft):
            subprocess.run([sys.executable, "train_sft.py", "--task-id", str(args.task_id), "--no-wandb",
                            f"sft.output_path={args.sft}"], cwd=ROOT, check=True)
    os.makedirs(args.out, exist_ok=True)
    run_all(args)
    results = {arm: [read_rows(arm, s, args) for s in args.seeds] for arm in ("grpo", "gae")}

    print(f"\n{args.metric} on held-out trials 30-49 vs env steps (task {args.task_id}, seeds {args.seeds})")
    for arm, runs in results.items():
        for seed, rows in zip(args.seeds, runs):
            xs, ys = curve(rows, args.metric)
            print(f"  {LABEL[arm]:7s} seed {seed}: " + " ".join(f"{int(x)}:{y:.2f}" for x, y in zip(xs, ys)))

    print("\nat the budget (first evaluation -> mean of the last 3 evaluations; greedy and sampled)")
    print("| run | env steps | held-out greedy | held-out sampled |\n| --- | --- | --- | --- |")
    for arm, runs in results.items():
        for seed, rows in zip(args.seeds, runs):
            cells = []
            for metric in ("val/success_rate", "val/sampled_success_rate"):
                _, ys = curve(rows, metric)
                cells.append(f"{ys[0]:.2f} -> {ys[-3:].mean():.2f} (last {ys[-1]:.2f})")
            print(f"| {LABEL[arm]} seed {seed} | {int(rows[-1]['charts/env_steps'])} | {' | '.join(cells)} |")

    for target in args.targets:
        print(f"\nenv steps to reach {target:.0%} ({args.metric}, {args.hold} evaluations in a row)")
        for arm, runs in results.items():
            reach = [steps_to_reach(rows, args.metric, target, args.hold) for rows in runs]
            print(f"  {LABEL[arm]}: " + ", ".join("not reached" if s is None else f"{int(s)}" for s in reach))

    means = {}
    for arm, runs in results.items():  # mean over seeds at each evaluation index (env steps differ slightly)
        pts = [curve(rows, args.metric) for rows in runs]
        k = min(len(xs) for xs, _ in pts)
        means[MARK[arm]] = (np.mean([xs[:k] for xs, _ in pts], 0), np.mean([ys[:k] for _, ys in pts], 0))
    print(f"\n{args.metric}, mean over seeds (G = GRPO, P = GAE-PPO)\n" + text_plot(means))

    print("\nseconds per iteration by phase (mean over iterations and seeds; eval only on iterations that ran it)")
    for arm, runs in results.items():
        rows = [r for run_rows in runs for r in run_rows]
        keys = ["time/rollout", "time/reward" if arm == "grpo" else "time/values", "time/update", "time/eval",
                "time/iteration"]
        parts = {k: np.mean([r[k] for r in rows if k in r]) for k in keys}
        print(f"  {LABEL[arm]}: " + " | ".join(f"{k.split('/')[1]} {v:.2f}" for k, v in parts.items()))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, color in (("grpo", "tab:orange"), ("gae", "tab:green")):
        for i, rows in enumerate(results[arm]):
            xs, ys = curve(rows, args.metric)
            ax.plot(xs, ys, color=color, alpha=0.8, label=LABEL[arm] if i == 0 else None)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(args.metric)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"GAE-PPO vs GRPO, tabletop task {args.task_id}")
    ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.join(ROOT, "plots"), exist_ok=True)
    fig.savefig(os.path.join(ROOT, "plots", "gae_ppo_vs_grpo.png"), dpi=90)
    print("\nplot: plots/gae_ppo_vs_grpo.png")
