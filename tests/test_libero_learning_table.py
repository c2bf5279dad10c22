"""benchmarks/libero_learning.py's table: start / best / mean of the last three evaluations, env steps and wall time,
from hand-made metrics rows (what train_srpo.py writes), and its PNG."""
import importlib.util
import os

import pytest

from tests.scripts import ROOT


def load():
    spec = importlib.util.spec_from_file_location("libero_learning", os.path.join(ROOT, "benchmarks",
                                                                                  "libero_learning.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(greedy, sampled, practice):
    """Evaluations at iterations 0, 2, 4, ...; one iteration of 100 env steps and 10 s each, each evaluation 5 s
    (iteration 1's time includes evaluation 0, as train_srpo.py measures it)."""
    out = [{"iteration": 0, "val/success_rate": greedy[0], "val/sampled_success_rate": sampled[0], "time/eval": 5.0,
            "charts/env_steps": 0.0}]
    for i, p in enumerate(practice, start=1):
        row = {"iteration": i, "rollout/success_rate": p, "charts/env_steps": 100.0 * i,
               "time/iteration": 10.0 + (5.0 if i == 1 else 0.0)}
        if i % 2 == 0:
            row.update({"val/success_rate": greedy[i // 2], "val/sampled_success_rate": sampled[i // 2],
                        "time/eval": 5.0})
        out.append(row)
    return out


def test_summary_start_best_last_three_steps_and_wall():
    ll = load()
    r = ll.summary(rows([0.5, 0.4, 0.8, 0.6, 0.7], [0.2, 0.3, 0.3, 0.5, 0.4], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]))
    assert r["greedy_start"] == 0.5 and r["greedy_best"] == 0.8 and r["greedy_last"] == pytest.approx(0.7)
    assert r["sampled_start"] == 0.2 and r["sampled_best"] == 0.5 and r["sampled_last"] == pytest.approx(0.4)
    assert r["practice_first"] == pytest.approx(0.2) and r["practice_last"] == pytest.approx(0.7)
    assert r["eval_iterations"] == [0, 2, 4, 6, 8] and r["env_steps"] == [0.0, 200.0, 400.0, 600.0, 800.0]
    assert r["total_env_steps"] == 800
    assert r["wall_s"] == 8 * 10 + 5 + 4 * 5  # iterations, evaluation 0 (inside iteration 1), evaluations 2..8


def test_table_has_a_mean_row_over_seeds_and_the_png_is_written(tmp_path, capsys):
    ll = load()
    results = {"binary": {1: ll.summary(rows([0.5, 0.6], [0.2, 0.4], [0.1, 0.3])),
                          2: ll.summary(rows([0.3, 0.8], [0.4, 0.6], [0.3, 0.5]))}}
    ll.print_table(results)
    lines = capsys.readouterr().out.splitlines()
    mean = [line for line in lines if line.startswith("| binary | mean |")]
    assert len(mean) == 1
    assert "0.40 / 0.70 / 0.55" in mean[0]  # start (0.5+0.3)/2, best (0.6+0.8)/2, last three = mean of all (2 evals)
    # practice over the first and the last three iterations: both are the two there are (0.2 and 0.4 per seed)
    assert "0.30 / 0.50 / 0.40" in mean[0] and "0.30 -> 0.30" in mean[0] and "| 200 |" in mean[0]
    png = tmp_path / "curves.png"
    ll.plot_curves(results, "title", str(png))
    assert png.stat().st_size > 1000


def test_an_out_folder_holding_another_tasks_sft_start_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "train_config.yaml").write_text("env:\n  suite: libero_object\n  task_ids:\n  - 0\n")
    (sft / "config.json").write_text("{}")  # a saved policy's files (their contents are not read here)
    (sft / "model.safetensors").write_bytes(b"")
    assert load().sft_task(str(sft)) == ("libero_object", 0) and load().sft_task(str(tmp_path / "none")) is None
    out = subprocess.run([sys.executable, "benchmarks/libero_learning.py", "--suite", "libero_spatial", "--out",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert out.stderr.strip() == (f"error: {tmp_path}/sft was trained on libero_object task 0, not libero_spatial "
                                  f"task 0: give this task its own --out")
