"""Learning test: from the weak SFT checkpoint on tabletop task 0, GAE-PPO raises success on the trials it practises and
its value head learns to explain the returns (deterministic seed, one CPU thread, ~5 minutes idle plus the session's
shared SFT start).

The start (`weak_sft`, tests/scripts.py SFT_STARTS: no augmentation, 128 wide) solves 15-25% of the held-out trials
30-49 greedily, depending on the CPU's float rounding. configs/gae_ppo.yaml: 64 episodes per iteration on practice
trials 0-9 (sparse success reward, gamma 0.99, lambda 0.95, actor lr 1e-4 after a 50-step warmup, critic lr 1e-3),
20 iterations (about 90 k env steps); evaluation before learning and every 10 iterations on trials 30-49, which are
never practised and never in a demo (1 greedy + 8 sampled episodes each).

How the bounds were set: `python tests/learning_seeds.py --tests gae_ppo --seeds 1 2 3` (AMD EPYC, AVX2 only),
mean +- sd over the three seeds, and what an update that does nothing gives. Re-measured 2026-11-27 after GAE-PPO
began training only on the tokens of the actions the env executed (make_action_mask, #45); the figures of
2026-11-26, before it, in brackets:
- practice success, first -> last 5 iterations (320 episodes each): +0.31 +- 0.19 (0.09, 0.43, 0.40) [+0.29 +- 0.07
  (0.28, 0.37, 0.23)]; do-nothing noise sd 0.034. mean - 2 sd is below 0 with this spread, so the bound comes from
  the noise: asserted >= 0.07 (2 noise sd, below the lowest seed's 0.094, which is seed 1, the one run here).
- explained variance of the value head, mean over the last 10 iterations: 0.49 +- 0.10 (0.55, 0.54, 0.38) [0.54 +-
  0.09]; a fresh or broken head explains ~0 (iteration 1: -0.003 to 0.001). Asserted >= 0.3 (mean - 2 sd = 0.29,
  lowest seed 0.38) and |EV| < 0.1 at iteration 1.
- held-out sampled success, start -> mean of the two evaluations: +0.08 +- 0.03 (0.05, 0.08, 0.09) [+0.10 +- 0.06],
  below 2 noise sd (0.042): printed, not asserted (this start gets better first at the trials it practises). The
  value loss does not fall reliably (the returns' spread grows as success rises): not asserted.
- the last approx KL, 0.003-0.006: asserted < 0.05 (no collapse).
"""
import numpy as np
import pytest

from tests.scripts import learning_run

pytestmark = pytest.mark.slow  # a learning test: the full tier (python test_all.py --all)

SCRIPT, START = "train_gae_ppo.py", "weak"  # tests/scripts.py SFT_STARTS
BOUNDS = {"practice": 0.07, "ev_last10": 0.3}  # asserted: measures(rows)[k] >= BOUNDS[k] (3 seeds: docstring)


def args(seed: int, start: str) -> list:
    return ["--seed", str(seed), "init.mode=checkpoint", f"init.path={start}", "train.iterations=20", "eval.every=10",
            "eval.trial_start=30", "eval.trials_per_task=20", "eval.samples_per_trial=8"]


def measures(rows: list) -> dict:
    """Practice success from the first to the last 5 iterations; held-out sampled success, mean of the two evaluations
    minus the start; the value head's explained variance at iteration 1 and its mean over the last 10; the final
    approx KL."""
    evals = [r for r in rows if "val/success_rate" in r]
    assert [r["iteration"] for r in evals] == [0, 10, 20]  # before learning (row 0), then every 10
    sampled = np.array([r["val/sampled_success_rate"] for r in evals])
    practice = np.array([r["rollout/success_rate"] for r in rows[1:]])  # rows 1..: iterations
    ev = np.array([r["train/explained_variance"] for r in rows[1:]])
    return {"start": evals[0]["val/success_rate"], "practice": practice[-5:].mean() - practice[:5].mean(),
            "sampled": sampled[1:].mean() - sampled[0], "ev_first": ev[0], "ev_last10": ev[-10:].mean(),
            "ppo_kl": rows[-1]["train/ppo_kl"]}


def test_gae_ppo_raises_held_out_success_from_weak_sft(weak_sft, tmp_path):
    m = measures(learning_run(SCRIPT, args(1, weak_sft), tmp_path, timeout=1800))
    print({k: round(float(v), 4) for k, v in m.items()})
    for k, bound in BOUNDS.items():
        assert m[k] >= bound, (k, m)
    assert abs(m["ev_first"]) < 0.1, m  # the fresh head explains ~nothing at iteration 1
    assert m["ppo_kl"] < 0.05, m  # small, clipped steps: no collapse
