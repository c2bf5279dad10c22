"""The validation set and the SFT-length rule (issue 67): every choice of start is made on a validation set of drawn
states that shares no state with the test set, the demos or the practice trials; the rule (the shortest candidate
whose validation greedy success reaches the bar, else the longest) on hand-made scores, nothing run; and
evaluate.py --drawn-only on tabletop."""
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

    def validation_eval(py, checkpoint, folder, set_file, args, temperature):
        steps = int(os.path.basename(checkpoint)[1:])
        assert args.validation_seed != args.heldout_seed and "validation" in folder
        g = greedy_by_steps[steps]
        return {"success": {"greedy": g, "sampled": g}, "interval": {"greedy": [g - 0.1, g + 0.1],
                                                                      "sampled": [g - 0.1, g + 0.1]}}

    monkeypatch.setattr(m, "make_sft", make_sft)
    monkeypatch.setattr(m, "validation_eval", validation_eval)
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


def test_the_validation_set_shares_no_state_with_the_test_set():
    m = load_benchmark("libero_learning")
    args = type("A", (), dict(task_id=3, heldout_seed=0, heldout_set=100, validation_seed=1, validation_set=50))()
    m.check_disjoint(args)  # passes: other placement seeds
    test = set(heldout.placement_seeds(3, 0, 100))
    val = set(heldout.placement_seeds(3, 1, 50))
    assert not test & val and min(val) >= heldout.SEED_LOW  # far above the demos' placement seeds (1000..)
    args.validation_seed = 0
    with pytest.raises(SystemExit, match="is the test set's --heldout-seed"):
        m.check_disjoint(args)


def test_drawn_only_evaluates_no_official_trial(tmp_path):
    result = evaluate.main(["--checkpoint", WEAK, "--heldout-set", "3", "--heldout-seed", "1", "--drawn-only",
                            "--max-steps", "3", "--heldout-file", str(tmp_path / "val.json"), "--out-dir",
                            str(tmp_path / "out")])
    assert [r["trial_id"] for r in result["outcomes"]["episodes"]["greedy"]] == [None, None, None]
    assert result["outcomes"]["heldout_set"]["name"] == "tabletop_task0_trialsnone_n3_seed1"
    with pytest.raises(SystemExit, match="add --heldout-set N"):
        evaluate.main(["--checkpoint", WEAK, "--drawn-only"])
