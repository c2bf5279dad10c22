"""How much of its speed a run keeps beside other work: each job alone, then two copies of it at once (a twin), with
torch's default threads ("before") and with the thread policy (common/threads.py, "after"); the ratio twin / alone.

    python benchmarks/twin.py                                  # tabletop SFT and RL, real LIBERO RL when importable
    python benchmarks/twin.py --jobs sft --modes after         # one job, one mode

Jobs (each a real training script in a subprocess, short; rates from the metrics.jsonl rows after the first, so
start-up, demo recording and the first block's warm-up are left out):
  sft        train_sft.py on tabletop task 0 (configs/sft.yaml's policy): charts/samples_per_s
  rl         train_srpo.py on tabletop task 0 from a scratch policy, every group updated (no accuracy filter: a
             scratch policy's groups would all be dropped, leaving no update to time), no evaluation: 1 / time/iteration
  libero_rl  train_srpo.py on real LIBERO (libero_object task 0) at benchmarks/libero_loop.py's CPU-scale setting
             (tiny token policy, 64 px, 2 simulator workers, streamed, 1 init state x 8 episodes of <= 50 steps), from
             a scratch policy: an SFT start takes longer than the whole benchmark on 2 cores (and the thread count
             does not depend on the start). Skipped, with the reason, where LIBERO is not importable.
Modes:
  before     the threads torch takes by default: train.threads=<the cores>, and libgomp's default wait (its threads
             spin ~3 ms after each parallel region: GOMP_SPINCOUNT=300000, what it does with OMP_WAIT_POLICY unset)
  after      the policy: train.threads=0 (auto), OMP_WAIT_POLICY=PASSIVE
OMP_NUM_THREADS is removed from the children's environment (it would decide the count in both modes). The twin's
rate is the mean of its two copies. Fair share is 0.50; the goal is >= 0.40. Every figure is a ratio inside one run:
on a shared machine the seconds move with its load, the ratios much less. Writes --out (JSON).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.threads import usable_cores  # noqa: E402 - after the path is set

JOBS = ("sft", "rl", "libero_rl")
MODES = ("before", "after")


def command(job: str, out_dir: str, args: argparse.Namespace) -> List[str]:
    """The job's training command, writing its run folder `<out_dir>/run`."""
    common = ["--no-wandb", f"log.output_dir={out_dir}", f"log.plots_dir={out_dir}", "log.run_name=run"]
    if job == "sft":
        return [sys.executable, "train_sft.py", "--task-id", "0", *common, f"sft.output_path={out_dir}/policy",
                f"sft.steps={args.sft_steps}", f"sft.log_every={args.sft_steps // 5}", "sft.eval_trials=1",
                "env.num_envs=1"]
    if job == "rl":
        return [sys.executable, "train_srpo.py", "--task-id", "0", *common, "init.mode=scratch",
                f"train.iterations={args.rl_iterations}", "algorithm.filter_accuracy=false", "eval.every=0",
                "log.checkpoint_every=1000"]
    return [sys.executable, "train_srpo.py", "--task-id", "0", *common, "env.suite=libero_object", "env.image_size=64",
            "env.fast_render=true", "env.max_steps=50", "env.num_envs=2", "env.pipeline=true", "init.mode=scratch",
            "policy.preset=tiny", "policy.hidden_size=128", "policy.image_size=64", "reward.mode=binary",
            "reward.encoder.kind=pixels", "rollout.n=8", "rollout.prompts_per_iteration=1", "rollout.temperature=0.5",
            f"train.iterations={args.libero_iterations}", "train.ppo_mini_batch_size=16",
            "train.ppo_micro_batch_size=8", "algorithm.filter_accuracy=false", "eval.every=0",
            "log.checkpoint_every=1000"]


def child_env(mode: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(WANDB_SILENT="true", WANDB_MODE="disabled")
    if mode == "before":
        env["GOMP_SPINCOUNT"] = "300000"
    return env


def rate(job: str, run_dir: str) -> float:
    """Samples/s (sft) or iterations/s (rl jobs) over the metrics rows after the first."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [r for r in map(json.loads, f) if r.get("iteration", 0) >= 2]
    if not rows:
        raise SystemExit(f"error: {run_dir}/metrics.jsonl has no row after the first: run longer")
    if job == "sft":
        return sum(r["charts/samples_per_s"] for r in rows) / len(rows)
    return len(rows) / sum(r["time/iteration"] for r in rows)


def run_copies(job: str, mode: str, copies: int, tmp: str, args: argparse.Namespace) -> Dict[str, object]:
    """`copies` runs of `job` started together; each one's rate and its thread line."""
    procs = []
    for c in range(copies):
        out = os.path.join(tmp, f"{job}_{mode}_{copies}_{c}")
        cmd = command(job, out, args) + ([f"train.threads={usable_cores()}"] if mode == "before" else [])
        os.makedirs(out, exist_ok=True)
        log = open(os.path.join(out, "log.txt"), "w")
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=child_env(mode), stdout=log, stderr=subprocess.STDOUT), out,
                      log))
    rates, threads = [], ""
    for p, out, log in procs:
        code = p.wait()
        log.close()
        text = open(os.path.join(out, "log.txt")).read()
        if code != 0:
            raise SystemExit(f"error: {job} ({mode}) failed (exit {code}):\n{text[-3000:]}")
        rates.append(rate(job, os.path.join(out, "run")))
        threads = next((part.strip() for line in text.splitlines() for part in line.split(" | ")
                        if part.strip().startswith("torch threads")), "?")
    return {"rates": rates, "mean": sum(rates) / len(rates), "threads": threads}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--sft-steps", type=int, default=100, help="SFT steps (5 metrics rows; the last 4 are timed)")
    p.add_argument("--rl-iterations", type=int, default=3, help="tabletop RL iterations (the first is not timed)")
    p.add_argument("--libero-iterations", type=int, default=2, help="LIBERO RL iterations (the first is not timed)")
    p.add_argument("--out", default="plots/twin.json")
    args = p.parse_args()
    print(f"{usable_cores()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="twin_") as tmp:
        for job in args.jobs:
            if job == "libero_rl" and importlib.util.find_spec("libero") is None:
                print("libero_rl: skipped (LIBERO is not importable: pip install -r requirements-libero.txt)")
                continue
            for mode in args.modes:
                t0 = time.perf_counter()
                alone = run_copies(job, mode, 1, tmp, args)
                twin = run_copies(job, mode, 2, tmp, args)
                row = {"job": job, "mode": mode, "alone": alone["mean"], "twin": twin["mean"],
                       "twin_rates": twin["rates"], "ratio": twin["mean"] / alone["mean"], "threads": alone["threads"],
                       "wall_s": round(time.perf_counter() - t0)}
                results.append(row)
                unit = "samples/s" if job == "sft" else "s/iteration"
                shown = (lambda r: r) if job == "sft" else (lambda r: 1 / r)
                print(f"{job:<10}{mode:<7} alone {shown(row['alone']):7.2f} {unit}, beside a twin "
                      f"{shown(row['twin']):7.2f} (copies {', '.join(f'{shown(r):.2f}' for r in twin['rates'])}): "
                      f"twin/alone {row['ratio']:.2f} | {row['threads']} | {row['wall_s']} s", flush=True)
    print(f"\n{'job':<10}{'mode':<8}{'twin/alone':>10}")
    for row in results:
        print(f"{row['job']:<10}{row['mode']:<8}{row['ratio']:>10.2f}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cores": usable_cores(), "rows": results}, f, indent=1)


if __name__ == "__main__":
    main()
