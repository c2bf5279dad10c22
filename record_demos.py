"""Demos from the scripted LIBERO expert (envs/libero_expert.py), recorded in LIBERO's HDF5 layout for train_sft.py
and train_luffy.py; without --record, the expert's success per task (which tasks and init states it can record).

Demos: N successful episodes per task from the suite's *random* placements (LIBERO's own placement samplers, drawn
from placement seeds --seed, --seed + 1, ...; never the 50 evaluation states), both cameras at --image-size,
written to <out>/<suite>/<task name>_demo.hdf5, the layout of LIBERO's released demos (docs/libero.md):
    python record_demos.py --record 50 --suite libero_object --task-ids 0 --out data/libero_demos/
One demo from each official init state --trial-start..+--trials instead (LUFFY's practice states 0..39):
    python record_demos.py --record-trials --trial-start 0 --trials 40 --suite libero_object --task-ids 0

Success over LIBERO's fixed initial states (the evaluation trials; no camera is rendered, the expert reads the
simulator), one line per task and a markdown table at the end:
    python record_demos.py --suite libero_object                 # all 10 tasks x 50 init states
    python record_demos.py --suite libero_goal --task-ids 1 2 4 6 8 9 --trials 10

Episodes run in --workers processes (default: 2, one per core of this machine); the workers and the recording are
envs/libero_expert.py's (evaluate_episode, record_demos), this file is their command line and the success table.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
from typing import Any, Dict, List, Optional

import numpy as np
from tqdm import tqdm

from envs.libero_expert import close_worker_env, evaluate_episode, expert_pool, record_demos


def evaluate(args: argparse.Namespace, task_ids: List[int], descriptions: List[str]) -> Dict[str, Any]:
    jobs = [(args.suite, t, j) for t in task_ids for j in range(args.trial_start, args.trial_start + args.trials)]
    results: Dict[int, List[Dict[str, Any]]] = {t: [] for t in task_ids}
    bar = tqdm(total=len(jobs), unit="ep", desc=f"expert on {args.suite}", dynamic_ncols=True)
    pool = expert_pool(args.workers)
    done = (pool.submit(evaluate_episode, *job) for job in jobs) if pool else (evaluate_episode(*job) for job in jobs)
    try:
        for item in (futures.as_completed(list(done)) if pool else done):
            r = item.result() if pool else item
            results[r["task"]].append(r)
            bar.update(1)
            rows = [x for rs in results.values() for x in rs]
            bar.set_postfix(success=f"{np.mean([x['success'] for x in rows]):.2f}")
            if len(results[r["task"]]) == args.trials:
                rs = sorted(results[r["task"]], key=lambda x: x["trial"])
                failed = [(x["trial"], x["phase"]) for x in rs if not x["success"]]
                tqdm.write(f"task {r['task']}: {sum(x['success'] for x in rs)}/{len(rs)} "
                           f"mean steps {np.mean([x['steps'] for x in rs if x['success']] or [0]):.0f}"
                           + (f" failed (trial, phase): {failed}" if failed else ""))
    finally:
        bar.close()
        if pool:
            pool.shutdown()
    table = {"suite": args.suite, "trials": [args.trial_start, args.trial_start + args.trials - 1], "tasks": []}
    print(f"\n| task | instruction | success ({args.trials} init states) | mean steps (successes) | regrasps |")
    print("|---|---|---|---|---|")
    for t in task_ids:
        rs = sorted(results[t], key=lambda x: x["trial"])
        ok = [x for x in rs if x["success"]]
        row = {"task_id": t, "instruction": descriptions[t], "success": len(ok) / len(rs),
               "mean_steps": float(np.mean([x["steps"] for x in ok])) if ok else None,
               "regrasps": int(sum(x["regrasps"] for x in rs)),
               "failed": [{"trial": x["trial"], "phase": x["phase"]} for x in rs if not x["success"]]}
        table["tasks"].append(row)
        steps = f"{row['mean_steps']:.0f}" if ok else "-"
        print(f"| {t} | {descriptions[t]} | {len(ok)}/{len(rs)} ({row['success']:.0%}) | {steps} | {row['regrasps']} |")
    mean = float(np.mean([r["success"] for r in table["tasks"]]))
    table["mean_success"] = mean
    print(f"| all | | {mean:.1%} | | |")
    return table


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default="libero_object", help="libero_object | libero_spatial | libero_goal")
    parser.add_argument("--task-ids", type=int, nargs="+", default=None, help="default: every task the expert handles")
    parser.add_argument("--trials", type=int, default=50, help="init states per task (evaluation)")
    parser.add_argument("--trial-start", type=int, default=0, help="first init state (evaluation)")
    parser.add_argument("--workers", type=int, default=2, help="episode processes")
    parser.add_argument("--json", default=None, help="write the evaluation table as JSON here")
    parser.add_argument("--record", type=int, default=0, help="record this many successful demos per task")
    parser.add_argument("--record-trials", action="store_true",
                        help="record one demo from each official init state --trial-start..+--trials (e.g. RL's "
                             "practice states 0..39 for LUFFY) instead of --record N random placements")
    parser.add_argument("--out", default="data/libero_demos", help="demo folder (a <suite>/ folder is made in it)")
    parser.add_argument("--image-size", type=int, default=128, help="camera size of recorded demos (px)")
    parser.add_argument("--fast-render", type=int, default=1, choices=(0, 1),
                        help="1: MSAA and reflections off, as configs/sft_libero.yaml evaluates (record what you "
                             "evaluate with)")
    parser.add_argument("--seed", type=int, default=1000, help="first placement seed of the recorded demos")
    parser.add_argument("--max-attempts", type=int, default=None, help="give up a task after this many episodes "
                                                                      "(default 3 x --record)")
    args = parser.parse_args(argv)
    args.fast_render = bool(args.fast_render)
    args.max_attempts = args.max_attempts or 3 * max(args.record, 1)

    from envs import EnvConfig
    from envs.libero import libero_benchmark, check_config, import_libero, task_descriptions

    try:
        check_config(EnvConfig(suite=args.suite, task_ids=args.task_ids or [0], image_size=args.image_size))
    except ValueError as e:
        raise SystemExit(f"error: {e}")
    import_libero("egl")
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    from envs.libero_expert import unhandled_reason

    bench = libero_benchmark(args.suite)
    descriptions = list(task_descriptions(args.suite))
    reasons = [unhandled_reason(robosuite_parse_problem(bench.get_task_bddl_file_path(t)))
               for t in range(len(descriptions))]
    handled = [t for t, r in enumerate(reasons) if r is None]
    task_ids = args.task_ids if args.task_ids is not None else handled
    for t in task_ids:
        if reasons[t]:
            raise SystemExit(f"error: the scripted expert cannot do task {t} of {args.suite} ('{descriptions[t]}'): "
                             f"{reasons[t]}; it does tasks {handled}")
    try:
        if args.record or args.record_trials:
            trials = range(args.trial_start, args.trial_start + args.trials) if args.record_trials else None
            record_demos(args.suite, task_ids, args.out, args.image_size, args.fast_render, args.workers,
                         count=args.record, seed=args.seed, max_attempts=args.max_attempts, trials=trials)
            return
        table = evaluate(args, task_ids, descriptions)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(table, f, indent=1)
    finally:  # episodes run here (--workers 1): close the simulator now
        close_worker_env()


if __name__ == "__main__":
    main()
