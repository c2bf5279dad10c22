"""Every benchmark script starts: `--help` answers (its imports resolve against today's modules; a refactor that
moves a function breaks a benchmark here, not in a reader's hands months later)."""
import glob
import os
import subprocess
import sys

import pytest

from tests.scripts import ROOT

SCRIPTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))


@pytest.mark.slow  # ~5 s each (torch imports): the full tier
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_answers_help(script):
    out = subprocess.run([sys.executable, os.path.join("benchmarks", script), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr[-2000:]
