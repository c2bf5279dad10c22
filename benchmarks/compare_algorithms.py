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
plots/compare_algorithms.md (the table, also printed; before it each run's evaluations and env steps to each target).
Runs `--jobs` training processes at a time, one thread each.

Presets (`--preset`, its arms and settings as the defaults; any flag still overrides them): the two-arm comparisons
that had scripts of their own, each at its own fixed `--iterations` (no env-step budget; `--eval-every`):
    srpo-vs-grpo      srpo, grpo from configs/sft.yaml's start; 60 iterations, evaluations every 5 with 8 sampled
                      episodes per trial, `--metric val/sampled_success_rate`, seed 1
    luffy-vs-grpo     luffy, grpo_unfiltered (rollout.n=8 on-policy, no filter), sft (300 more SFT steps on the same
                      10 demos from the start: one evaluation, no env steps), rl_sft (PPO on rollouts + NLL of demos),
                      from a very weak SFT (1 demo, 300 steps); RL arms practise on trials 0-9, 8 prompts x 8, episodes
                      cut at 60 steps; 30 iterations, 4 sampled episodes per trial, seeds 1 2
    flowsar-ablation  flowsar_base (the write-up's quickstart: softplus_kl, mse energy, linear EMA) and one key changed
                      each (flowsar_mse_branch, flowsar_sde, flowsar_fixed_ema) plus flowsar_shipped (mse_branch + fixed
                      EMA); every arm sets all three keys; from configs/flowsar.yaml's auto-SFT start (20 demos, no
                      DrQ); 40 iterations, greedy evaluations, seed 1

    python benchmarks/compare_algorithms.py                                     # 7 arms x 3 seeds, task 0, 200 k steps
    python benchmarks/compare_algorithms.py --seeds 1 --env-steps 30000 --arms grpo gae_ppo flowsar
    python benchmarks/compare_algorithms.py --reuse                             # re-read finished runs, redo the table
    python benchmarks/compare_algorithms.py --sft-overrides sft.num_demos=40 sft.steps=2500 --out runs/bench_cmp_strong
    python benchmarks/compare_algorithms.py --preset srpo-vs-grpo --seeds 1 2 --start PATH -- rollout.n=8
    python benchmarks/compare_algorithms.py --preset srpo-vs-grpo --arm-args srpo algorithm.accuracy_lower_bound=0
    python benchmarks/compare_algorithms.py --preset flowsar-ablation --arms flowsar_base flowsar_sde --iterations 10
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.child_runs import ONE_THREAD, run_logged, run_pool  # noqa: E402
from common.tabletop_arms import ARMS, PRESETS, episodes_per_iteration, max_episode_steps  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402
from common.curves import (HOLD, LAST, LATE, METRIC, PRACTICE, TARGETS, band, eval_curve,  # noqa: E402
                           markdown_table, ratio_lines, run_lines, summarize)

MAX_SEGMENTS = 6  # runs resumed at most this many times to reach the budget
AGAIN = "run again with --reuse to keep the SFT starts and the finished runs"  # after Ctrl-C


# ---- launching
def run_name(arm: str, task: int, seed: int) -> str:
    return f"{arm}_t{task}_s{seed}"


def sh(cmd: List[str], log_path: str) -> Tuple[int, float]:
    """Run `cmd` (one thread, output appended to log_path); (exit code, wall seconds)."""
    print("$ " + " ".join(["python"] + [os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:]]),
          flush=True)  # one string: two threads printing at once do not interleave it
    return run_logged(cmd, log_path, ONE_THREAD, append=True)


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
    """One (arm, task, seed) run from the SFT start `sft` (make_sft's dict) up to the env-step budget, or for
    --iterations; {'status', 'wall_s', 'segments', ...} (also saved as JSON: --reuse keeps a finished run of the same
    start, budget, evaluation and overrides)."""
    label, script, overrides, _ = ARMS[arm]
    overrides = [*overrides, *[kv for given in args.arm_args or [] if given[0] == arm for kv in given[1:]]]
    if script != "train_sft.py":
        overrides += [*args.rl_overrides, *args.overrides]  # the preset's and the command's, for every RL arm
    name = run_name(arm, task, seed)
    run_dir, info_path = os.path.join(args.out, name), os.path.join(args.out, "logs", name + ".json")
    same = {"budget": args.env_steps, "eval_samples": args.eval_samples, "evals": args.evals,
            "sft": sft.get("finished"), "iterations": args.iterations,
            "eval_every": args.eval_every if args.iterations else None, "overrides": overrides}
    if args.reuse and os.path.isfile(info_path):
        with open(info_path) as f:
            info = json.load(f)
        before = {"iterations": 0, "eval_every": None, "overrides": overrides}  # records from before these keys
        if info["status"] == "ok" and all(info.get(k, before.get(k)) == v for k, v in same.items()):
            return info
    if os.path.isfile(info_path):
        os.remove(info_path)  # an interrupted re-run must not pass for the finished one
    for folder in (run_dir, run_dir + "_policy"):  # the run; an SFT arm's exported policy
        shutil.rmtree(folder, ignore_errors=True)
    log_path = os.path.join(args.out, "logs", name + ".log")
    open(log_path, "w").close()
    budget = args.env_steps
    iters = args.iterations or max(2, math.ceil(budget / (episodes_per_iteration(script) * max_episode_steps(task))))
    # ~args.evals evaluations (a few more, as episodes are shorter than the longest); >= 2 so that iteration 1's row
    # holds the start's evaluation alone (an evaluation after iteration 1 would overwrite it in that row)
    every = args.eval_every if args.iterations else max(2, round(iters / args.evals))
    info = {"status": "ok", "wall_s": 0.0, "segments": 0, "log": log_path, **same}
    logs = [f"log.output_dir={args.out}", f"log.run_name={name}", f"log.plots_dir={args.out}/plots"]
    if script == "train_sft.py":  # more SFT from the start: one evaluation, at its end
        cmd = [sys.executable, script, "--task-id", str(task), "--seed", str(seed), "--no-wandb",
               f"policy.init_path={sft['path']}", f"sft.output_path={run_dir}_policy", *logs, *overrides]
    else:
        cmd = [sys.executable, script, "--task-id", str(task), "--seed", str(seed), "--no-wandb",
               "init.mode=checkpoint", f"init.path={sft['path']}", f"eval.every={every}", "eval.trial_start=30",
               "eval.trials_per_task=20", f"eval.samples_per_trial={args.eval_samples}", *logs,
               "log.checkpoint_every=100000", *overrides]
        if script == "train_gae_ppo.py" and not args.iterations:  # stops on its own budget flag
            cmd += ["--timesteps", str(budget), f"train.iterations={100 * iters}"]
        else:
            cmd += [f"train.iterations={iters}"]
    while True:
        code, wall = sh(cmd, log_path)
        info["wall_s"] += wall
        info["segments"] += 1
        if code != 0:
            info["status"] = "failed"
            break
        if args.iterations or script in ("train_gae_ppo.py", "train_sft.py"):
            break
        rows = read_rows(run_dir)
        done, steps = int(rows[-1]["iteration"]), float(rows[-1]["charts/env_steps"])
        if steps >= budget or info["segments"] >= MAX_SEGMENTS:
            break
        more = math.ceil((budget - steps) / (steps / done))  # at the env steps per iteration measured so far
        cmd = [sys.executable, script, "--resume", run_dir, "--no-wandb",
               f"train.iterations={done + more}"]
    print(f"[{label} task {task} seed {seed}] {info['status']} in {info['wall_s']:.0f} s "
          f"({info['segments']} segment(s)); log {os.path.relpath(log_path, ROOT)}", flush=True)
    with open(info_path, "w") as f:
        json.dump(info, f)
    return info


def plot(bands: Dict[str, tuple], evals: Dict[str, List[Tuple[np.ndarray, np.ndarray]]], budget: float, title: str,
         path: str, metric: str = METRIC, targets: Sequence[float] = TARGETS) -> None:
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
    for target in targets:
        ax.axhline(target, color="gray", ls="--", lw=0.8)
    ax.set_xlim(0, max([budget] + [float(xs.max()) for runs in evals.values() for xs, _ in runs if len(xs)]))
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("held-out greedy success (trials 30-49)" if metric == METRIC else f"{metric} (trials 30-49)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=list(PRESETS), default="all", help="arms and settings as the defaults")
    p.add_argument("--tasks", type=int, nargs="+", default=[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--env-steps", type=int, default=200_000, help="env-step budget of every run")
    p.add_argument("--iterations", type=int, default=0,
                   help="instead of a budget: every run this many iterations, evaluated every --eval-every")
    p.add_argument("--eval-every", type=int, default=5, help="with --iterations: eval.every")
    p.add_argument("--arms", nargs="+", default=PRESETS["all"][1]["arms"], choices=list(ARMS))
    p.add_argument("--arm-args", nargs="+", action="append", metavar=("ARM", "KEY=VALUE"),
                   help="overrides for one arm only, e.g. --arm-args srpo algorithm.accuracy_lower_bound=0")
    p.add_argument("--jobs", type=int, default=2, help="training processes at a time (one thread each)")
    p.add_argument("--evals", type=int, default=5, help="evaluations per run aimed at (sets eval.every)")
    p.add_argument("--eval-samples", type=int, default=0,
                   help="eval.samples_per_trial: sampled held-out episodes per trial besides the greedy one")
    p.add_argument("--metric", default=METRIC, help="val/success_rate (greedy) | val/sampled_success_rate")
    p.add_argument("--targets", type=float, nargs="+", default=list(TARGETS), help="success levels to report env "
                                                                                   "steps for")
    p.add_argument("--hold", type=int, default=HOLD,
                   help="a target counts as reached at the first of this many evaluations in a row at or above it")
    p.add_argument("--start", default=None, help="the policy every arm starts from (no SFT start is made)")
    p.add_argument("--sft-overrides", nargs="+", default=[], help="extra train_sft.py overrides for both SFT starts")
    p.add_argument("--reuse", action="store_true", help="keep SFT starts and finished runs; rerun only the others")
    p.add_argument("--out", default=None, help="default runs/bench_<preset> (all: runs/bench_compare_algorithms)")
    p.add_argument("--plot", default=None, help="default plots/<preset>.png (all: plots/compare_algorithms.png)")
    p.add_argument("overrides", nargs="*", help="overrides for every RL arm (after --)")
    p.set_defaults(rl_overrides=[])
    preset = argparse.ArgumentParser(add_help=False)
    preset.add_argument("--preset", choices=list(PRESETS), default="all")
    p.set_defaults(**PRESETS[preset.parse_known_args(argv)[0].preset][1])
    args = p.parse_args(argv)
    for given in args.arm_args or []:
        if given[0] not in ARMS or len(given) < 2:
            p.error(f"--arm-args {' '.join(given)}: give an arm ({', '.join(ARMS)}) and its KEY=VALUE overrides")
    name = "compare_algorithms" if args.preset == "all" else args.preset.replace("-", "_")
    args.out = os.path.abspath(args.out or os.path.join(ROOT, "runs", f"bench_{name}"))
    args.plot = args.plot or os.path.join(ROOT, "plots", f"{name}.png")
    return args


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse(argv)
    metric, targets, hold = args.metric, args.targets, args.hold
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    t_start = time.time()

    # 1. SFT starts: one token and/or one flow policy per task, on the same demos (or --start for every arm)
    types = sorted({ARMS[a][3] for a in args.arms})
    starts = [(ty, t) for t in args.tasks for ty in types]
    if args.start:
        sft = {k: {"path": os.path.abspath(args.start), "ok": True, "wall_s": 0.0, "log": None,
                   "finished": os.path.getmtime(args.start)} for k in starts}
    else:
        sft = dict(zip(starts, run_pool(lambda ty, t: make_sft(ty, t, args), starts, args.jobs, AGAIN)))
    for (ty, t), info in sft.items():
        if not info["ok"]:
            sys.exit(f"error: the {ty} SFT start for task {t} failed; see {info['log']}")

    # 2. every (arm, task, seed) run, args.jobs at a time
    jobs = [(a, t, s) for a in args.arms for t in args.tasks for s in args.seeds]
    infos = dict(zip(jobs, run_pool(lambda a, t, s: train_arm(a, t, s, sft[(ARMS[a][3], t)], args), jobs,
                                    args.jobs, AGAIN)))

    # 3. table and plot
    done = {arm: {(t, s): read_rows(os.path.join(args.out, run_name(arm, t, s))) for a, t, s in jobs
                  if a == arm and infos[(a, t, s)]["status"] == "ok"} for arm in args.arms}
    budget = args.env_steps if not args.iterations else max(
        [float(rows[-1].get("charts/env_steps", 0.0)) for runs in done.values() for rows in runs.values()] + [1.0])
    table, bands, points, lines = {}, {}, {}, []
    for arm in args.arms:
        label = ARMS[arm][0]
        bad = sorted({infos[j]["status"] for j in jobs if j[0] == arm} - {"ok"})
        if not done[arm]:
            table[label] = {"seeds": " / ".join(bad)}
            continue
        walls = {(t, s): infos[(arm, t, s)]["wall_s"] for t, s in done[arm]}
        table[label] = summarize(done[arm], walls, budget, metric, targets, hold)
        if bad:
            table[label]["seeds"] += f" ({' / '.join(bad)}: {len(jobs) // len(args.arms) - len(done[arm])} runs)"
        bands[label] = band(done[arm], budget, metric=metric)
        points[label] = [eval_curve(rows, metric) for rows in done[arm].values()]
        lines += run_lines(label, done[arm], metric, targets, hold)
    if len(args.arms) == 2:  # two arms: the second's env steps to each target over the first's
        lines += ratio_lines(*(ARMS[a][0] for a in args.arms), *(done[a] for a in args.arms), metric, targets, hold)
    length = f"{args.iterations} iterations" if args.iterations else f"{args.env_steps / 1000:.0f} k env steps"
    title = (f"tabletop task{'s' * (len(args.tasks) > 1)} {' '.join(map(str, args.tasks))}, "
             f"{length}, mean ± std over seeds")
    plot(bands, points, budget, title, args.plot, metric, targets)

    sft_walls = ", ".join(f"{ty} task {t} {info['wall_s']:.0f} s" for (ty, t), info in sft.items())
    md_path = os.path.splitext(args.plot)[0] + ".md"
    what = "Held-out greedy success" if metric == METRIC else f"Held-out `{metric}`"
    text = "\n".join([
        f"# {PRESETS[args.preset][0]}, {title}",
        "",
        f"`python benchmarks/compare_algorithms.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
        "",
        f"{what} (`{metric}`, trials 30-49): the first evaluation (the start) and "
        f"the last, mean ± std over seeds (tasks averaged within a seed), the mean of the "
        f"evaluations from {LATE:.2f} of the budget on and of the last {LAST} (less noisy than one evaluation of 20 "
        f"trials). Env steps to " + " / ".join(f"{t:.0%}" for t in targets) + ": mean over the runs that reached it, "
        f"at the first of {hold} evaluations in a row at or above it (how many did). Practice success "
        f"(`rollout/success_rate`) over the first and last {PRACTICE} iterations. Seconds per iteration by phase, "
        f"mean over iterations (reward = SRPO's progress reward, "
        f"GAE-PPO's value pass, FlowSAR's self-annotation; LUFFY's demos are in its rollout); eval = all evaluations' "
        f"seconds / iterations. Wall per run: mean over runs, one thread "
        f"each, {args.jobs} at a time. " + (f"The preset's overrides of every RL arm: {' '.join(args.rl_overrides)}. "
                                           if args.rl_overrides else "") + (f"Start: {args.start}." if args.start else
                                           f"SFT starts (train_sft.py configs/sft.yaml"
                                           f"{' ' + ' '.join(args.sft_overrides) if args.sft_overrides else ''}): "
                                           f"{sft_walls}."),
        "",
        markdown_table(table, metric, targets, hold),
        "",
        "Each run's evaluations (env steps: success) and env steps to each target:",
        "",
        "```",
        *lines,
        "```",
        "",
        f"Plot: {os.path.relpath(args.plot, ROOT)}; runs and logs: {os.path.relpath(args.out, ROOT)}/; "
        f"{time.time() - t_start:.0f} s for this invocation.",
    ])
    with open(md_path, "w") as f:
        f.write(text + "\n")
    print("\n" + text + f"\n\nwrote {os.path.relpath(args.plot, ROOT)} and {os.path.relpath(md_path, ROOT)}")


if __name__ == "__main__":
    main()
