"""Where SRPO's update time goes, against the rollout's (issue #18: the update should cost no more than the rollout).

1. Runs `train_srpo.py` for --iterations (scratch policy, every group kept, no evaluation) twice, with siiRL's old-log-
   prob recompute and with the rollout's log-probs (the default), and prints the means over iterations 2.. of
   time/rollout, time/old_log_prob, time/update and (old log-prob + update) / rollout for each.
2. Takes one rollout of a scratch policy in-process and times the update's pieces on its policy steps (rows): the
   old-log-prob pass, forward / backward per micro-batch, the optimizer step, and the vision tower's share of a forward.
3. On the same rows: forward + backward per row for micro-batches of 16-256, and fp32 against bf16 CPU autocast.

    python benchmarks/update_profile.py [--iterations 4] [--threads 2] [--prompts 8] [--n 8] [-- key=value ...]
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # run as a script

from envs import EnvConfig  # noqa: E402
from common.child_runs import run_or_exit  # noqa: E402
from common.metrics_log import read_rows  # noqa: E402
from common.rollout import collect_rollouts, flatten_steps  # noqa: E402
from envs import make_vector_env  # noqa: E402
from models import TokenPolicy, TokenPolicyConfig  # noqa: E402
from models.vla_backbone import to_pixels  # noqa: E402


def run_script(args) -> None:
    """Both old-log-prob sources, one after the other in the same run: siiRL's recompute (a second forward) and the
    rollout's own log-probs (the default)."""
    for recompute in (True, False):
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, "train_srpo.py", "--task-id", "0", "--no-wandb", "init.mode=scratch",
                   "algorithm.filter_accuracy=false", "eval.every=0", f"train.iterations={args.iterations}",
                   f"rollout.prompts_per_iteration={args.prompts}", f"rollout.n={args.n}",
                   f"train.recompute_old_log_prob={str(recompute).lower()}", "log.run_name=update_profile",
                   f"log.output_dir={out}", f"log.plots_dir={out}", *args.overrides]
            run_or_exit(cmd, os.path.join(out, "log.txt"), {"OMP_NUM_THREADS": str(args.threads)})
            rows = read_rows(os.path.join(out, "update_profile"))
        rows = [r for r in rows if r["iteration"] >= 2] or rows  # row 0 is the start; iteration 1 pays for warm-up
        mean = {k: float(np.mean([r.get(k, 0.0) for r in rows]))
                for k in ("time/rollout", "time/old_log_prob", "time/update", "time/iteration")}
        update = mean["time/old_log_prob"] + mean["time/update"]
        print(f"train_srpo.py, {args.prompts} x {args.n} episodes, {args.threads} threads, "
              f"train.recompute_old_log_prob={str(recompute).lower()}, mean of iterations "
              f"{rows[0]['iteration']}-{rows[-1]['iteration']}:")
        print(f"  rollout {mean['time/rollout']:.2f} s | old log-probs {mean['time/old_log_prob']:.2f} s | PPO "
              f"epochs {mean['time/update']:.2f} s | (old + PPO) / rollout = {update / mean['time/rollout']:.2f} | "
              f"iteration {mean['time/iteration']:.2f} s")


def timed(fn, repeats: int = 1) -> float:
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def profile_pieces(args) -> None:
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig())
    env = make_vector_env(EnvConfig(num_envs=16), seed=0)
    policy.eval()
    batch = collect_rollouts(env, policy, [0] * args.prompts, list(range(args.prompts)), n_samples=args.n,
                             progress=False)
    steps = flatten_steps(batch)
    mb = min(32, len(steps))
    part = steps.take(slice(0, mb))
    tokens = part.tensor("tokens")
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)

    def no_grad_forward():
        with torch.no_grad():
            policy.log_prob(part.obs, part.instructions, tokens)

    def vision():
        enc = policy.core.encoder
        with torch.no_grad():
            enc.vision(torch.cat([to_pixels(part.obs[k], enc.device) for k in ("agentview", "wrist")]))

    no_grad_forward()  # warm-up
    t_old, t_vis = timed(no_grad_forward, 3), timed(vision, 3)
    policy.train()
    t_fwd = t_bwd = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        log_prob, entropy = policy.log_prob(part.obs, part.instructions, tokens)
        loss = -log_prob.mean()
        t1 = time.perf_counter()
        loss.backward()
        t_fwd, t_bwd = t_fwd + (t1 - t0) / 3, t_bwd + (time.perf_counter() - t1) / 3
    t_opt = timed(optimizer.step, 3)
    n_micro = -(-len(steps) // mb)
    print(f"update pieces, scratch policy, {len(steps)} rows ({len(batch)} episodes; rollout "
          f"{batch.stats['time/rollout_policy_s']:.2f} s in the policy, {batch.stats['time/rollout_env_s']:.2f} s "
          f"in the env), micro-batch {mb}, {torch.get_num_threads()} threads:")
    print(f"  old-log-prob pass {t_old * 1e3:.0f} ms per micro-batch (vision tower {t_vis * 1e3:.0f} ms of it, "
          f"{100 * t_vis / t_old:.0f}%) -> {n_micro * t_old:.2f} s per iteration")
    print(f"  PPO micro-batch: forward {t_fwd * 1e3:.0f} ms, backward {t_bwd * 1e3:.0f} ms -> "
          f"{n_micro * (t_fwd + t_bwd):.2f} s per epoch; optimizer step {t_opt * 1e3:.1f} ms per mini-batch")

    # 3. would bigger micro-batches or bf16 autocast on the CPU make the same work cheaper? (same run, same rows)
    def fwd_bwd_ms_per_row(rows, bf16: bool = False) -> float:
        toks = rows.tensor("tokens")

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                log_prob, _ = policy.log_prob(rows.obs, rows.instructions, toks)
            (-log_prob.float().mean()).backward()

        step()  # warm-up
        return timed(step, 3) * 1e3 / len(rows)

    # interleaved rounds, median per setting: a shared machine's load changes within seconds
    sizes = [s for s in (16, 32, 64, 128, 256) if s <= len(steps)]
    rounds = [{s: fwd_bwd_ms_per_row(steps.take(slice(0, s))) for s in sizes} for _ in range(3)]
    print("  forward + backward per row by micro-batch size (median of 3 interleaved rounds): "
          + ", ".join(f"{s}: {np.median([r[s] for r in rounds]):.2f} ms" for s in sizes))
    pairs = np.array([(fwd_bwd_ms_per_row(part), fwd_bwd_ms_per_row(part, bf16=True)) for _ in range(5)])
    fp32, bf16 = np.median(pairs, 0)
    per_pair = np.round(pairs[:, 0] / pairs[:, 1], 2).tolist()
    print(f"  micro-batch {mb}: fp32 {fp32:.2f} ms per row, bf16 autocast {bf16:.2f} ms per row, median of 5 "
          f"interleaved pairs (fp32 / bf16 {fp32 / bf16:.2f}; per pair {per_pair})")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=4, help="train_srpo.py iterations (the first is not averaged)")
    p.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS / torch threads")
    p.add_argument("--prompts", type=int, default=8, help="(task, trial) prompts per iteration")
    p.add_argument("--n", type=int, default=8, help="samples per prompt")
    p.add_argument("--skip-script", action="store_true", help="only the in-process breakdown (part 2)")
    p.add_argument("overrides", nargs="*", help="train_srpo.py overrides for part 1 (after --), e.g. "
                                                "init.mode=checkpoint init.path=checkpoints/sft_tabletop_task0")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if not args.skip_script:
        run_script(args)
    profile_pieces(args)
