"""Does RL make a policy more robust than its SFT start, and which algorithm helps most? (issue #32)

Trains (or, with --reuse, keeps) benchmarks/compare_algorithms.py's runs: per task one token and one flow SFT start
on the same demos, every algorithm from its start with the same env-step budget and seeds, in the same folder
(default runs/bench_compare_algorithms, so `compare_algorithms.py` runs already there are reused). Then evaluates
every SFT start and every run's final policy with `evaluate.py --suites robustness` on the held-out trials 30-49 of
the embedded suite and of its nine perturbed variants (one greedy episode per start; trial j of a variant is base
trial j perturbed), and tabulates greedy success per perturbation family, mean ± std over seeds (tasks averaged
within a seed; an SFT start is one policy per task, so it has no spread), the drop against the base suite, and the
change against the arm's own SFT start.

    python benchmarks/robustness.py --reuse        # 7 arms x 3 seeds, task 0, 200 k env steps, reusing finished runs
    python benchmarks/robustness.py --arms grpo srpo --seeds 1 2 3 --env-steps 100000
    python benchmarks/robustness.py --reuse --skip-training   # only evaluate what is there and redo the table

Writes plots/robustness.md (the tables, also printed) and plots/robustness.png (success per family, one bar per
policy, ± std over seeds); each policy's robustness.json (every episode's 0/1 result) under <out>/robustness/.
`--rl-overrides` (e.g. for a smoke test) is appended to every RL run's command line; --reuse does not check it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_algorithms as ca  # noqa: E402

ROOT = ca.ROOT
sys.path.insert(0, ROOT)
from common.child_runs import run_pool  # noqa: E402
from common.robustness import chart, per_seed, table  # noqa: E402
from common.tabletop_arms import ARMS, PRESETS  # noqa: E402


# ---- evaluation
def evaluate_checkpoint(name: str, path: str, task: int, args: argparse.Namespace) -> Optional[dict]:
    """`evaluate.py --suites robustness` on `path` (one task, held-out trials), its robustness.json (None if it
    failed). With --reuse, a result newer than the checkpoint and made with the same trials is kept."""
    out_dir = os.path.join(args.out, "robustness", name)
    result = os.path.join(out_dir, "robustness.json")
    trials = list(range(args.trial_start, args.trial_start + args.trials))
    if args.reuse and os.path.isfile(result) and os.path.getmtime(result) > newest_mtime(path):
        with open(result) as f:
            res = json.load(f)
        if res["trial_ids"] == trials and res["task_ids"] == [task]:
            return res
    os.makedirs(out_dir, exist_ok=True)
    cmd = [sys.executable, "evaluate.py", "--checkpoint", path, "--suites", "robustness", "--task-ids", str(task),
           "--trial-start", str(args.trial_start), "--trials", str(args.trials), "--gifs", str(args.gifs),
           "--num-envs", str(args.trials), "--out-dir", out_dir]
    code, wall = ca.sh(cmd, os.path.join(out_dir, "evaluate.log"))
    if code != 0 or not os.path.isfile(result):
        print(f"[robustness] {name}: evaluation failed; see {os.path.join(out_dir, 'evaluate.log')}", flush=True)
        return None
    print(f"[robustness] {name}: {wall:.0f} s", flush=True)
    with open(result) as f:
        return json.load(f)


def newest_mtime(path: str) -> float:
    """The newest modification time of any file under `path` (a new checkpoint makes old results stale)."""
    times = [os.path.getmtime(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files]
    return max(times, default=0.0)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, nargs="+", default=[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--env-steps", type=int, default=200_000, help="env-step budget of every RL run")
    p.add_argument("--arms", nargs="+", default=PRESETS["all"][1]["arms"], choices=list(ARMS))
    p.add_argument("--jobs", type=int, default=2, help="processes at a time (one thread each)")
    p.add_argument("--evals", type=int, default=5, help="evaluations per RL run aimed at (compare_algorithms.py)")
    p.add_argument("--eval-samples", type=int, default=0, help="compare_algorithms.py's --eval-samples")
    p.add_argument("--sft-overrides", nargs="+", default=[], help="extra train_sft.py overrides for both SFT starts")
    p.add_argument("--rl-overrides", nargs="+", default=[], help="extra overrides for every RL run (smoke tests)")
    p.add_argument("--reuse", action="store_true", help="keep SFT starts, finished runs and their evaluations")
    p.add_argument("--skip-training", action="store_true",
                   help="train nothing: evaluate the SFT starts and runs already in --out")
    p.add_argument("--trial-start", type=int, default=30, help="first held-out trial evaluated")
    p.add_argument("--trials", type=int, default=20, help="trials per task and suite")
    p.add_argument("--gifs", type=int, default=0, help="evaluate.py --gifs (episode GIFs per suite; 0 = none)")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_compare_algorithms"))
    p.add_argument("--plot", default=os.path.join(ROOT, "plots", "robustness.png"))
    p.set_defaults(iterations=0, eval_every=5, arm_args=None, overrides=[])  # compare_algorithms.py's budget runs
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    t_start = time.time()

    # 1. SFT starts and RL runs: compare_algorithms.py's (same starts, budget and seeds; --reuse keeps finished ones)
    types = sorted({ARMS[a][3] for a in args.arms})
    starts = [(ty, t) for t in args.tasks for ty in types]
    jobs = [(a, t, s) for a in args.arms for t in args.tasks for s in args.seeds]
    if args.skip_training:
        sft = {(ty, t): {"path": os.path.join(args.out, f"sft_{ty}_t{t}_policy")} for ty, t in starts}
        ok = {j for j in jobs if os.path.isdir(os.path.join(args.out, ca.run_name(*j), "checkpoints"))}
    else:
        sft = dict(zip(starts, run_pool(lambda ty, t: ca.make_sft(ty, t, args), starts, args.jobs, ca.AGAIN)))
        for (ty, t), info in sft.items():
            if not info["ok"]:
                sys.exit(f"error: the {ty} SFT start for task {t} failed; see {info['log']}")
        infos = run_pool(lambda a, t, s: ca.train_arm(a, t, s, sft[(ARMS[a][3], t)], args), jobs, args.jobs,
                         ca.AGAIN)
        ok = {j for j, info in zip(jobs, infos) if info["status"] == "ok"}
    t_train = time.time() - t_start

    # 2. robustness evaluation of every SFT start and every finished run's final policy
    evals = [(f"sft_{ty}_t{t}", sft[(ty, t)]["path"], t) for ty, t in starts if os.path.isdir(sft[(ty, t)]["path"])]
    evals += [(ca.run_name(*j), os.path.join(args.out, ca.run_name(*j)), j[1]) for j in jobs if j in ok]
    t_eval = time.time()
    results = dict(zip([e[0] for e in evals], run_pool(lambda n, path, t: evaluate_checkpoint(n, path, t, args),
                                                       evals, args.jobs, ca.AGAIN)))
    t_eval = time.time() - t_eval

    # 3. table and plot
    rows: Dict[str, Dict[str, List[float]]] = {}
    start_of: Dict[str, str] = {}
    for ty in types:
        found = {(t, 0): results[f"sft_{ty}_t{t}"] for t in args.tasks if results.get(f"sft_{ty}_t{t}")}
        if found:
            rows[f"SFT ({ty})"] = per_seed(found)
    for arm in args.arms:
        label, _, _, ty = ARMS[arm]
        found = {(t, s): results[ca.run_name(arm, t, s)] for a, t, s in jobs
                 if a == arm and results.get(ca.run_name(arm, t, s))}
        if found:
            rows[label] = per_seed(found)
            start_of[label] = f"SFT ({ty})"
    title = (f"tabletop task{'s' * (len(args.tasks) > 1)} {' '.join(map(str, args.tasks))}: SFT starts and RL at "
             f"{args.env_steps:,} env steps, trials {args.trial_start}-{args.trial_start + args.trials - 1}"
             f", mean ± std over seeds")
    chart(rows, title, args.plot)
    md_path = os.path.splitext(args.plot)[0] + ".md"
    text = "\n".join([
        f"# Robustness, {title}",
        "",
        f"`python benchmarks/robustness.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"Greedy success (%) on held-out trials {args.trial_start}-{args.trial_start + args.trials - 1} of the base "
        f"suite `tabletop` and of its perturbation families (language: tabletop_lan; task: tabletop_task; objects: "
        f"tabletop_object, tabletop_distractor; positions: tabletop_swap, tabletop_gripper; vision: tabletop_camera, "
        f"tabletop_light, tabletop_noise; a family pools its variants' episodes), mean ± std over seeds (tasks "
        f"averaged within a seed). The last two columns: all variants pooled minus the base suite (how much the "
        f"perturbations cost), and minus the row's SFT start (what RL changed under perturbation). Each RL run is "
        f"compare_algorithms.py's: same SFT start, same {args.env_steps:,} env-step budget. Per-episode results: "
        f"{os.path.relpath(os.path.join(args.out, 'robustness'), ROOT)}/*/robustness.json.",
        "",
        table(rows, start_of),
        "",
        f"Plot: {os.path.relpath(args.plot, ROOT)}. Training (or reuse) {t_train:.0f} s, robustness evaluation of "
        f"{len(evals)} policies {t_eval:.0f} s ({args.jobs} at a time, one thread each).",
    ])
    with open(md_path, "w") as f:
        f.write(text + "\n")
    print("\n" + text + f"\n\nwrote {os.path.relpath(args.plot, ROOT)} and {os.path.relpath(md_path, ROOT)}")


if __name__ == "__main__":
    main()
