"""The learning tests over seeds: how each `tests/test_learning_*.py` bound was set.

Runs each test's exact run (its `SCRIPT`, `args(seed, start)` and SFT start, tests/scripts.py) for every seed, one
thread per run, `--jobs` runs at a time, and prints each measure the test computes (`measures(rows)`): the value per
seed, mean, sample standard deviation, mean - 2 sd, and the test's bound (`BOUNDS`). A bound is where it should be
when it sits at or below mean - 2 sd and clearly above what an update that does nothing gives (a gain of 0: greedy
evaluation of an unchanged policy repeats itself exactly; sampled and practice success only move by their binomial
noise, printed as `noise sd` for the gains: sqrt(2 p (1 - p) / n) with the start's p and the episodes compared).
Results: docs/results.md#learning-tests.

    python tests/learning_seeds.py --seeds 1 2 3 --jobs 2                 # all four tests, ~2 h on 2 cores
    python tests/learning_seeds.py --tests srpo flowsar --seeds 4 5 --out runs/learning_seeds
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.scripts import learning_run, only_run_metrics, sft_start  # noqa: E402

TESTS = ("srpo", "gae_ppo", "luffy", "flowsar")
# episodes behind each gain's two sides (start vs end), for the do-nothing update's binomial noise
NOISE_EPISODES = {("srpo", "sampled"): (160, 480), ("srpo", "practice"): (640, 640),
                  ("gae_ppo", "sampled"): (160, 320), ("gae_ppo", "practice"): (320, 320),
                  ("flowsar", "practice"): (640, 640)}


def one(name: str, seed: int, start: str, out: str) -> dict:
    """One seed of one test: its measures, computed from the run's metrics (a finished run in out/<name>_s<seed>,
    marked by its done.json, is read again instead of rerun, so a changed `measures` needs no new runs)."""
    mod = importlib.import_module(f"tests.test_learning_{name}")
    folder = os.path.join(out, f"{name}_s{seed}")
    done = os.path.join(folder, "done.json")
    if not os.path.exists(done):
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished run: start it again
        t0 = time.time()
        learning_run(mod.SCRIPT, mod.args(seed, start), folder)
        with open(done, "w") as f:
            json.dump({"minutes": (time.time() - t0) / 60}, f)
    with open(done) as f:
        minutes = json.load(f)["minutes"]
    m = {k: float(v) for k, v in mod.measures(only_run_metrics(folder)).items()}
    print(f"{name} seed {seed}: {json.dumps({k: round(v, 3) for k, v in m.items()})}", flush=True)
    return dict(m, minutes=minutes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", nargs="+", choices=TESTS, default=list(TESTS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "learning_seeds"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    mods = {n: importlib.import_module(f"tests.test_learning_{n}") for n in args.tests}
    kinds = sorted({m.START for m in mods.values() if m.START is not None})
    starts = {}
    for kind in kinds:  # the tests' SFT starts (deterministic: one per kind, shared by every seed)
        path = os.path.join(args.out, f"sft_{kind}", "policy")
        starts[kind] = path if os.path.exists(path) else sft_start(kind, os.path.join(args.out, f"sft_{kind}"))
        print(f"SFT start {kind}: {starts[kind]}", flush=True)
    jobs = [(n, s) for s in args.seeds for n in args.tests]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = dict(zip(jobs, pool.map(lambda j: one(j[0], j[1], starts.get(mods[j[0]].START), args.out), jobs)))
    for name in args.tests:
        mod, rows = mods[name], [results[(name, s)] for s in args.seeds]
        print(f"\n{name} ({mod.SCRIPT}, seeds {' '.join(map(str, args.seeds))}; "
              f"{np.mean([r['minutes'] for r in rows]):.1f} min per run)")
        print(f"  {'measure':<20} {'per seed':<30} {'mean':>7} {'sd':>7} {'mean-2sd':>9} {'bound':>7} {'noise sd':>9}")
        for key in rows[0]:
            if key == "minutes":
                continue
            v = np.array([r[key] for r in rows])
            sd = v.std(ddof=1) if len(v) > 1 else float("nan")
            bound = mod.BOUNDS.get(key)
            noise = ""
            if (name, key) in NOISE_EPISODES:
                p = np.mean([r["start"] for r in rows])
                n1, n2 = NOISE_EPISODES[(name, key)]
                noise = f"{np.sqrt(p * (1 - p) * (1 / n1 + 1 / n2)):.3f}"
            print(f"  {key:<20} {' '.join(f'{x:.3f}' for x in v):<30} {v.mean():7.3f} {sd:7.3f} "
                  f"{v.mean() - 2 * sd:9.3f} {'' if bound is None else bound:>7} {noise:>9}")


if __name__ == "__main__":
    main()
