"""Logger: metrics.jsonl rows, PNG panels, resume appends, wandb off and wandb offline (no network, no repo folders)."""
import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from common.config import LogConfig
from common import metrics_log
from common.metrics_log import Logger, format_line, panel_series

torch.set_num_threads(1)
os.environ["WANDB_SILENT"] = "true"
os.environ["WANDB_MODE"] = "offline"


@dataclass
class Cfg:
    seed: int = 0
    log: LogConfig = field(default_factory=LogConfig)


def metrics_at(i: int) -> dict:
    return {"train/pg_loss": torch.tensor(1.0 / (i + 1)), "train/value_loss": np.float32(0.5),
            "rollout/success_rate": i / 10, "val/success_rate": 0.1 * i, "train/pg_clipfrac": 0.2,
            "train/ppo_kl": 0.01, "train/grad_norm": 2.0, "charts/SPS": 1234.5,
            "not_a_scalar": np.zeros(3)}


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_jsonl_png_and_resume_without_wandb(tmp_path):
    log_cfg = LogConfig(plots_dir=str(tmp_path / "plots"), wandb=False, plot_every=2)
    run_dir = str(tmp_path / "runs" / "r1")
    logger = Logger(run_dir, "r1", Cfg(), log_cfg)
    for i in range(3):
        logger.log(metrics_at(i), step=i)
    png = tmp_path / "plots" / "r1" / "training_curves.png"
    assert png.is_file() and png.stat().st_size > 10_000  # drawn after the 2nd update
    logger.log({"train/pg_loss": float("nan")}, step=3)
    logger.close()
    rows = read_rows(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert rows[1]["train/pg_loss"] == 0.5 and rows[2]["rollout/success_rate"] == 0.2
    assert rows[0]["train/value_loss"] == 0.5 and "not_a_scalar" not in rows[0]
    assert rows[3]["train/pg_loss"] is None  # NaN is written as null, not as invalid JSON
    assert not os.path.exists(os.path.join(run_dir, "wandb"))
    assert sorted(os.listdir(png.parent)) == ["training_curves.png"]  # no temp files left behind

    resumed = Logger(run_dir, "r1", Cfg(), log_cfg)  # a resumed run appends
    assert sorted(resumed.history) == [0, 1, 2, 3] and resumed.history[2]["val/success_rate"] == 0.2
    resumed.log(metrics_at(4), step=4)
    resumed.close()
    assert [r["iteration"] for r in read_rows(os.path.join(run_dir, "metrics.jsonl"))] == [0, 1, 2, 3, 4]


def test_wandb_offline_writes_under_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything wandb might drop in the working directory lands in tmp_path
    log_cfg = LogConfig(plots_dir=str(tmp_path / "plots"), wandb=True, wandb_mode="offline")
    run_dir = str(tmp_path / "runs" / "r2")
    logger = Logger(run_dir, "r2", Cfg(), log_cfg)
    logger.log(metrics_at(0), step=0)
    logger.log(metrics_at(1), step=1)
    logger.close()
    offline_runs = [d for d in os.listdir(os.path.join(run_dir, "wandb")) if d.startswith("offline-run-")]
    assert len(offline_runs) == 1
    with open(os.path.join(run_dir, "wandb_id.txt")) as f:
        assert offline_runs[0].endswith(f.read().strip())
    assert len(read_rows(os.path.join(run_dir, "metrics.jsonl"))) == 2
    assert set(os.listdir(tmp_path)) == {"runs", "plots"}


def test_format_line():
    line = format_line(12, {"charts/SPS": 812.4, "rollout/success_rate": 0.625, "train/pg_loss": -0.01321,
                            "train/steps": 4096}, ["charts/SPS", "rollout/success_rate", "train/pg_loss",
                                                   "train/steps", "missing"])
    assert line == "iter 12 | SPS 812.4 | rollout/success_rate 0.625 | pg_loss -0.01321 | steps 4096"
    # k/N and an ETA; seconds carry a unit (not `iteration 5.72`, read as a count)
    line = format_line(5, {"time/iteration": 5.72, "charts/elapsed_s": 192.0, "val/success_rate": 0.5,
                           "charts/samples_per_s": 56.9}, [
        "time/iteration", "charts/elapsed_s", "val/success_rate", "charts/samples_per_s"], total=30, eta_s=143.0)
    assert line == ("iter 5/30 | time/iteration 5.7s | elapsed_s 3m12s | val/success_rate 0.5 | samples_per_s 56.9 | "
                    "ETA 2m23s")  # a rate (*_per_s) is not a duration


def test_a_metric_is_spelled_the_same_on_every_line():
    """Row 0 shows val/success_rate alone, later rows beside rollout/success_rate: one spelling on both."""
    alone = format_line(0, {"val/success_rate": 0.6}, ["val/success_rate"])
    beside = format_line(1, {"rollout/success_rate": 0.2, "val/success_rate": 0.6},
                         ["rollout/success_rate", "val/success_rate"])
    assert alone == "iter 0 | val/success_rate 0.6" and beside.endswith("| val/success_rate 0.6")


def test_panel_series_labels_for_a_reader_and_keeps_a_repeated_curve():
    history = {0: {"rollout/success_rate": 0.2, "sampling/success_rate": 0.2, "val/success_rate": 0.4},
               1: {"rollout/success_rate": 0.5, "sampling/success_rate": 0.5},
               2: {"rollout/success_rate": 0.6, "sampling/success_rate": 0.7}}
    keys = ["rollout/success_rate", "sampling/success_rate", "val/success_rate"]
    assert panel_series(history, keys) == [("practice rollouts (sampled)", [0, 1, 2], [0.2, 0.5, 0.6], "o", "-"),
                                           ("practice rollouts, before dynamic sampling", [0, 1, 2], [0.2, 0.5, 0.7],
                                            "o", "-"),
                                           ("held-out trials, greedy", [0], [0.4], "o", "-")]
    history[2]["sampling/success_rate"] = 0.6  # the same series: still drawn (dashed over the first) and named
    assert panel_series(history, keys)[1] == ("practice rollouts, before dynamic sampling (= practice rollouts "
                                              "(sampled))", [0, 1, 2], [0.2, 0.5, 0.6], "o", "--")
    assert panel_series({1: {"train/x": 1.0}}, ["train/x"]) == [("train/x", [1], [1.0], "o", "-")]  # no label: the key
    long = {i: {"train/x": 1.0, "val/success_rate": 0.5} for i in range(40)}  # 40 points: only evaluations marked
    assert [c.marker for c in panel_series(long, ["train/x", "val/success_rate"])] == [None, "o"]


def test_the_plot_keeps_coincident_greedy_and_sampled_curves_and_marks_evaluations(tmp_path, monkeypatch):
    """A run whose greedy and sampled held-out success coincide: training_curves.png draws both, each with its
    legend entry, and every evaluation point carries a marker (45 iterations: the practice curve has none)."""
    from matplotlib.figure import Figure

    drawn = {}
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        drawn["lines"] = {ax.get_title(): [(line.get_label(), line.get_marker(), line.get_linestyle())
                                           for line in ax.get_lines()] for ax in fig.axes}
        drawn["legends"] = {ax.get_title(): [t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes}
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    logger = Logger(str(tmp_path / "runs" / "r3"), "r3", Cfg(), LogConfig(plots_dir=str(tmp_path / "plots"),
                                                                         wandb=False, plot_every=0))
    for i in range(45):
        row = {"rollout/success_rate": i / 45, "charts/env_steps": 100.0 * (i + 1)}
        if i % 5 == 0:
            row.update({"val/success_rate": i / 50, "val/sampled_success_rate": i / 50})
        logger.log(row, step=i)
    logger.close()
    assert drawn["lines"]["Success rate"] == [
        ("practice rollouts (sampled)", "None", "-"), ("held-out trials, sampled", "o", "-"),
        ("held-out trials, greedy (= held-out trials, sampled)", "o", "--")]
    assert drawn["legends"]["Success rate"] == [label for label, _, _ in drawn["lines"]["Success rate"]]




def test_read_rows_of_a_running_run_leaves_out_the_line_being_written(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0}\n\n{"iteration": 1}\n{"iteration": 2, "lo')
    assert metrics_log.read_rows(str(tmp_path)) == [{"iteration": 0}, {"iteration": 1}]
