"""Does the embedded SRPO default hold what it learns? `train_srpo.py --task-id N --seed S` with its defaults on each
tabletop task (each from its own auto_sft start), then one row per task: practice success over the first and the last
10 iterations, held-out greedy at the start, its best and the mean of the last three evaluations, held-out sampled
success (start -> mean of the last three), token entropy over the first and the last 10 iterations, env steps, wall;
then the SFT start and each final policy on --heldout-set (200) held-out states, paired (evaluate.py --paired).
The two checks of issue 56: practice success does not fall (last 10 >= first 10), and the mean of the last three
held-out greedy evaluations is within 0.1 of the run's best.
Results: docs/results.md#does-the-embedded-default-hold-what-it-learns.

    python benchmarks/tabletop_default.py --tasks 0 1 2 3 4 5 6 7 8 9 --jobs 2     # ~3 h on 2 cores
    python benchmarks/tabletop_default.py --tasks 5 --set algorithm.loss_agg_mode=token-mean --out runs/td_token_mean

Runs go to <out>/t<task>_s<seed> (one thread each, `--jobs` at a time); a finished run (its done.json) is read
again instead of rerun, an unfinished one continues from its newest checkpoint (one without a checkpoint starts
again), and a run another job still holds is refused in one line. `--set` passes overrides to every run (a variant);
a folder whose run has another recipe (an older default, another --set) is refused in one line, never read as this one.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time
from typing import Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.arms import pairs_table, plateau_measures, plateau_table  # noqa: E402
from common.child_runs import ONE_THREAD, newest_resumable, only_run, run_logged, run_pool  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402


def srpo_rows(folder: str) -> List[dict]:
    """The SRPO run's metrics rows (an auto_sft start made by the run has its own folder beside it)."""
    return read_rows(only_run(os.path.join(folder, "runs"), "srpo__"))


RECIPE = ("env", "rollout", "reward", "algorithm", "train", "eval")  # what a run's folder must share with the command
# (policy and init: the auto_sft start resolves them; log: the folder itself)


def recipe_mismatch(run_dir: str, task: int, seed: int, overrides: Sequence[str]) -> List[str]:
    """The recipe keys (RECIPE) on which the run in `run_dir` (its config.yaml) differs from what `train_srpo.py
    --task-id task --seed seed *overrides` gives now, as `key=saved (now: value)`: a folder left by an older default
    (the constant step before cosine) or by another --set."""
    import train_srpo
    from common.config import flatten_config, load_config, parse_cli

    now = flatten_config(parse_cli(train_srpo.Config, "configs/srpo.yaml",
                                   argv=["--task-id", str(task), "--seed", str(seed), "--no-wandb", *overrides]))
    saved = flatten_config(load_config(train_srpo.Config, os.path.join(run_dir, "config.yaml")))
    return [f"{k}={saved[k]} (now: {now[k]})" for k in sorted(now) if k.split(".")[0] in RECIPE and now[k] != saved[k]]


def refuse_other_recipe(folder: str, task: int, seed: int, overrides: Sequence[str]) -> None:
    """Exits in one line when a run already in `folder` was made with another recipe than this command's: reading
    it (done) or continuing it (stopped) would report an old recipe under the current one's name."""
    for run_dir in sorted(glob.glob(os.path.join(folder, "runs", "srpo__*"))):
        if not os.path.exists(os.path.join(run_dir, "config.yaml")):  # stopped before it saved anything: restarted
            continue
        diff = recipe_mismatch(run_dir, task, seed, overrides)
        if diff:
            raise SystemExit(f"error: {run_dir} ran another recipe than this command's: {'; '.join(diff)}: give "
                             f"another --out (or --set the saved values to read it)")


def stopped_or_restart(folder: str, task: int, seed: int):
    """An unfinished run in `folder`: the SRPO run to continue (the newest with a complete checkpoint), else None;
    the others (older, or without a checkpoint) are removed. Exits in one line when a job still holds a run's lock:
    a live run is never deleted or run twice."""
    from common.run_folder import lock_run_dir
    from base.config_fields import ConfigError

    runs = sorted(glob.glob(os.path.join(folder, "runs", "srpo__*")))
    for run_dir in runs:
        try:
            lock_run_dir(run_dir, f"task {task} seed {seed}").release()
        except ConfigError as e:
            raise SystemExit(f"error: {e}") from None
    keep = newest_resumable(os.path.join(folder, "runs"), "srpo__")
    for run_dir in runs:
        if run_dir != keep:  # older or checkpoint-less runs: srpo_rows reads the one run left
            shutil.rmtree(run_dir)
    return keep


def one(task: int, seed: int, overrides: Sequence[str], out: str) -> Dict[str, float]:
    folder = os.path.join(out, f"t{task}_s{seed}")
    done = os.path.join(folder, "done.json")
    refuse_other_recipe(folder, task, seed, overrides)
    if not os.path.exists(done):
        os.makedirs(folder, exist_ok=True)
        stopped = stopped_or_restart(folder, task, seed)
        t0 = time.time()
        cmd = ([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", stopped, "--no-wandb"] if stopped else
               [sys.executable, os.path.join(ROOT, "train_srpo.py"), "--task-id", str(task), "--seed", str(seed),
                "--no-wandb", f"log.output_dir={folder}/runs", f"log.plots_dir={folder}/plots", *overrides])
        rc, _ = run_logged(cmd, os.path.join(folder, "log.txt"), ONE_THREAD, append=True)
        if rc != 0:
            raise SystemExit(f"task {task} seed {seed} failed (exit {rc}): see {folder}/log.txt"
                             + ("; run this again to continue it" if rc == 130 else ""))
        with open(done, "w") as f:
            json.dump({"minutes": (time.time() - t0) / 60, "overrides": list(overrides),
                       "resumed": bool(stopped)}, f)
    with open(done) as f:
        minutes = json.load(f)["minutes"]
    m = dict(plateau_measures(srpo_rows(folder)), minutes=minutes)
    print(f"task {task} seed {seed}: {json.dumps({k: round(v, 3) for k, v in m.items()})}", flush=True)
    return m


def end_vs_start(folder: str, task: int, states: int) -> Dict[str, Dict]:
    """The SFT start and the run's final policy on `states` held-out states of the task (its never-practised trials
    30..49 plus states drawn from the suite's placements; greedy, and sampled at the run's temperature, with
    `evaluate.py --heldout-set --paired`): per decoding its paired record, the start (mean_a), the end (mean_b) and
    end - start (diff) with its paired bootstrap 95% interval (low, high). Far more episodes than the in-run
    evaluations (20 greedy), so a fall from the start or a lift shows beyond their noise. Kept in
    <folder>/heldout<states>/ and read again."""
    import yaml

    run = only_run(os.path.join(folder, "runs"), "srpo__")
    with open(os.path.join(run, "config.yaml")) as f:
        start = yaml.safe_load(f)["init"]["path"] or os.path.join("checkpoints", f"sft_tabletop_task{task}")
    out = os.path.join(folder, f"heldout{states}")
    flags = ["--heldout-set", str(states), "--trial-start", "30", "--trials", "20", "--sampled", "--gifs", "0",
             "--heldout-file", os.path.join(out, "heldout_set.json")]
    steps = (("start", [start], os.path.join(out, "start", "outcomes.json")),
             ("end", [run, "--paired", os.path.join(out, "start", "outcomes.json")],
              os.path.join(out, "end", "paired.json")))
    for name, what, made in steps:
        if not os.path.isfile(made):
            os.makedirs(out, exist_ok=True)
            cmd = [sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", *what, *flags, "--out-dir",
                   os.path.join(out, name)]
            if run_logged(cmd, os.path.join(out, f"{name}.log"), ONE_THREAD)[0]:
                raise SystemExit(f"task {task}: the held-out evaluation failed: see {out}/{name}.log")
    with open(os.path.join(out, "end", "paired.json")) as f:
        paired = json.load(f)
    return {m: paired[m] for m in ("greedy", "sampled")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", type=int, default=list(range(10)))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run (a variant)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "tabletop_default"))
    ap.add_argument("--heldout-set", type=int, default=200, metavar="N",
                    help="then the SFT start and each final policy on N held-out states, paired (0: skip)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tasks = [(t,) for t in args.tasks]
    rows = run_pool(lambda t: one(t, args.seed, args.set, args.out), tasks, args.jobs, "run this again to continue")
    ends = run_pool(lambda t: end_vs_start(os.path.join(args.out, f"t{t}_s{args.seed}"), t, args.heldout_set), tasks,
                    args.jobs, "run this again to continue") if args.heldout_set else []
    print(f"\ntrain_srpo.py defaults{' + ' + ' '.join(args.set) if args.set else ''}, seed {args.seed}")
    print("\n".join(plateau_table(args.tasks, rows)))
    if ends:
        print(f"\nThe SFT start and the final policy on {args.heldout_set} held-out states (trials 30-49 and drawn "
              f"ones), paired: start -> end, end - start [95% CI]")
        print("\n".join(pairs_table(args.tasks, ends)))


if __name__ == "__main__":
    main()
