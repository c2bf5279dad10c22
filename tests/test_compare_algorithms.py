"""benchmarks/compare_algorithms.py: its table's statistics (common/curves.py) on fake metric rows (the runs themselves
take hours), and the command lines its arms and presets (common/tabletop_arms.py) start (nothing run)."""
import json
import os
import sys

import numpy as np
import pytest

from common import arms, curves, tabletop_arms  # the statistics the benchmark's table uses; its arms
from tests.scripts import load_benchmark

ca = load_benchmark("compare_algorithms")


def fake_run(successes, steps_per_iteration=1000.0, every=2, phases=(1.0, 0.5, 2.0), eval_s=3.0):
    """Metric rows as the RL scripts log them: the start's evaluation as row 0 at 0 env steps, then one every `every`
    iterations; `successes` = the evaluations in order."""
    rows, evals = [{"iteration": 0, "charts/env_steps": 0, "val/success_rate": successes[0], "time/eval": eval_s}], \
        iter(successes[1:])
    n = (len(successes) - 1) * every
    for it in range(1, n + 1):
        row = {"iteration": it, "charts/env_steps": it * steps_per_iteration, "time/rollout": phases[0],
               "time/reward": phases[1], "time/update": phases[2]}
        if it % every == 0:
            row["val/success_rate"], row["time/eval"] = next(evals), eval_s
        rows.append(row)
    return rows


def test_eval_curve_puts_the_start_at_zero_env_steps():
    xs, ys = curves.eval_curve(fake_run([0.2, 0.4, 0.6]))
    assert xs.tolist() == [0.0, 2000.0, 4000.0]
    assert ys.tolist() == [0.2, 0.4, 0.6]


def test_steps_to_reach_the_first_of_two_evaluations_in_a_row_at_or_above_the_target():
    rows = fake_run([0.2, 0.5, 0.4, 0.9, 0.95])  # evaluations at 0, 2000, ..., 8000 env steps
    assert curves.steps_to(rows, 0.5) == 6000.0  # the single 0.5 at 2000 is followed by 0.4: not held
    assert curves.steps_to(rows, 0.9) == 6000.0
    assert curves.steps_to(rows, 0.95) is None  # only the last evaluation: not held
    assert curves.steps_to(fake_run([0.6, 0.7]), 0.5) == 0.0  # the start already there
    assert arms.steps_to_reach(rows, curves.METRIC, 0.5) == 2000.0  # hold=1: the first one
    assert curves.steps_to(rows, 0.5, hold=1) == 2000.0  # --hold 1


def test_late_mean_averages_the_evaluations_from_two_thirds_of_the_budget_on():
    rows = fake_run([0.2, 0.5, 0.4, 0.9])  # evaluations at 0, 2000, 4000, 6000 env steps
    assert curves.late_mean(rows, budget=6000.0) == pytest.approx((0.4 + 0.9) / 2)  # from 4000 on
    assert curves.late_mean(fake_run([0.2, 0.5]), budget=6000.0) is None  # ended before 4000


def test_band_is_mean_and_std_over_seeds_of_the_interpolated_curves():
    runs = {(0, 1): fake_run([0.0, 0.4]), (0, 2): fake_run([0.2, 0.8])}  # evaluations at 0 and 2000 env steps
    grid, mean, std, seeds = curves.band(runs, budget=4000.0, points=5)  # 0, 1000, 2000, 3000, 4000
    assert grid.tolist() == [0.0, 1000.0, 2000.0, 3000.0, 4000.0]
    np.testing.assert_allclose(seeds[0], [0.0, 0.2, 0.4, 0.4, 0.4])  # held at the last evaluation past it
    np.testing.assert_allclose(mean, [0.1, 0.35, 0.6, 0.6, 0.6])
    np.testing.assert_allclose(std, [0.1, 0.15, 0.2, 0.2, 0.2])


def test_band_averages_tasks_within_a_seed_before_the_spread_over_seeds():
    runs = {(0, 1): fake_run([0.0, 0.4]), (1, 1): fake_run([0.2, 0.8])}  # one seed, two tasks
    _, mean, std, seeds = curves.band(runs, budget=2000.0, points=2)
    assert len(seeds) == 1
    np.testing.assert_allclose(mean, [0.1, 0.6])
    np.testing.assert_allclose(std, [0.0, 0.0])


def test_summarize_cells():
    runs = {(0, 1): fake_run([0.2, 0.5, 0.6]), (0, 2): fake_run([0.4, 0.4, 1.0], steps_per_iteration=2000.0)}
    cells = curves.summarize(runs, {(0, 1): 100.0, (0, 2): 140.0}, budget=6000.0)
    assert cells["seeds"] == "1 2"
    assert cells["iterations"] == "4 ± 0"
    assert cells["env steps used"] == "6,000 ± 2,000"  # 4,000 and 8,000
    assert cells["start"] == "0.30 ± 0.10"
    assert cells["at budget"] == "0.80 ± 0.20"
    assert cells["late mean"] == "0.65 ± 0.05"  # from 4,000 on: 0.6; 0.4 and 1.0
    assert cells["to 50%"] == "2.0 k (1/2 runs)"  # 0.5, 0.6 from 2,000; the second run's 1.0 is its last evaluation
    assert cells["to 90%"] == "not reached"
    assert (cells["rollout"], cells["reward"], cells["update"]) == ("1.00", "0.50", "2.00")
    assert cells["eval"] == f"{6 * 3.0 / 8:.2f}"  # 3 evaluations (the start's too) x 3 s per run, over 8 iterations
    assert cells["total wall"] == "120 s ± 20 s"
    table = curves.markdown_table({"GRPO": cells, "LUFFY": {"seeds": "missing"}})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| algorithm |")
    assert lines[2].startswith("| GRPO | 1 2 | 4 ± 0 | 6,000 ± 2,000 | 0.30 ± 0.10 | 0.80 ± 0.20 | 0.65 ± 0.05 |")
    assert lines[3].startswith("| LUFFY | missing |")


def test_summarize_reads_gae_values_and_flowsar_annotation_as_the_reward_phase():
    rows = fake_run([0.1, 0.2])
    for r in rows[1:]:
        r["time/values"] = r.pop("time/reward")
    assert curves.summarize({(0, 1): rows}, {(0, 1): 10.0}, budget=2000.0)["reward"] == "0.50"
    for r in rows[1:]:
        r.pop("time/values")
    assert curves.summarize({(0, 1): rows}, {(0, 1): 10.0}, budget=2000.0)["reward"] == "-"  # LUFFY: no separate phase


@pytest.mark.parametrize("script,episodes", [("train_srpo.py", 64), ("train_gae_ppo.py", 64), ("train_luffy.py", 64),
                                             ("train_flowsar.py", 32)])
def test_episodes_per_iteration_from_the_shipped_configs(script, episodes):
    assert tabletop_arms.episodes_per_iteration(script) == episodes


def test_runs_as_its_docstring_writes_it():
    import subprocess

    out = subprocess.run([sys.executable, "benchmarks/compare_algorithms.py", "--help"], cwd=ca.ROOT,
                         env=dict(os.environ, PYTHONPATH=""), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--env-steps" in out.stdout, out.stderr[-2000:]


def test_an_interrupted_rerun_is_not_kept_as_the_finished_run(tmp_path, monkeypatch):
    """--reuse re-runs a run whose SFT start changed; if that re-run is interrupted, the old run's record must not
    survive it (its run folder is already gone), so the next --reuse runs it again."""
    (tmp_path / "logs").mkdir()
    info_path = tmp_path / "logs" / f"{ca.run_name('grpo', 0, 1)}.json"
    kept = {"status": "ok", "budget": 1000, "eval_samples": 0, "evals": 5}  # a record from before --iterations
    info_path.write_text(json.dumps({**kept, "sft": 1.0}))
    args = ca.parse(["--out", str(tmp_path), "--env-steps", "1000", "--reuse"])

    def interrupted(cmd, log_path):
        assert "train_srpo.py" == cmd[1]  # run in the checkout, named relative to it: --reuse survives moving it
        raise KeyboardInterrupt

    monkeypatch.setattr(ca, "sh", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ca.train_arm("grpo", 0, 1, {"path": "x", "finished": 2.0}, args)  # a newer SFT start than the record's
    assert not info_path.exists()
    info_path.write_text(json.dumps({**kept, "sft": 2.0}))
    assert ca.train_arm("grpo", 0, 1, {"path": "x", "finished": 2.0}, args)["status"] == "ok"  # same start: kept


def launched(tmp_path, monkeypatch, argv, arm, seed=1):
    """The command line train_arm starts for (arm, task 0, seed) under `argv` (nothing runs), the start at 'START'."""
    cmds = []
    monkeypatch.setattr(ca, "sh", lambda cmd, log_path: cmds.append(cmd[1:]) or (0, 1.0))
    args = ca.parse(["--out", str(tmp_path), *argv])
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)  # main makes it
    assert ca.train_arm(arm, 0, seed, {"path": "START", "finished": 1.0}, args)["status"] == "ok"
    assert len(cmds) == 1  # --iterations: one segment, no resume
    out = os.path.join(str(tmp_path), ca.run_name(arm, 0, seed))
    logs = [f"log.output_dir={tmp_path}", f"log.run_name={ca.run_name(arm, 0, seed)}",
            f"log.plots_dir={tmp_path}/plots"]
    return cmds[0], out, logs


def test_preset_srpo_vs_grpo_runs_what_srpo_vs_grpo_py_ran(tmp_path, monkeypatch):
    """The retired srpo_vs_grpo.py's defaults: train_srpo.py from the start, 60 iterations, evaluated every 5 on trials
    30-49 with 8 sampled episodes each (configs/srpo.yaml's), GRPO = reward.mode=binary; --arm-args for one arm."""
    cmd, _, logs = launched(tmp_path, monkeypatch, ["--preset", "srpo-vs-grpo", "--arm-args", "srpo", "a.b=1",
                                                    "--", "rollout.n=8"], "grpo")
    assert cmd == ["train_srpo.py", "--task-id", "0", "--seed", "1", "--no-wandb", "init.mode=checkpoint",
                   "init.path=START", "eval.every=5", "eval.trial_start=30", "eval.trials_per_task=20",
                   "eval.samples_per_trial=8", *logs, "log.checkpoint_every=100000", "reward.mode=binary",
                   "rollout.n=8", "train.iterations=60"]  # --arm-args srpo ...: not this arm's
    cmd, _, _ = launched(tmp_path, monkeypatch, ["--preset", "srpo-vs-grpo", "--arm-args", "srpo", "a.b=1"], "srpo")
    assert cmd[-2:] == ["a.b=1", "train.iterations=60"]
    args = ca.parse(["--preset", "srpo-vs-grpo"])
    assert (args.arms, args.seeds, args.metric, args.hold, args.targets) == (["srpo", "grpo"], [1],
                                                                              "val/sampled_success_rate", 2, [0.5, 0.9])
    assert args.plot.endswith(os.path.join("plots", "srpo_vs_grpo.png"))
    assert ca.parse(["--preset", "srpo-vs-grpo", "--iterations", "120"]).iterations == 120  # a flag beats the preset


def test_preset_luffy_vs_grpo_runs_what_luffy_vs_grpo_py_ran(tmp_path, monkeypatch):
    """The retired luffy_vs_grpo.py's arms: the RL ones with its practice settings before the command's overrides;
    the SFT arm is train_sft.py from the start on the 10 practice demos (no RL keys); the start a 1-demo SFT."""
    cmd, _, logs = launched(tmp_path, monkeypatch, ["--preset", "luffy-vs-grpo", "--eval-samples", "0", "--",
                                                    "train.lr=1e-3"], "grpo_unfiltered", seed=2)
    assert cmd == ["train_srpo.py", "--task-id", "0", "--seed", "2", "--no-wandb", "init.mode=checkpoint",
                   "init.path=START", "eval.every=5", "eval.trial_start=30", "eval.trials_per_task=20",
                   "eval.samples_per_trial=0", *logs, "log.checkpoint_every=100000", "reward.mode=binary",
                   "algorithm.filter_accuracy=false", "algorithm.entropy_coeff=0.001", "rollout.train_trials=10",
                   "rollout.prompts_per_iteration=8", "rollout.n=8", "env.max_steps=60", "train.lr=1e-3",
                   "train.iterations=30"]
    cmd, out, logs = launched(tmp_path, monkeypatch, ["--preset", "luffy-vs-grpo", "--", "train.lr=1e-3"], "sft")
    assert cmd == ["train_sft.py", "--task-id", "0", "--seed", "1", "--no-wandb", "policy.init_path=START",
                   f"sft.output_path={out}_policy", *logs, "sft.demo_starts=false", "sft.num_demos=10",
                   "sft.steps=300", "sft.eval_every=0", "sft.eval_trial_start=30", "sft.eval_trials=20"]
    args = ca.parse(["--preset", "luffy-vs-grpo"])
    assert (args.arms, args.seeds, args.eval_samples) == (["luffy", "grpo_unfiltered", "sft", "rl_sft"], [1, 2], 4)
    assert args.sft_overrides == ["sft.num_demos=1", "sft.steps=300", "sft.eval_every=0", "sft.eval_trial_start=30",
                                  "sft.eval_trials=20"]


def test_preset_flowsar_ablation_sets_all_three_keys_in_every_arm(tmp_path, monkeypatch):
    cmd, _, _ = launched(tmp_path, monkeypatch, ["--preset", "flowsar-ablation"], "flowsar_sde")
    assert cmd[0] == "train_flowsar.py" and "eval.samples_per_trial=0" in cmd
    assert cmd[-4:] == ["algorithm.loss_variant=softplus_kl", "algorithm.energy_type=sde",
                        "algorithm.ema_schedule=linear", "train.iterations=40"]
    assert tabletop_arms.ARMS["flowsar_shipped"][2] == ["algorithm.loss_variant=mse_branch",
                                                       "algorithm.energy_type=mse", "algorithm.ema_schedule=fixed"]
    args = ca.parse(["--preset", "flowsar-ablation"])
    assert args.arms == ["flowsar_base", "flowsar_mse_branch", "flowsar_sde", "flowsar_fixed_ema", "flowsar_shipped"]
    assert args.sft_overrides == ["sft.num_demos=20", "sft.augment_shift=0"]  # configs/flowsar.yaml's init.sft_args
    assert ca.parse([]).arms == ["srpo", "grpo", "drgrpo", "adv_grpo", "gae_ppo", "flowsar", "luffy"]


def test_a_bad_arm_args_names_the_arms(capsys):
    with pytest.raises(SystemExit):
        ca.parse(["--arm-args", "nope", "a=1"])
    assert "--arm-args nope a=1: give an arm (srpo," in capsys.readouterr().err


def test_each_run_line_and_the_two_arm_ratio():
    a = {(0, 1): fake_run([0.2, 0.5, 0.6, 0.9, 0.9]), (0, 2): fake_run([0.6, 0.7])}  # evaluations every 2000 steps
    b = {(0, 1): fake_run([0.2, 0.4, 0.5, 0.5, 0.9, 0.95]), (0, 2): fake_run([0.1, 0.5, 0.6])}
    assert curves.run_lines("A", a, curves.METRIC, [0.5, 0.9], 2) == [
        "  A task 0 seed 1: 0:0.20 2000:0.50 4000:0.60 6000:0.90 8000:0.90; to 50%: 2000, 90%: 6000",
        "  A task 0 seed 2: 0:0.60 2000:0.70; to 50%: 0, 90%: not reached"]
    assert curves.ratio_lines("A", "B", a, b, curves.METRIC, [0.5, 0.9], 2) == [
        "B / A env steps to 50%: 2.00x over 1 run(s)",  # seed 1: 4000 / 2000; seed 2's A reached it at the start
        "B / A env steps to 90%: 1.33x over 1 run(s)"]  # 8000 / 6000


def test_last_three_and_practice_cells():
    rows = fake_run([0.1, 0.2, 0.4, 0.6, 0.8], every=5)  # 20 iterations
    for i, r in enumerate(rows[1:]):
        r["rollout/success_rate"] = 0.1 if i < 10 else 0.7
    cells = curves.summarize({(0, 1): rows}, {(0, 1): 1.0}, budget=20000.0)
    assert cells["last 3"] == "0.60"  # (0.4 + 0.6 + 0.8) / 3
    assert cells["practice"] == "0.10 -> 0.70"  # iterations 1-10, 11-20


def test_reuse_keeps_a_run_only_of_the_same_iterations_and_overrides(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / f"{ca.run_name('srpo', 0, 1)}.json").write_text(json.dumps(
        {"status": "ok", "budget": 200000, "eval_samples": 8, "evals": 5, "sft": 1.0, "iterations": 60,
         "eval_every": 5, "overrides": []}))
    started = []
    monkeypatch.setattr(ca, "sh", lambda cmd, log_path: started.append(cmd) or (0, 1.0))

    def reuse(*argv):
        args = ca.parse(["--preset", "srpo-vs-grpo", "--out", str(tmp_path), "--reuse", *argv])
        return ca.train_arm("srpo", 0, 1, {"path": "x", "finished": 1.0}, args)["status"]

    assert reuse() == "ok" and len(started) == 0  # the same: kept
    assert reuse("--iterations", "120") == "ok" and len(started) == 1  # longer: run again
    assert reuse("--iterations", "120", "--", "rollout.n=8") == "ok" and len(started) == 2  # other overrides
    assert reuse("--iterations", "120", "--", "rollout.n=8") == "ok" and len(started) == 2  # now kept
