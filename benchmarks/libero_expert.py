"""The scripted LIBERO expert (envs/libero_expert.py): its success per task, or demos recorded in LIBERO's HDF5 layout.

Success over LIBERO's fixed initial states (the evaluation trials; no camera is rendered, the expert reads the
simulator), one line per task and a markdown table at the end:
    python benchmarks/libero_expert.py --suite libero_object                 # all 10 tasks x 50 init states
    python benchmarks/libero_expert.py --suite libero_goal --task-ids 1 2 4 6 8 9 --trials 10

Demos: N successful episodes per task from the suite's *random* placements (LIBERO's own placement samplers, drawn
from placement seeds --seed, --seed + 1, ...; never the 50 evaluation states), both cameras at --image-size,
written to <out>/<suite>/<task name>_demo.hdf5, the layout of LIBERO's released demos (docs/libero.md):
    python benchmarks/libero_expert.py --record 50 --suite libero_object --task-ids 0 --out data/libero_demos/

Episodes run in --workers processes (default: 2, one per core of this machine).
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import json
import multiprocessing
import os
import sys
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

_WORKER: Dict[str, Any] = {}  # per process: the env and expert, kept across episodes (the scene is built per task)


def _worker_env(suite: str, task: int, image_size: int, cameras: bool, fast_render: bool):
    from envs import EnvConfig
    from envs.libero import LiberoEnv
    from envs.libero_expert import LiberoExpert

    key = (suite, image_size, cameras, fast_render)
    if _WORKER.get("key") != key:
        if "env" in _WORKER:
            _WORKER["env"].close()
        env = LiberoEnv(EnvConfig(suite=suite, task_ids=[task], image_size=image_size, fast_render=fast_render),
                        cameras=cameras)
        _WORKER.update(key=key, env=env, expert=LiberoExpert(env))
    return _WORKER["env"], _WORKER["expert"]


def evaluate_episode(suite: str, task: int, trial: int) -> Dict[str, Any]:
    """The expert from LIBERO's init state `trial` of `task`, no cameras."""
    from envs.libero_expert import run_episode

    env, expert = _worker_env(suite, task, 8, False, True)
    return {"task": task, "trial": trial, **run_episode(env, expert, {"task_id": task, "trial_id": trial})}


def record_episode(suite: str, task: int, seed: int, image_size: int, fast_render: bool, trial: bool = False
                   ) -> Dict[str, Any]:
    """The expert from the random placement drawn with `seed` (with `trial`: from the suite's init state number
    `seed`), recorded (both cameras); a success also carries the file's attributes and the scene's MJCF."""
    from envs.libero_expert import demo_file_attrs, run_episode

    env, expert = _worker_env(suite, task, image_size, True, fast_render)
    start = {"task_id": task, "trial_id": seed} if trial else {"task_id": task, "placement_seed": seed}
    out = run_episode(env, expert, start, record=True)
    out.update(task=task, seed=seed, task_name=env.task_names[task])
    if out["success"]:
        out["file_attrs"] = demo_file_attrs(env, {})
        out["model_file"] = env.raw_env.sim.model.get_xml()  # the scene's MJCF, as LIBERO's demos carry it
    else:
        out.pop("arrays")
    return out


def _pool(workers: int) -> Optional[futures.Executor]:
    if workers <= 1:
        return None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def evaluate(args: argparse.Namespace, task_ids: List[int], descriptions: List[str]) -> Dict[str, Any]:
    jobs = [(args.suite, t, j) for t in task_ids for j in range(args.trial_start, args.trial_start + args.trials)]
    results: Dict[int, List[Dict[str, Any]]] = {t: [] for t in task_ids}
    bar = tqdm(total=len(jobs), unit="ep", desc=f"expert on {args.suite}", dynamic_ncols=True)
    pool = _pool(args.workers)
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


def record(args: argparse.Namespace, task_ids: List[int]) -> None:
    """N successful demos per task, one file each; a file is written under a temporary name and renamed once
    complete (an interrupted task leaves none)."""
    pool = _pool(args.workers)
    per_task = args.trials if args.record_trials else args.record
    bar = tqdm(total=per_task * len(task_ids), unit="demo" if not args.record_trials else "trial", desc=f"recording {args.suite}", dynamic_ncols=True)
    t0 = time.time()
    try:
        for task in task_ids:
            writers: List[Any] = []
            try:
                attempts = _record_task(args, pool, task, bar, writers)
            except BaseException:
                for writer in writers:
                    writer.abort()
                raise
            path = writers[0].path
            tqdm.write(f"task {task}: {writers[0].num_demos} demos in {attempts} attempts "
                       f"({writers[0].num_demos / attempts:.0%}) -> "
                       f"{path} ({os.path.getsize(path) / 2**20:.1f} MiB); {(time.time() - t0) / 60:.1f} min so far")
    finally:
        bar.close()
        if pool:
            pool.shutdown(cancel_futures=True)
    minutes = (time.time() - t0) / 60
    print(f"recorded {per_task * len(task_ids)} {'init states' if args.record_trials else 'demos'} in "
          f"{minutes:.1f} min ({per_task * len(task_ids) / max(minutes, 1e-9):.2f}/min, {args.workers} workers)")


def _record_task(args: argparse.Namespace, pool: Optional[futures.Executor], task: int, bar: Any,
                 writers: List[Any]) -> int:
    """One task's file: demo i is the i-th success in seed order, whatever order the workers finish in (the same
    file every time); its writer goes into `writers` once it exists. -> episodes run."""
    from envs import EnvConfig
    from envs.libero_expert import DemoFileWriter

    if args.record_trials:
        return _record_trials(args, pool, task, bar, writers)
    pending: Dict[int, Any] = {}  # seed -> future
    finished: Dict[int, Dict[str, Any]] = {}  # seed -> result, not yet written
    next_seed, next_write, kept, attempts = args.seed, args.seed, 0, 0
    while kept < args.record:
        if attempts >= args.max_attempts:
            raise SystemExit(f"error: task {task}: only {kept} of {args.record} demos succeeded in {attempts} "
                             f"attempts (--max-attempts)")
        if pool:
            needed = args.record - kept - sum(r["success"] for r in finished.values())  # no episode to spare
            while len(pending) < min(args.workers, needed) and next_seed - args.seed < args.max_attempts:
                pending[next_seed] = pool.submit(record_episode, args.suite, task, next_seed, args.image_size,
                                                 args.fast_render)
                next_seed += 1
            done, _ = futures.wait(list(pending.values()), return_when=futures.FIRST_COMPLETED)
            for seed in [seed for seed, future in pending.items() if future in done]:
                finished[seed] = pending.pop(seed).result()
        else:
            finished[next_seed] = record_episode(args.suite, task, next_seed, args.image_size, args.fast_render)
            next_seed += 1
        while next_write in finished and kept < args.record:
            r = finished.pop(next_write)
            attempts, next_write = attempts + 1, next_write + 1
            if r["success"]:
                if not writers:
                    extra = {"recorder": "vla-rl scripted expert (envs/libero_expert.py)", "suite": args.suite,
                             "task_id": task, "image_size": args.image_size, "fast_render": args.fast_render,
                             "num_steps_wait": EnvConfig().num_steps_wait, "first_placement_seed": args.seed}
                    path = os.path.join(args.out, args.suite, f"{r['task_name']}_demo.hdf5")
                    writers.append(DemoFileWriter(path, {**r["file_attrs"], **extra}))
                writers[0].add(r["arrays"], {"placement_seed": r["seed"], "model_file": r["model_file"]})
                kept += 1
                bar.update(1)
            bar.set_postfix(task=task, attempts=attempts, kept=kept)
    for future in pending.values():
        future.cancel()
    writers[0].close()
    return attempts


def _record_trials(args: argparse.Namespace, pool: Optional[futures.Executor], task: int, bar: Any,
                   writers: List[Any]) -> int:
    """--record-trials: one attempt from each official init state --trial-start.. (e.g. RL's practice states 0..39,
    LUFFY's demonstrations of them), the successes written in trial order with their trial_id; a failure is named
    and skipped. -> episodes run."""
    from envs import EnvConfig
    from envs.libero_expert import DemoFileWriter

    trials = list(range(args.trial_start, args.trial_start + args.trials))
    jobs = [(args.suite, task, j, args.image_size, args.fast_render, True) for j in trials]
    results = list(pool.map(record_episode, *zip(*jobs))) if pool else [record_episode(*job) for job in jobs]
    failed = [j for j, r in zip(trials, results) if not r["success"]]
    for j, r in zip(trials, results):
        if r["success"]:
            if not writers:
                extra = {"recorder": "vla-rl scripted expert (envs/libero_expert.py)", "suite": args.suite,
                         "task_id": task, "image_size": args.image_size, "fast_render": args.fast_render,
                         "num_steps_wait": EnvConfig().num_steps_wait, "trials": [trials[0], trials[-1]]}
                path = os.path.join(args.out, args.suite, f"{r['task_name']}_demo.hdf5")
                writers.append(DemoFileWriter(path, {**r["file_attrs"], **extra}))
            writers[0].add(r["arrays"], {"trial_id": j, "model_file": r["model_file"]})
        bar.update(1)
    if not writers:
        raise SystemExit(f"error: task {task}: the expert failed from every init state {trials[0]}-{trials[-1]}")
    if failed:
        tqdm.write(f"task {task}: no demo from init states {failed} (the expert failed there)")
    writers[0].close()
    return len(trials)


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
            record(args, task_ids)
            return
        table = evaluate(args, task_ids, descriptions)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(table, f, indent=1)
    finally:  # episodes run here (--workers 1): close the simulator now, not while the interpreter tears EGL down
        if "env" in _WORKER:  # (robosuite's render context then printed "Exception ignored ... EGLError" tracebacks)
            _WORKER.pop("env").close()


if __name__ == "__main__":
    main()
