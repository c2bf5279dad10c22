"""Interrupts and failures of real runs (issue 47, "Nothing lost, nothing corrupted"): Ctrl-C to the process group,
SIGTERM to one process, a second Ctrl-C while a checkpoint or a policy copy is written, a slow checkpoint under
accelerate's launcher, a full disk, the README's first command stopped in its SFT, and the real-LIBERO run; each
checks what was left and that the advised resume finishes (tests/breaking.py). Slow: tiny runs, minutes each."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.breaking import (L1, OFT, ROOT, ENV, SFT, SRPO, _session, check_checkpoints, checkpoints,
                            ctrl_c_two_processes, finish, full_disk, iterations, launcher, logged, no_temporary_copies,
                            no_traceback, one_run, probe, resumed_to_the_end, rows, run, sigterm_one_worker, start,
                            tail, wait_for)

pytestmark = pytest.mark.slow  # real runs of the scripts, interrupted: the full tier (python test_all.py --all)


@probe
def test_second_sigint_during_checkpoint_write_srpo(out: str) -> str:
    """One process; two SIGINTs land in the middle of iteration 2's (due) checkpoint write."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "train.iterations=4", "log.checkpoint_every=1"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_CHECKPOINT": "iter_000002", "SIGNALS": "2"})
    run_dir = one_run(out)
    if "[test] 2 SIGINT sent" not in stdout:
        pytest.fail(f"the signals were not sent (exit {code}): {tail(stderr)}")
    if code != 130:
        pytest.fail(f"exit {code}, not 130: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    if 2 not in saved:
        pytest.fail(f"iteration 2's checkpoint is missing: {saved}")
    return f"exit 130, checkpoints {saved} verify, no .tmp; " + resumed_to_the_end(run_dir, stdout, stderr, 4)


@probe
def test_second_sigint_during_checkpoint_write_sft(out: str) -> str:
    """train_sft.py (one process): two SIGINTs in the middle of the step-10 checkpoint's write (sft.eval_every=10)."""
    code, stdout, stderr = run("train_sft.py", [*SFT, "sft.steps=30", "sft.log_every=5", "sft.eval_every=10",
                                                f"sft.output_path={out}/exported"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_CHECKPOINT": "iter_000002", "SIGNALS": "2"})
    run_dir = one_run(out)
    if code != 130 or "[test] 2 SIGINT sent" not in stdout:
        pytest.fail(f"exit {code} (signals sent: {'[test]' in stdout}): {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    if 2 not in saved or os.path.exists(f"{out}/exported"):
        pytest.fail(f"checkpoints {saved}; exported: {os.path.exists(f'{out}/exported')}")
    no_temporary_copies(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 6)
    from common.checkpoint import load_saved_policy

    load_saved_policy(f"{out}/exported")
    return f"exit 130, checkpoints {saved} verify; {said}, exported policy loads"


@probe
def test_second_sigint_during_sft_export(out: str) -> str:
    """train_sft.py: two SIGINTs while it copies a policy folder (best/ at the end, then the export)."""
    code, stdout, stderr = run("train_sft.py", [*SFT, "sft.steps=10", "sft.log_every=5",
                                                f"sft.output_path={out}/exported"], out,
                               wrapper="signal_in_save.py", env={"SIGNAL_COPY": "1", "SIGNALS": "2"})
    run_dir = one_run(out)
    if "[test] 2 SIGINT sent" not in stdout:
        pytest.fail(f"the signals were not sent (exit {code}): {tail(stderr)}")
    no_traceback(stderr)
    no_temporary_copies(run_dir, out)
    from common.checkpoint import load_saved_policy

    if code == 0:
        load_saved_policy(f"{out}/exported")
        return "the copy finished (exit 0), exported policy loads, no temporary copy left"
    if code != 130:
        pytest.fail(f"exit {code}: {tail(stderr)}")
    said = resumed_to_the_end(run_dir, stdout, stderr, 2)
    load_saved_policy(f"{out}/exported")
    return f"exit 130; {said}; exported policy loads"


@probe
def test_sft_ctrl_c_in_its_last_block(out: str) -> str:
    """train_sft.py: Ctrl-C once block 1 of 2 is logged (so during the last block or its evaluation): the advised
    resume must export the policy."""
    proc = start("train_sft.py", [*SFT, "sft.steps=10", "sft.log_every=5", "sft.eval_trials=4",
                                  f"sft.output_path={out}/exported"], out)
    wait_for(logged(out, 1), proc, what="block 1")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    if code == 0:
        pytest.fail("the run finished before the signal landed (probe timing): rerun")
    if code != 130:
        pytest.fail(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 2)
    from common.checkpoint import load_saved_policy

    load_saved_policy(f"{out}/exported")
    return f"exit 130 with block {saved} saved; {said}, exported policy loads"


@probe
def test_ctrl_c_2proc_gae_ppo(out: str) -> str:
    """train_gae_ppo.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_gae_ppo.py", out)


@probe
def test_ctrl_c_2proc_luffy(out: str) -> str:
    """train_luffy.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_luffy.py", out)


@probe
def test_ctrl_c_2proc_flowsar(out: str) -> str:
    """train_flowsar.py on two processes: Ctrl-C once iteration 1 is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_flowsar.py", out)


@probe
def test_ctrl_c_2proc_flowsar_fsdp(out: str) -> str:
    """train_flowsar.py on two processes, train.strategy=fsdp (its EMA reference sharded): Ctrl-C once iteration 1
    is logged (ctrl_c_two_processes)."""
    return ctrl_c_two_processes("train_flowsar.py", out, extra=["train.strategy=fsdp"])


@probe
def test_sigterm_to_worker_1(out: str) -> str:
    """train_srpo.py on two processes: SIGTERM to process 1 only, once iteration 1 is logged."""
    return sigterm_one_worker(out, 1)


@probe
def test_sigterm_to_worker_0(out: str) -> str:
    """train_srpo.py on two processes: SIGTERM to process 0 only, once iteration 1 is logged."""
    return sigterm_one_worker(out, 0)


@probe
def test_sigterm_to_worker_1_slow_checkpoint(out: str) -> str:
    """As sigterm_to_worker_1, with process 0's checkpoint write taking 12 s and torch's launcher giving its processes
    5 s to end once one has exited (TORCH_ELASTIC_SHUTDOWN_TIMEOUT; 30 s by default: a 7B checkpoint takes
    minutes): process 1 must not exit before the checkpoint is written."""
    return sigterm_one_worker(out, 1, env={"SIGNAL_CHECKPOINT": "iter_000001", "SIGNALS": "0", "SAVE_SLEEP": "12",
                                           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}, wrapper="signal_in_save.py")


@probe
def test_ctrl_c_launcher_slow_checkpoint(out: str) -> str:
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
                pytest.fail(f"the stop line does not say the launcher's {grace} s and how to give more: {tail(stdout)}")
            written = [n for n in checkpoints(run_dir) if not n.startswith(".tmp_iter_")]
            if written:
                pytest.fail(f"a write killed by the launcher left {written} in {run_dir}/checkpoints")
            said.append(f"5 s: killed in its write as said, no checkpoint-like folder left (launcher exit {code})")
        else:
            saved = check_checkpoints(run_dir)
            if len(saved) != 1:
                pytest.fail(f"30 s: checkpoints after the stop: {saved} (launcher exit {code}); {tail(stderr)}")
            said.append(f"30 s: iteration {saved[0]} saved and verifies; " +
                        resumed_to_the_end(run_dir, stdout, stderr, 3))
    return "; ".join(said)


@probe
def test_fsdp_offload_run_and_resume(out: str) -> str:
    """train.strategy=fsdp train.fsdp_offload=true on two processes: 2 iterations, then --resume to 3."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "train.iterations=2", "train.strategy=fsdp",
                                                 "train.fsdp_offload=true"], out, 2)
    if code != 0:
        pytest.fail(f"exit {code}: {tail(stderr)}")
    run_dir = one_run(out)
    saved = check_checkpoints(run_dir)
    shards = sorted(os.listdir(os.path.join(run_dir, "checkpoints", f"iter_{saved[-1]:06d}", "shards")))
    proc = subprocess.Popen([*launcher(2), os.path.join(ROOT, "train_srpo.py"), "--resume", run_dir,
                             "train.iterations=3"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    code, stdout, stderr = finish(proc)
    if code != 0 or iterations(run_dir) != [0, 1, 2, 3]:
        pytest.fail(f"resume exit {code}, rows {iterations(run_dir)}: {tail(stderr)}")
    check_checkpoints(run_dir)
    return f"2 iterations, shards {shards}, --resume to 3: rows 0..3 once, checkpoints verify"


@probe
def test_full_disk_sft_checkpoint(out: str) -> str:
    """train_sft.py: after its step-50 checkpoint the disk keeps 64 KiB free (metrics rows fit, a checkpoint not)."""
    return full_disk(out, "train_sft.py", [*SFT, "sft.steps=150", "sft.log_every=5", "sft.eval_every=50",
                                           f"sft.output_path={out}/exported"], 1, 64 << 10, 10, 30)


@probe
def test_full_disk_sft_completely(out: str) -> str:
    """train_sft.py: after its step-50 checkpoint the disk is full to the last byte (the next metrics row fails)."""
    return full_disk(out, "train_sft.py", [*SFT, "sft.steps=150", "sft.log_every=5", "sft.eval_every=50",
                                           f"sft.output_path={out}/exported"], 1, 0, 10, 30)


@probe
def test_full_disk_fsdp_shards(out: str) -> str:
    """train_srpo.py on two processes, train.strategy=fsdp: after iteration 1's checkpoint 64 KiB stay free, so
    iteration 2's shards/ write fails on the processes."""
    return full_disk(out, "train_srpo.py", [*SRPO, "train.iterations=3", "log.checkpoint_every=1",
                                            "train.strategy=fsdp"], 2, 64 << 10, 1, 3)


# ---- policy families and the README's first command

@probe
def test_openvla_oft_l1_sft_ctrl_c_resume_evaluate(out: str) -> str:
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
        pytest.fail(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    said = resumed_to_the_end(run_dir, stdout, stderr, 4)
    results = []
    for target in (f"{out}/exported", run_dir):
        code, o, e = run("evaluate.py", ["--checkpoint", target, "--trials", "1", "--max-steps", "8", "--gifs", "0",
                                         "--task-ids", "0", "--out-dir", f"{out}/eval_{len(results)}"], out,
                         outputs=False)
        if code != 0:
            pytest.fail(f"evaluate.py --checkpoint {target}: exit {code}: {tail(e)}")
        with open(f"{out}/eval_{len(results)}/results.json") as f:
            results.append(json.load(f).get("policy_type") or "ok")
    return f"stopped at block {saved}, {said}; evaluate.py reads the export and the run folder"


@probe
def test_readme_first_command_interrupted_in_auto_sft(out: str) -> str:
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
        pytest.fail(f"first run: exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    sft_run = one_run(work, "train_sft")
    saved = check_checkpoints(sft_run)
    code, stdout, stderr = finish(go(), timeout=1800)
    if code != 0:
        pytest.fail(f"the same command again: exit {code}: {tail(stderr)}")
    steps = [r["charts/step"] for r in rows(sft_run)]
    if steps != list(range(10, 130, 10)):
        pytest.fail(f"SFT rows {steps}")
    srpo = one_run(work, "srpo")
    if iterations(srpo)[-1] != 1 or not os.path.isdir(os.path.join(work, "checkpoints", "sft_tabletop_task0")):
        pytest.fail(f"SRPO rows {iterations(srpo)}")
    return f"stopped with SFT blocks {saved} saved; the same command continued the SFT (rows 10..120 once), " \
           f"exported it and finished SRPO"


@pytest.mark.real_libero
@probe
def test_libero_gae_ppo_ctrl_c_resume(out: str) -> str:
    """configs/gae_ppo_libero.yaml on real LIBERO with the tiny OpenVLA-OFT folder in the official (L1) layout, the
    config's start with its proprio projector (64 px, fast_render, 2 envs, 16 steps): Ctrl-C once iteration 1 is
    logged, resume to 2, no simulator worker left running."""
    args = ["--config", "configs/gae_ppo_libero.yaml", "--task-id", "0", "--no-wandb", "init.mode=checkpoint",
            f"init.path={OFT}_l1", "policy.lora_rank=4", "policy.bf16_weights=false", "policy.unnorm_key=libero_10",
            "env.image_size=64", "env.num_envs=2", "env.max_steps=16", "env.fast_render=true", "eval.protocol=heldout",
            "rollout.prompts_per_iteration=2", "train.iterations=3", "eval.every=0", "train.mini_batch_size=4",
            "train.micro_batch_size=4", "log.checkpoint_every=100"]
    proc = start("train_gae_ppo.py", args, out)
    wait_for(logged(out, 1), proc, timeout=900, what="iteration 1")
    os.killpg(proc.pid, signal.SIGINT)
    code, stdout, stderr = finish(proc)
    run_dir = one_run(out)
    if code != 130:
        pytest.fail(f"exit {code}: {tail(stderr)}")
    no_traceback(stderr)
    saved = check_checkpoints(run_dir)
    time.sleep(2)
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _session(int(pid)) == proc.pid]
    if left:
        pytest.fail(f"processes of the stopped run still alive: {left}")
    return f"exit 130, iteration {saved} saved and verifies, no worker left; " + \
        resumed_to_the_end(run_dir, stdout, stderr, 3)
