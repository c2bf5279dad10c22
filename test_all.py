"""Run the whole test suite: `python test_all.py` (extra arguments go to one pytest run, e.g. `-k tabletop` or `-x`).

Without arguments the learning tests (tests/test_learning_*.py: one thread each, about 40 minutes together on this
project's 2-core machines) run in a second pytest process beside all the others, whose output streams live; theirs is
printed when they end, then one closing line counts both: the suite takes about as long as the learning tests.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List

ROOT = os.path.dirname(os.path.abspath(__file__))
PYTEST = [sys.executable, "-m", "pytest", "-q", "-rs", "--durations=15", "-p", "no:cacheprovider"]


def counts(text: str) -> Dict[str, int]:
    """passed / failed / skipped of a pytest summary line (errors count as failed)."""
    found = {"passed": 0, "failed": 0, "skipped": 0}
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", line)]
    for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", lines[-1] if lines else ""):
        found["failed" if word.startswith("error") else word] += int(number)
    return found


def run_side_by_side(first: List[str], second: List[str]) -> int:
    """pytest on `first` (output to a file, printed at the end) and on `second` (output live) at the same time; one
    closing line 'N passed, N failed, N skipped' over both; non-zero when either failed."""
    with tempfile.TemporaryFile("w+") as log:
        background = subprocess.Popen(PYTEST + first, stdout=log, stderr=subprocess.STDOUT)
        proc = subprocess.Popen(PYTEST + second, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        shown = []
        for line in proc.stdout:
            sys.stdout.write(line)
            shown.append(line)
        rc_second = proc.wait()
        rc_first = background.wait()
        log.seek(0)
        first_out = log.read()
    print(f"\n---- {' '.join(first)} (run beside the above) ----\n{first_out}", flush=True)
    total = {k: counts(first_out)[k] + counts("".join(shown))[k] for k in ("passed", "failed", "skipped")}
    failed = total["failed"] + (1 if (rc_first or rc_second) and not total["failed"] else 0)
    print(f"{total['passed']} passed, {failed} failed, {total['skipped']} skipped", flush=True)
    return 1 if rc_first or rc_second else 0


if __name__ == "__main__":
    os.chdir(ROOT)
    if sys.argv[1:]:
        sys.exit(subprocess.call(PYTEST + ["tests", *sys.argv[1:]]))
    learning = sorted(glob.glob("tests/test_learning_*.py"))
    sys.exit(run_side_by_side(learning, ["tests", *[f"--ignore={p}" for p in learning]]))
