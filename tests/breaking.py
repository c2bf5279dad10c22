"""What the reliability tests (tests/test_interrupts.py, tests/test_handed_over.py) share: run a script as a user
would (its own process group, outputs under the test's folder, one thread per process), break it the way the world
does (a signal to the group or to one worker, a checkpoint write that is slow or hit by a signal, a full disk), and
check what was left: checkpoints verify against their manifest, no temporary folders, one line with advice that
works, the resume finishes with every iteration logged once.

A probe is a function of its folder `out` that fails (pytest.fail) when a promise broke and returns what it checked;
`@probe` makes it a test (pytest -s prints the returned line). Full-disk probes mount a small tmpfs (root; skipped
otherwise)."""
from __future__ import annotations

import glob
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import pytest

from tests.scripts import ENV, ROOT

FIXTURES = os.path.join(ROOT, "tests", "fixtures")
L1 = os.path.join(FIXTURES, "tiny_openvla_oft_l1")
OFT = os.path.join(FIXTURES, "tiny_openvla_oft")


# tiny, fast settings per script (the tests' own), with weights that really move and a checkpoint only when asked
SRPO = ["--task-id", "0", "init.mode=scratch", "env.num_envs=8", "env.max_steps=16", "rollout.n=4",
        "rollout.prompts_per_iteration=2", "rollout.train_trials=10", "eval.every=1", "eval.trials_per_task=2",
        "eval.samples_per_trial=0", "reward.encoder.num_frames=4", "--no-wandb", "algorithm.filter_accuracy=false",
        "algorithm.entropy_coeff=0.01", "log.keep_checkpoints=10", "train.lr=1e-3"]
GAE_PPO = ["--task-id", "0", "init.mode=scratch", "env.num_envs=8", "env.max_steps=16",
           "rollout.prompts_per_iteration=4", "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=0",
           "train.lr_warmup_steps=1", "--no-wandb", "log.keep_checkpoints=10"]
LUFFY = ["--task-id", "0", "init.mode=scratch", "env.num_envs=8", "env.max_steps=32", "rollout.n=4",
         "rollout.prompts_per_iteration=2", "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=0",
         "train.mini_batch_size=16", "train.micro_batch_size=8", "--no-wandb", "log.keep_checkpoints=10"]
FLOWSAR = ["--task-id", "0", "init.mode=scratch", "policy.hidden_size=32", "policy.expert_dim=32",
           "policy.num_layers=1", "policy.num_heads=2", "env.num_envs=8", "env.max_steps=16", "rollout.n=2",
           "rollout.prompts_per_iteration=2", "rollout.flow_steps=2", "eval.every=1", "eval.trials_per_task=2",
           "eval.samples_per_trial=0", "train.mini_batch_size=8", "train.micro_batch_size=4", "--no-wandb",
           "log.keep_checkpoints=10"]
SFT = ["--task-id", "0", "--no-wandb", "policy.token.hidden_size=32", "policy.token.num_layers=1",
       "policy.token.num_heads=2", "sft.num_demos=2", "sft.batch_size=8", "sft.eval_trials=2", "env.max_steps=8",
       "env.num_envs=2", "sft.augment_shift=2", "sft.warmup_steps=5"]
FAST = {"train_srpo.py": SRPO, "train_gae_ppo.py": GAE_PPO, "train_luffy.py": LUFFY, "train_flowsar.py": FLOWSAR,
        "train_sft.py": SFT}


# ---- running scripts

def port() -> int:
    """A free TCP port for a launch's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launcher(processes: int) -> List[str]:
    """python, or accelerate's CPU launch of N processes (the shipped launch file) on a fresh port."""
    if processes == 1:
        return [sys.executable]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            os.path.join(ROOT, "configs", "accelerate", "cpu_2proc.yaml"), "--num_processes", str(processes),
            "--main_process_port", str(port())]


def start(script: str, args: Sequence[str], out: str, processes: int = 1, wrapper: Optional[str] = None,
          env: Optional[Dict[str, str]] = None, cwd: str = ROOT, outputs: bool = True) -> subprocess.Popen:
    """The script in its own process group (a terminal's foreground job), outputs under `out`."""
    paths = [f"log.output_dir={out}/runs", f"log.plots_dir={out}/plots"] if outputs else []
    target = [os.path.join(FIXTURES, wrapper), script] if wrapper else [os.path.join(ROOT, script)]
    proc = subprocess.Popen([*launcher(processes), *target, *args, *paths], cwd=cwd, env=dict(ENV, **(env or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.log_dir = out  # finish() keeps what it printed there
    return proc


def finish(proc: subprocess.Popen, timeout: float = 900) -> tuple:
    """(exit code, stdout, stderr); a process still running after `timeout` s is a hang (killed, the test fails)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"still running {timeout:.0f} s later (hang); stderr: {tail(stderr)}")
    finally:
        if getattr(proc, "log_dir", None):
            n = len(glob.glob(os.path.join(proc.log_dir, "log_*.out")))
            for ext, text in (("out", locals().get("stdout")), ("err", locals().get("stderr"))):
                with open(os.path.join(proc.log_dir, f"log_{n}.{ext}"), "w") as f:
                    f.write(text or "")
    return proc.returncode, stdout, stderr


def run(script: str, args: Sequence[str], out: str, processes: int = 1, **kw) -> tuple:
    return finish(start(script, args, out, processes, **kw))


def tail(text: str, n: int = 400) -> str:
    lines = [line for line in text.strip().splitlines() if "ep/s" not in line and line.strip()]
    return " | ".join(lines[-4:])[-n:]


def one_run(out: str, prefix: str = "") -> str:
    """The run folder under `out`/runs whose name starts with `prefix`."""
    runs = sorted(glob.glob(os.path.join(out, "runs", prefix + "*")))
    runs = [r for r in runs if os.path.isdir(r)]
    if len(runs) != 1:
        pytest.fail(f"expected one run folder under {out}/runs, found {[os.path.basename(r) for r in runs]}")
    return runs[0]


def rows(run_dir: str) -> List[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def iterations(run_dir: str) -> List[int]:
    return [r["iteration"] for r in rows(run_dir)]


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen, timeout: float = 600, what: str = "") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if condition():
                return
        except (OSError, ValueError, json.JSONDecodeError):
            pass
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: {tail(proc.stderr.read())}")
        time.sleep(0.05)
    pytest.fail(f"no {what} within {timeout:.0f} s")


def logged(out: str, iteration: int, prefix: str = "", key: str = "iteration") -> Callable[[], bool]:
    """True once the run under `out` has logged a row with `key` >= `iteration`."""
    def check() -> bool:
        runs = glob.glob(os.path.join(out, "runs", prefix + "*", "metrics.jsonl"))
        return bool(runs) and any(r.get(key, -1) >= iteration for r in rows(os.path.dirname(runs[0])))
    return check


def workers(proc: subprocess.Popen) -> Dict[int, int]:
    """{rank: pid} of an accelerate launch's worker processes (children of its launcher)."""
    found = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != proc.pid:
                continue
            pid = int(stat.split("/")[2])
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = pid
        except (OSError, ValueError, IndexError):
            continue
    return found


# ---- what a stopped run must have left

def checkpoints(run_dir: str) -> List[str]:
    root = os.path.join(run_dir, "checkpoints")
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def check_checkpoints(run_dir: str) -> List[int]:
    """Every checkpoint verifies against its manifest; no temporary folder is left. Their iterations."""
    from common.checkpoint import CheckpointError, verify_checkpoint

    names = checkpoints(run_dir)
    leftovers = [n for n in names if not re.fullmatch(r"iter_\d{6}", n)]
    if leftovers:
        pytest.fail(f"left in {run_dir}/checkpoints: {leftovers}")
    for name in names:
        try:
            verify_checkpoint(os.path.join(run_dir, "checkpoints", name))
        except CheckpointError as e:
            pytest.fail(str(e))
    return [int(n[5:]) for n in names]


def no_traceback(stderr: str, processes: int = 1) -> None:
    """No traceback from our processes (with several, torch's launcher prints its own for a failed launch: the lines
    of a worker's traceback carry its [rankN] prefix)."""
    lines = stderr.splitlines() if processes == 1 else [line for line in stderr.splitlines() if "[rank" in line]
    if any("Traceback" in line for line in lines):
        pytest.fail(f"a traceback: {tail(stderr, 700)}")


def error_lines(stderr: str) -> List[str]:
    """The `error: ...` lines (a worker's may carry a [rankN]: prefix), without the prefix."""
    return [line[line.index("error: "):] for line in stderr.splitlines() if re.search(r"(^|: )error: ", line)]


def continue_command(stdout: str, stderr: str = "") -> List[str]:
    """The command the run said to continue with (its last 'continue with: ...'), runnable here."""
    said = re.findall(r"continue with: (.+?)(?:\s*$)", stdout + "\n" + stderr, flags=re.M)
    if not said:
        pytest.fail(f"no 'continue with:' advice; stdout: {tail(stdout)}; stderr: {tail(stderr)}")
    words = shlex.split(said[-1])
    if words[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(port()), *words[2:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    pytest.fail(f"unexpected advice: {said[-1]}")


def run_advice(stdout: str, stderr: str = "", extra: Sequence[str] = (), env=None, cwd: str = ROOT,
               log_dir: Optional[str] = None) -> tuple:
    cmd = [*continue_command(stdout, stderr), *extra]
    proc = subprocess.Popen(cmd, cwd=cwd, env=dict(ENV, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    proc.log_dir = log_dir
    return finish(proc)


def resumed_to_the_end(run_dir: str, stdout: str, stderr: str, total: int, extra: Sequence[str] = ()) -> str:
    """Run the advised command: it must finish, and every iteration 0/1..total appear once."""
    code, out2, err2 = run_advice(stdout, stderr, extra, log_dir=os.path.dirname(os.path.dirname(run_dir)))
    if code != 0:
        pytest.fail(f"the advised resume failed (exit {code}): {tail(err2)}")
    its = iterations(run_dir)
    if sorted(set(its)) != its or its[-1] != total:
        pytest.fail(f"after the resume the metrics rows are iterations {its}")
    return f"resume finished ({len(its)} rows, each once)"


def probe(fn: Callable[[str], str]):
    """The probe `fn(out) -> what it checked` as a test of its own tmp_path (no __wrapped__: pytest sees tmp_path)."""
    def test(tmp_path):
        print(f"held   {fn.__name__[5:]}: {fn(str(tmp_path))}")
    test.__name__, test.__doc__ = fn.__name__, fn.__doc__
    return test


def no_temporary_copies(*folders: str) -> None:
    """Fails when an interrupted write left a temporary copy (a *.tmp* name) in any of `folders`."""
    left = [n for folder in folders for n in os.listdir(folder) if ".tmp" in n]
    if left:
        pytest.fail(f"temporary copies left in {', '.join(folders)}: {left}")


def ctrl_c_two_processes(script: str, out: str, stop_after: int = 1, total: int = 3, extra: Sequence[str] = ()) -> str:
    """Ctrl-C in the terminal (SIGINT to the launcher and both processes) once iteration `stop_after` is logged, no
    checkpoint due: both stop together, that iteration saved, the advised resume finishes."""
    proc = start(script, [*FAST[script], f"train.iterations={total}", "log.checkpoint_every=100", *extra], out, 2)
    wait_for(logged(out, stop_after), proc, what=f"iteration {stop_after}")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    no_traceback(stderr, 2)
    saved = check_checkpoints(run_dir)
    if len(saved) != 1:
        pytest.fail(f"checkpoints after the stop: {saved}; stderr: {tail(stderr)}")
    its = iterations(run_dir)
    if its[-1] != saved[0] or sorted(set(its)) != its:
        pytest.fail(f"rows {its} but checkpoint {saved}")
    if f"interrupted: iterations 1..{saved[0]} are saved in {run_dir}/checkpoints" not in stdout:
        pytest.fail(f"no interrupt line naming iteration {saved[0]}: {tail(stdout)}")
    return f"launcher exit {code}, iteration {saved[0]} saved and verifies; " + \
        resumed_to_the_end(run_dir, stdout, stderr, total)


def sigterm_one_worker(out: str, rank: int, script: str = "train_srpo.py", extra: Sequence[str] = (),
                       env: Optional[Dict[str, str]] = None, wrapper: Optional[str] = None) -> str:
    """SIGTERM to one worker process only (a scheduler's preemption notice), once iteration 1 is logged."""
    proc = start(script, [*FAST[script], "train.iterations=3", "log.checkpoint_every=100", *extra], out, 2, env=env,
                 wrapper=wrapper)
    wait_for(logged(out, 1), proc, what="iteration 1")
    pids = workers(proc)
    if rank not in pids:
        pytest.fail(f"worker {rank} not found among {pids}")
    os.kill(pids[rank], signal.SIGTERM)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    no_traceback(stderr, 2)
    saved = check_checkpoints(run_dir)
    if len(saved) != 1:
        pytest.fail(f"checkpoints after the stop: {saved} (launcher exit {code}); stderr: {tail(stderr)}")
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)
    if any(c not in ("130",) for c in codes):
        pytest.fail(f"worker exit codes {codes} (130 each expected): {tail(stderr, 800)}")
    if "continue with:" not in stdout:
        pytest.fail(f"no resume advice: {tail(stdout)}")
    return f"both stopped (exit codes {codes or 'n/a'}), iteration {saved[0]} saved and verifies; " + \
        resumed_to_the_end(run_dir, stdout, stderr, 3)


# ---- full disk

class Tmpfs:
    """A small tmpfs at `path` (needs root), filled on demand."""

    def __init__(self, path: str, size_mb: int):
        self.path = path
        os.makedirs(path, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", path], check=True,
                       capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Write a filler file until `leave` bytes are free (0: until the disk is full)."""
        with open(os.path.join(self.path, "filler"), "ab") as f:
            try:
                while self.free() > leave + (1 << 20):
                    f.write(b"\0" * (1 << 20))
                    f.flush()
                while self.free() > leave:
                    f.write(b"\0" * 4096)
                    f.flush()
            except OSError:
                pass

    def unfill(self) -> None:
        os.remove(os.path.join(self.path, "filler"))

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.path], capture_output=True)


def full_disk(out: str, script: str, args: Sequence[str], processes: int, leave: int, first_checkpoint: int,
              total: int, size_mb: int = 256) -> str:
    """The run writes to a tmpfs that fills up (all but `leave` bytes) once its first checkpoint is written: it must
    stop with one line, earlier checkpoints intact, the advice naming --resume only when a checkpoint exists; after
    the space is freed, the advised command must finish the run."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = Tmpfs(os.path.join(out, "disk"), size_mb)
    try:
        proc = start(script, [*args, f"log.output_dir={disk.path}/runs", f"log.plots_dir={disk.path}/plots"], out,
                     processes, outputs=False)
        first = os.path.join(disk.path, "runs", "*", "checkpoints", f"iter_{first_checkpoint:06d}", "MANIFEST.json")
        wait_for(lambda: bool(glob.glob(first)), proc, what="the first checkpoint")
        disk.fill(leave)
        code, stdout, stderr = finish(proc)
        run_dir = glob.glob(os.path.join(disk.path, "runs", "*"))[0]
        if code == 0:
            pytest.fail("the run finished on a full disk (nothing failed?)")
        no_traceback(stderr, processes)
        errors = error_lines(stderr)
        if not errors:
            pytest.fail(f"exit {code} without an error line: {tail(stderr, 700)}")
        if len(set(errors)) != 1:
            pytest.fail(f"{len(set(errors))} different error lines: {errors}")
        saved = check_checkpoints(run_dir)
        if first_checkpoint not in saved:
            pytest.fail(f"the earlier checkpoint is gone: {saved}")
        if "--resume" in errors[-1] and not saved:
            pytest.fail(f"advice names --resume without a checkpoint: {errors[-1]}")
        disk.unfill()
        said = resumed_to_the_end(run_dir, "", errors[-1], total)
        return f"one line ({errors[-1][:90]}...), checkpoints {saved} intact; space freed: {said}"
    finally:
        disk.close()


def finished_run(out: str, iterations: int = 1) -> str:
    """A tiny finished SRPO run under `out` (its folder)."""
    code, _, stderr = run("train_srpo.py", [*SRPO, f"train.iterations={iterations}"], out)
    if code != 0:
        pytest.fail(f"the tiny SRPO run failed (exit {code}): {tail(stderr)}")
    return one_run(out)


def one_line_refusal(code: int, stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if code == 0 or len(lines) != 1 or not all(n in lines[0] for n in needles):
        pytest.fail(f"exit {code}, expected one line with {needles}: {tail(stderr)}")


def _refresh_manifest(path: str) -> None:
    """What whoever hands over a run folder can do after altering a file: rewrite the sha256 manifest."""
    from common.checkpoint import MANIFEST, SIGNATURE, file_sha256

    files = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            rel = os.path.relpath(os.path.join(dirpath, name), path)
            if rel not in (MANIFEST, SIGNATURE):
                full = os.path.join(path, rel)
                files[rel] = {"size": os.path.getsize(full), "sha256": file_sha256(full)}
    with open(os.path.join(path, MANIFEST), "w") as f:
        json.dump({"iteration": 1, "files": files}, f)


class _Touch:
    """Unpickling it creates a file: the stand-in for any code a pickle can run."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def _session(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None
