"""What a shared or handed-over run folder, config or file can hold (issues 55 and 72): a pickle that runs code, an
fsdp folder from elsewhere, `${oc.env:...}`, a second job on the same run, two auto-SFT seeds at once, a demo file of
many large demos, symlinked locks and checkpoints, a YAML alias bomb, duplicate keys, out-of-range flags and names,
forged demos, outcomes, held-out sets and state.json, a stream of SIGTERMs: each refused in one line or survived, with
nothing written outside the run (tests/breaking.py). Slow: tiny runs of the scripts."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.breaking import (ENV, FIXTURES, ROOT, SRPO, _refresh_manifest, _Touch, checkpoints, finish, finished_run,
                            iterations, logged, one_line_refusal, one_run, probe, run, start, tail, wait_for)

pytestmark = pytest.mark.slow  # real runs of the scripts: the full tier (python test_all.py --all)


@probe
def test_resume_a_run_whose_rng_pt_runs_code(out: str) -> str:
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
        pytest.fail("the pickle in rng.pt ran its code")
    one_line_refusal(code, stderr, "rng.pt", "refused")
    return "refused in one line, the code did not run"


@probe
def test_resume_an_fsdp_folder_written_elsewhere(out: str) -> str:
    """A run folder whose checkpoint holds fsdp `shards/` (torch reads their .metadata with pickle), resumed by
    another user or machine (another trust key): refused in one line naming --trust-run, before any shard is read."""
    run_dir = finished_run(out)
    last = os.path.join(run_dir, "checkpoints", checkpoints(run_dir)[-1])
    os.makedirs(os.path.join(last, "shards"))
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=2"], out, outputs=False,
                          env={"XDG_CACHE_HOME": os.path.join(out, "another_machine")})
    one_line_refusal(code, stderr, "not written on this machine", "--trust-run")
    return "refused in one line naming --trust-run"


@probe
def test_config_override_reads_the_environment(out: str) -> str:
    """A command copied from a thread: `log.run_name=${oc.env:PROBE_SECRET}`: refused in one line naming the key,
    the secret nowhere in the output, no run folder made."""
    code, stdout, stderr = run("train_srpo.py", [*SRPO, "log.run_name=${oc.env:PROBE_SECRET}"], out,
                               env={"PROBE_SECRET": "hunter2"})
    if "hunter2" in stdout + stderr:
        pytest.fail("the secret appeared in the output")
    one_line_refusal(code, stderr, "log.run_name", "interpolation")
    if os.path.isdir(os.path.join(out, "runs")) and os.listdir(os.path.join(out, "runs")):
        pytest.fail(f"a run folder was made: {os.listdir(os.path.join(out, 'runs'))}")
    return "refused in one line naming log.run_name, secret not shown, no run folder"


@probe
def test_two_resumes_of_one_run(out: str) -> str:
    """A job requeued while the old one still runs: the second `--resume` of a running run is refused in one line
    naming the first one's pid and host; after the first ends (killed: a stale lock), a resume takes over."""
    import socket

    run_dir = finished_run(out)
    first = start("train_srpo.py", ["--resume", run_dir, "train.iterations=200"], out, outputs=False)
    try:
        wait_for(lambda: os.path.exists(os.path.join(run_dir, "run.lock")), first, what="the run's lock")
        code, _, stderr = run("train_srpo.py", ["--resume", run_dir, "train.iterations=200"], out, outputs=False)
        if first.poll() is not None:
            pytest.fail("the first resume ended before the second was refused (probe timing): rerun")
        one_line_refusal(code, stderr, f"in use by pid {first.pid} on {socket.gethostname()}")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    code, _, stderr = run("train_srpo.py", ["--resume", run_dir, f"train.iterations={iterations(run_dir)[-1] + 1}"],
                          out, outputs=False)
    if code != 0:
        pytest.fail(f"the resume after the holder died failed (exit {code}): {tail(stderr)}")
    return "second resume refused naming pid and host; the stale lock of the killed job taken over"


@probe
def test_two_auto_sft_seeds_racing(out: str) -> str:
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
            pytest.fail(f"a seed failed (exit {code}): {tail(stderr)}")
    sft_runs = glob.glob(os.path.join(work, "runs", "train_sft__*"))
    if len(sft_runs) != 1:
        pytest.fail(f"{len(sft_runs)} SFT runs made the same start: {sft_runs}")
    from common.checkpoint import load_saved_policy

    load_saved_policy(os.path.join(work, "checkpoints", "sft_tabletop_task0"))
    waited = sum("waiting for it" in stdout or "made by another run" in stdout for _, stdout, _ in results)
    return f"both seeds finished, one SFT run, the export loads ({waited} seed waited for the other)"


@probe
def test_many_large_demos_num_demos_1(out: str) -> str:
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
        pytest.fail(f"{len(demos)} demos, peak {peak / 1e6:.0f} MB (one demo is 39 MB)")
    return f"1 demo read, peak {peak / 1e6:.0f} MB of the file's ~790 MB"


# ---- issue 72: a run folder handed over by someone else cannot write outside itself, delete another run's
# checkpoints or hang the loader; every file read is validated

@probe
def test_symlinked_locks(out: str) -> str:
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
        pytest.fail("a symlinked export lock was taken")
    except ConfigError as e:
        if "symbolic link" not in str(e):
            pytest.fail(f"the export lock's refusal does not say why: {e}")
    with open(target) as f:
        if f.read() != "keep me\n" or os.path.exists(os.path.join(out, "created_elsewhere")):
            pytest.fail("a lock's target was written or created")
    return "run.lock (to a file, dangling) and an export lock refused in one line; targets untouched"


@probe
def test_alias_bomb_and_duplicate_keys(out: str) -> str:
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
        pytest.fail(f"refused after {took:.0f} s")
    config = os.path.join(out, "two_trains.yaml")
    with open(config, "w") as f:
        f.write("train:\n  lr: 0.1\nseed: 3\ntrain:\n  iterations: 4\n")
    code, _, stderr = run("train_srpo.py", ["--config", config, *SRPO], out)
    one_line_refusal(code, stderr, "two_trains.yaml:4", "given twice")
    code, _, stderr = run("train_srpo.py", [*SRPO, "train.lr=[1, 2"], out)
    one_line_refusal(code, stderr, "train.lr", "not valid YAML")
    return f"alias bomb refused in {took:.0f} s (the start of python included), duplicate keys and a bad override too"


@probe
def test_linked_checkpoints_of_another_run(out: str) -> str:
    """A run folder whose checkpoints/ is a symbolic link to another run's: `--resume` refused in one line and the
    other run keeps every checkpoint (was: continued that run and pruned its newest)."""
    code, _, stderr = run("train_srpo.py", [*SRPO, "train.iterations=2", "log.checkpoint_every=1"],
                          os.path.join(out, "a"))
    if code != 0:
        pytest.fail(f"the tiny SRPO run failed (exit {code}): {tail(stderr)}")
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
        pytest.fail(f"the other run's checkpoints changed: {before} -> {after}")
    return f"refused in one line; the other run keeps {', '.join(before)}"


@probe
def test_out_of_range_inputs(out: str) -> str:
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
        pytest.fail("log.run_name=../x made a folder outside log.output_dir")
    return "--heldout-set 100000000, eval trials 45..64 and log.run_name=../x refused in one line each"


@probe
def test_forged_files(out: str) -> str:
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
            pytest.fail(f"a demo file with {what} was read")
        except ValueError as e:
            if "\n" in str(e) or path not in str(e):
                pytest.fail(f"{what}: {e}")
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
        pytest.fail("a held-out set holding practice trial 3 was read")
    except ValueError as e:
        if "trial_id 3" not in str(e):
            pytest.fail(f"the forged set's refusal: {e}")
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


@probe
def test_repeated_sigterm(out: str) -> str:
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
        pytest.fail(f"exit {code}: {tail(stderr)}")
    return "exit 130, no traceback"
