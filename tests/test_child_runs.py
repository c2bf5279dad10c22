"""A benchmark's chain of runs stopped by Ctrl-C (common/child_runs.py): the terminal's SIGINT reaches the benchmark
and the run it is waiting on; the run must be let stop at its safe point (a training run saves the iteration under
way), not killed, and the benchmark exits 130 with one line once it has."""
import os
import signal
import subprocess
import sys
import time

from tests.scripts import ENV, ROOT

CHILD = """
import os, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # a safe point a second away, then the save
    open(sys.argv[1] + "/saved", "w").close()
    sys.exit(130)
signal.signal(signal.SIGINT, stop)
with open(sys.argv[1] + "/ready.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(sys.argv[1] + "/ready.tmp", sys.argv[1] + "/ready")  # whole, once it exists
time.sleep(60)
"""
PARENT = """
import signal, sys
from common.child_runs import run_or_exit
signal.signal(signal.SIGINT, signal.default_int_handler)  # as under a terminal
run_or_exit([sys.executable, sys.argv[1], sys.argv[2]], sys.argv[2] + "/child.log")
"""


def start_chain(tmp_path) -> subprocess.Popen:
    """The chain (PARENT) in its own process group, as a terminal's job, once its run (CHILD) can take a signal."""
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "parent.py").write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "child.py"), str(tmp_path)],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 30
    while not (tmp_path / "ready").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "ready").exists(), proc.communicate(timeout=30)
    return proc


def test_ctrl_c_lets_the_run_save_then_the_chain_exits_130(tmp_path):
    proc = start_chain(tmp_path)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "saved").exists(), f"the run was killed before its save: {err}"
    assert proc.returncode == 130 and "Traceback" not in err
    assert "interrupted: child.py stopped" in err and "run the same command again" in err


def test_a_run_stopped_alone_ends_the_chain_with_the_same_line(tmp_path):
    """A signal to the run alone (a scheduler's, or `kill -INT <its pid>`): it saves and exits 130, and the chain
    says so in the same line and exits 130, not 'failed'."""
    proc = start_chain(tmp_path)
    os.kill(int((tmp_path / "ready").read_text()), signal.SIGINT)  # the run's pid, as it wrote it
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "saved").exists() and proc.returncode == 130
    assert "interrupted: child.py stopped" in err and "failed" not in err and "Traceback" not in err
