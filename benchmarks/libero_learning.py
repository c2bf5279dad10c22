"""Does RL learn on real LIBERO? Scripted-expert demos -> SFT -> SRPO (or GRPO) on the real simulator, CPU-sized.

The chain a researcher would run with LIBERO's released demos and a pretrained VLA, made here from what a CPU has:
1. demos: `benchmarks/libero_expert.py --record N` (the scripted expert reads the simulator; the suite's random
   placements, never one of the 50 evaluation init states), in LIBERO's HDF5 layout, at --image-size;
2. SFT: `train_sft.py --config configs/sft_libero.yaml` with the tiny token policy on those demos (one start, seed 0);
3. RL: `train_srpo.py` from that start, per seed, under the heldout protocol: practice on init states 0..39, greedy and
   sampled evaluation on 40..49 before learning (iteration 0) and every --eval-every iterations.
4. (--pro) LIBERO-PRO: the SFT start and each run's final policy greedy on the task's held-out init states in the
   base suite and each perturbed variant (`evaluate.py --suites robustness`): does RL change robustness?
Each step is skipped when its output is already there (demos file, SFT folder, a finished RL run, a robustness
folder), and an RL run that stopped early continues from its newest checkpoint (`train_srpo.py --resume`; one is saved
every iteration), so an interrupted benchmark continues where it stopped, and a larger --iterations extends runs. At
the end a table per arm and seed and its mean over seeds: held-out greedy / sampled success at the start, the best and
the mean of the last three evaluations, practice success over the first and last three iterations, env steps and wall
time; and a PNG of the held-out curves (<out>/plots/libero_learning_<suite>_t<task>_<arms><setting>.png).

    python benchmarks/libero_learning.py --seeds 1 2    # libero_object 0, in runs/libero_learning/libero_object_t0
    python benchmarks/libero_learning.py --reward srpo binary --seeds 1 2             # SRPO and plain GRPO
    python benchmarks/libero_learning.py --reward binary --lr 2e-5 --prompts 2 --temperature 0.5 --iterations 20 --pro
    python benchmarks/libero_learning.py --suite libero_spatial --reward binary --lr 2e-5 --prompts 2 --temperature 0.5

On this 2-core CPU one SRPO iteration (8 episodes of <= --max-steps steps at 64 px, two simulator workers) takes
a few minutes and one evaluation (10 trials x (1 greedy + --samples sampled)) about as long; recording 30 demos
~7 min, SFT ~5 min; results and the exact commands in docs/results.md ("Does RL learn on real LIBERO?").
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run(cmd: List[str], log: str) -> None:
    """A step of the chain in a subprocess, its output in `log` (the command is its first line); exit on failure."""
    print("$ " + " ".join(cmd), flush=True)
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        code = subprocess.call(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if code:
        with open(log) as f:
            tail = f.read()[-2000:]
        sys.exit(f"error: step failed (exit {code}), its output in {log}:\n{tail}")


def rows_of(run_dir: str) -> List[Dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def finished(runs: str, iterations: int):
    """The run folder under `runs` whose metrics reach `iterations`, else None."""
    for run_dir in sorted(glob.glob(os.path.join(runs, "*"))):
        if os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) and \
                any(r.get("iteration") == iterations for r in rows_of(run_dir)):
            return run_dir
    return None


def sft_task(sft: str):
    """(suite, task id) the SFT start in `sft` was trained on, None when there is none yet."""
    if not os.path.isdir(sft):
        return None
    from evaluate import saved_env_config  # the one reader of the training config saved with a policy

    env = saved_env_config(sft)
    return None if env is None else (env.suite, env.task_ids[0])


def resumable(runs: str):
    """The newest run folder under `runs` with a complete checkpoint (an interrupted run, or a finished one to extend
    to more iterations), else None."""
    from common.checkpoint import latest_checkpoint

    for run_dir in sorted(glob.glob(os.path.join(runs, "*")), reverse=True):
        if os.path.isdir(os.path.join(run_dir, "checkpoints")) and latest_checkpoint(run_dir) is not None:
            return run_dir
    return None


def summary(rows: List[Dict], last: int = 3) -> Dict:
    """One run's row of the table: held-out greedy / sampled success at the start (iteration 0), the best and the mean
    of the last `last` evaluations, practice success over the first and last `last` iterations, env steps, and the
    wall time (training + evaluation seconds from metrics.jsonl: iteration 1's time includes evaluation 0)."""
    evals = [r for r in rows if "val/success_rate" in r]
    practice = [r["rollout/success_rate"] for r in rows if "rollout/success_rate" in r]
    out: Dict = {"eval_iterations": [r["iteration"] for r in evals],
                 "env_steps": [r.get("charts/env_steps", 0.0) for r in evals],
                 "practice_first": round(mean(practice[:last]), 3), "practice_last": round(mean(practice[-last:]), 3),
                 "total_env_steps": int(max(r.get("charts/env_steps", 0.0) for r in rows)),
                 "wall_s": round(sum(r.get("time/iteration", 0.0) for r in rows)
                                 + sum(r.get("time/eval", 0.0) for r in evals if r["iteration"] > 0))}
    for name, key in (("greedy", "val/success_rate"), ("sampled", "val/sampled_success_rate")):
        values = [round(r.get(key, float("nan")), 3) for r in evals]
        out[name] = values
        out[name + "_start"], out[name + "_best"] = values[0], max(values)
        out[name + "_last"] = round(mean(values[-last:]), 3)
    return out


def mean(values: List[float]) -> float:
    return sum(values) / max(1, len(values))


def print_table(results: Dict[str, Dict[int, Dict]]) -> None:
    """Per arm and seed, then the mean over seeds: start / best / mean of the last three evaluations."""
    print("| arm | seed | held-out greedy: start / best / last 3 | held-out sampled: start / best / last 3 | "
          "practice, first 3 -> last 3 iterations | env steps | wall |")
    print("|---|---|---|---|---|---|---|")
    for arm, seeds in results.items():
        rows = list(seeds.items())
        if len(rows) > 1:  # the mean over seeds of every number (the per-evaluation lists are not in the table)
            first = rows[0][1]
            rows.append(("mean", {k: mean([r[k] for r in seeds.values()]) for k, v in first.items()
                                  if isinstance(v, (int, float))}))
        for seed, r in rows:
            print(f"| {arm} | {seed} | {r['greedy_start']:.2f} / {r['greedy_best']:.2f} / {r['greedy_last']:.2f} | "
                  f"{r['sampled_start']:.2f} / {r['sampled_best']:.2f} / {r['sampled_last']:.2f} | "
                  f"{r['practice_first']:.2f} -> {r['practice_last']:.2f} | {int(r['total_env_steps']):,} | "
                  f"{r['wall_s'] / 60:.0f} min |")


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
    names = list(tables)
    print(f"\nLIBERO-PRO, {args.suite} task {args.task_id}, greedy, init states 40..{39 + args.pro_trials}:")
    print("| suite | what changes | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for suite, first in tables[names[0]].items():
        print(f"| {suite} | {first['changes']} | " + " | ".join(f"{tables[n][suite]['success']:.2f}" for n in names)
              + " |")
    with open(os.path.join(out, "results_robustness.json"), "w") as f:
        json.dump({n: {s: t[s]["success"] for s in t} for n, t in tables.items()}, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--demos", type=int, default=30, help="expert demos recorded and used for SFT")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--sft-steps", type=int, default=1500)
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
    args = p.parse_args()
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

    demo_dir = os.path.join(out, "demos")
    files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    if not files:
        run([py, "benchmarks/libero_expert.py", "--record", str(args.demos), "--suite", args.suite, "--task-ids",
             str(args.task_id), "--out", demo_dir, "--image-size", str(args.image_size)], os.path.join(out, "demos.log"))
        files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    env = [f"env.suite={args.suite}", f"env.image_size={args.image_size}", "env.fast_render=true",
           f"env.max_steps={args.max_steps}", "env.pipeline=true", "--no-wandb"]  # pipeline: streamed episodes
    sft = os.path.join(out, "sft")
    if not os.path.isdir(sft):
        run([py, "train_sft.py", "--config", "configs/sft_libero.yaml", "--task-id", str(args.task_id), *env,
             "env.num_envs=2", f"sft.demo_paths=[{files[0]}]", f"sft.num_demos={args.demos}",
             f"sft.steps={args.sft_steps}", "sft.eval_every=0", "sft.eval_trials=1", "sft.log_every=50",
             "policy.token.preset=tiny", "policy.token.hidden_size=128", "policy.token.lora_rank=0",
             f"sft.output_path={sft}", "seed=0", f"log.output_dir={out}/sft_run", f"log.plots_dir={out}/plots"],
            os.path.join(out, "sft.log"))
    results: Dict[str, Dict[int, Dict]] = {}
    finals = {"sft": sft}
    for reward in args.reward:
        arm = reward + setting
        results[arm] = {}
        for seed in args.seeds:
            runs = os.path.join(out, f"{arm}_s{seed}")
            run_dir = finished(runs, args.iterations)
            stopped = resumable(runs) if run_dir is None else None
            if stopped is not None:  # continue it (train.iterations may grow)
                run([py, "train_srpo.py", "--resume", stopped, f"train.iterations={args.iterations}",
                     "--no-wandb"], os.path.join(out, f"{arm}_s{seed}_resumed.log"))
                run_dir = finished(runs, args.iterations)
            if run_dir is None:
                run([py, "train_srpo.py", "--task-id", str(args.task_id), "--seed", str(seed), *env, "env.num_envs=2",
                     "init.mode=checkpoint", f"init.path={sft}", f"reward.mode={reward}",
                     "reward.encoder.kind=pixels", "eval.protocol=heldout", "rollout.n=8",
                     f"rollout.prompts_per_iteration={args.prompts}", f"rollout.temperature={args.temperature}",
                     f"train.lr={args.lr}", f"train.iterations={args.iterations}", "train.ppo_mini_batch_size=16",
                     "train.ppo_micro_batch_size=8", "train.lr_warmup_steps=5", f"eval.every={args.eval_every}",
                     "eval.trials_per_task=10", f"eval.samples_per_trial={args.samples}",
                     f"log.output_dir={runs}", f"log.plots_dir={out}/plots", "log.checkpoint_every=1"],
                    os.path.join(out, f"{arm}_s{seed}.log"))
                run_dir = finished(runs, args.iterations)
            results[arm][seed] = summary([r for r in rows_of(run_dir) if r["iteration"] <= args.iterations])
            finals[f"{arm}_s{seed}"] = run_dir
        with open(os.path.join(out, f"results_{arm}.json"), "w") as f:
            json.dump(results[arm], f, indent=1)
    title = (f"{args.suite} task {args.task_id}, {args.demos} expert demos, SFT {args.sft_steps} steps, "
             f"{args.iterations} iterations x {args.prompts} x 8 episodes, held-out init states 40..49")
    print("\n" + title)
    print_table(results)
    # one PNG per command's arms: an SRPO command does not overwrite the GRPO command's figure
    plot_curves(results, title, os.path.join(out, "plots", f"libero_learning_{args.suite}_t{args.task_id}_"
                                                            f"{'_'.join(args.reward)}{setting}.png"))
    if args.pro:
        robustness(py, finals, args, out)


if __name__ == "__main__":
    main()
