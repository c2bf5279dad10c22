"""Every training script on one plot (issue #18): the same tasks, seeds and env-step budget, each from its own SFT start
trained on the same demos, evaluated the same way on held-out trials 30-49.

Arms (shipped configs; only the keys named here change):
    srpo      SRPO            train_srpo.py (reward.mode=srpo: world-model progress reward for failures)
    grpo      GRPO            train_srpo.py reward.mode=binary
    drgrpo    Dr.GRPO         train_srpo.py reward.mode=binary algorithm.norm_adv_by_std_in_grpo=false
                              algorithm.loss_agg_mode=seq-mean-token-sum-norm (no std, no length normalisation)
    adv_grpo  Advanced GRPO   train_srpo.py reward.mode=binary algorithm.adv_estimator=advanced_grpo (the write-up takes
                              the environment's episode reward, here binary success, and normalises per token)
    gae_ppo   GAE-PPO         train_gae_ppo.py --timesteps <budget>
    flowsar   FlowSAR         train_flowsar.py (flow policy: starts from a flow SFT on the same demos)
    luffy     LUFFY           train_luffy.py
Starts: per task, one token SFT (shared by the six token arms) and one flow SFT, both `train_sft.py` with
configs/sft.yaml and the same `--sft-overrides` (so the same demos: same sft.num_demos from the same demo starts).
Budget: GAE-PPO stops on `--timesteps`; the others first run the iterations the budget allows at the longest possible
episodes, then are resumed (`--resume RUN train.iterations=...`, the same run continued) with the iterations the
measured env steps per iteration say are left, until the budget is reached; each stops within one iteration past it
and evaluates there (the table says how many env steps each run used). Evaluation: one greedy episode per held-out
trial (`val/success_rate`) at the start, every `eval.every` iterations (~5 evaluations per run) and at the end
(`--eval-samples 8` adds `val/sampled_success_rate`, at 9x the evaluation time). The flow SFT uses the same
sft.num_demos as the token SFT (configs/sft.yaml's 10), not the 20 that train_flowsar.py's own auto_sft uses.
Writes plots/compare_algorithms.png (mean over seeds, band = ± std over seeds, x = env steps) and
plots/compare_algorithms.md (the table, also printed). Runs `--jobs` training processes at a time, one thread each.

    python benchmarks/compare_algorithms.py                                     # 7 arms x 3 seeds, task 0, 200 k steps
    python benchmarks/compare_algorithms.py --seeds 1 --env-steps 30000 --arms grpo gae_ppo flowsar
    python benchmarks/compare_algorithms.py --reuse                             # re-read finished runs, redo the table
    python benchmarks/compare_algorithms.py --sft-overrides sft.num_demos=40 sft.steps=2500 --out runs/bench_cmp_strong
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.arms import curve, steps_to_reach  # noqa: E402
ARMS = {  # key -> (label, script, overrides, policy type)
    "srpo": ("SRPO", "train_srpo.py", [], "token"),
    "grpo": ("GRPO", "train_srpo.py", ["reward.mode=binary"], "token"),
    "drgrpo": ("Dr.GRPO", "train_srpo.py", ["reward.mode=binary", "algorithm.norm_adv_by_std_in_grpo=false",
               "algorithm.loss_agg_mode=seq-mean-token-sum-norm"], "token"),
    "adv_grpo": ("Advanced GRPO", "train_srpo.py", ["reward.mode=binary", "algorithm.adv_estimator=advanced_grpo"],
                 "token"),
    "gae_ppo": ("GAE-PPO", "train_gae_ppo.py", [], "token"),
    "flowsar": ("FlowSAR", "train_flowsar.py", [], "flow"),
    "luffy": ("LUFFY", "train_luffy.py", [], "token"),
}
METRIC = "val/success_rate"  # held-out greedy success (one episode per trial 30..49)
PHASES = {"rollout": ["time/rollout"], "reward": ["time/reward", "time/values", "time/annotation"],
          "update": ["time/update"]}  # reward: SRPO's reward, GAE-PPO's value pass, FlowSAR's self-annotation
TARGETS = (0.5, 0.9)
HOLD = 2  # a target counts as reached at the first of 2 evaluations in a row at or above it (one is +-0.15 noise)
LATE = 2 / 3  # "late mean": the mean of the evaluations from this fraction of the budget on
MAX_SEGMENTS = 6  # runs resumed at most this many times to reach the budget


# ---- launching
def episodes_per_iteration(script: str) -> int:
    """Episodes one iteration rolls out, from the script's shipped config (LUFFY's demos count: they are executed)."""
    with open(os.path.join(ROOT, "configs", script[len("train_"):-len(".py")] + ".yaml")) as f:
        r = yaml.safe_load(f)["rollout"]
    return int(r["prompts_per_iteration"] * r.get("n", 1))  # GAE-PPO: one episode per start


def max_episode_steps(task: int) -> int:
    from envs.tabletop import TASKS

    return int(TASKS[task][3])


def run_name(arm: str, task: int, seed: int) -> str:
    return f"{arm}_t{task}_s{seed}"


def read_rows(run_dir: str) -> List[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def sh(cmd: List[str], log_path: str) -> Tuple[int, float]:
    """Run `cmd` (one thread, output appended to log_path); (exit code, wall seconds)."""
    print("$ " + " ".join(["python"] + [os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:]]),
          flush=True)  # one string: two threads printing at once do not interleave it
    t0 = time.time()
    with open(log_path, "a") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env=dict(os.environ, OMP_NUM_THREADS="1", WANDB_SILENT="true")).returncode
    return code, time.time() - t0


def failure(script: str, log_path: str) -> str:
    """'missing' for a script that is absent or a placeholder that says so, else 'failed'."""
    if not os.path.isfile(os.path.join(ROOT, script)):
        return "missing"
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:].lower()
    return "missing" if "placeholder" in tail or "not implemented" in tail else "failed"


def run_pool(fn, jobs: List[tuple], workers: int) -> List:
    """[fn(*job) for job in jobs], `workers` at a time (threads that each wait on one subprocess). Ctrl-C reaches the
    running children too (they stop and exit); the jobs not started yet are dropped."""
    pool = ThreadPoolExecutor(workers)
    try:
        return list(pool.map(lambda job: fn(*job), jobs))
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        raise SystemExit("interrupted; run again with --reuse to keep the SFT starts and the finished runs") from None
    finally:
        pool.shutdown()


def make_sft(policy_type: str, task: int, args: argparse.Namespace) -> dict:
    """The SFT start of `policy_type` for `task` (train_sft.py, configs/sft.yaml + --sft-overrides)."""
    name = f"sft_{policy_type}_t{task}"
    path, info_path = os.path.join(args.out, name + "_policy"), os.path.join(args.out, "logs", name + ".json")
    cmd = [sys.executable, "train_sft.py", "--task-id", str(task), "--no-wandb",
           f"policy.type={policy_type}", f"sft.output_path={path}", f"log.output_dir={args.out}/sft_runs",
           f"log.run_name={name}", f"log.plots_dir={args.out}/plots", *args.sft_overrides]
    if args.reuse and os.path.isdir(path) and os.path.isfile(info_path):
        with open(info_path) as f:
            info = json.load(f)
        if info.get("ok") and info.get("cmd") == cmd[1:]:
            return info
        print(f"[reuse] {name}: made with other overrides (or failed); training it again", flush=True)
    if os.path.isfile(info_path):
        os.remove(info_path)  # an interrupted re-run must not pass for the finished one
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(os.path.join(args.out, "sft_runs", name), ignore_errors=True)
    log_path = os.path.join(args.out, "logs", name + ".log")
    open(log_path, "w").close()
    code, wall = sh(cmd, log_path)
    info = {"path": path, "wall_s": wall, "ok": code == 0 and os.path.isdir(path), "log": log_path, "cmd": cmd[1:],
            "finished": time.time()}
    with open(info_path, "w") as f:
        json.dump(info, f)
    return info


def train_arm(arm: str, task: int, seed: int, sft: dict, args: argparse.Namespace) -> dict:
    """One (arm, task, seed) run from the SFT start `sft` (make_sft's dict) up to the env-step budget; {'status',
    'wall_s', 'segments', ...} (also saved as JSON: --reuse keeps a finished run of the same start, budget and eval)."""
    label, script, overrides, _ = ARMS[arm]
    name = run_name(arm, task, seed)
    if not os.path.isfile(os.path.join(ROOT, script)):
        return {"status": "missing", "wall_s": 0.0, "segments": 0, "log": None}
    run_dir, info_path = os.path.join(args.out, name), os.path.join(args.out, "logs", name + ".json")
    same = {"budget": args.env_steps, "eval_samples": args.eval_samples, "evals": args.evals,
            "sft": sft.get("finished")}
    if args.reuse and os.path.isfile(info_path):
        with open(info_path) as f:
            info = json.load(f)
        if info["status"] == "ok" and all(info.get(k) == v for k, v in same.items()):
            return info
    if os.path.isfile(info_path):
        os.remove(info_path)  # an interrupted re-run must not pass for the finished one
    shutil.rmtree(run_dir, ignore_errors=True)
    log_path = os.path.join(args.out, "logs", name + ".log")
    open(log_path, "w").close()
    budget = args.env_steps
    iters = max(2, math.ceil(budget / (episodes_per_iteration(script) * max_episode_steps(task))))
    # ~args.evals evaluations (a few more, as episodes are shorter than the longest); >= 2 so that iteration 1's row
    # holds the start's evaluation alone (an evaluation after iteration 1 would overwrite it in that row)
    every = max(2, round(iters / args.evals))
    info = {"status": "ok", "wall_s": 0.0, "segments": 0, "log": log_path, **same}
    base = [sys.executable, script, "--task-id", str(task), "--seed", str(seed), "--no-wandb",
            "init.mode=checkpoint", f"init.path={sft['path']}", f"eval.every={every}", "eval.trial_start=30",
            "eval.trials_per_task=20", f"eval.samples_per_trial={args.eval_samples}", f"log.output_dir={args.out}",
            f"log.run_name={name}", f"log.plots_dir={args.out}/plots", "log.checkpoint_every=100000", *overrides]
    if script == "train_gae_ppo.py":  # stops on its own budget flag
        cmd = base + ["--timesteps", str(budget), f"train.iterations={100 * iters}"]
    else:
        cmd = base + [f"train.iterations={iters}"]
    while True:
        code, wall = sh(cmd, log_path)
        info["wall_s"] += wall
        info["segments"] += 1
        if code != 0:
            info["status"] = failure(script, log_path)
            break
        rows = read_rows(run_dir)
        done, steps = int(rows[-1]["iteration"]), float(rows[-1]["charts/env_steps"])
        if steps >= budget or script == "train_gae_ppo.py" or info["segments"] >= MAX_SEGMENTS:
            break
        more = math.ceil((budget - steps) / (steps / done))  # at the env steps per iteration measured so far
        cmd = [sys.executable, script, "--resume", run_dir, "--no-wandb",
               f"train.iterations={done + more}"]
    print(f"[{label} task {task} seed {seed}] {info['status']} in {info['wall_s']:.0f} s "
          f"({info['segments']} segment(s)); log {os.path.relpath(log_path, ROOT)}", flush=True)
    with open(info_path, "w") as f:
        json.dump(info, f)
    return info


# ---- aggregation (pure: unit-tested on fake rows in tests/test_compare_algorithms.py)
def eval_curve(rows: List[dict]) -> Tuple[np.ndarray, np.ndarray]:
    """(env steps, METRIC) at every evaluation; the start's evaluation is row 0, at 0 env steps."""
    return curve(rows, METRIC)


def steps_to(rows: List[dict], target: float) -> Optional[float]:
    """Env steps at the first of HOLD evaluations in a row with METRIC >= target (None if never)."""
    return steps_to_reach(rows, METRIC, target, hold=HOLD)


def late_mean(rows: List[dict], budget: float) -> Optional[float]:
    """Mean METRIC over the evaluations at >= LATE * budget env steps (None if there are none)."""
    xs, ys = eval_curve(rows)
    late = ys[xs >= LATE * budget]
    return float(late.mean()) if len(late) else None


def band(runs: Dict[Tuple[int, int], List[dict]], budget: float, points: int = 41):
    """(grid, mean, std, per-seed curves) of METRIC over env steps 0..budget: each run's evaluations interpolated onto
    the grid (held at its last value past its last evaluation), averaged over tasks within a seed, then mean and std
    over seeds."""
    grid = np.linspace(0.0, budget, points)
    by_seed: Dict[int, List[np.ndarray]] = {}
    for (task, seed), rows in sorted(runs.items()):
        xs, ys = eval_curve(rows)
        if len(xs):
            by_seed.setdefault(seed, []).append(np.interp(grid, xs, ys))
    seeds = np.array([np.mean(c, 0) for _, c in sorted(by_seed.items())])
    if not len(seeds):
        return grid, np.full(points, np.nan), np.full(points, np.nan), seeds
    return grid, seeds.mean(0), seeds.std(0), seeds


def mean_std(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    v = [x for x in values if x is not None and np.isfinite(x)]
    if not v:
        return "-"
    return fmt.format(np.mean(v)) + (" ± " + fmt.format(np.std(v)) if len(v) > 1 else "")


def per_seed(runs: Dict[Tuple[int, int], List[dict]], value) -> List[float]:
    """value(rows) averaged over tasks within each seed (one number per seed)."""
    out: Dict[int, List[float]] = {}
    for (task, seed), rows in runs.items():
        v = value(rows)
        if v is not None:
            out.setdefault(seed, []).append(v)
    return [float(np.mean(v)) for _, v in sorted(out.items())]


def kilo(x: float) -> str:
    return f"{x / 1000:.1f} k"


def summarize(runs: Dict[Tuple[int, int], List[dict]], walls: Dict[Tuple[int, int], float],
              budget: float) -> Dict[str, str]:
    """The table cells of one algorithm from its runs' metric rows ((task, seed) -> rows), wall seconds and budget."""
    def evals(rows):
        return eval_curve(rows)[1]

    seeds = sorted({s for _, s in runs})
    cells = {"seeds": " ".join(str(s) for s in seeds),
             "env steps used": mean_std(per_seed(runs, lambda r: r[-1].get("charts/env_steps")), "{:,.0f}"),
             "start": mean_std(per_seed(runs, lambda r: evals(r)[0] if len(evals(r)) else None)),
             "at budget": mean_std(per_seed(runs, lambda r: evals(r)[-1] if len(evals(r)) else None)),
             "late mean": mean_std(per_seed(runs, lambda r: late_mean(r, budget)))}
    for target in TARGETS:
        reach = [steps_to(rows, target) for rows in runs.values()]
        hit = [r for r in reach if r is not None]
        cells[f"to {target:.0%}"] = (f"{kilo(float(np.mean(hit)))} ({len(hit)}/{len(reach)} runs)" if hit
                                     else "not reached")
    rows = [r for run_rows in runs.values() for r in run_rows]
    iters = max(1, sum(int(r[-1]["iteration"]) for r in runs.values()))
    for phase, keys in PHASES.items():
        vals = [r[k] for r in rows for k in keys if r.get(k) is not None]
        cells[phase] = f"{np.mean(vals):.2f}" if vals else "-"
    eval_total = sum(r.get("time/eval") or 0.0 for r in rows)
    cells["eval"] = f"{eval_total / iters:.2f}"
    cells["iterations"] = mean_std([r[-1]["iteration"] for r in runs.values()], "{:.0f}")
    cells["total wall"] = mean_std(list(walls.values()), "{:.0f} s")
    return cells


COLUMNS = ["algorithm", "seeds", "iterations", "env steps used", "start", "at budget", "late mean", "to 50%", "to 90%",
           "rollout", "reward", "update", "eval", "total wall"]


def markdown_table(rows: Dict[str, Dict[str, str]]) -> str:
    head = ["algorithm", "seeds", "iterations", "env steps used", "held-out greedy at start",
            "held-out greedy at budget", "mean of the evaluations from 2/3 of the budget on",
            f"env steps to 50% ({HOLD} evaluations in a row)", "env steps to 90%", "rollout s/it", "reward s/it",
            "update s/it", "eval s/it", "wall per run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in rows.items():
        lines.append("| " + " | ".join([label] + [cells.get(c, "") for c in COLUMNS[1:]]) + " |")
    return "\n".join(lines)


def plot(bands: Dict[str, tuple], evals: Dict[str, List[Tuple[np.ndarray, np.ndarray]]], budget: float, title: str,
         path: str) -> None:
    """Mean line and ± std band per algorithm (`band`'s output, up to the budget), with every run's evaluations as
    dots (the last ones a little past the budget: a run stops at the end of the iteration that reaches it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (label, (grid, mean, std, seeds)), color in zip(bands.items(), plt.cm.tab10.colors):
        if not len(seeds):
            continue
        ax.plot(grid, mean, color=color, lw=2, label=f"{label} ({len(seeds)} seed{'s' * (len(seeds) > 1)})")
        ax.fill_between(grid, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1), color=color, alpha=0.15, lw=0)
        for xs, ys in evals.get(label, []):
            ax.plot(xs, ys, "o", color=color, alpha=0.6, ms=4, mew=0)
    for target in TARGETS:
        ax.axhline(target, color="gray", ls="--", lw=0.8)
    ax.set_xlim(0, max([budget] + [float(xs.max()) for runs in evals.values() for xs, _ in runs if len(xs)]))
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("held-out greedy success (trials 30-49)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, nargs="+", default=[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--env-steps", type=int, default=200_000, help="env-step budget of every run")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    p.add_argument("--jobs", type=int, default=2, help="training processes at a time (one thread each)")
    p.add_argument("--evals", type=int, default=5, help="evaluations per run aimed at (sets eval.every)")
    p.add_argument("--eval-samples", type=int, default=0,
                   help="eval.samples_per_trial: sampled held-out episodes per trial besides the greedy one")
    p.add_argument("--sft-overrides", nargs="+", default=[], help="extra train_sft.py overrides for both SFT starts")
    p.add_argument("--reuse", action="store_true", help="keep SFT starts and finished runs; rerun only the others")
    p.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_compare_algorithms"))
    p.add_argument("--plot", default=os.path.join(ROOT, "plots", "compare_algorithms.png"))
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    t_start = time.time()

    # 1. SFT starts: one token and/or one flow policy per task, on the same demos
    types = sorted({ARMS[a][3] for a in args.arms})
    starts = [(ty, t) for t in args.tasks for ty in types]
    sft = dict(zip(starts, run_pool(lambda ty, t: make_sft(ty, t, args), starts, args.jobs)))
    for (ty, t), info in sft.items():
        if not info["ok"]:
            sys.exit(f"error: the {ty} SFT start for task {t} failed; see {info['log']}")

    # 2. every (arm, task, seed) run, args.jobs at a time
    jobs = [(a, t, s) for a in args.arms for t in args.tasks for s in args.seeds]
    infos = dict(zip(jobs, run_pool(lambda a, t, s: train_arm(a, t, s, sft[(ARMS[a][3], t)], args), jobs, args.jobs)))

    # 3. table and plot
    table, bands, points = {}, {}, {}
    for arm in args.arms:
        label = ARMS[arm][0]
        done = {(t, s): read_rows(os.path.join(args.out, run_name(arm, t, s))) for a, t, s in jobs
                if a == arm and infos[(a, t, s)]["status"] == "ok"}
        bad = sorted({infos[j]["status"] for j in jobs if j[0] == arm} - {"ok"})
        if not done:
            table[label] = {"seeds": " / ".join(bad)}
            continue
        walls = {(t, s): infos[(arm, t, s)]["wall_s"] for t, s in done}
        table[label] = summarize(done, walls, args.env_steps)
        if bad:
            table[label]["seeds"] += f" ({' / '.join(bad)}: {len(jobs) // len(args.arms) - len(done)} runs)"
        bands[label] = band(done, args.env_steps)
        points[label] = [eval_curve(rows) for rows in done.values()]
    title = (f"tabletop task{'s' * (len(args.tasks) > 1)} {' '.join(map(str, args.tasks))}, "
             f"{args.env_steps / 1000:.0f} k env steps, mean ± std over seeds")
    plot(bands, points, args.env_steps, title, args.plot)

    sft_walls = ", ".join(f"{ty} task {t} {info['wall_s']:.0f} s" for (ty, t), info in sft.items())
    md_path = os.path.splitext(args.plot)[0] + ".md"
    text = "\n".join([
        f"# All algorithms, {title}",
        "",
        f"`python benchmarks/compare_algorithms.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"Held-out greedy success (`{METRIC}`, one episode per trial 30-49): the first evaluation (the SFT start) and "
        f"the last (at the budget), mean ± std over seeds (tasks averaged within a seed), and the mean of the "
        f"evaluations from {LATE:.2f} of the budget on (less noisy than one evaluation of 20 trials). Env steps to "
        f"50% / 90%: mean over the runs that reached it, at the first of {HOLD} evaluations in a row at or above it "
        f"(how many did). Seconds per iteration by phase, mean over iterations (reward = SRPO's progress reward, "
        f"GAE-PPO's value pass, FlowSAR's self-annotation; LUFFY's demos are in its rollout); eval = all evaluations' "
        f"seconds / iterations. Wall per run: mean over runs, one thread "
        f"each, {args.jobs} at a time. SFT starts (train_sft.py configs/sft.yaml"
        f"{' ' + ' '.join(args.sft_overrides) if args.sft_overrides else ''}): {sft_walls}.",
        "",
        markdown_table(table),
        "",
        f"Plot: {os.path.relpath(args.plot, ROOT)}; runs and logs: {os.path.relpath(args.out, ROOT)}/; "
        f"{time.time() - t_start:.0f} s for this invocation.",
    ])
    with open(md_path, "w") as f:
        f.write(text + "\n")
    print("\n" + text + f"\n\nwrote {os.path.relpath(args.plot, ROOT)} and {os.path.relpath(md_path, ROOT)}")


if __name__ == "__main__":
    main()
