"""test_all.py: the learning tests run beside the others, and the closing line counts both runs."""
import importlib.util
import os

from tests.scripts import ROOT


def _test_all():
    spec = importlib.util.spec_from_file_location("test_all_module", os.path.join(ROOT, "test_all.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_read_pytest_summary_lines():
    counts = _test_all().counts
    assert counts("x\n3 failed, 386 passed, 6 deselected, 6 warnings in 1457.94s (0:24:17)\n") == {
        "passed": 386, "failed": 3, "skipped": 0}
    assert counts("1 error, 2 passed, 4 skipped in 3.0s") == {"passed": 2, "failed": 1, "skipped": 4}


def test_side_by_side_runs_count_both_and_fail_when_either_fails(tmp_path, capsys):
    good, bad = tmp_path / "test_good.py", tmp_path / "test_bad.py"
    good.write_text("def test_a():\n    assert 1\n\ndef test_b():\n    assert 2\n")
    bad.write_text("import pytest\n\ndef test_c():\n    assert 0\n\n@pytest.mark.skip('why')\ndef test_d():\n    pass\n")
    module = _test_all()
    assert module.run_side_by_side([str(good)], [str(good)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "4 passed, 0 failed, 0 skipped"
    assert module.run_side_by_side([str(bad)], [str(good)]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "2 passed, 1 failed, 1 skipped"


def test_every_learning_multi_process_and_real_libero_test_is_in_the_full_tier_only():
    """The fast tier (`python test_all.py`, `-m "not slow"`) leaves out the learning tests, the tests that launch
    several processes (accelerate, torch.multiprocessing) and those that run the real simulator (marked real_libero,
    which conftest makes slow): what pytest collects for the fast tier holds none of them."""
    import ast
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pytest", "tests", "--collect-only", "-q", "-m", "not slow",
                          "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    fast = {line.split("[")[0] for line in out.stdout.splitlines() if "::" in line}
    assert len(fast) > 300, out.stdout[-2000:]
    assert not [t for t in fast if t.startswith("tests/test_learning_")]
    launches = ("accelerate.commands.launch", "mp.spawn", "launch_command(", "torchrun")
    several = []
    for name in sorted({t.split("::")[0] for t in fast}):
        source = open(os.path.join(ROOT, name)).read()
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and f"{name}::{node.name}" in fast:
                body = ast.get_source_segment(source, node)
                if any(k in body for k in launches) and '"--num_processes", "1"' not in body:
                    several.append(f"{name}::{node.name}")
    assert not several, f"tests that launch several processes but are not marked slow: {several}"
    skip_without_libero = "find_spec(" + '"libero") is None'  # an inline skip: the marker's job (split: not this file)
    files = sorted({t.split("::")[0] for t in fast})
    inline = [f for f in files if skip_without_libero in open(os.path.join(ROOT, f)).read()]
    assert not inline, f"a real-LIBERO test skips through the real_libero marker (tests/conftest.py): {inline}"
