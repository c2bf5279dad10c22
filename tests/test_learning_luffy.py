"""Learning test: from a very weak SFT start on tabletop task 0 (one demo, 5% of the held-out trials), LUFFY raises
success on held-out trials (deterministic seed, one thread, CPU).

configs/luffy.yaml: 8 prompts per iteration on practice trials 0-9, each a group of 7 on-policy rollouts plus the
scripted expert's demonstration of the same start (tokenised as the policy acts), LUFFY's recipe (GRPO over all 8
rows, no std, policy shaping p / (p + 0.1) on the demo tokens, and no PPO clip: `loss_remove_clip=true`, which the
shipped config turns off); episodes cut at 60 steps as in
benchmarks/luffy_vs_grpo.py, whose seed-1 run this is. 60 iterations; greedy evaluation every 10 on trials 30-49,
which are never practised and never demonstrated. One greedy evaluation of 20 trials swings by +-0.15, so the test
compares the first evaluation with the mean of the last three, and practice success over the first / last 10
iterations. Measured (seed 1, one thread): held-out greedy 0.05 -> 0.0, 0.0, 0.25, 0.35, 0.20, 0.50 (iterations
10-60); practice 0.11 -> 0.28; about 7 minutes on one idle core with the 1-minute start. This shows that LUFFY learns,
not that it beats GRPO: from the same start GRPO rose too (seeds 1 / 2: 0.22 / 0.70, mean of the last three), and 300
SFT steps on the same 10 demos reach 0.60-0.65 (README, "LUFFY vs GRPO vs SFT"). With the shipped config (PPO clip
kept) the same run does not rise (0.05 -> 0.35 0.15 0.05 0.25 0.10 0.00, practice 0.18 -> 0.08); without the clip,
LUFFY collapsed from the 40% DrQ start in all three seeds of benchmarks/compare_algorithms.py, hence the default.
"""
import numpy as np

from tests.scripts import read_metrics, run_script


def test_luffy_raises_held_out_success_from_very_weak_sft(very_weak_sft, tmp_path):
    run_script("train_luffy.py", ["--task-id", "0", "--no-wandb", "--seed", "1", "init.mode=checkpoint",
                                  f"init.path={very_weak_sft}", "train.iterations=60", "eval.every=10",
                                  "eval.trial_start=30", "eval.trials_per_task=20", "eval.samples_per_trial=0",
                                  "rollout.train_trials=10", "rollout.prompts_per_iteration=8", "rollout.n=8",
                                  "env.max_steps=60", "algorithm.loss_remove_clip=true",  # LUFFY's recipe, see above
                                  "log.checkpoint_every=1000"], outputs=tmp_path, timeout=2400)
    (run,) = (tmp_path / "runs").iterdir()
    rows = read_metrics(str(run))
    evals = [r for r in rows if "val/success_rate" in r]
    assert [r["iteration"] for r in evals] == [0, 10, 20, 30, 40, 50, 60]  # before learning (row 0), then every 10
    greedy = np.array([r["val/success_rate"] for r in evals])
    practice = np.array([r["rollout/success_rate"] for r in rows[1:]])  # rows 1..: iterations (on-policy rows only)
    demos = np.array([r["demos/success_rate"] for r in rows[1:]])
    print(f"held-out greedy (trials 30-49) {greedy.round(2).tolist()}; practice (trials 0-9) first/last 10 iterations "
          f"{practice[:10].mean():.2f} / {practice[-10:].mean():.2f}")
    assert (demos == 1.0).all(), demos  # every demonstration replayed as the policy acts succeeds
    assert greedy[-3:].mean() >= greedy[0] + 0.2, greedy
    assert practice[-10:].mean() >= practice[:10].mean() + 0.1, practice
