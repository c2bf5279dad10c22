"""benchmarks/tabletop_default.py's row of a run (common/arms.py's plateau_measures, from hand-made metrics rows, as
train_srpo.py writes them), the held-out check's false-alarm rate (against its closed form) and the folder handling."""
import json

import pytest

from common import arms
from tests.scripts import load_benchmark


def load():
    return load_benchmark("tabletop_default")


def test_a_runs_row_windows_best_last_three_and_both_checks():
    """12 iterations (windows of 10: first 1..10, last 3..12), evaluations at 0, 4, 8, 12: greedy 0.5 / 0.9 / 0.8 /
    0.7 (best 0.9, last three 0.8: holds), sampled 0.4 / 0.8 / 0.6 / 0.6 (best 0.8, last three 0.667: fails)."""
    greedy, sampled = {0: 0.5, 4: 0.9, 8: 0.8, 12: 0.7}, {0: 0.4, 4: 0.8, 8: 0.6, 12: 0.6}
    rows = [{"iteration": 0, "val/success_rate": 0.5, "val/sampled_success_rate": 0.4}]
    for i in range(1, 13):
        row = {"iteration": i, "rollout/success_rate": i / 20, "train/entropy": 0.1 * i, "charts/env_steps": 100 * i}
        if i in greedy:
            row.update({"val/success_rate": greedy[i], "val/sampled_success_rate": sampled[i]})
        rows.append(row)
    r = arms.plateau_measures(rows)
    assert r["practice_first"] == pytest.approx(5.5 / 20) and r["practice_last"] == pytest.approx(7.5 / 20)
    assert r["entropy_first"] == pytest.approx(0.55) and r["entropy_last"] == pytest.approx(0.75)
    assert (r["greedy_start"], r["greedy_best"], r["greedy_last3"]) == pytest.approx((0.5, 0.9, 0.8))
    assert (r["sampled_start"], r["sampled_best"], r["sampled_last3"]) == pytest.approx((0.4, 0.8, 2 / 3))
    assert (r["practice_holds"], r["greedy_holds"], r["sampled_holds"]) == (1.0, 1.0, 0.0)
    assert (r["env_steps"], r["evaluations"]) == (1200.0, 4.0)


def test_false_alarm_against_its_closed_form():
    """Three evaluations of one episode each: the best minus the mean of all three is 0 only when all three agree,
    so the check fails with probability 1 - p^3 - (1 - p)^3 (0.75 at p = 0.5, 0.488 at p = 0.8); a policy that always
    succeeds never fails it."""
    assert arms.false_alarm(0.5, 3, 1) == pytest.approx(0.75, abs=0.01)
    assert arms.false_alarm(0.8, 3, 1) == pytest.approx(1 - 0.8 ** 3 - 0.2 ** 3, abs=0.01)
    assert arms.false_alarm(1.0, 13, 20) == 0.0


def test_the_printed_tables_per_task_their_mean_and_the_checks_noise():
    """The benchmark's two tables (common/arms.py): per task its measures, the mean with how many tasks pass each
    check, the false-alarm line at the runs' number of evaluations (runs without sampled evaluations: an empty cell,
    that check not passed); then start -> end on the held-out set per task and the mean with the intervals above and
    below 0."""
    m1 = {"practice_first": 0.5, "practice_last": 0.75, "greedy_start": 0.5, "greedy_best": 0.9, "greedy_last3": 0.85,
          "entropy_first": 1.0, "entropy_last": 0.5, "env_steps": 12_000.0, "minutes": 10.0, "practice_holds": 1.0,
          "greedy_holds": 1.0, "evaluations": 13.0, "sampled_start": 0.25, "sampled_best": 0.5,
          "sampled_last3": 0.375, "sampled_holds": 0.0}
    m2 = {**m1, "practice_last": 0.25, "practice_holds": 0.0, "env_steps": 8_000.0, "minutes": 20.0,
          "evaluations": 12.0}
    lines = arms.plateau_table([3, 4], [m1, m2])
    assert lines[2:5] == [
        "| 3 | 0.50 -> 0.75 | 0.50 / 0.90 / 0.85 | 0.25 / 0.50 / 0.38 | 1.00 -> 0.50 | 12 k | 10.0 | yes | yes | no |",
        "| 4 | 0.50 -> 0.25 | 0.50 / 0.90 / 0.85 | 0.25 / 0.50 / 0.38 | 1.00 -> 0.50 | 8 k | 20.0 | no | yes | no |",
        "| mean | 0.50 -> 0.50 | 0.50 / 0.90 / 0.85 | | 1.00 -> 0.50 | 10 k | 15.0 | 1 of 2 | 2 of 2 | 0 of 2 |"]
    assert lines[5] == "" and lines[6].startswith("The held-out check's noise: a plateau whose outcomes re-draw")
    assert f"{arms.false_alarm(0.8, 13, 20):.2f} at p = 0.8" in lines[6] and "(13 greedy evaluations" in lines[6]
    greedy_only = {k: v for k, v in m1.items() if not k.startswith("sampled")}
    assert arms.plateau_table([3], [greedy_only])[2].endswith("| 0.50 / 0.90 / 0.85 |  | 1.00 -> 0.50 | 12 k | 10.0 | "
                                                              "yes | yes | no |")
    pair = {"mean_a": 0.5, "mean_b": 0.75, "diff": 0.25, "low": 0.125, "high": 0.375}
    fall = {"mean_a": 0.5, "mean_b": 0.25, "diff": -0.25, "low": -0.375, "high": -0.125}
    assert arms.pairs_table([3, 4], [{"greedy": pair, "sampled": pair}, {"greedy": fall, "sampled": pair}]) == [
        "| task | greedy | sampled |", "|---|---|---|",
        "| 3 | 0.50 -> 0.75, +0.25 [+0.12, +0.38] | 0.50 -> 0.75, +0.25 [+0.12, +0.38] |",
        "| 4 | 0.50 -> 0.25, -0.25 [-0.38, -0.12] | 0.50 -> 0.75, +0.25 [+0.12, +0.38] |",
        "| mean | 0.50 -> 0.50, +0.00; above 0: 1 of 2, below 0: 1 | "
        "0.50 -> 0.75, +0.25; above 0: 2 of 2, below 0: 0 |"]


def test_an_unfinished_run_continues_from_its_checkpoint_and_a_live_one_is_refused(tmp_path, monkeypatch):
    """`one()` used to delete an unfinished folder and start again, even under a run that was still going. Now: the
    newest SRPO run continues when it has a checkpoint (older and checkpoint-less runs are removed), and a run whose
    lock another job holds stops the benchmark in one line, deleting nothing."""
    import common.checkpoint
    from common.run_folder import lock_run_dir

    m = load()
    runs = tmp_path / "t3_s7" / "runs"
    old, new = runs / "srpo__tabletop__t3__s7__20261129-010000", runs / "srpo__tabletop__t3__s7__20261129-020000"
    sft = runs / "train_sft__tabletop__t3__s0__20261129-010001"
    for d in (old, new, sft):
        d.mkdir(parents=True)
    with_checkpoint = {str(new)}
    monkeypatch.setattr(common.checkpoint, "latest_checkpoint", lambda run_dir, **_: (
        run_dir + "/checkpoints/iter_000025" if run_dir in with_checkpoint else None))

    live = lock_run_dir(str(new), "a run")  # held through another open file: as another job would hold it
    try:
        with pytest.raises(SystemExit, match=r"^error: task 3 seed 7: .*is in use by pid \d+"):
            m.stopped_or_restart(str(tmp_path / "t3_s7"), 3, 7)
    finally:
        live.release()
    assert old.is_dir() and new.is_dir()

    assert m.stopped_or_restart(str(tmp_path / "t3_s7"), 3, 7) == str(new)
    assert not old.exists() and new.is_dir() and sft.is_dir()

    with_checkpoint.clear()
    assert m.stopped_or_restart(str(tmp_path / "t3_s7"), 3, 7) is None
    assert not new.exists() and sft.is_dir()


def test_the_start_and_the_end_on_a_held_out_set_paired(tmp_path):
    """end_vs_start runs evaluate.py on the run's SFT start (its config's init.path) and on the run's newest
    checkpoint, paired on the same states (trials 30-49 and drawn ones), and reads paired.json: here an untrained tiny
    policy (which never succeeds) against the weak SFT fixture, so end - start is minus the start's success."""
    import yaml

    from tests.test_evaluate import rl_checkpoint
    from tests.test_heldout import WEAK

    m = load()
    folder = tmp_path / "t0_s7"
    run = rl_checkpoint(tmp_path / "made", train_trials=30, eval_start=30)
    (folder / "runs").mkdir(parents=True)
    run = run.rename(folder / "runs" / "srpo__tabletop__t0__s7__20261129-010000")
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["init"]["path"] = WEAK
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    e = m.end_vs_start(str(folder), 0, 22)
    for mode in ("greedy", "sampled"):
        r = e[mode]
        assert r["mean_b"] == 0.0 and r["diff"] == pytest.approx(-r["mean_a"]) and r["low"] <= r["diff"] <= r["high"]
    paired = json.loads((folder / "heldout22" / "end" / "paired.json").read_text())
    assert paired["a"] == WEAK and paired["heldout_set"]["states"] == 22
    start = json.loads((folder / "heldout22" / "start" / "outcomes.json").read_text())
    assert start["checkpoint"] == WEAK and {k: e[k]["mean_a"] for k in e} == start["success"]
    assert [r["trial_id"] for r in start["episodes"]["greedy"][:21]] == list(range(30, 50)) + [None]
    (folder / "heldout22" / "end" / "outcomes.json").unlink()  # read again, not run again: paired.json is there
    assert m.end_vs_start(str(folder), 0, 22) == e


def test_a_folder_run_with_another_recipe_is_refused_not_read(tmp_path):
    """A finished folder made under an older default (the constant step, before cosine) was read again and reported
    as the current default. Now its saved recipe is compared with the command's: another value exits in one line
    naming the key, both values and the fix; the same command (here with --set of the saved value) reads it; policy
    and init (which the auto_sft start fills in) and log are not part of the recipe."""
    from omegaconf import OmegaConf

    import train_srpo
    from common.config import parse_cli

    m = load()
    cfg = parse_cli(train_srpo.Config, "configs/srpo.yaml", argv=["--task-id", "3", "--seed", "7",
                                                                   "train.lr_schedule=constant"])
    saved = OmegaConf.to_container(OmegaConf.structured(cfg))
    saved["policy"]["hidden_size"] += 1
    saved["log"]["output_dir"] = str(tmp_path / "t3_s7" / "runs")
    run_dir = tmp_path / "t3_s7" / "runs" / "srpo__tabletop__t3__s7__20261129-010000"
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.create(saved), run_dir / "config.yaml")
    with pytest.raises(SystemExit) as e:
        m.refuse_other_recipe(str(tmp_path / "t3_s7"), 3, 7, [])
    assert str(e.value) == (f"error: {run_dir} ran another recipe than this command's: train.lr_schedule=constant "
                            f"(now: cosine): give another --out (or --set the saved values to read it)")
    m.refuse_other_recipe(str(tmp_path / "t3_s7"), 3, 7, ["train.lr_schedule=constant"])  # the same recipe: no exit
    with pytest.raises(SystemExit, match=r"env.task_ids=\[3\] \(now: \[4\]\)"):
        m.refuse_other_recipe(str(tmp_path / "t3_s7"), 4, 7, ["train.lr_schedule=constant"])
