"""Run the tests: `python test_all.py` is the fast tier (minutes: unit tests of every formula and short runs of each
script, on both cores), `python test_all.py --all` the full tier CI runs (`.ci/run`): the fast tier plus the tests
marked slow (the learning tests over seeds, multi-process runs, real LIBERO). Extra arguments go to one pytest run,
e.g. `python test_all.py -k tabletop` or `python test_all.py --all -x`.

How the time is spent: the fast tier runs in two pytest workers (pytest-xdist), one thread each. In the full tier the
learning tests (tests/test_learning_*.py: one thread each, the longest tests) run in one pytest process beside a
second one that takes every other test, whose output streams live; the learning tests' output is printed when they
end, then one closing line counts both.
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


def workers() -> List[str]:
    """pytest-xdist's two workers when it is installed (requirements.txt has it), else one process."""
    try:
        import xdist  # noqa: F401
    except ImportError:
        return []
    return ["-n", str(min(2, os.cpu_count() or 1))]


USAGE = """usage: python test_all.py [--all] [PYTEST ARGS ...]

  (nothing)     the fast tier: every test not marked slow, in two workers (minutes)
  --all         the full tier CI runs (.ci/run): the fast tier plus the slow tests (learning tests over seeds,
                multi-process and real-LIBERO runs)
  PYTEST ARGS   one pytest run of a selection, e.g. `python test_all.py -k tabletop`, `python test_all.py --all -x`
                (`python -m pytest --help` lists pytest's own options)
"""


def main(argv: List[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):  # this script's flags, not pytest's 400 lines
        print(__doc__.split("\n\n")[0] + "\n\n" + USAGE, end="")
        return 0
    os.chdir(ROOT)
    full = "--all" in argv
    rest = [a for a in argv if a != "--all"]
    if rest:  # a selection: one pytest run (the fast tier's marker unless --all)
        return subprocess.call(PYTEST + ["tests", *([] if full else ["-m", "not slow"]), *rest])
    if not full:
        return subprocess.call(PYTEST + ["tests", "-m", "not slow", *workers()])
    learning = sorted(glob.glob("tests/test_learning_*.py"))
    return run_side_by_side(learning, ["tests", *[f"--ignore={p}" for p in learning]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
