"""The validation set and the SFT-length rule (issue 67): every choice of start is made on a validation set of drawn
states that shares no state with the test set, the demos or the practice trials; the rule (the shortest candidate
whose validation greedy success reaches the bar, else the longest) on hand-made scores, nothing run; and
evaluate.py --drawn-only on tabletop."""
import argparse
import json
import os
import sys

import pytest

import evaluate
from common import heldout
from tests.scripts import ROOT, load_benchmark

WEAK = os.path.join(ROOT, "tests", "fixtures", "tabletop_t0_weak")


def fake_chain(monkeypatch, tmp_path, greedy_by_steps):
    """libero_learning's main with its subprocesses replaced: demos present, each SFT candidate 'made' as a folder,
    each validation evaluation returning the given greedy success. -> the list of candidates trained."""
    m = load_benchmark("libero_learning")
    demos = tmp_path / "demos" / "libero_object"
    demos.mkdir(parents=True)
    (demos / "task_demo.hdf5").write_text("")
    trained = []

    def make_sft(py, out, sft, run_root, demo_file, steps, args, env, made, log):
        trained.append(steps)
        os.makedirs(sft, exist_ok=True)

    def score(py, checkpoint, folder, set_file, args, validation=False, paired=None):
        steps = int(os.path.basename(checkpoint)[1:])
        assert validation and args.validation_seed != args.heldout_seed and "validation" in folder
        g = greedy_by_steps[steps]
        return {"success": {"greedy": g, "sampled": g}, "interval": {"greedy": [g - 0.1, g + 0.1],
                                                                      "sampled": [g - 0.1, g + 0.1]}}

    monkeypatch.setattr(m, "make_sft", make_sft)
    monkeypatch.setattr(m, "score", score)
    monkeypatch.setattr(m, "run_arms", lambda *a: pytest.fail("--sft-only with candidates never touches the test set"))
    monkeypatch.setattr(sys, "argv", ["libero_learning.py", "--suite", "libero_object", "--task-id", "3", "--demos",
                                      "100", "--sft-candidates", "5000", "1500", "3000", "--sft-only", "--out",
                                      str(tmp_path)])
    m.main()
    return trained, json.loads((tmp_path / "sft_choice.json").read_text())


def test_the_rule_takes_the_shortest_start_that_reaches_the_bar_and_trains_no_longer_one(monkeypatch, tmp_path):
    trained, choice = fake_chain(monkeypatch, tmp_path, {1500: 0.22, 3000: 0.30, 5000: 0.9})
    assert trained == [1500, 3000]  # shortest first; 5000 is never trained once 3000 passes (0.30 >= 0.3)
    assert choice["chosen_steps"] == 3000 and choice["validation_set"] == {"states": 50, "seed": 1, "drawn_only": True}
    assert list(choice["candidates"]) == ["1500", "3000"] and choice["candidates"]["1500"]["greedy"]["success"] == 0.22


def test_the_rule_falls_back_to_the_longest_start(monkeypatch, tmp_path):
    trained, choice = fake_chain(monkeypatch, tmp_path, {1500: 0.0, 3000: 0.1, 5000: 0.29})
    assert trained == [1500, 3000, 5000] and choice["chosen_steps"] == 5000


def test_the_validation_set_shares_no_state_with_the_test_set(monkeypatch, tmp_path, capsys):
    heldout.check_disjoint(3, 0, 100, 1, 50)  # passes: other placement seeds
    test = set(heldout.placement_seeds(3, 0, 100))
    val = set(heldout.placement_seeds(3, 1, 50))
    assert not test & val and min(val) >= heldout.SEED_LOW  # far above the demos' placement seeds (1000..)
    with pytest.raises(ValueError, match="is the test set's --heldout-seed"):
        heldout.check_disjoint(3, 0, 100, 0, 50)
    monkeypatch.setattr(heldout, "placement_seeds", lambda task, seed, n: list(range(seed, seed + n)))
    with pytest.raises(ValueError, match=r"share placement seeds \[1, 2\]: choose another --validation-seed"):
        heldout.check_disjoint(3, 0, 3, 1, 3)  # 0 1 2 and 1 2 3
    m = load_benchmark("libero_learning")  # the benchmark's --sft-candidates says it in one line
    (tmp_path / "demos" / "libero_object").mkdir(parents=True)
    (tmp_path / "demos" / "libero_object" / "task_demo.hdf5").write_text("")
    monkeypatch.setattr(sys, "argv", ["libero_learning.py", "--suite", "libero_object", "--task-id", "3",
                                      "--sft-candidates", "1500", "--heldout-seed", "0", "--validation-seed", "0",
                                      "--out", str(tmp_path)])
    monkeypatch.setattr(m, "run", lambda cmd, log: None)
    with pytest.raises(SystemExit, match="^error: --validation-seed 0 is the test set's --heldout-seed"):
        m.main()


def test_drawn_only_evaluates_no_official_trial(tmp_path):
    result = evaluate.main(["--checkpoint", WEAK, "--heldout-set", "3", "--heldout-seed", "1", "--drawn-only",
                            "--max-steps", "3", "--heldout-file", str(tmp_path / "val.json"), "--out-dir",
                            str(tmp_path / "out")])
    assert [r["trial_id"] for r in result["outcomes"]["episodes"]["greedy"]] == [None, None, None]
    assert result["outcomes"]["heldout_set"]["name"] == "tabletop_task0_trialsnone_n3_seed1"
    with pytest.raises(SystemExit, match="add --heldout-set N"):
        evaluate.main(["--checkpoint", WEAK, "--drawn-only"])


def test_sft_from_copies_the_committed_start_once_and_records_no_demos(monkeypatch, tmp_path):
    """--sft-from: the runs start from exactly a saved start (the one committed under docs/data/), copied to
    <out>/sft once, without recording demos or training; sft_settings.json says where it came from."""
    m = load_benchmark("libero_learning")
    start = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0", "sft_start_2026-12-07")
    called = []
    monkeypatch.setattr(m, "run", lambda cmd, log: called.append(cmd))
    monkeypatch.setattr(m, "run_arms", lambda args, out, sft, env, py: called.append(("arms", sft)))
    monkeypatch.setattr(sys, "argv", ["libero_learning.py", "--suite", "libero_spatial", "--demos", "100",
                                      "--sft-steps", "1500", "--sft-from", start, "--sft-only", "--out",
                                      str(tmp_path)])
    m.main()
    assert called == [("arms", str(tmp_path / "sft"))]  # no demos recorded, no SFT trained
    with open(tmp_path / "sft" / "model.safetensors", "rb") as a, open(os.path.join(start, "model.safetensors"),
                                                                          "rb") as b:
        assert a.read() == b.read()
    made = json.loads((tmp_path / "sft_settings.json").read_text())
    assert made["sft_steps"] == 1500 and made["copied_from"] == start


def test_the_committed_start_loads_and_its_outcomes_are_the_docs_numbers():
    """docs/results.md: the start made again on 2026-12-07 (committed) scores 0.39 greedy / 0.55 sampled on the
    table's 100-state set (the same sha256 as the lost start's outcomes), the 2-thread SFT 0.34 / 0.50; the start
    loads as the tiny token policy and carries the provenance of the run that made it."""
    from common.checkpoint import load_saved_policy

    data = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0")
    new, two, old = (heldout.read_outcomes(os.path.join(data, f"{n}_outcomes.json"))
                     for n in ("sft_start_2026-12-07", "sft_2threads_2026-12-07", "sft"))
    assert new["heldout_set"]["sha256"] == two["heldout_set"]["sha256"] == old["heldout_set"]["sha256"]
    assert (new["success"]["greedy"], new["success"]["sampled"]) == pytest.approx((0.39, 0.55))
    assert new["interval"]["greedy"] == pytest.approx([0.30, 0.48])
    assert (two["success"]["greedy"], two["success"]["sampled"]) == pytest.approx((0.34, 0.50))
    assert old["success"]["greedy"] == pytest.approx(0.50)
    policy = load_saved_policy(os.path.join(data, "sft_start_2026-12-07"))
    assert sum(p.numel() for p in policy.parameters()) > 400_000 and policy.cfg.image_size == 64
    (entry,) = json.load(open(os.path.join(data, "sft_start_2026-12-07", "provenance.json")))
    assert entry["dirty"] is False and len(entry["commit"]) == 40


def test_score_draws_the_validation_set_without_official_trials_and_the_test_set_with_them(monkeypatch, tmp_path):
    """libero_learning's one scoring command: the validation set is drawn states only, the test set the official
    trials 40..49 and then drawn states; an outcomes file of the same policy is not scored again."""
    m = load_benchmark("libero_learning")
    commands = []

    def run(cmd, log):  # evaluate.py in this process, episodes cut to 3 steps
        commands.append(cmd)
        evaluate.main(cmd[2:] + ["--max-steps", "3"])

    monkeypatch.setattr(m, "run", run)
    args = argparse.Namespace(validation_set=3, validation_seed=1, heldout_set=12, heldout_seed=0, family="token")
    val = m.score("python", WEAK, str(tmp_path / "val"), str(tmp_path / "val.json"), args, validation=True)
    test = m.score("python", WEAK, str(tmp_path / "test"), str(tmp_path / "test.json"), args)
    assert [r["trial_id"] for r in val["episodes"]["greedy"]] == [None] * 3
    assert [r["trial_id"] for r in test["episodes"]["greedy"]] == list(range(40, 50)) + [None] * 2
    assert set(val["episodes"]) == set(test["episodes"]) == {"greedy", "sampled"}
    assert m.score("python", WEAK, str(tmp_path / "val"), str(tmp_path / "val.json"), args, validation=True) == val
    assert len(commands) == 2


def test_the_table_header_reads_the_chosen_candidates_sft_run(tmp_path):
    """The SFT start's token accuracy and loss above the table come from the run that made it: <out>/sft_run for a
    single start, sft_candidates/s<N>_run for the candidate the rule chose (not the '?' of a missing run)."""
    m = load_benchmark("libero_learning")
    for start, acc in ((tmp_path / "sft", 0.5), (tmp_path / "sft_candidates" / "s3000", 0.62)):
        run = start.parent / f"{start.name}_run"
        (run / "sft__x").mkdir(parents=True)
        rows = [{"iteration": 1, "sft/token_accuracy": 0.1, "sft/loss": 3.0},
                {"iteration": 2, "sft/token_accuracy": acc, "sft/loss": 1.19}]
        (run / "sft__x" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert m.sft_header(str(start)) == {"token_accuracy": acc, "loss": 1.19, "flow_mse": None}
    assert m.sft_header(str(tmp_path / "elsewhere")) == {"token_accuracy": None, "loss": None, "flow_mse": None}
