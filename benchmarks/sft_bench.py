"""SFT wall time on the embedded suite: the weak baseline recipe and the strong recipe (configs/sft.yaml + overrides).

    python benchmarks/sft_bench.py                 # both recipes, task 0
    python benchmarks/sft_bench.py --recipes weak  # one recipe

Prints, per recipe, demos, steps, total wall time, the time until the held-out greedy success first reached the
recipe's target, and the best success; writes plots/sft_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RECIPES = {  # name -> (overrides on configs/sft.yaml, target held-out success)
    "weak": ([], 0.3),
    "strong": (["sft.num_demos=40", "sft.steps=2500", "sft.eval_every=500", "sft.batch_size=32"], 0.9),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--out", default="plots/sft_bench.json")
    args = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows = []
    for name in args.recipes:
        overrides, target = RECIPES[name]
        run_name = f"sft_bench_{name}_t{args.task_id}_{time.strftime('%Y%m%d-%H%M%S')}"
        t0 = time.time()
        subprocess.run([sys.executable, os.path.join(ROOT, "train_sft.py"), "--task-id", str(args.task_id), "--no-wandb",
                        f"log.run_name={run_name}", f"sft.output_path=checkpoints/sft_bench_{name}_task{args.task_id}",
                        *overrides], env=env, check=True)
        wall = time.time() - t0
        with open(os.path.join("runs", run_name, "metrics.jsonl")) as f:
            evals = [r for r in map(json.loads, f) if r.get("val/success_rate") is not None]
        reached = [r for r in evals if r["val/success_rate"] >= target]
        rows.append({"recipe": name, "overrides": overrides, "target": target, "wall_s": round(wall, 1),
                     "time_to_target_s": round(reached[0]["charts/elapsed_s"], 1) if reached else None,
                     "steps_to_target": reached[0]["iteration"] if reached else None,
                     "best_success": max(r["val/success_rate"] for r in evals),
                     "curve": [(r["iteration"], r["val/success_rate"]) for r in evals]})
    print(f"\n{'recipe':<8}{'wall s':>9}{'target':>8}{'to target s':>13}{'best':>7}  curve (step, held-out success)")
    for r in rows:
        reach = "never" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.0f}"
        print(f"{r['recipe']:<8}{r['wall_s']:>9.0f}{r['target']:>8.0%}{reach:>13}{r['best_success']:>7.0%}  "
              + " ".join(f"{s}:{v:.0%}" for s, v in r["curve"]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"threads": args.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
