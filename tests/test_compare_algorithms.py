"""benchmarks/compare_algorithms.py's aggregation on fake metric rows (the runs themselves take hours)."""
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from common import arms  # the statistics the benchmark's table uses
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
    xs, ys = ca.eval_curve(fake_run([0.2, 0.4, 0.6]))
    assert xs.tolist() == [0.0, 2000.0, 4000.0]
    assert ys.tolist() == [0.2, 0.4, 0.6]


def test_steps_to_reach_the_first_of_two_evaluations_in_a_row_at_or_above_the_target():
    rows = fake_run([0.2, 0.5, 0.4, 0.9, 0.95])  # evaluations at 0, 2000, ..., 8000 env steps
    assert ca.steps_to(rows, 0.5) == 6000.0  # the single 0.5 at 2000 is followed by 0.4: not held
    assert ca.steps_to(rows, 0.9) == 6000.0
    assert ca.steps_to(rows, 0.95) is None  # only the last evaluation: not held
    assert ca.steps_to(fake_run([0.6, 0.7]), 0.5) == 0.0  # the start already there
    assert arms.steps_to_reach(rows, ca.METRIC, 0.5) == 2000.0  # hold=1 (srpo_vs_grpo's default): the first one


def test_late_mean_averages_the_evaluations_from_two_thirds_of_the_budget_on():
    rows = fake_run([0.2, 0.5, 0.4, 0.9])  # evaluations at 0, 2000, 4000, 6000 env steps
    assert ca.late_mean(rows, budget=6000.0) == pytest.approx((0.4 + 0.9) / 2)  # from 4000 on
    assert ca.late_mean(fake_run([0.2, 0.5]), budget=6000.0) is None  # ended before 4000


def test_band_is_mean_and_std_over_seeds_of_the_interpolated_curves():
    runs = {(0, 1): fake_run([0.0, 0.4]), (0, 2): fake_run([0.2, 0.8])}  # evaluations at 0 and 2000 env steps
    grid, mean, std, seeds = ca.band(runs, budget=4000.0, points=5)  # 0, 1000, 2000, 3000, 4000
    assert grid.tolist() == [0.0, 1000.0, 2000.0, 3000.0, 4000.0]
    np.testing.assert_allclose(seeds[0], [0.0, 0.2, 0.4, 0.4, 0.4])  # held at the last evaluation past it
    np.testing.assert_allclose(mean, [0.1, 0.35, 0.6, 0.6, 0.6])
    np.testing.assert_allclose(std, [0.1, 0.15, 0.2, 0.2, 0.2])


def test_band_averages_tasks_within_a_seed_before_the_spread_over_seeds():
    runs = {(0, 1): fake_run([0.0, 0.4]), (1, 1): fake_run([0.2, 0.8])}  # one seed, two tasks
    _, mean, std, seeds = ca.band(runs, budget=2000.0, points=2)
    assert len(seeds) == 1
    np.testing.assert_allclose(mean, [0.1, 0.6])
    np.testing.assert_allclose(std, [0.0, 0.0])


def test_summarize_cells():
    runs = {(0, 1): fake_run([0.2, 0.5, 0.6]), (0, 2): fake_run([0.4, 0.4, 1.0], steps_per_iteration=2000.0)}
    cells = ca.summarize(runs, {(0, 1): 100.0, (0, 2): 140.0}, budget=6000.0)
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
    table = ca.markdown_table({"GRPO": cells, "LUFFY": {"seeds": "missing"}})
    lines = table.splitlines()
    assert len(lines) == 4 and lines[0].startswith("| algorithm |")
    assert lines[2].startswith("| GRPO | 1 2 | 4 ± 0 | 6,000 ± 2,000 | 0.30 ± 0.10 | 0.80 ± 0.20 | 0.65 ± 0.05 |")
    assert lines[3].startswith("| LUFFY | missing |")


def test_summarize_reads_gae_values_and_flowsar_annotation_as_the_reward_phase():
    rows = fake_run([0.1, 0.2])
    for r in rows[1:]:
        r["time/values"] = r.pop("time/reward")
    assert ca.summarize({(0, 1): rows}, {(0, 1): 10.0}, budget=2000.0)["reward"] == "0.50"
    for r in rows[1:]:
        r.pop("time/values")
    assert ca.summarize({(0, 1): rows}, {(0, 1): 10.0}, budget=2000.0)["reward"] == "-"  # LUFFY: no separate phase


@pytest.mark.parametrize("script,episodes", [("train_srpo.py", 64), ("train_gae_ppo.py", 64), ("train_luffy.py", 64),
                                             ("train_flowsar.py", 32)])
def test_episodes_per_iteration_from_the_shipped_configs(script, episodes):
    assert ca.episodes_per_iteration(script) == episodes


def test_runs_as_its_docstring_writes_it():
    import subprocess

    out = subprocess.run([sys.executable, "benchmarks/compare_algorithms.py", "--help"], cwd=ca.ROOT,
                         env=dict(os.environ, PYTHONPATH=""), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--env-steps" in out.stdout, out.stderr[-2000:]


def test_a_missing_or_placeholder_script_is_listed_as_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(ca.ARMS, "nope", ("Nope", "train_nope.py", [], "token"))
    args = SimpleNamespace(out=str(tmp_path), reuse=False, env_steps=1000, eval_samples=0, evals=5)
    assert ca.train_arm("nope", 0, 1, {"path": "x", "finished": 1.0}, args)["status"] == "missing"  # nothing ran
    log = tmp_path / "run.log"
    log.write_text("error: train_luffy.py is a placeholder: not written yet\n")
    assert ca.failure("train_luffy.py", str(log)) == "missing"
    log.write_text("Traceback ...\nRuntimeError: shapes do not match\n")
    assert ca.failure("train_luffy.py", str(log)) == "failed"


def test_an_interrupted_rerun_is_not_kept_as_the_finished_run(tmp_path, monkeypatch):
    """--reuse re-runs a run whose SFT start changed; if that re-run is interrupted, the old run's record must not
    survive it (its run folder is already gone), so the next --reuse runs it again."""
    (tmp_path / "logs").mkdir()
    info_path = tmp_path / "logs" / f"{ca.run_name('grpo', 0, 1)}.json"
    info_path.write_text('{"status": "ok", "budget": 1000, "eval_samples": 0, "evals": 5, "sft": 1.0}')
    args = SimpleNamespace(out=str(tmp_path), reuse=True, env_steps=1000, eval_samples=0, evals=5)

    def interrupted(cmd, log_path):
        assert "train_srpo.py" == cmd[1]  # run in the checkout, named relative to it: --reuse survives moving it
        raise KeyboardInterrupt

    monkeypatch.setattr(ca, "sh", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ca.train_arm("grpo", 0, 1, {"path": "x", "finished": 2.0}, args)  # a newer SFT start than the record's
    assert not info_path.exists()
    info_path.write_text('{"status": "ok", "budget": 1000, "eval_samples": 0, "evals": 5, "sft": 2.0}')
    assert ca.train_arm("grpo", 0, 1, {"path": "x", "finished": 2.0}, args)["status"] == "ok"  # same start: kept
