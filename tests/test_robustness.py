"""Robustness evaluation (common/robustness.py, `evaluate.py --suites`): suite lists, the aggregates on hand-made
episodes, and evaluate.py as a subprocess writing the tables, JSON, chart and GIFs."""
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import pytest
import torch

import evaluate
from common.robustness import base_of, expand_suites, family_of, markdown, summarize, variants_of
from models.token_policy import TokenPolicy, TokenPolicyConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)
VARIANT_SUITES = ["tabletop_lan", "tabletop_object", "tabletop_swap", "tabletop_task", "tabletop_camera",
                  "tabletop_light", "tabletop_noise", "tabletop_distractor", "tabletop_gripper"]


def test_suite_lists_and_families():
    assert expand_suites("robustness", "tabletop") == ["tabletop"] + VARIANT_SUITES
    assert expand_suites("robustness", "tabletop_lan") == ["tabletop"] + VARIANT_SUITES
    assert variants_of("tabletop") == VARIANT_SUITES and base_of("tabletop_swap") == "tabletop"
    # the base suite comes first and is added when missing (every drop is measured against it)
    assert expand_suites("tabletop_noise, tabletop_lan", "tabletop") == ["tabletop", "tabletop_noise", "tabletop_lan"]
    assert expand_suites("tabletop_lan,tabletop,tabletop_lan", "libero_10") == ["tabletop", "tabletop_lan"]
    assert [family_of(s) for s in ["tabletop"] + VARIANT_SUITES] == [
        None, "language", "objects", "positions", "task", "vision", "vision", "vision", "objects", "positions"]
    with pytest.raises(ValueError, match="unknown env.suite 'tabletop_fog'"):
        expand_suites("tabletop,tabletop_fog", "tabletop")
    with pytest.raises(ValueError, match="mixes the base suites libero_spatial, tabletop"):
        expand_suites("tabletop_lan,libero_spatial", "tabletop")
    with pytest.raises(ValueError, match="'libero_90' has no perturbed variants"):
        expand_suites("robustness", "libero_90")


def record(family, successes, trials=(0, 1, 2, 3)):
    return {"family": family, "changes": "x", "instructions": {}, "episodes": {
        "task_id": [0] * len(successes), "trial_id": list(trials), "success": successes, "steps": [5] * len(successes)}}


def test_summarize_success_drop_paired_counts_and_families():
    per_suite = {"tabletop": record(None, [1, 1, 0, 0]), "tabletop_lan": record("language", [1, 0, 1, 0]),
                 "tabletop_camera": record("vision", [0, 0, 0, 0]), "tabletop_noise": record("vision", [1, 1, 1, 0])}
    out = summarize(per_suite, "tabletop")
    assert out["base_success"] == 0.5
    lan = per_suite["tabletop_lan"]
    assert (lan["success"], lan["drop"], lan["lost"], lan["gained"], lan["n"]) == (0.5, 0.0, 1, 1, 4)
    assert lan["stderr"] == pytest.approx(0.25)  # sqrt(0.5 * 0.5 / 4)
    cam = per_suite["tabletop_camera"]
    assert (cam["drop"], cam["lost"], cam["gained"], cam["stderr"]) == (-0.5, 2, 0, 0.0)
    assert per_suite["tabletop_noise"]["drop"] == 0.25 and per_suite["tabletop_noise"]["gained"] == 1
    vision = out["per_family"]["vision"]  # the two vision variants' 8 episodes pooled: 3 / 8
    assert vision == {"suites": ["tabletop_camera", "tabletop_noise"], "success": 0.375, "n": 8, "drop": -0.125}
    assert list(out["per_family"]) == ["language", "vision"]
    assert out["mean_variant_success"] == pytest.approx((0.5 + 0.0 + 0.75) / 3)
    text = markdown({"checkpoint": "c", "policy_type": "token", "task_ids": [0], "trial_ids": [0, 1, 2, 3],
                     "trials": 4, "seed": 0, "base_suite": "tabletop", "per_suite": per_suite, **out})
    assert "| tabletop_camera | vision | x | 0.0% | 0.0 | -50.0 | 2 / 0 | 4 |" in text
    assert "| vision | tabletop_camera, tabletop_noise | 37.5% | -12.5 | 8 |" in text


def test_evaluate_suites_subprocess_writes_tables_json_chart_gifs(tmp_path):
    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(tmp_path / "policy"))
    out = tmp_path / "robust"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(tmp_path / "policy"), "--suites",
                           "tabletop_lan,tabletop_noise", "--task-ids", "0", "4", "--trials", "2", "--trial-start",
                           "40", "--max-steps", "12", "--num-envs", "4", "--out-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "| tabletop_lan | language | the instruction reworded, same meaning | 0.0% | 0.0 | +0.0 | 0 / 0 | 4 |" \
        in proc.stdout
    res = json.loads((out / "robustness.json").read_text())
    assert res["suites"] == ["tabletop", "tabletop_lan", "tabletop_noise"] and res["base_suite"] == "tabletop"
    assert res["trial_ids"] == [40, 41] and res["task_ids"] == [0, 4] and res["seed"] == 0
    assert res["trial_seeds"] == {"TRIAL_SEED": 20261120, "VARIANT_SEED": 20261125}
    lan = res["per_suite"]["tabletop_lan"]
    assert lan["instructions"] == {"0": "place the red cube on the blue dish",
                                   "4": "put the green cube on top of the red cube"}
    assert lan["episodes"] == {"task_id": [0, 0, 4, 4], "trial_id": [40, 41, 40, 41], "success": [0, 0, 0, 0],
                               "steps": [12, 12, 12, 12]}  # an untrained policy never succeeds: every episode runs out
    assert res["per_suite"]["tabletop"]["instructions"]["0"] == "put the red block on the blue plate"
    assert res["base_success"] == 0.0 and res["per_family"]["vision"]["suites"] == ["tabletop_noise"]
    assert res["per_family"]["vision"]["n"] == 4 and res["per_suite"]["tabletop_noise"]["drop"] == 0.0
    assert (out / "robustness.md").read_text().count("\n| tabletop") == 3
    assert (out / "robustness.png").stat().st_size > 5_000
    for suite in res["suites"]:
        frames = imageio.mimread(out / f"episodes_{suite}.gif")
        assert frames[0].shape[0] == 128 and len(frames) > 1
    noisy = imageio.mimread(out / "episodes_tabletop_noise.gif")
    clean = imageio.mimread(out / "episodes_tabletop.gif")
    assert noisy[0].shape == clean[0].shape and (noisy[0] != clean[0]).any()


def test_bad_suites_stop_with_one_line(tmp_path):
    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(tmp_path / "policy"))
    for suites, msg in [("tabletop,libero_10", "error: --suites mixes the base suites"),
                        ("tabletop_rain", "error: unknown env.suite 'tabletop_rain'")]:
        with pytest.raises(SystemExit) as e:
            evaluate.main(["--checkpoint", str(tmp_path / "policy"), "--suites", suites, "--trials", "1"])
        assert str(e.value).startswith(msg) and "\n" not in str(e.value)
    with pytest.raises(SystemExit, match="^error: --suites evaluates one greedy episode per start; drop --sampled"):
        evaluate.main(["--checkpoint", str(tmp_path / "policy"), "--suites", "robustness", "--sampled"])


def fake_result(base, variants):
    """A robustness.json: `base` and each variant's 0/1 episodes ({suite: [...]}) with their summaries."""
    per_suite = {"tabletop": record(None, base, range(len(base)))}
    for suite, eps in variants.items():
        per_suite[suite] = record(family_of(suite), eps, range(len(eps)))
    return {"base_suite": "tabletop", "per_suite": per_suite, **summarize(per_suite, "tabletop")}


def test_benchmark_aggregates_families_over_tasks_then_seeds(tmp_path):
    from common import robustness as bench  # benchmarks/robustness.py's table

    r1 = fake_result([1, 1, 1, 1], {"tabletop_lan": [1, 1, 0, 0], "tabletop_camera": [0, 0, 0, 0],
                                    "tabletop_noise": [1, 1, 1, 1]})
    v = bench.family_values(r1)
    assert v == {"base": 1.0, "language": 0.5, "vision": 0.5, "all variants": pytest.approx(6 / 12)}
    r2 = fake_result([1, 1, 0, 0], {"tabletop_lan": [0, 0, 0, 0], "tabletop_camera": [1, 1, 1, 1],
                                    "tabletop_noise": [1, 1, 1, 1]})
    r3 = fake_result([0, 0, 0, 0], {"tabletop_lan": [0, 0, 0, 0], "tabletop_camera": [0, 0, 0, 0],
                                    "tabletop_noise": [0, 0, 0, 0]})
    # seed 1: tasks 0 and 1 (r1, r2) averaged; seed 2: r3
    seeds = bench.per_seed({(0, 1): r1, (1, 1): r2, (0, 2): r3})
    assert seeds["base"] == [0.75, 0.0] and seeds["language"] == [0.25, 0.0] and seeds["vision"] == [0.75, 0.0]
    assert seeds["all variants"] == [pytest.approx((6 / 12 + 8 / 12) / 2), 0.0] and seeds["task"] == []
    assert bench.cell([0.75, 0.25]) == "50.0 ± 25.0" and bench.cell([0.5]) == "50.0" and bench.cell([]) == "-"
    rows = {"SFT (token)": bench.per_seed({(0, 0): r3}), "GRPO": seeds}
    text = bench.table(rows, {"GRPO": "SFT (token)"})
    lines = text.splitlines()
    assert lines[0] == ("| policy | seeds | base | language | task | objects | positions | vision | all variants | "
                        "drop: all variants - base | all variants - its SFT start |")
    assert lines[2] == "| SFT (token) | 1 | 0.0 | 0.0 | - | - | - | 0.0 | 0.0 | 0.0 | - |"
    # GRPO: all variants per seed 58.3 / 0.0; drop vs base 58.3 - 75 = -16.7 and 0; vs the SFT start (0.0): +58.3 / 0
    assert lines[3] == ("| GRPO | 2 | 37.5 ± 37.5 | 12.5 ± 12.5 | - | - | - | 37.5 ± 37.5 | 29.2 ± 29.2 | -8.3 ± 8.3 | "
                        "29.2 ± 29.2 |")
    bench.chart(rows, "title", str(tmp_path / "plots" / "robustness.png"))  # the same rows as bars (a column with
    assert (tmp_path / "plots" / "robustness.png").stat().st_size > 1000  # no values is left empty)


def test_policies_side_by_side_per_suite():
    """benchmarks/libero_learning.py --pro's table: per suite (in the first policy's order) what changes and each
    policy's success."""
    from common.robustness import suites_table

    sft = {"libero_spatial": {"changes": "-", "success": 0.5},
           "libero_spatial_swap": {"changes": "swap", "success": 0.2}}
    run = {"libero_spatial": {"changes": "-", "success": 0.75},
           "libero_spatial_swap": {"changes": "swap", "success": 0.125}}
    assert suites_table({"sft": sft, "grpo_s1": run}) == [
        "| suite | what changes | sft | grpo_s1 |", "|---|---|---|---|", "| libero_spatial | - | 0.50 | 0.75 |",
        "| libero_spatial_swap | swap | 0.20 | 0.12 |"]


def test_benchmark_runs_as_its_docstring_writes_it():
    out = subprocess.run([sys.executable, "benchmarks/robustness.py", "--help"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=""), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--skip-training" in out.stdout and "--rl-overrides" in out.stdout, out.stderr[-2000:]
