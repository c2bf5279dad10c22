"""SFT recipes on the embedded suite: held-out greedy success per task and seed, and wall time.

    python benchmarks/sft_bench.py                                      # weak, drq128, drq: tasks 0 4 9, seeds 0 1 2
    python benchmarks/sft_bench.py --recipes drq --tasks 0 --seeds 0    # one run
    python benchmarks/sft_bench.py --recipes strong --tasks 0           # the strong (near-expert) recipe

Every run is `train_sft.py --task-id T --seed S` on configs/sft.yaml with the recipe's overrides; success is greedy on
the held-out trials 30-49 (never in a demo), evaluated every `--eval-every` steps. Runs go `--jobs` at a time on one
thread each. Prints, per recipe and task, the final held-out success of each seed and their mean ± std, the wall time,
and writes plots/sft_bench.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.child_runs import ONE_THREAD, run_or_exit, run_pool  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402

RECIPES = {  # name -> overrides on configs/sft.yaml
    "weak": ["sft.augment_shift=0", "policy.token.hidden_size=128"],  # 10 demos, 1000 steps, no augmentation, 128 wide
    "drq128": ["sft.augment_shift=4", "policy.token.hidden_size=128"],  # the same + DrQ random shift of 4 px
    "drq": ["sft.augment_shift=4", "policy.token.hidden_size=256"],  # the same, 256 wide (configs/sft.yaml's default)
    "drq20": ["sft.augment_shift=4", "sft.num_demos=20", "sft.steps=2000", "policy.token.hidden_size=128"],
    "drq40": ["sft.augment_shift=4", "sft.num_demos=40", "sft.steps=3000",  # for the long two-object task 9
              "policy.token.hidden_size=128"],
    "strong": ["sft.num_demos=40", "sft.steps=2500", "sft.batch_size=32", "policy.token.hidden_size=128"],
}


def run_one(recipe: str, task: int, seed: int, args: argparse.Namespace) -> dict:
    """One train_sft.py run in a subprocess -> its evaluation curve and wall time."""
    run_name = f"sft_bench_{recipe}_t{task}_s{seed}"
    wall = run_or_exit([sys.executable, os.path.join(ROOT, "train_sft.py"), "--task-id", str(task), "--seed", str(seed),
                        "--no-wandb", f"log.output_dir={args.out_dir}", f"log.run_name={run_name}",
                        f"sft.output_path={os.path.join(args.out_dir, 'policies', run_name)}",
                        f"sft.eval_every={args.eval_every}", *RECIPES[recipe]],
                       os.path.join(args.out_dir, run_name + ".log"), ONE_THREAD)
    evals = [r for r in read_rows(os.path.join(args.out_dir, run_name)) if r.get("val/success_rate") is not None]
    return {"recipe": recipe, "task": task, "seed": seed, "wall_s": round(wall, 1),
            "final": evals[-1]["val/success_rate"], "curve": [(r["iteration"], r["val/success_rate"]) for r in evals]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", nargs="+", default=["weak", "drq128", "drq"], choices=list(RECIPES))
    p.add_argument("--tasks", nargs="+", type=int, default=[0, 4, 9])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    p.add_argument("--out-dir", default="runs/sft_bench")
    p.add_argument("--out", default="plots/sft_bench.json")
    args = p.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    todo = [(r, t, s) for r in args.recipes for t in args.tasks for s in args.seeds]
    t0 = time.time()
    rows = run_pool(lambda *job: run_one(*job, args), todo, args.jobs)
    print(f"\n{len(rows)} runs in {time.time() - t0:.0f} s ({args.jobs} at a time, one thread each); held-out greedy "
          f"success (trials 30-49) at the last step")
    print(f"{'recipe':<8}{'task':>5}  {'per seed':<20}{'mean':>6}{'std':>6}{'wall s':>8}  curve of the first seed")
    for recipe in args.recipes:
        for task in args.tasks:
            rs = [r for r in rows if r["recipe"] == recipe and r["task"] == task]
            finals = [r["final"] for r in rs]
            print(f"{recipe:<8}{task:>5}  {' '.join(f'{v:.2f}' for v in finals):<20}{np.mean(finals):>6.2f}"
                  f"{np.std(finals):>6.2f}{np.mean([r['wall_s'] for r in rs]):>8.0f}  "
                  + " ".join(f"{s}:{v:.0%}" for s, v in rs[0]["curve"]))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "recipes": {r: RECIPES[r] for r in args.recipes}}, f, indent=1)


if __name__ == "__main__":
    main()
