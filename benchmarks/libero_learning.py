"""Does RL learn on real LIBERO? Scripted-expert demos -> SFT -> SRPO (or GRPO) on the real simulator, CPU-sized.

The chain a researcher would run with LIBERO's released demos and a pretrained VLA, made here from what a CPU has:
1. demos: `record_demos.py --record N` (the scripted expert reads the simulator; the suite's random
   placements, never one of the 50 evaluation init states), in LIBERO's HDF5 layout, at --image-size;
2. SFT: `train_sft.py --config configs/sft_libero.yaml` with the tiny token policy on those demos (one start, seed 0);
3. RL: `train_srpo.py` from that start, per seed, under the heldout protocol: practice on init states 0..39, greedy and
   sampled evaluation on 40..49 before learning (iteration 0) and every --eval-every iterations.
4. (--pro) LIBERO-PRO: the SFT start and each run's final policy greedy on the task's held-out init states in the
   base suite and each perturbed variant (`evaluate.py --suites robustness`): does RL change robustness?
Each step is skipped when its output is already there (demos file, SFT folder, a finished RL run, a robustness
folder), an SFT that stopped continues from its newest checkpoint (`train_sft.py --resume`; one every 250 steps), and
an RL run that stopped early continues from its newest checkpoint (`train_srpo.py --resume`; one is saved every
iteration; Ctrl-C lets the run under way save the iteration it is in), so an interrupted benchmark continues where
it stopped, and a larger --iterations extends runs. At
the end a table per arm and seed and its mean over seeds: held-out greedy / sampled success at the start, the best and
the mean of the last three evaluations, practice success over the first and last three iterations, env steps and wall
time; and a PNG of the held-out curves (<out>/plots/libero_learning_<suite>_t<task>_<arms><setting>.png).

--arms (issue 56) replaces step 3's RL with the CPU-scale recipe's arms (docs/recipes.md, "CPU scale"), all from the
one SFT start: grpo (configs/srpo_libero_grpo_cpu.yaml), srpo (configs/srpo_libero_cpu.yaml) and control (the grpo
config with reward.shuffle=true: each kept group's scores permuted among its episodes, so the update moves the policy
as far but toward no outcome), each seed until --env-steps (train.total_timesteps; a run stops at the end of the
iteration that reaches it), resumed when stopped and extended when the budget grows. Then the SFT start and every
run's final policy on one held-out set (`evaluate.py --heldout-set N --paired`: official trials 40..49, never practised
nor evaluated in-run, plus states drawn from the suite's placements; greedy and sampled at the recipe's temperature;
saved once in <out>/heldout/), and a table: the SFT start's token accuracy, loss and held-out success above it; per arm
and seed start -> end with end - start and its paired bootstrap 95% interval over the states (common/heldout.py),
practice success over the first and last three iterations, env steps, iterations and wall time; per arm the pooled
lift: the per-state differences pooled over the seeds (each state's end success averaged over the arm's seeds minus its
start success), bootstrapped over the states, so its interval covers the choice of states and not the choice of seeds
(the per-seed rows and "k of n seeds > 0" show that); SRPO - GRPO and each arm - control likewise on the seed means. A
PNG of held-out greedy success against env steps (in-run curves per seed, the arm mean, each final policy on the set,
the SFT start's interval), and with --data-out every policy's per-episode outcomes as compact JSON plus the table.
--sft-only stops after the SFT start's held-out evaluation (check the start before days of runs).

    python benchmarks/libero_learning.py --seeds 1 2    # libero_object 0, in runs/libero_learning/libero_object_t0
    python benchmarks/libero_learning.py --reward srpo binary --seeds 1 2             # SRPO and plain GRPO
    python benchmarks/libero_learning.py --reward binary --lr 2e-5 --prompts 2 --temperature 0.5 --iterations 20 --pro
    python benchmarks/libero_learning.py --suite libero_spatial --reward binary --lr 2e-5 --prompts 2 --temperature 0.5
    python benchmarks/libero_learning.py --suite libero_spatial --demos 100 --sft-steps 5000 --sft-only --out D
    python benchmarks/libero_learning.py --suite libero_spatial --demos 100 --sft-steps 1500 --arms grpo srpo control \\
        --seeds 1 2 3 --env-steps 300000 --out D    # seed by seed; control on seed 1; then --data-out docs/data/.../D

On this 2-core CPU one SRPO iteration (8 episodes of <= --max-steps steps at 64 px, two simulator workers) takes
a few minutes and one evaluation (10 trials x (1 greedy + --samples sampled)) about as long; recording 30 demos
~7 min, SFT ~5 min; results and the exact commands in docs/results.md ("Does RL learn on real LIBERO?").
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Dict, List, Tuple

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.arms import arms_table, data_files, read_data, seeds_table, summary  # noqa: E402
from common.child_runs import first_run_reaching, newest_resumable, run_or_exit  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402
from common.cpu_recipe import (ARMS, COMPARISONS, FLOW_ARMS, ITERATION_CAP, PRACTICE_TRIALS,  # noqa: E402
                               SFT_POLICY, arm_order, sampling)


def run(cmd: List[str], log: str) -> None:
    """A step of the chain in a subprocess, its output in `log` (the command is its first line); exit on failure."""
    print("$ " + " ".join(cmd), flush=True)
    run_or_exit(cmd, log)


def finished(runs: str, iterations: int):
    """The run folder under `runs` whose metrics reach `iterations`, else None."""
    return first_run_reaching(runs, lambda rows: any(r.get("iteration") == iterations for r in rows))


def sft_task(sft: str):
    """(suite, task id) the SFT start in `sft` was trained on, None when there is none yet."""
    if not os.path.isdir(sft):
        return None
    from evaluate import saved_env_config  # the one reader of the training config saved with a policy

    env = saved_env_config(sft)
    return None if env is None else (env.suite, env.task_ids[0])


def plot_curves(results: Dict[str, Dict[int, Dict]], title: str, path: str) -> None:
    """Held-out greedy and sampled success against env steps, one line per arm and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, name in zip(axes, ("greedy", "sampled")):
        for i, (arm, seeds) in enumerate(results.items()):
            for j, (seed, r) in enumerate(seeds.items()):
                ax.plot(r["env_steps"], r[name], marker="o", color=f"C{i}", linestyle=["-", "--", ":", "-."][j % 4],
                        label=f"{arm} seed {seed}")
        ax.set_title(f"held-out {name} success")
        ax.set_xlabel("env steps")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("success (10 init states: 40..49)")
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"curves: {path}")


def robustness(py: str, policies: Dict[str, str], args, out: str) -> None:
    """LIBERO-PRO: every policy greedy on the trained task's held-out init states in the base suite and each variant
    (`evaluate.py --suites robustness`), one folder each (skipped when its robustness.json is there); one table."""
    from common.robustness import suites_table

    tables = {}
    for name, checkpoint in policies.items():
        folder = os.path.join(out, "robustness", name)
        found = os.path.join(folder, "robustness.json")
        if not os.path.isfile(found):
            run([py, "evaluate.py", "--checkpoint", checkpoint, "--suite", args.suite, "--suites", "robustness",
                 "--task-ids", str(args.task_id), "--trials", str(args.pro_trials), "--trial-start", "40",
                 "--max-steps", str(args.max_steps), "--num-envs", "2", "--out-dir", folder],
                os.path.join(out, f"robustness_{name}.log"))
        with open(found) as f:
            tables[name] = json.load(f)["per_suite"]
    print(f"\nLIBERO-PRO, {args.suite} task {args.task_id}, greedy, init states 40..{39 + args.pro_trials}:\n"
          + "\n".join(suites_table(tables)))
    with open(os.path.join(out, "results_robustness.json"), "w") as f:
        json.dump({n: {s: t[s]["success"] for s in t} for n, t in tables.items()}, f, indent=1)


# ------------------------------------------------------------------------------------------------------------------
# --arms: the CPU-scale recipe's arms at an equal env-step budget, judged on one paired held-out set
# ------------------------------------------------------------------------------------------------------------------
def budget_reached(runs: str, budget: int):
    """The run folder under `runs` whose metrics reach the env-step budget (or the iteration cap), else None."""
    def reached(rows: List[dict]) -> bool:
        return bool(rows) and (max(r.get("charts/env_steps", 0.0) for r in rows) >= budget
                               or max(r["iteration"] for r in rows) >= ITERATION_CAP)

    return first_run_reaching(runs, reached)


def sft_header(sft: str) -> Dict:
    """The SFT start's last logged token accuracy and loss (nats per action token) from its run's metrics (in
    `<sft>_run/`: <out>/sft_run, or a candidate's sft_candidates/s<N>_run); a flow start's flow-matching loss
    instead."""
    rows = [r for path in sorted(glob.glob(os.path.join(sft.rstrip("/") + "_run", "*", "metrics.jsonl")))
            for r in read_rows(os.path.dirname(path)) if "sft/token_accuracy" in r or "sft/flow_mse" in r]
    last = rows[-1] if rows else {}
    return {"token_accuracy": last.get("sft/token_accuracy"), "loss": last.get("sft/loss"),
            "flow_mse": last.get("sft/flow_mse")}


def plot_arms(blocks: List[Tuple[Dict[str, Dict[int, Dict]], Dict, str]], path: str) -> None:
    """Held-out greedy success against env steps, one panel per (arms, start, title) block (one SFT start each): each
    seed's in-run evaluations (thin), the arm's mean over seeds (thick, interpolated on the env steps all its seeds
    reached), each final policy on the held-out set (marker with its bootstrap interval), the SFT start's held-out
    interval (grey band); the control arms in grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(blocks), figsize=(8 * len(blocks), 4.5), squeeze=False)
    for ax, (arms, start, title) in zip(axes[0], blocks):
        plot_block(ax, arms, start, title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"curves: {path}")


def plot_block(ax, arms: Dict[str, Dict[int, Dict]], start: Dict, title: str) -> None:
    low, high = start["interval"]["greedy"]
    ax.axhspan(low, high, color="0.85", label=f"SFT start, held-out set: {start['success']['greedy']:.2f} "
                                               f"[{low:.2f}, {high:.2f}]")
    colors = {"grpo": "C0", "srpo": "C1", "luffy": "C2", "gae_ppo": "C3", "flowsar": "C4", "control": "0.45",
              "flow_control": "0.7", "flowsar_tiny": "C5", "flowsar_tiny_control": "0.6"}
    for i, (arm, seeds) in enumerate(arms.items()):
        color = colors.get(arm, f"C{i + 2}")
        curves = []
        for seed, r in seeds.items():
            s = r["summary"]
            ax.plot(s["env_steps"], s["greedy"], color=color, alpha=0.35, linewidth=1)
            curves.append((s["env_steps"], s["greedy"]))
            o = r["outcomes"]
            lo, hi = o["interval"]["greedy"]
            y = o["success"]["greedy"]
            ax.errorbar([s["total_env_steps"]], [y], yerr=[[y - lo], [hi - y]], color=color, marker="o", capsize=3)
        reach = min(x[-1] for x, _ in curves)
        grid = np.linspace(0.0, reach, 41)
        ax.plot(grid, np.mean([np.interp(grid, x, y) for x, y in curves], axis=0), color=color, linewidth=2.5,
                label=f"{arm}: mean of {len(seeds)} seeds (in-run evaluations); end on the held-out set")
    ax.set_xlabel("env steps")
    ax.set_ylabel("held-out greedy success")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{title}\nlines: in-run evaluations (10 init states); markers: the final policies on the "
                 f"{start['heldout_set']['states']}-state held-out set, 95% interval", fontsize=8)


def score(py: str, checkpoint: str, folder: str, set_file: str, args, validation: bool = False, paired=None) -> Dict:
    """`evaluate.py --heldout-set N` of one policy, greedy and sampled as its recipe samples, on the states generated
    once into `set_file`: the test set (official trials 40..49 plus drawn states) or, with `validation`, the validation
    set (--validation-set states drawn with --validation-seed, no official trial). Skipped when its outcomes.json is
    there and of the same training iteration. With `paired` (the start's outcomes.json) it also writes paired.json."""
    from common import heldout
    from evaluate import checkpoint_iteration

    found = os.path.join(folder, "outcomes.json")
    if os.path.isfile(found):
        was = heldout.read_outcomes(found)
        if was.get("iteration") == checkpoint_iteration(checkpoint):
            return was
    os.makedirs(folder, exist_ok=True)
    states = (["--heldout-set", str(args.validation_set), "--heldout-seed", str(args.validation_seed), "--drawn-only"]
              if validation else ["--heldout-set", str(args.heldout_set), "--heldout-seed", str(args.heldout_seed),
                                  "--trial-start", "40", "--trials", "10"])
    run([py, "evaluate.py", "--checkpoint", checkpoint, *states, "--heldout-file", set_file, "--sampled",
         *sampling(args.family), "--num-envs", "2", "--gifs", "0", "--out-dir", folder]
        + (["--paired", paired] if paired else []), folder.rstrip("/") + ".log")
    return heldout.read_outcomes(found)


def practice_demos(py: str, out: str, args) -> str:
    """LUFFY's demonstrations: one scripted-expert demo from each practice init state 0..39 of the task
    (`record_demos.py --record-trials`; a state the expert fails is left out), recorded once into
    <out>/practice_demos/. -> the HDF5 file."""
    folder = os.path.join(out, "practice_demos")
    files = glob.glob(os.path.join(folder, args.suite, "*_demo.hdf5"))
    if not files:
        run([py, "record_demos.py", "--record-trials", "--trial-start", "0", "--trials",
             str(PRACTICE_TRIALS), "--suite", args.suite, "--task-ids", str(args.task_id), "--out", folder,
             "--image-size", str(args.image_size)], os.path.join(out, "practice_demos.log"))
        files = glob.glob(os.path.join(folder, args.suite, "*_demo.hdf5"))
    return files[0]


def run_arms(args, out: str, sft: str, env: List[str], py: str) -> None:
    """--arms: each arm x seed from the SFT start at the CPU-scale recipe up to --env-steps (resumed when stopped,
    extended when the budget grows), the SFT start and every final policy on one held-out set, the table, the PNG and
    (--data-out) the outcome files."""
    heldout_dir = os.path.join(out, "heldout", f"n{args.heldout_set}_seed{args.heldout_seed}")
    set_file = os.path.join(heldout_dir, "heldout_set.json")  # generated by the first evaluation, read by the others
    start = score(py, sft, os.path.join(heldout_dir, "sft"), set_file, args)
    header = {**sft_header(sft), "demos": args.demos, "sft_steps": args.sft_steps}
    arms: Dict[str, Dict[int, Dict]] = {arm: {} for arm in ([] if args.sft_only else args.arms)}
    for arm, seed in arm_order(list(arms), args.seeds, args.control_seeds):
        script, config, extra = ARMS[arm]
        if arm == "luffy":  # its prompts and demonstrations: the scripted expert from the practice states only
            extra = [*extra, f"demos.paths=[{practice_demos(py, out, args)}]"]
        runs = os.path.join(out, f"cpu_{arm}_s{seed}")
        limits = [f"train.total_timesteps={args.env_steps}", f"train.iterations={ITERATION_CAP}"]
        run_dir = budget_reached(runs, args.env_steps)
        stopped = newest_resumable(runs) if run_dir is None else None
        if stopped is not None:  # continue it (the budget may grow)
            run([py, script, "--resume", stopped, *limits, "--no-wandb"],
                os.path.join(out, f"cpu_{arm}_s{seed}_resumed.log"))
            run_dir = budget_reached(runs, args.env_steps)
        if run_dir is None:
            run([py, script, "--config", config, "--task-id", str(args.task_id), "--seed", str(seed),
                 *env, "env.num_envs=2", f"init.path={sft}", *extra, *limits, f"log.output_dir={runs}",
                 f"log.plots_dir={out}/plots"], os.path.join(out, f"cpu_{arm}_s{seed}.log"))
            run_dir = budget_reached(runs, args.env_steps)
        end = score(py, run_dir, os.path.join(heldout_dir, f"{arm}_s{seed}"), set_file, args,
                    paired=os.path.join(heldout_dir, "sft", "outcomes.json"))
        arms[arm][seed] = {"outcomes": end, "summary": summary(read_rows(run_dir)), "run_dir": run_dir}
    arms = {arm: dict(sorted(seeds.items())) for arm, seeds in arms.items() if seeds}
    table = arms_table(start, arms, header, COMPARISONS)
    title = (f"{args.suite} task {args.task_id}: SFT ({args.demos} demos, {args.sft_steps} steps) -> CPU-scale recipe "
             f"to {args.env_steps:,} env steps; held-out set of {args.heldout_set} states")
    print("\n" + title + "\n" + "\n".join(table["lines"]))
    with open(os.path.join(out, f"results_arms_n{args.heldout_set}.json"), "w") as f:
        json.dump({k: v for k, v in table.items() if k != "lines"}, f, indent=1, default=str)
    if arms:
        plot_arms([(arms, start, title)], os.path.join(out, "plots", f"libero_learning_{args.suite}_t{args.task_id}_"
                                                                 f"{'_'.join(arms)}_n{args.heldout_set}.png"))
    if args.data_out:  # the per-episode outcomes behind every row with each run's row, compact, and the table
        data = args.data_out  # this start's folder: another start's outcomes there are never overwritten
        was = os.path.join(data, "sft_outcomes.json")
        if os.path.isfile(was):
            with open(was) as f:
                if json.load(f).get("episodes") != start["episodes"]:
                    sys.exit(f"error: --data-out {data} holds another SFT start's outcomes: give this start a folder "
                             f"of its own")
        os.makedirs(data, exist_ok=True)
        files = data_files(start, arms, header, title)
        for name, outcomes in files.items():
            with open(os.path.join(data, f"{name}_outcomes.json"), "w") as f:
                json.dump(outcomes, f, separators=(",", ":"))
        with open(os.path.join(data, "table.md"), "w") as f:
            f.write(title + "\n\n" + "\n".join(table["lines"]) + "\n")
        print(f"outcomes: {data} ({len(files)} files and table.md)")
    if args.pro:  # LIBERO-PRO: the SFT start and every final policy, greedy on the task's held-out init states
        robustness(py, {"sft": sft, **{f"{arm}_s{seed}": r["run_dir"] for arm, seeds in arms.items()
                                       for seed, r in seeds.items()}}, args, out)


def print_data_table(folders: List[str], png: str) -> None:
    """--table: each --data-out folder's arms against its own start (arms_table), one block of the table each, and
    one figure with a panel per folder; nothing is run."""
    blocks = []
    for folder in folders:
        try:
            start, arms, header, title = read_data(folder, order=list(ARMS))
        except ValueError as e:
            sys.exit(f"error: {e}")
        print(f"\n{title} ({folder})\n" + "\n".join(arms_table(start, arms, header, COMPARISONS)["lines"]))
        if arms:
            blocks.append((arms, start, title))
    if blocks:
        plot_arms(blocks, png)


def make_sft(py: str, out: str, sft: str, run_root: str, demo_file: str, steps: int, args, env: List[str],
             made: str, log: str) -> None:
    """The SFT start in `sft` (skipped when there): `train_sft.py` on the demos for `steps` steps (seed 0, the tiny
    policy of --family: SFT_POLICY), its run folder under `run_root`, continued from its newest checkpoint when it was stopped; then
    what made it to `made` (JSON)."""
    if os.path.isdir(sft):
        return
    stopped_sft = newest_resumable(run_root)
    if stopped_sft:  # an SFT that was stopped (it checkpoints every 250 steps): continue it if it is this start's
        from omegaconf import OmegaConf

        was = OmegaConf.load(os.path.join(stopped_sft, "config.yaml")).sft
        if (was.steps, was.num_demos) != (steps, args.demos):
            sys.exit(f"error: the stopped SFT in {stopped_sft} trains {was.steps} steps on {was.num_demos} demos, not "
                     f"{steps} on {args.demos}: give this SFT start its own --out")
        run([py, "train_sft.py", "--resume", stopped_sft], os.path.join(out, f"{log}_resumed.log"))
    else:
        run([py, "train_sft.py", "--config", "configs/sft_libero.yaml", "--task-id", str(args.task_id), *env,
             "env.num_envs=2", f"sft.demo_paths=[{demo_file}]", f"sft.num_demos={args.demos}",
             f"sft.steps={steps}", "sft.eval_every=0", "sft.checkpoint_every=250", "sft.eval_trials=1",
             "sft.log_every=50", *SFT_POLICY[args.family],
             f"sft.output_path={sft}", "seed=0", f"log.output_dir={run_root}", f"log.plots_dir={out}/plots"],
            os.path.join(out, f"{log}.log"))
    with open(made, "w") as f:
        json.dump({"demos": args.demos, "sft_steps": steps, "image_size": args.image_size,
                   **({"family": "flow"} if args.family == "flow" else {})}, f)


def choose_sft(py: str, out: str, demo_file: str, args, env: List[str]) -> str:
    """--sft-candidates: the rule written into docs/results.md before any RL run (issue 67): SFT starts of the
    candidate lengths, shortest first, each scored on the validation set (never the test set); the start is the first
    whose validation greedy success is >= --validation-min, else the longest. Later candidates are not trained once
    one passes. Writes <out>/sft_choice.json (every candidate's validation success, the rule, the choice); returns the
    chosen start's folder and sets args.sft_steps to its length."""
    from common import heldout

    try:
        heldout.check_disjoint(args.task_id, args.heldout_seed, args.heldout_set, args.validation_seed,
                               args.validation_set)
    except ValueError as e:
        sys.exit(f"error: {e}")
    folder = os.path.join(out, "validation", f"n{args.validation_set}_seed{args.validation_seed}")
    set_file = os.path.join(folder, "validation_set.json")
    scores: Dict[int, Dict] = {}
    chosen = None
    for steps in sorted(args.sft_candidates):
        sft = os.path.join(out, "sft_candidates", f"s{steps}")
        make_sft(py, out, sft, os.path.join(out, "sft_candidates", f"s{steps}_run"), demo_file, steps, args, env,
                 os.path.join(out, "sft_candidates", f"s{steps}_settings.json"), f"sft_s{steps}")
        o = score(py, sft, os.path.join(folder, f"sft_s{steps}"), set_file, args, validation=True)
        scores[steps] = {m: {"success": o["success"][m], "interval": o["interval"][m]} for m in o["success"]}
        print(f"SFT {steps} steps on the validation set ({args.validation_set} drawn states, seed "
              f"{args.validation_seed}): " + ", ".join(f"{m} {v['success']:.2f} [{v['interval'][0]:.2f}, "
                                                          f"{v['interval'][1]:.2f}]" for m, v in scores[steps].items()),
              flush=True)
        if o["success"]["greedy"] >= args.validation_min:
            chosen = steps
            break
    rule = (f"the shortest of {sorted(args.sft_candidates)} SFT steps whose validation greedy success is >= "
            f"{args.validation_min}; none: the longest")
    chosen = chosen if chosen is not None else max(args.sft_candidates)
    with open(os.path.join(out, "sft_choice.json"), "w") as f:
        json.dump({"rule": rule, "validation_set": {"states": args.validation_set, "seed": args.validation_seed,
                                                    "drawn_only": True},
                   "candidates": scores, "chosen_steps": chosen}, f, indent=1)
    print(f"SFT start chosen by the rule ({rule}): {chosen} steps", flush=True)
    args.sft_steps = chosen
    return os.path.join(out, "sft_candidates", f"s{chosen}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--demos", type=int, default=30, help="expert demos recorded and used for SFT")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--sft-steps", type=int, default=1500)
    p.add_argument("--family", default="token", choices=sorted(SFT_POLICY),
                   help="the tiny policy SFT trains and RL starts from: token (the grpo/srpo/control/luffy/gae_ppo "
                        "arms) or flow (flowsar, flowsar_tiny and their controls); give each family its own --out")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reward", nargs="+", default=["srpo"], choices=["srpo", "binary"],
                   help="one RL arm each: srpo, binary (plain GRPO)")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--samples", type=int, default=2, help="sampled evaluation episodes per held-out trial")
    p.add_argument("--max-steps", type=int, default=200, help="episode limit (libero_object's own: 280; the expert "
                                                               "needs ~115)")
    p.add_argument("--prompts", type=int, default=1, help="init states (groups of 8 episodes) per iteration")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0, help="rollout and sampled-evaluation temperature")
    p.add_argument("--pro", action="store_true", help="then evaluate the SFT start and each run's final policy on "
                                                      "the LIBERO-PRO variants of the task")
    p.add_argument("--pro-trials", type=int, default=10, help="held-out init states per LIBERO-PRO suite (from 40)")
    p.add_argument("--out", default=None, help="one task's chain (demos, SFT, runs, plots); default "
                                                "runs/libero_learning/<suite>_t<task id>")
    p.add_argument("--arms", nargs="+", default=None, choices=list(ARMS),
                   help="instead of --reward: the CPU-scale recipe's arms (grpo: configs/srpo_libero_grpo_cpu.yaml, "
                        "srpo: configs/srpo_libero_cpu.yaml, control: grpo with reward.shuffle=true) per seed up to "
                        "--env-steps, then the SFT start and each final policy on one --heldout-set, paired")
    p.add_argument("--control-seeds", type=int, nargs="+", default=None,
                   help="--arms: the control arm's seeds (default: the first of --seeds; one control run)")
    p.add_argument("--env-steps", type=int, default=300_000, help="--arms: env-step budget of every run "
                                                                 "(train.total_timesteps)")
    p.add_argument("--heldout-set", type=int, default=100, metavar="N",
                   help="--arms: held-out states (official trials 40..49 plus drawn ones) of the paired evaluation")
    p.add_argument("--heldout-seed", type=int, default=0, help="--arms: the seed the held-out states are drawn with")
    p.add_argument("--data-out", default=None, metavar="FOLDER",
                   help="--arms: copy every policy's per-episode outcomes (compact JSON, each run's row with them) "
                        "and the table to FOLDER, one per SFT start (e.g. docs/data/libero_learning/libero_object_t3; "
                        "a folder holding another start's outcomes is refused)")
    p.add_argument("--table", nargs="+", default=None, metavar="DATA",
                   help="run nothing: one table and one figure (a panel per folder) of every arm in these --data-out "
                        "folders (e.g. docs/data/libero_learning/libero_spatial_t0_start_2026-12-07 and ..._flow: the "
                        "token and the flow starts' arms), from their files alone; the figure to --table-png")
    p.add_argument("--table-png", default=os.path.join("plots", "libero_learning_arms.png"),
                   help="--table: where the figure goes")
    p.add_argument("--sft-from", default=None, metavar="FOLDER",
                   help="start from this saved SFT policy (e.g. the committed "
                        "docs/data/libero_learning/libero_spatial_t0/sft_start_2026-12-07) instead of training one: "
                        "copied to <out>/sft once; --demos and --sft-steps must say how it was made")
    p.add_argument("--sft-candidates", type=int, nargs="+", default=None, metavar="STEPS",
                   help="instead of --sft-steps: SFT lengths tried shortest first, the start chosen on the validation "
                        "set by the rule (the first with validation greedy >= --validation-min, else the longest); "
                        "in <out>/sft_candidates/, the choice in <out>/sft_choice.json")
    p.add_argument("--validation-set", type=int, default=50, metavar="N",
                   help="--sft-candidates: drawn states of the validation set (no official trial)")
    p.add_argument("--validation-seed", type=int, default=1,
                   help="--sft-candidates: the validation set's seed (never the test set's --heldout-seed)")
    p.add_argument("--validation-min", type=float, default=0.3,
                   help="--sft-candidates: validation greedy success the chosen start reaches")
    p.add_argument("--sft-only", action="store_true", help="make (or reuse) the demos and the SFT start, evaluate "
                                                           "it on the --heldout-set and stop (no RL)")
    args = p.parse_args()
    if args.table:
        return print_data_table(args.table, args.table_png)
    if args.family == "flow" and not (args.arms or args.sft_only):
        p.error("--family flow: give --arms flowsar flow_control (or flowsar_tiny, --sft-only); --reward runs "
                "train_srpo.py's token policy")
    wrong = [a for a in args.arms or [] if (a in FLOW_ARMS) != (args.family == "flow")]
    if wrong:
        p.error(f"--arms {' '.join(wrong)}: {'flow' if wrong[0] in FLOW_ARMS else 'token'}-policy arms, but --family "
                f"{args.family}: run them with --family {'flow' if wrong[0] in FLOW_ARMS else 'token'} (and an --out "
                f"of their own)")
    if args.sft_from and args.sft_candidates:
        p.error("--sft-from and --sft-candidates: a start is either given or chosen; drop one")
    if args.sft_from and not os.path.isfile(os.path.join(args.sft_from, "config.json")):
        p.error(f"--sft-from {args.sft_from}: not a saved policy folder (no config.json)")
    for flag, value in (("--env-steps", args.env_steps), ("--heldout-set", args.heldout_set),
                        ("--demos", args.demos), ("--sft-steps", args.sft_steps)):
        if value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    # one folder per RL setting beside the shared demos and SFT start: the defaults keep the first runs' names
    setting = "".join(f"_{k}{v:g}" for k, v, d in (("lr", args.lr, 1e-4), ("p", args.prompts, 1),
                                                   ("t", args.temperature, 1.0)) if v != d)
    out = os.path.abspath(args.out or os.path.join("runs", "libero_learning", f"{args.suite}_t{args.task_id}"))
    os.makedirs(out, exist_ok=True)
    trained_on = sft_task(os.path.join(out, "sft"))
    if trained_on not in (None, (args.suite, args.task_id)):
        sys.exit(f"error: {out}/sft was trained on {trained_on[0]} task {trained_on[1]}, not {args.suite} task "
                 f"{args.task_id}: give this task its own --out")
    py = sys.executable
    sft = os.path.join(out, "sft")
    settings = {"demos": args.demos, "sft_steps": args.sft_steps, "image_size": args.image_size,
                **({"family": "flow"} if args.family == "flow" else {})}
    made = os.path.join(out, "sft_settings.json")  # what the SFT start was made with (folders from before: absent)
    if os.path.isdir(sft) and os.path.isfile(made):
        with open(made) as f:
            was = json.load(f)
        differ = [k for k in settings if was.get(k) != settings[k]]
        if differ:
            sys.exit(f"error: {out}/sft was made with {', '.join(f'{k} {was.get(k)}' for k in differ)}, not "
                     f"{', '.join(f'{k} {settings[k]}' for k in differ)}: give this SFT start its own --out")
    demo_dir = os.path.join(out, "demos")
    files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    if not files and not args.sft_from:
        run([py, "record_demos.py", "--record", str(args.demos), "--suite", args.suite, "--task-ids",
             str(args.task_id), "--out", demo_dir, "--image-size", str(args.image_size)], os.path.join(out, "demos.log"))
        files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    env = [f"env.suite={args.suite}", f"env.image_size={args.image_size}", "env.fast_render=true",
           f"env.max_steps={args.max_steps}", "env.pipeline=true", "--no-wandb"]  # pipeline: streamed episodes
    if args.sft_candidates:  # the start chosen on the validation set by the rule written before any RL run
        sft = choose_sft(py, out, files[0], args, env)
        if args.sft_only:  # the choice only: the test set scores the start once, beside the arms' final policies
            return
    elif args.sft_from:  # a committed start (docs/data/...): the runs start from exactly it
        if not os.path.isdir(sft):
            import shutil

            shutil.copytree(args.sft_from, sft)
            with open(made, "w") as f:
                json.dump({**settings, "copied_from": os.path.abspath(args.sft_from)}, f)
    else:
        make_sft(py, out, sft, os.path.join(out, "sft_run"), files[0], args.sft_steps, args, env, made, "sft")
    if args.arms or args.sft_only:
        return run_arms(args, out, sft, env, py)
    results: Dict[str, Dict[int, Dict]] = {}
    finals = {"sft": sft}
    for reward in args.reward:
        arm = reward + setting
        results[arm] = {}
        for seed in args.seeds:
            runs = os.path.join(out, f"{arm}_s{seed}")
            run_dir = finished(runs, args.iterations)
            stopped = newest_resumable(runs) if run_dir is None else None
            if stopped is not None:  # continue it (train.iterations may grow)
                run([py, "train_srpo.py", "--resume", stopped, f"train.iterations={args.iterations}",
                     "--no-wandb"], os.path.join(out, f"{arm}_s{seed}_resumed.log"))
                run_dir = finished(runs, args.iterations)
            if run_dir is None:
                run([py, "train_srpo.py", "--task-id", str(args.task_id), "--seed", str(seed), *env, "env.num_envs=2",
                     "init.mode=checkpoint", f"init.path={sft}", f"reward.mode={reward}",
                     "reward.encoder.kind=pixels", "eval.protocol=heldout", "rollout.n=8",
                     f"rollout.prompts_per_iteration={args.prompts}", f"rollout.temperature={args.temperature}",
                     f"train.lr={args.lr}", f"train.iterations={args.iterations}", "train.mini_batch_size=16",
                     "train.micro_batch_size=8", "train.lr_warmup_steps=5", f"eval.every={args.eval_every}",
                     "eval.trials_per_task=10", f"eval.samples_per_trial={args.samples}",
                     f"log.output_dir={runs}", f"log.plots_dir={out}/plots", "log.checkpoint_every=1"],
                    os.path.join(out, f"{arm}_s{seed}.log"))
                run_dir = finished(runs, args.iterations)
            results[arm][seed] = summary([r for r in read_rows(run_dir) if r["iteration"] <= args.iterations])
            finals[f"{arm}_s{seed}"] = run_dir
        with open(os.path.join(out, f"results_{arm}.json"), "w") as f:
            json.dump(results[arm], f, indent=1)
    title = (f"{args.suite} task {args.task_id}, {args.demos} expert demos, SFT {args.sft_steps} steps, "
             f"{args.iterations} iterations x {args.prompts} x 8 episodes, held-out init states 40..49")
    print("\n" + title + "\n" + "\n".join(seeds_table(results)))
    # one PNG per command's arms: an SRPO command does not overwrite the GRPO command's figure
    plot_curves(results, title, os.path.join(out, "plots", f"libero_learning_{args.suite}_t{args.task_id}_"
                                                            f"{'_'.join(args.reward)}{setting}.png"))
    if args.pro:
        robustness(py, finals, args, out)


if __name__ == "__main__":
    main()
