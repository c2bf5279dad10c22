"""LUFFY vs GRPO vs SFT on the same demos vs "RL w/ SFT loss", from the same weak start with the same seeds.

Arms (all on the embedded suite, task `--task-id`, practice trials 0..train_trials-1, held-out trials 30-49):
  luffy   train_luffy.py (configs/luffy.yaml): 7 rollouts + the expert's demo of the same start per group
  grpo    train_srpo.py reward.mode=binary, rollout.n=8 on-policy samples, the dynamic-sampling filter off
  rl_sft  train_luffy.py algorithm.use_sft_multitask_loss=true adv_estimator=grpo_split (PPO on rollouts + NLL of demos)
  sft     train_sft.py from the same start on the same demos (the scripted expert on trials 0..train_trials-1, the
          demos the RL arms see), `--sft-steps` gradient steps; no env steps
The RL arms share iterations, prompts per iteration, group size and env-step budget. The start defaults to a very weak
SFT (1 demo from the suite's demo starts, 300 steps: 5% held-out greedy; 54-59% of GRPO's groups fail
entirely over its first 10 iterations): `--start PATH` overrides. `--report` re-reads finished runs and prints the table.
Prints held-out success (greedy and sampled) against env steps per run, a summary table, and writes a JSON.

    python benchmarks/luffy_vs_grpo.py --seeds 1 2 --iterations 30
    python benchmarks/luffy_vs_grpo.py --arms luffy grpo --iterations 10 -- train.lr=1e-3   # extra RL overrides
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
ARMS = {  # arm -> (script, overrides)
    "luffy": ("train_luffy.py", []),
    "grpo": ("train_srpo.py", ["reward.mode=binary", "algorithm.filter_accuracy=false", "algorithm.entropy_coeff=0.001"]),
    "rl_sft": ("train_luffy.py", ["algorithm.use_sft_multitask_loss=true", "algorithm.adv_estimator=grpo_split"]),
}


def sh(cmd: List[str], log: str) -> subprocess.Popen:
    print("$", " ".join(cmd[1:]), flush=True)
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                env=dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true"))


def rl_command(arm: str, seed: int, args: argparse.Namespace) -> List[str]:
    script, overrides = ARMS[arm]
    return [sys.executable, script, "--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb",
            "init.mode=checkpoint", f"init.path={args.start}", f"train.iterations={args.iterations}",
            f"eval.every={args.eval_every}", "eval.trial_start=30", "eval.trials_per_task=20",
            f"eval.samples_per_trial={args.samples}", f"rollout.train_trials={args.train_trials}",
            f"rollout.prompts_per_iteration={args.prompts}", "rollout.n=8", f"env.max_steps={args.max_steps}",
            f"log.output_dir={args.out}", f"log.run_name=bench_{arm}_s{seed}", "log.checkpoint_every=1000",
            *overrides, *args.overrides]


def sft_command(seed: int, args: argparse.Namespace) -> List[str]:
    return [sys.executable, "train_sft.py", "--task-id", str(args.task_id), "--seed", str(seed), "--no-wandb",
            f"policy.init_path={args.start}", "sft.demo_starts=false", f"sft.num_demos={args.train_trials}",
            f"sft.steps={args.sft_steps}", "sft.eval_every=0", "sft.eval_trial_start=30", "sft.eval_trials=20",
            f"sft.output_path={args.out}/bench_sft_s{seed}_policy", f"log.output_dir={args.out}",
            f"log.run_name=bench_sft_s{seed}"]


def read_rows(name: str, args: argparse.Namespace) -> List[Dict[str, float]]:
    with open(os.path.join(args.out, name, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--arms", nargs="+", default=["luffy", "grpo", "sft", "rl_sft"], choices=[*ARMS, "sft"])
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--samples", type=int, default=4, help="sampled held-out episodes per trial (eval.samples_per_trial)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per iteration (x 8 samples)")
    p.add_argument("--train-trials", type=int, default=10, help="practice trials = the demos' starts")
    p.add_argument("--max-steps", type=int, default=60, help="episode limit (task 0's expert needs ~26 steps)")
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--start", default=None, help="policy all arms start from (default: a very weak SFT, made once)")
    p.add_argument("--parallel", type=int, default=2, help="runs at a time (one thread each)")
    p.add_argument("--out", default="runs/luffy_vs_grpo")
    p.add_argument("--report", action="store_true", help="launch nothing: re-read the runs under --out, print the table")
    p.add_argument("overrides", nargs="*", help="extra section.key=value overrides for the RL arms (after --)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    if args.start is None and not args.report:
        args.start = os.path.join(args.out, "start_policy")
        if not os.path.isdir(args.start):
            cmd = [sys.executable, "train_sft.py", "--task-id", str(args.task_id), "--no-wandb", "sft.num_demos=1",
                   "sft.steps=300", "sft.eval_every=0", "sft.eval_trial_start=30", "sft.eval_trials=20",
                   f"sft.output_path={args.start}", f"log.output_dir={args.out}", "log.run_name=bench_start"]
            if sh(cmd, os.path.join(args.out, "bench_start.log")).wait() != 0:
                raise SystemExit(f"error: the start SFT failed; see {args.out}/bench_start.log")
    jobs = [(arm, seed, sft_command(seed, args) if arm == "sft" else rl_command(arm, seed, args))
            for seed in args.seeds for arm in args.arms]
    running: List[subprocess.Popen] = []
    for arm, seed, cmd in [] if args.report else jobs:
        while len(running) >= args.parallel:
            running = [r for r in running if r.poll() is None]
            time.sleep(2)
        running.append(sh(cmd, os.path.join(args.out, f"bench_{arm}_s{seed}.log")))
    if any(r.wait() != 0 for r in running):
        print("warning: a run failed; see its log in", args.out)

    results, lines = {}, []
    for arm, seed, _ in jobs:
        try:
            rows = read_rows(f"bench_{arm}_s{seed}", args)
        except OSError:
            continue
        evals = [r for r in rows if "val/success_rate" in r]
        greedy = [r["val/success_rate"] for r in evals]
        sampled = [r.get("val/sampled_success_rate", float("nan")) for r in evals]
        steps = [r.get("charts/env_steps", 0.0) for r in evals]
        results[f"{arm}_s{seed}"] = {"env_steps": steps, "greedy": greedy, "sampled": sampled}
        if arm != "sft":
            print(f"{arm:7s} seed {seed}: env steps {[int(s) for s in steps]}\n   greedy {np.round(greedy, 2).tolist()}"
                  + (f"\n   sampled {np.round(sampled, 3).tolist()}" if np.isfinite(sampled).any() else ""))
        if arm == "sft":  # one evaluation, after training; the start's success is the RL arms' first one
            lines.append(f"| sft seed {seed} | start -> {greedy[-1]:.2f} | - | - | 0 |")
        else:
            samp = (f"{sampled[0]:.2f} -> {np.nanmean(sampled[-3:]):.2f}" if np.isfinite(sampled).any()
                    else "- (--samples 0)")
            practice = [r["rollout/success_rate"] for r in rows if "rollout/success_rate" in r]  # on-policy rows
            lines.append(f"| {arm} seed {seed} | {greedy[0]:.2f} -> {np.mean(greedy[-3:]):.2f} | {samp} | "
                         f"{np.mean(practice[:10]):.2f} -> {np.mean(practice[-10:]):.2f} | {int(steps[-1])} |")
    print("\n| run | held-out greedy, first -> mean of last 3 | held-out sampled, first -> last 3 | practice success, "
          "first -> last 10 iterations | env steps |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(lines))
    print(f"(sft: first = the start's success, last = after {args.sft_steps} steps on the same demos; "
          f"{time.time() - t0:.0f} s in all)")
    with open(os.path.join(args.out, "luffy_vs_grpo.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
