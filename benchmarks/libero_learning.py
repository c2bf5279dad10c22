"""Does RL learn on real LIBERO? Scripted-expert demos -> SFT -> SRPO (or GRPO) on the real simulator, CPU-sized.

The chain a researcher would run with LIBERO's released demos and a pretrained VLA, made here from what a CPU has:
1. demos: `benchmarks/libero_expert.py --record N` (the scripted expert reads the simulator; the suite's random
   placements, never one of the 50 evaluation init states), in LIBERO's HDF5 layout, at --image-size;
2. SFT: `train_sft.py --config configs/sft_libero.yaml` with the tiny token policy on those demos (one start, seed 0);
3. RL: `train_srpo.py` from that start, per seed, under the heldout protocol: practice on init states 0..39, greedy and
   sampled evaluation on 40..49 before learning (iteration 0) and every --eval-every iterations.
Each step is skipped when its output is already there (demos file, SFT folder, a finished RL run), so an interrupted
benchmark continues where it stopped. The table at the end: per seed, held-out greedy / sampled success at the start
and at each evaluation, and practice success over the first and the last iterations.

    python benchmarks/libero_learning.py --seeds 1 2 --out runs/libero_learning      # libero_object task 0, ~1 h/seed
    python benchmarks/libero_learning.py --reward binary --seeds 1 2                  # plain GRPO instead of SRPO
    python benchmarks/libero_learning.py --reward binary --lr 2e-5 --prompts 2 --temperature 0.5 --iterations 20

On this 2-core CPU one SRPO iteration (8 episodes of <= --max-steps steps at 64 px, two simulator workers) takes
a few minutes and one evaluation (10 trials x (1 greedy + --samples sampled)) about as long; results and the exact
command in docs/results.md ("Does RL learn on real LIBERO?").
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


def summary(rows: List[Dict], last: int = 3) -> Dict[str, float]:
    evals = [r for r in rows if "val/success_rate" in r]
    practice = [r["rollout/success_rate"] for r in rows if "rollout/success_rate" in r]
    return {"greedy": [round(r["val/success_rate"], 3) for r in evals],
            "sampled": [round(r.get("val/sampled_success_rate", float("nan")), 3) for r in evals],
            "eval_iterations": [r["iteration"] for r in evals],
            "practice_first": round(sum(practice[:last]) / max(1, len(practice[:last])), 3),
            "practice_last": round(sum(practice[-last:]) / max(1, len(practice[-last:])), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--demos", type=int, default=30, help="expert demos recorded and used for SFT")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--sft-steps", type=int, default=1500)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--reward", default="srpo", choices=["srpo", "binary"], help="binary = plain GRPO")
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--samples", type=int, default=2, help="sampled evaluation episodes per held-out trial")
    p.add_argument("--max-steps", type=int, default=200, help="episode limit (libero_object's own: 280; the expert "
                                                               "needs ~115)")
    p.add_argument("--prompts", type=int, default=1, help="init states (groups of 8 episodes) per iteration")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0, help="rollout and sampled-evaluation temperature")
    p.add_argument("--out", default="runs/libero_learning")
    args = p.parse_args()
    # one folder per RL setting beside the shared demos and SFT start: the defaults keep the first runs' names
    arm = args.reward + "".join(f"_{k}{v:g}" for k, v, d in (("lr", args.lr, 1e-4), ("p", args.prompts, 1),
                                                           ("t", args.temperature, 1.0)) if v != d)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    py = sys.executable

    demo_dir = os.path.join(out, "demos")
    files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    if not files:
        run([py, "benchmarks/libero_expert.py", "--record", str(args.demos), "--suite", args.suite, "--task-ids",
             str(args.task_id), "--out", demo_dir, "--image-size", str(args.image_size)], os.path.join(out, "demos.log"))
        files = glob.glob(os.path.join(demo_dir, args.suite, "*_demo.hdf5"))
    env = [f"env.suite={args.suite}", f"env.image_size={args.image_size}", "env.fast_render=true",
           f"env.max_steps={args.max_steps}", "--no-wandb"]
    sft = os.path.join(out, "sft")
    if not os.path.isdir(sft):
        run([py, "train_sft.py", "--config", "configs/sft_libero.yaml", "--task-id", str(args.task_id), *env,
             "env.num_envs=2", f"sft.demo_paths=[{files[0]}]", f"sft.num_demos={args.demos}",
             f"sft.steps={args.sft_steps}", "sft.eval_every=0", "sft.eval_trials=1", "sft.log_every=50",
             "policy.token.preset=tiny", "policy.token.hidden_size=128", "policy.token.lora_rank=0",
             f"sft.output_path={sft}", "seed=0", f"log.output_dir={out}/sft_run", f"log.plots_dir={out}/plots"],
            os.path.join(out, "sft.log"))
    results = {}
    for seed in args.seeds:
        runs = os.path.join(out, f"{arm}_s{seed}")
        run_dir = finished(runs, args.iterations)
        if run_dir is None:
            run([py, "train_srpo.py", "--task-id", str(args.task_id), "--seed", str(seed), *env, "env.num_envs=2",
                 "init.mode=checkpoint", f"init.path={sft}", f"reward.mode={args.reward}",
                 "reward.encoder.kind=pixels", "eval.protocol=heldout", "rollout.n=8",
                 f"rollout.prompts_per_iteration={args.prompts}", f"rollout.temperature={args.temperature}",
                 f"train.lr={args.lr}", f"train.iterations={args.iterations}",
                 "train.ppo_mini_batch_size=16", "train.ppo_micro_batch_size=8", "train.lr_warmup_steps=5", f"eval.every={args.eval_every}",
                 "eval.trials_per_task=10", f"eval.samples_per_trial={args.samples}",
                 f"log.output_dir={runs}", f"log.plots_dir={out}/plots", "log.checkpoint_every=1"],
                os.path.join(out, f"{arm}_s{seed}.log"))
            run_dir = finished(runs, args.iterations)
        results[seed] = summary(rows_of(run_dir))
    print(f"\n{args.suite} task {args.task_id}, {args.demos} expert demos, SFT {args.sft_steps} steps, "
          f"{arm} {args.iterations} iterations x {args.prompts} x 8 episodes, held-out init states 40..49")
    print("| seed | evaluated at | held-out greedy | held-out sampled | practice, first 3 -> last 3 iterations |")
    print("|---|---|---|---|---|")
    for seed, r in results.items():
        print(f"| {seed} | {r['eval_iterations']} | {r['greedy']} | {r['sampled']} | "
              f"{r['practice_first']} -> {r['practice_last']} |")
    with open(os.path.join(out, f"results_{arm}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
