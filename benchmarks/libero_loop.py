"""Where a real-LIBERO RL iteration's time goes, and how close the loop runs to the simulator's ceiling, in one run.

    python benchmarks/libero_loop.py --sft runs/libero_learning/libero_object_t0/sft     # the CPU-scale recipe
    python benchmarks/libero_loop.py --prompts 1 --eval-trials 2    # shorter (docs/results.md); scratch policy

1. The ceiling: the same workers (env.num_envs, image size, fast render) stepping chunks of a zero-cost policy
   (`benchmarks/rollout_pipeline.py`'s stand-in) in `collect_rollouts`: env steps per second of the workers' stepping
   time (physics + render, resets left out: "stepping"), and of the wall (resets included).
2. The loop: `train_srpo.py` at the CPU-scale setting of `benchmarks/libero_learning.py` (tiny token policy, 64 px,
   2 workers, 2 init states x 8 episodes of <= 200 steps per iteration, GRPO), --iterations iterations with
   evaluation at the start and every --eval-every, once with env.pipeline=false (the episodes in blocks of N, reset
   together: how the recipe ran before issue 53) and once with env.pipeline=true (episodes streamed: an env takes the
   next episode as soon as it frees, its reset overlapped with the other envs' steps). Each run's wall time is split
   by the timings it logs (metrics.jsonl: time/*, the rollout's policy / physics / reset counters from the workers):
   start-up (+ checkpoints and shut-down: the process's wall time minus its iterations and evaluations), rollout
   (physics + render, resets, idle workers, the policy's share), reward, update, evaluation.
3. A policy as slow as the physics (--latency-ms physics, as rollout_pipeline.py): the rollout alone (no update),
   blocks against streaming, with the stand-in sleeping that long per call.
4. With --sft and --heldout N: the held-out evaluation as `evaluate.py --heldout-set N` runs it (`evaluate_policy` on
   the set's states, greedy then sampled, streamed), in this process: its env steps/s with the simulator builds left
   out, against a ceiling measured just before and after it, and against the same episodes replayed on the same
   workers with a zero-cost policy (their recorded chunks, resets included: the simulator's ceiling for that work).
The last lines sum up what issue 71 asks of the loop from an SFT start (episodes that end early): training + in-run
evaluation end to end, the in-run evaluation alone and the held-out evaluation, each / its ceiling (goal >= 0.85).
Every figure is read against a ceiling measured in the same run (each training run's against the mean of two taken
just before and just after it, as a shared machine's load drifts): compare the ratios, not the seconds. Needs real
LIBERO; --sft is an SFT folder (benchmarks/libero_learning.py makes one), else the policy starts from scratch (every
episode runs to the step limit: no successes, so no uneven episode ends).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.child_runs import only_run, run_or_exit  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402


def env_config(args, num_envs: int):
    from envs import EnvConfig

    return EnvConfig(suite=args.suite, task_ids=[args.task_id], image_size=args.image_size, fast_render=True,
                     max_steps=args.max_steps, num_envs=num_envs, action_chunk=8)


def ceiling(args) -> float:
    """env steps/s of the workers stepping a zero-cost policy (their stepping time: resets left out), measured now."""
    import torch

    from benchmarks.rollout_pipeline import SleepPolicy
    from common.rollout import collect_rollouts
    from envs import make_vector_env

    n = args.workers
    env = make_vector_env(env_config(args, n))
    try:
        torch.manual_seed(0)
        free, episodes = SleepPolicy(8), args.ceiling_episodes * n
        collect_rollouts(env, free, [args.task_id] * n, list(range(n)), progress=False, pipeline=True)  # builds
        b = collect_rollouts(env, free, [args.task_id] * episodes, list(range(episodes)), progress=False,
                             pipeline=True)
        return b.stats["rollout/env_steps"] / (b.stats["time/rollout_physics_s"] / n)
    finally:
        env.close()


def rollout_rates(args) -> Dict[str, float]:
    """Part 1 and 3: the ceiling (zero-cost policy, streamed) and, per latency, blocks vs streaming steps/s."""
    import torch

    from benchmarks.rollout_pipeline import SleepPolicy
    from common.rollout import collect_rollouts
    from envs import make_vector_env

    n = args.workers
    env = make_vector_env(env_config(args, n))
    out: Dict[str, float] = {}
    try:
        torch.manual_seed(0)
        free = SleepPolicy(8)
        collect_rollouts(env, free, [args.task_id] * n, list(range(n)), progress=False, pipeline=True)  # builds
        episodes = args.ceiling_episodes * n
        t0 = time.perf_counter()
        b = collect_rollouts(env, free, [args.task_id] * episodes, list(range(episodes)), progress=False,
                             pipeline=True)
        wall = time.perf_counter() - t0
        steps = b.stats["rollout/env_steps"]
        out["ceiling"] = steps / (b.stats["time/rollout_physics_s"] / n)  # stepping only
        out["ceiling_with_resets"] = steps / (wall - b.stats["time/rollout_build_s"] / n)
        out["reset_s_per_episode"] = b.stats["time/rollout_reset_s"] / episodes
        print(f"ceiling: {out['ceiling']:.1f} env steps/s stepping ({n} workers, {episodes} episodes of "
              f"{args.max_steps} steps, zero-cost policy); {out['ceiling_with_resets']:.1f} with the resets "
              f"({out['reset_s_per_episode']:.2f} s per episode)", flush=True)
        for latency in args.latency_ms:
            ms = 1000 * (b.stats["time/rollout_physics_s"] / n) / (steps / n / 8) / 2 if latency == "physics" \
                else float(latency)  # physics: half a round of chunks (rollout_pipeline.py's definition)
            policy = SleepPolicy(8, ms / 1000)
            for name, pipeline in (("blocks", False), ("streamed", True)):
                t0 = time.perf_counter()
                r = collect_rollouts(env, policy, [args.task_id] * episodes, list(range(episodes)), progress=False,
                                     pipeline=pipeline)
                rate = r.stats["rollout/env_steps"] / (time.perf_counter() - t0)
                out[f"latency_{latency}_{name}"] = rate
                print(f"policy {ms:.0f} ms/call ({latency}), {name}: {rate:.1f} env steps/s = "
                      f"{rate / out['ceiling']:.0%} of the ceiling", flush=True)
    finally:
        env.close()
    return out


def replay_rate(env, batches, options: Dict[str, list], workers: int) -> Dict[str, float]:
    """The simulator's ceiling for the same work: every episode of `batches` (a held-out evaluation's) replayed on the
    same workers with a zero-cost policy: each worker resets to its next episode's start (`options`: the evaluation's
    per-start reset options) and steps the episode's recorded chunks back to back. Env steps/s of the wall with the
    builds left out, and the env steps replayed (equal to the evaluation's when the simulator is deterministic)."""
    import numpy as np

    episodes = []
    for b in batches.values():
        for i in range(len(b)):
            start = {"task_ids": int(b.task_ids[i]), "trial_ids": int(b.trial_ids[i]),
                     **{k: v[int(b.group_ids[i])] for k, v in options.items()}}
            episodes.append((start, b.actions[i, :int(b.valid_steps[i])]))
    todo, current, steps, build = list(range(len(episodes)))[::-1], {}, 0, 0.0

    def start(i: int) -> None:
        e = todo.pop()
        env.reset_envs_async(np.array([i]), {k: [v] for k, v in episodes[e][0].items()})
        current[i] = [e, -1]  # -1: its reset is in flight

    t0 = time.perf_counter()
    for i in range(min(workers, len(todo))):
        start(i)
    while current:
        env.wait_envs(np.array(sorted(current)))
        for i in sorted(current):
            if not env.envs_ready(np.array([i]))[0]:
                continue
            e, c = current[i]
            if c < 0:
                build += float(env.reset_envs_wait(np.array([i]))[1]["build_s"][0])
            else:
                steps += int(env.step_chunk_wait(np.array([i]))["steps"][0])
            if c + 1 < len(episodes[e][1]):
                env.step_chunk_async(np.array([i]), episodes[e][1][c + 1][None])
                current[i][1] = c + 1
            else:
                del current[i]
                if todo:
                    start(i)
    return {"rate": steps / (time.perf_counter() - t0 - build / workers), "steps": steps}


def heldout_rate(args, tmp: str) -> Dict[str, float]:
    """Part 4: the SFT policy on --heldout N states (official trials 40..49 and drawn ones, held-out seed 0), greedy
    and sampled at T 0.5, as evaluate.py --heldout-set runs them; env steps/s without the simulator builds."""
    import torch

    from common import heldout
    from common.checkpoint import load_saved_policy
    from common.evaluation import evaluate_policy
    from envs import make_vector_env

    policy = load_saved_policy(args.sft)
    cfg = env_config(args, args.workers)
    hset, _, _ = heldout.load_or_build(os.path.join(tmp, "heldout_set.json"), cfg, [args.task_id],
                                       list(range(40, 50)), args.heldout, 0)
    starts, options = heldout.starts_and_options(hset)
    env = make_vector_env(cfg)
    evals, replays = [], []
    try:  # evaluation and replay in turns (--heldout-repeats): the same work each time, a drifting load shared
        for _ in range(args.heldout_repeats):
            torch.manual_seed(0)
            t0, cpu0 = time.perf_counter(), time.process_time()
            _, batches = evaluate_policy(env, policy, [args.task_id], [], samples_per_trial=1, temperature=0.5,
                                         greedy=True, pairs=starts, reset_options=options, pipeline=True)
            evals.append((batches, time.perf_counter() - t0, time.process_time() - cpu0))
            replays.append(replay_rate(env, batches, options, args.workers))
    finally:
        env.close()
    (batches, wall, main_cpu), n = evals[0], args.workers  # the first: with the simulator builds
    steps = sum(b.stats["rollout/env_steps"] for b in batches.values())
    build = sum(b.stats["time/rollout_build_s"] for b in batches.values()) / n
    success = {m: float(b.complete.mean()) for m, b in batches.items()}
    per_worker = {k: sum(b.stats[f"time/rollout_{k}_s"] for b in batches.values()) / n for k in ("physics", "reset")}
    rates = [sum(b.stats["rollout/env_steps"] for b in bs.values())
             / (w - sum(b.stats["time/rollout_build_s"] for b in bs.values()) / n) for bs, w, _ in evals]
    return {"steps": steps, "wall": wall, "build": build, "rate": rates[0], **success,
            "physics": per_worker["physics"], "reset": per_worker["reset"] - build,
            "policy": sum(b.stats["time/rollout_policy_s"] for b in batches.values()), "main_cpu": main_cpu,
            "rates": rates, "replays": [r["rate"] for r in replays], "replay_steps": replays[0]["steps"]}


def train_command(args, pipeline: bool, out_dir: str) -> List[str]:
    """train_srpo.py at benchmarks/libero_learning.py's CPU-scale setting."""
    init = ["init.mode=checkpoint", f"init.path={args.sft}"] if args.sft else \
        ["init.mode=scratch", "policy.preset=tiny", "policy.hidden_size=128", f"policy.image_size={args.image_size}"]
    return [sys.executable, "train_srpo.py", "--task-id", str(args.task_id), "--seed", "1", f"env.suite={args.suite}",
            f"env.image_size={args.image_size}", "env.fast_render=true", f"env.max_steps={args.max_steps}",
            "--no-wandb", f"env.num_envs={args.workers}", f"env.pipeline={str(pipeline).lower()}", *init,
            f"reward.mode={args.reward}", "reward.encoder.kind=pixels", "eval.protocol=heldout", "rollout.n=8",
            f"rollout.prompts_per_iteration={args.prompts}", "rollout.temperature=0.5", "train.lr=2e-5",
            f"train.iterations={args.iterations}", "train.mini_batch_size=16", "train.micro_batch_size=8",
            "train.lr_warmup_steps=5", f"eval.every={args.eval_every}", f"eval.trials_per_task={args.eval_trials}",
            f"eval.samples_per_trial={args.eval_samples}", f"log.output_dir={out_dir}", f"log.plots_dir={out_dir}",
            "log.checkpoint_every=1"]


def profile_run(args, pipeline: bool, tmp: str) -> Dict[str, float]:
    """Part 2: one train_srpo.py run, its wall time split by what it logged."""
    out_dir = os.path.join(tmp, f"pipeline_{pipeline}")
    cmd = train_command(args, pipeline, out_dir)
    wall = run_or_exit(cmd, out_dir + ".log")
    rows = read_rows(only_run(out_dir))

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in rows)

    envs = max(float(r.get("rollout/envs", 0.0)) for r in rows) or args.workers
    p: Dict[str, float] = {"wall": wall, "train_steps": total("rollout/env_steps"),
                           "eval_steps": total("eval/env_steps")}
    p["rollout"], p["eval"], p["iterations"] = total("time/rollout"), total("time/eval"), total("time/iteration")
    eval0 = sum(float(r.get("time/eval", 0.0)) for r in rows if r["iteration"] == 0)  # inside iteration 1's time
    p["physics"] = total("time/rollout_physics_s") / envs  # wall-equivalent seconds: worker-seconds / workers
    p["build"] = total("time/rollout_build_s") / envs
    p["reset"] = total("time/rollout_reset_s") / envs - p["build"]
    p["idle"] = p["rollout"] - p["physics"] - p["reset"] - p["build"]
    p["policy"] = total("time/rollout_policy_s")
    p["reward"], p["update"] = total("time/reward"), total("time/update") + total("time/old_log_prob")
    p["other_iteration"] = p["iterations"] - p["rollout"] - p["reward"] - p["update"] - eval0
    p["startup_checkpoint"] = wall - p["iterations"] - (p["eval"] - eval0)
    p["eval_physics"] = total("time/eval_rollout_physics_s") / envs
    p["eval_build"] = total("time/eval_rollout_build_s") / envs
    p["eval_reset"] = total("time/eval_rollout_reset_s") / envs - p["eval_build"]
    p["eval_idle"] = p["eval"] - p["eval_physics"] - p["eval_reset"] - p["eval_build"]
    p["eval_policy"] = total("time/eval_rollout_policy_s")
    p["steady"] = p["iterations"] + p["eval"] - eval0 - p["build"] - p["eval_build"]  # no start-up, no builds
    p["successes"] = sum(float(r.get("rollout/success_rate", 0.0)) for r in rows if "rollout/success_rate" in r)
    return p


def eval_rate(p: Dict[str, float]) -> float:
    """The in-run evaluations' env steps per second of their wall time, the simulator builds left out."""
    return p["eval_steps"] / max(p["eval"] - p["eval_build"], 1e-9)


def cpu_bound(stepping: float, resets: float, policy: float, workers: int) -> float:
    """The most a loop on these cores can reach of the stepping-only ceiling, from its own CPU-seconds: the workers'
    stepping, their resets and the policy's calls (`stepping`, `resets` wall-equivalent per worker, `policy` in the
    main process) all run on the same cores, where the ceiling's zero-cost policy and uncounted resets leave every
    CPU-second to stepping. Other main-process work (messages, logging) is left out: the true bound is lower."""
    cpu_stepping = stepping * workers
    return cpu_stepping / max(cpu_stepping + resets * workers + policy, 1e-9)


def print_profiles(profiles: Dict[str, Dict[str, float]]) -> None:
    names = list(profiles)
    print("\n| seconds (share of the process's wall) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    rows = [("start-up (imports, policy, workers), checkpoints, shut-down", "startup_checkpoint"),
            ("rollout: workers building the task's simulator (first reset)", "build"),
            ("rollout: workers stepping (physics + render)", "physics"),
            ("rollout: workers resetting", "reset"), ("rollout: workers idle (policy, tail, messages)", "idle"),
            ("(the rollout's policy calls, main process)", "policy"), ("reward", "reward"),
            ("update (+ old log-probs)", "update"), ("rest of the iterations (logging, filtering)", "other_iteration"),
            ("evaluation: workers building", "eval_build"), ("evaluation: workers stepping", "eval_physics"),
            ("evaluation: workers resetting", "eval_reset"), ("evaluation: workers idle", "eval_idle"),
            ("(the evaluation's policy calls)", "eval_policy")]
    for label, key in rows:
        print(f"| {label} | " + " | ".join(f"{profiles[n][key]:.0f} ({profiles[n][key] / profiles[n]['wall']:.0%})"
                                         for n in names) + " |")
    print("| **wall** | " + " | ".join(f"{profiles[n]['wall']:.0f}" for n in names) + " |")
    for label, steps_of, secs_of in (
            ("env steps/s end to end, training + evaluation steps, process wall",
             lambda p: p["train_steps"] + p["eval_steps"], lambda p: p["wall"]),
            ("the same without start-up and simulator builds (steady state)",
             lambda p: p["train_steps"] + p["eval_steps"], lambda p: p["steady"]),
            ("training env steps/s, steady state", lambda p: p["train_steps"], lambda p: p["steady"]),
            ("training env steps/s, process wall", lambda p: p["train_steps"], lambda p: p["wall"]),
            ("rollout alone, builds left out", lambda p: p["train_steps"], lambda p: p["rollout"] - p["build"])):
        rates = [(steps_of(profiles[n]) / secs_of(profiles[n]), profiles[n]["ceiling"]) for n in names]
        print(f"| {label} | " + " | ".join(f"{r:.1f} = **{r / c:.0%}** of the ceiling" for r, c in rates) + " |")
    print("| in-run evaluation env steps/s, builds left out | " + " | ".join(
        f"{eval_rate(profiles[n]):.1f} = **{eval_rate(profiles[n]) / profiles[n]['ceiling']:.0%}** of the ceiling"
        for n in names) + " |")
    for label, keys, less in (("workers' time stepping, process wall (load-robust: the run's own stepping rate)",
                                ("physics", "eval_physics"), ()),
                               ("the same, steady state", ("physics", "eval_physics"),
                                ("startup_checkpoint", "build", "eval_build")),
                               ("the same, rollout alone", ("physics",), ("build",))):
        shares = []
        for n in names:
            q = profiles[n]
            total_s = q["rollout"] if keys == ("physics",) else q["wall"]
            shares.append(sum(q[k] for k in keys) / (total_s - sum(q[k] for k in less)))
        print(f"| {label} | " + " | ".join(f"**{x:.0%}**" for x in shares) + " |")
    print("| ceiling (env steps/s, zero-cost policy, measured before and after the run) | " + " | ".join(
        f"{profiles[n]['ceiling']:.1f}" for n in names) + " |")
    print("| env steps (training + evaluation) | " + " | ".join(
        f"{profiles[n]['train_steps']:.0f} + {profiles[n]['eval_steps']:.0f}" for n in names) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default="libero_object")
    p.add_argument("--task-id", type=int, default=0)
    p.add_argument("--sft", default=None, help="SFT policy folder to start from (default: a scratch tiny policy)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=2, help="init states (groups of 8 episodes) per iteration")
    p.add_argument("--reward", default="binary", choices=["binary", "srpo"])
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--eval-every", type=int, default=2)
    p.add_argument("--eval-trials", type=int, default=4, help="held-out init states per evaluation")
    p.add_argument("--eval-samples", type=int, default=1, help="sampled episodes per held-out init state")
    p.add_argument("--ceiling-episodes", type=int, default=2, help="episodes per worker for the ceiling")
    p.add_argument("--latency-ms", nargs="*", default=["physics"], help="stand-in policy latencies (ms or physics)")
    p.add_argument("--modes", nargs="+", default=["blocks", "streamed"], choices=["blocks", "streamed"])
    p.add_argument("--heldout", type=int, default=0, metavar="N",
                   help="with --sft: also time the held-out evaluation of N states (evaluate.py --heldout-set N)")
    p.add_argument("--heldout-repeats", type=int, default=2,
                   help="held-out evaluations, each followed by the replay of its episodes (the load drifts)")
    args = p.parse_args()
    print(f"# {args.suite} task {args.task_id}, {args.image_size} px, {args.workers} workers, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f} at start", flush=True)
    rollout_rates(args)  # parts 1 and 3: printed as measured
    profiles = {}
    with tempfile.TemporaryDirectory(prefix="libero_loop_") as tmp:
        for mode in args.modes:  # each run between two ceilings of its own: the load of a shared machine drifts
            before = ceiling(args)
            p = profile_run(args, mode == "streamed", tmp)
            after = ceiling(args)
            p["ceiling"] = (before + after) / 2
            profiles[f"{mode} (env.pipeline={str(mode == 'streamed').lower()})"] = p
            print(f"{mode}: {p['wall']:.0f} s; ceiling {before:.1f} before, {after:.1f} after; load average "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
        held = None
        if args.sft and args.heldout:
            before = ceiling(args)
            held = heldout_rate(args, tmp)
            held["ceiling"] = (before + ceiling(args)) / 2
            print(f"held-out evaluation: {held['steps']:.0f} env steps in {held['wall']:.0f} s ({held['build']:.0f} s "
                  f"building the simulators), greedy {held['greedy']:.2f}, sampled {held['sampled']:.2f}; "
                  f"ceiling {held['ceiling']:.1f}", flush=True)
    print(f"\n# load average {os.getloadavg()[0]:.1f} at end; the ceiling of each column: the mean of the two "
          f"measured just before and after its run")
    print_profiles(profiles)
    streamed = next((q for n, q in profiles.items() if n.startswith("streamed")), None)
    if streamed is not None:  # issue 71's three ratios, each against the ceiling measured around it
        print(f"\nend to end (training + in-run evaluation, process wall) / ceiling: "
              f"{(streamed['train_steps'] + streamed['eval_steps']) / streamed['wall'] / streamed['ceiling']:.2f} "
              f"(goal >= 0.85)")
        print(f"in-run evaluation (builds left out) / ceiling: {eval_rate(streamed) / streamed['ceiling']:.2f} "
              f"(goal >= 0.85)")
        q, n = streamed, args.workers
        print(f"the most a loop can reach on these cores (CPU-seconds of stepping / stepping + resets + policy): "
              f"training rollout {cpu_bound(q['physics'], q['reset'], q['policy'], n):.2f}, in-run evaluation "
              f"{cpu_bound(q['eval_physics'], q['eval_reset'], q['eval_policy'], n):.2f}")
    if held is not None:
        print(f"held-out evaluation (builds left out) / ceiling: {held['rate'] / held['ceiling']:.2f} (goal >= 0.85); "
              f"the most a loop can reach: {cpu_bound(held['physics'], held['reset'], held['policy'], args.workers):.2f}"
              f" ({cpu_bound(held['physics'], held['reset'], held['main_cpu'], args.workers):.2f} with all of the main "
              f"process's CPU: {held['main_cpu']:.1f} s, of it the policy's calls {held['policy']:.1f} s; the workers' "
              f"stepping {held['physics']:.1f} s and resets {held['reset']:.1f} s each, of {held['wall'] - held['build']:.1f} s)")
        pairs = ", ".join(f"{e:.1f} / {r:.1f} = {e / r:.2f}" for e, r in zip(held["rates"], held["replays"]))
        print(f"held-out evaluation / the same episodes replayed with a zero-cost policy (the simulator's ceiling for "
              f"the same work, resets included), in turns: {pairs}; pooled "
              f"{sum(held['rates']) / sum(held['replays']):.2f} (goal >= 0.85; {held['replay_steps']} of "
              f"{held['steps']:.0f} env steps replayed)")


if __name__ == "__main__":
    main()
