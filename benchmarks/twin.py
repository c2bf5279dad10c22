"""How much of its speed a run keeps beside other work: each job alone, then two copies of it at once (a twin), with
torch's default threads ("before") and with the thread policy (common/threads.py, "after"); the ratio twin / alone.

    python benchmarks/twin.py                                  # tabletop SFT and RL, real LIBERO RL when importable
    python benchmarks/twin.py --jobs sft --modes after         # one job, one mode

Jobs (each a real training script in a subprocess, long enough never to end by itself; the measuring window opens
once every copy has logged its first metrics row, so start-up, demo recording and the warm-up are left out, and lasts
--seconds; each copy's rate is over the rows it logged inside the window; the copies are then stopped with Ctrl-C):
  sft        train_sft.py on tabletop task 0 (configs/sft.yaml's policy), rows of 5 steps: charts/samples_per_s
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
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import metrics_log  # noqa: E402 - after the path is set
from common.threads import usable_cores  # noqa: E402

JOBS = ("sft", "rl", "libero_rl")
MODES = ("before", "after")


def command(job: str, out_dir: str) -> List[str]:
    """The job's training command (long enough never to end by itself), writing its run folder `<out_dir>/run`."""
    common = ["--no-wandb", f"log.output_dir={out_dir}", f"log.plots_dir={out_dir}", "log.run_name=run"]
    if job == "sft":
        return [sys.executable, "train_sft.py", "--task-id", "0", *common, f"sft.output_path={out_dir}/policy",
                "sft.steps=100000", "sft.log_every=5", "sft.checkpoint_every=0", "sft.eval_trials=1", "env.num_envs=1"]
    if job == "rl":
        return [sys.executable, "train_srpo.py", "--task-id", "0", *common, "init.mode=scratch",
                "train.iterations=100000", "algorithm.filter_accuracy=false", "eval.every=0", "log.checkpoint_every=100000"]
    return [sys.executable, "train_srpo.py", "--task-id", "0", *common, "env.suite=libero_object", "env.image_size=64",
            "env.fast_render=true", "env.max_steps=50", "env.num_envs=2", "env.pipeline=true", "init.mode=scratch",
            "policy.preset=tiny", "policy.hidden_size=128", "policy.image_size=64", "reward.mode=binary",
            "reward.encoder.kind=pixels", "rollout.n=8", "rollout.prompts_per_iteration=1", "rollout.temperature=0.5",
            "train.iterations=100000", "train.mini_batch_size=16", "train.micro_batch_size=8",
            "algorithm.filter_accuracy=false", "eval.every=0", "log.checkpoint_every=100000"]


def child_env(mode: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(WANDB_SILENT="true", WANDB_MODE="disabled")
    if mode == "before":
        env["GOMP_SPINCOUNT"] = "300000"
    return env


def read_rows(run_dir: str) -> List[dict]:
    """The rows a running copy has logged so far (none before its metrics.jsonl exists)."""
    try:
        return metrics_log.read_rows(run_dir)
    except FileNotFoundError:
        return []


def stop(procs: List[subprocess.Popen]) -> None:
    """Ctrl-C twice (the run ends at once, closing its simulator workers); killed if it lingers."""
    for sig in (signal.SIGINT, signal.SIGINT):
        for p in procs:
            if p.poll() is None:
                p.send_signal(sig)
        time.sleep(1)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


RUNNING: List[subprocess.Popen] = []  # stopped when the benchmark itself is stopped (SIGTERM, Ctrl-C)


def run_copies(job: str, mode: str, copies: int, tmp: str, seconds: float) -> Dict[str, object]:
    """`copies` runs of `job` started together. The window opens once every copy has logged its first row (start-up
    and warm-up done) and closes `seconds` later (or once every copy has logged a row inside it); each copy's rate is
    over the rows it logged inside the window."""
    outs, procs = [], []
    for c in range(copies):
        out = os.path.join(tmp, f"{job}_{mode}_{copies}_{c}")
        os.makedirs(out, exist_ok=True)
        cmd = command(job, out) + ([f"train.threads={usable_cores()}"] if mode == "before" else [])
        with open(os.path.join(out, "log.txt"), "w") as log:
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=child_env(mode), stdout=log, stderr=subprocess.STDOUT))
        outs.append(out)
    RUNNING[:] = procs
    seen: List[List[tuple]] = [[] for _ in procs]  # (time it appeared, row) per copy
    opened = None
    try:
        while True:
            time.sleep(0.5)
            now = time.perf_counter()
            for c, out in enumerate(outs):
                for row in read_rows(os.path.join(out, "run"))[len(seen[c]):]:
                    seen[c].append((now, row))
            for p, out in zip(procs, outs):
                if p.poll() is not None:
                    text = open(os.path.join(out, "log.txt")).read()
                    raise SystemExit(f"error: {job} ({mode}) ended early (exit {p.returncode}):\n{text[-3000:]}")
            if opened is None and all(seen):
                opened = now
            inside = [[r for t, r in rows if opened is not None and t > opened] for rows in seen]
            if opened is not None and now - opened >= seconds and all(inside) or \
                    opened is not None and now - opened >= 4 * seconds:
                break
    finally:
        stop(procs)
    rates = []
    for rows in inside:
        if not rows:
            raise SystemExit(f"error: {job} ({mode}): a copy logged no row in {4 * seconds:.0f} s; give --seconds more")
        rates.append(sum(r["charts/samples_per_s"] for r in rows) / len(rows) if job == "sft" else
                     len(rows) / sum(r["time/iteration"] for r in rows))
    text = open(os.path.join(outs[0], "log.txt")).read()
    threads = next((part.strip() for line in text.splitlines() for part in line.split(" | ")
                    if part.strip().startswith("torch threads")), "?")
    return {"rates": rates, "mean": sum(rates) / len(rates), "threads": threads,
            "rows": [len(rows) for rows in inside]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", nargs="+", default=list(JOBS), choices=JOBS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--seconds", type=float, nargs=3, default=[40, 60, 60], metavar=("SFT", "RL", "LIBERO_RL"),
                   help="each measuring window (after every copy's first metrics row), per job")
    p.add_argument("--out", default="plots/twin.json")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (stop(RUNNING), sys.exit(143)))
    print(f"{usable_cores()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="twin_") as tmp:
        for job in args.jobs:
            if job == "libero_rl" and importlib.util.find_spec("libero") is None:
                print("libero_rl: skipped (LIBERO is not importable: pip install -r requirements-libero.txt)")
                continue
            for mode in args.modes:
                t0 = time.perf_counter()
                seconds = args.seconds[JOBS.index(job)]
                alone = run_copies(job, mode, 1, tmp, seconds)
                twin = run_copies(job, mode, 2, tmp, seconds)
                row = {"job": job, "mode": mode, "alone": alone["mean"], "twin": twin["mean"],
                       "twin_rates": twin["rates"], "ratio": twin["mean"] / alone["mean"], "threads": alone["threads"],
                       "rows": [alone["rows"], twin["rows"]], "wall_s": round(time.perf_counter() - t0)}
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
