"""tests/recipes_recheck.py, the re-check of docs/recipes.md's citations: its parsing by hand, every row
checkable (a literal or an EXPECT text: none left to read by hand), and a run against a tiny git repository standing
in for a reference (a cited line that holds the value is ok, one that drifted is MISS)."""
import os
import subprocess

import pytest

from tests import recipes_recheck as recheck


def test_citations_parse_by_hand():
    cell = "siiRL script:50-52@af00a77; siirl/engine/fsdp_workers.py:212@af00a77 (x); RLinf losses.py:221-223,342"
    assert recheck.citations(cell) == [
        ("siiRL", "script", [50, 51, 52], "af00a77"),
        ("siiRL", "siirl/engine/fsdp_workers.py", [212], "af00a77"),
        ("RLinf", "losses.py", [221, 222, 223, 342], "a3816b5"),  # no @: the pinned commit
    ]
    assert recheck.citations("specs openvla_oft.md (no reference)") == []


def test_literals_and_holds():
    numbers, idents = recheck.literals("`5e-6` (lr), clip_ratio_c True")
    assert 5e-6 in numbers and "clip_ratio_c" in idents and "True" in idents
    assert recheck.holds("    lr: 5.0e-06", [5e-6], [], None)  # numbers compare as numbers
    assert not recheck.holds("    lr: 1.0e-05", [5e-6], [], None)
    assert recheck.holds("x = masked_mean_ratio(v)", [], [], "masked_mean_ratio")


def test_every_row_is_checkable():
    """Each row of docs/recipes.md cites a reference file:line, and names a literal or has an EXPECT text."""
    unchecked = []
    for config, key, reference, source in recheck.rows():
        numbers, idents = recheck.literals(reference)
        if not recheck.citations(source) or not (numbers or idents or (config, key) in recheck.EXPECT):
            unchecked.append((config, key))
    assert not unchecked, unchecked


def test_a_drifted_citation_is_a_miss(tmp_path, monkeypatch):
    repo = tmp_path / "ref"
    repo.mkdir()
    (repo / "script.sh").write_text("a=1\nexport PPO_EPOCHS=1\nexport LR=5e-6\n")
    git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()[:7]
    doc = tmp_path / "recipes.md"
    doc.write_text("## `configs/x_libero.yaml`\n\n| key | ours | reference | source | ✓/✗ |\n|---|---|---|---|---|\n"
                   f"| `train.lr` | `5e-6` | 5e-6 | siiRL script:3@{commit} | ✓ |\n"
                   f"| `train.update_epochs` | `1` | 2 | siiRL script:2@{commit} | ✓ |\n")
    monkeypatch.setattr(recheck, "RECIPES", str(doc))
    monkeypatch.setitem(recheck.SHORT, ("siiRL", "script"), "script.sh")
    results = recheck.check({"siiRL": recheck.Checkout(str(repo))})
    assert [(status, key) for status, _, key, _ in results] == [("ok", "train.lr"), ("MISS", "train.update_epochs")]


MIRRORS = os.environ.get("VLA_RL_REFERENCES", "/work/.mirror")  # <owner>+<name>/repo clones of the six references


@pytest.mark.skipif(not os.path.isdir(os.path.join(MIRRORS, "sii-research+siiRL", "repo")),
                    reason="no local reference checkouts (VLA_RL_REFERENCES)")
def test_every_row_confirmed_against_the_local_checkouts():
    assert recheck.main(["--mirror-root", MIRRORS, "--only", "MISS"]) == 0
