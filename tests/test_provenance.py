"""common/provenance.py: which code made a result. The code state of this checkout against git itself, a run
folder's entries per start / resume, the config hash, an exported SFT start pointing at its run, and evaluate.py
--heldout-set writing `provenance` into the outcomes file (older outcomes files without it still read)."""
import json
import os
import subprocess

import evaluate
from common import heldout, provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args):
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True).stdout.strip()


def test_code_state_is_this_checkouts_head_and_its_tracked_changes():
    state = provenance.code_state()
    assert state["commit"] == git("rev-parse", "HEAD") and len(state["commit"]) == 40
    assert state["dirty"] == bool(git("status", "--porcelain", "--untracked-files=no"))
    assert provenance.versions()["torch"].startswith("2.")


def test_config_hash_ignores_key_order_and_sees_values():
    a = provenance.config_sha256({"train": {"lr": 2e-5, "iterations": 3}, "seed": 1})
    assert a == provenance.config_sha256({"seed": 1, "train": {"iterations": 3, "lr": 2e-5}})
    assert a != provenance.config_sha256({"seed": 2, "train": {"iterations": 3, "lr": 2e-5}})
    assert provenance.config_sha256({}) is None


def test_a_run_keeps_one_entry_per_start_and_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert provenance.read_run(str(run)) == []
    provenance.record_run(str(run), 0)
    provenance.record_run(str(run), 8)
    entries = provenance.read_run(str(run))
    assert [e["from_iteration"] for e in entries] == [0, 8]
    assert entries[0]["commit"] == git("rev-parse", "HEAD") and "torch" in entries[0]["versions"]
    (run / "provenance.json").write_text("[1, 2")  # garbage reads as no provenance, not a traceback
    assert provenance.read_run(str(run)) == []


def test_a_checkpoint_finds_its_run_and_an_exported_start_the_run_that_wrote_it(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "iter_000003" / "policy").mkdir(parents=True)
    provenance.record_run(str(run), 0)
    assert provenance.run_folder_of(str(run / "checkpoints" / "iter_000003" / "policy")) == str(run)
    exported = tmp_path / "sft"
    exported.mkdir()
    (exported / provenance.EXPORTED_BY).write_text(str(run) + "\n")
    assert provenance.run_folder_of(str(exported)) == str(run)
    assert provenance.run_folder_of(str(tmp_path / "nowhere")) is None


def test_heldout_outcomes_carry_provenance_and_old_files_still_read(tmp_path):
    from tests.test_evaluate import rl_checkpoint

    run_dir = rl_checkpoint(tmp_path, train_trials=50, eval_start=0)
    provenance.record_run(str(run_dir), 0)
    result = evaluate.main(["--checkpoint", str(run_dir), "--heldout-set", "2", "--max-steps", "3", "--heldout-file",
                            str(tmp_path / "set.json"), "--out-dir", str(tmp_path / "out")])
    p = result["outcomes"]["provenance"]
    assert p["evaluation"]["commit"] == git("rev-parse", "HEAD") and isinstance(p["evaluation"]["dirty"], bool)
    assert [e["from_iteration"] for e in p["training"]] == [0]
    assert p["train_config_sha256"] == provenance.config_sha256(evaluate.saved_train_config(str(run_dir)))
    saved = heldout.read_outcomes(str(tmp_path / "out" / "outcomes.json"))
    assert saved["provenance"] == json.loads(json.dumps(p))
    old = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0", "control_s1_outcomes.json")
    assert "provenance" not in heldout.read_outcomes(old)  # written before provenance existed: still an outcomes file
