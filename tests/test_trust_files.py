"""Issue 72, what a handed-over folder or file holds: a run folder's checkpoints must be inside it, every file read is
validated at the boundary (one line naming the file, the field and the fix), and values without a range get one.
Each test fails on the code before the fix (noted per test)."""
import json
import math
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

from common import heldout
from common.checkpoint import (CheckpointError, latest_checkpoint, load_training_state, read_rng_states,
                               save_checkpoint)
from common.config import ConfigError
from tests.test_checkpoint import TinyPolicy
from tests.test_security import rewrite_manifest

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="disabled")


def checkpoint(run_dir, iteration, keep_last=10, extra=None):
    policy = TinyPolicy()
    return save_checkpoint(str(run_dir), iteration, policy, {"actor": torch.optim.Adam(policy.parameters())},
                           keep_last=keep_last, extra=extra)


def listing(folder):
    return sorted(os.listdir(folder))


# ---- a run folder's parts are inside it

def a_run_folder(run_dir, name):
    """A run folder of train_srpo.py as far as a resume reads it before building anything: config.yaml."""
    from common.config import save_config
    from train_srpo import Config

    cfg = Config()
    cfg.log.run_name = name
    save_config(cfg, str(run_dir / "config.yaml"), script="srpo", exclusive=True)


def test_a_symlinked_checkpoints_folder_is_refused_and_the_other_run_keeps_every_checkpoint(tmp_path):
    # before: --resume continued the other run and pruned its newest checkpoints
    other, mine = tmp_path / "runs" / "other", tmp_path / "runs" / "mine"
    for i in (1, 2, 3):
        checkpoint(other, i)
    mine.mkdir()
    a_run_folder(mine, "mine")
    os.symlink(other / "checkpoints", mine / "checkpoints")
    before = {name: os.listdir(other / "checkpoints" / name) for name in listing(other / "checkpoints")}
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", str(mine),
                          "train.iterations=5", "log.keep_checkpoints=1"], cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode != 0 and out.stderr.strip().count("\n") == 0, out.stderr[-2000:]
    assert "is a symbolic link" in out.stderr and "inside its folder" in out.stderr
    assert {name: os.listdir(other / "checkpoints" / name) for name in listing(other / "checkpoints")} == before
    with pytest.raises(CheckpointError, match="symbolic link"):  # nor is anything written there
        checkpoint(mine, 4, keep_last=1)
    assert listing(other / "checkpoints") == ["iter_000001", "iter_000002", "iter_000003"]


def test_an_iteration_folder_linked_from_elsewhere_is_refused(tmp_path):
    # before: resumed in silence
    checkpoint(tmp_path / "elsewhere", 7)
    checkpoint(tmp_path / "run", 1)
    os.symlink(tmp_path / "elsewhere" / "checkpoints" / "iter_000007", tmp_path / "run" / "checkpoints" / "iter_000007")
    with pytest.raises(CheckpointError, match="iter_000007 is a symbolic link"):
        latest_checkpoint(str(tmp_path / "run"))


def test_pruning_sorts_iterations_as_numbers(tmp_path):
    # before: names sorted as strings, so iter_1000000 sorted before iter_999999 and was deleted once written
    for i in (999_998, 999_999, 1_000_000):
        checkpoint(tmp_path, i, keep_last=2)
    assert listing(tmp_path / "checkpoints") == ["iter_1000000", "iter_999999"]
    assert latest_checkpoint(str(tmp_path)).endswith("iter_1000000")


def test_a_checkpoint_whose_state_names_another_run_is_refused(tmp_path):
    from common.run import Schedule, check_resumable

    path = checkpoint(tmp_path / "mine", 2, extra={"run_name": "theirs", "state": {}})
    with pytest.raises(CheckpointError, match="'run_name' is 'theirs'.*belongs to another run"):
        check_resumable(path, str(tmp_path / "mine"), Schedule(10, 0, 1))


def test_a_resume_that_would_do_nothing_is_refused_or_noted(tmp_path):
    # before: `--resume` with train.iterations below the checkpoint's printed "done" having done nothing
    from common.run import Schedule, check_resumable

    path = checkpoint(tmp_path / "run", 4, extra={"run_name": "run", "state": {}})
    assert check_resumable(path, str(tmp_path / "run"), Schedule(5, 0, 1)) is None
    with pytest.raises(CheckpointError) as e:
        check_resumable(path, str(tmp_path / "run"), Schedule(3, 0, 1))
    assert "past the run's end at iteration 3" in str(e.value) and "raise train.iterations above 4" in str(e.value)
    assert "nothing is left to train (raise train.iterations above 4" in check_resumable(
        path, str(tmp_path / "run"), Schedule(4, 0, 1))
    # train_sft.py: an iteration is a block of steps (a run stopped after its last block still exports on resume)
    note = check_resumable(path, str(tmp_path / "run"), Schedule(4, 0, 1, steps_per_iteration=10, total_steps=40))
    assert "saved at its last step 40" in note and "raise sft.steps above 40" in note


def test_a_run_named_iter_something_is_a_run_not_a_checkpoint(tmp_path):
    # before: `--resume runs/iter_test` was taken for a checkpoint folder and the advice named runs/ as the run
    from common.config import LogConfig
    from common.run_folder import resolve_run_dir

    (tmp_path / "iter_test").mkdir()
    assert resolve_run_dir(LogConfig(output_dir=str(tmp_path)), "x", str(tmp_path / "iter_test"), True) == \
        ("iter_test", str(tmp_path / "iter_test"))


# ---- ranges

@pytest.mark.parametrize("name", ["../x", "../../x", "a/b", "/tmp/x", "..", "a\\b"])
def test_a_run_name_that_leaves_the_output_folder_is_refused(tmp_path, name):
    # before: log.run_name=../../x wrote outside log.output_dir and log.plots_dir
    from common.config import LogConfig
    from common.run_folder import create_run_dir

    log = LogConfig(output_dir=str(tmp_path / "runs" / "deep"), plots_dir=str(tmp_path / "plots" / "deep"),
                    run_name=name)
    with pytest.raises(ConfigError) as e:
        create_run_dir(log, "srpo")
    assert "log.run_name" in str(e.value) and "one folder name" in str(e.value)
    assert listing(tmp_path / "runs" / "deep") == [] and not (tmp_path / "x").exists()


def test_heldout_set_of_a_hundred_million_is_refused_in_one_line():
    # before: the placement seeds were drawn in O(n^2), no range: it hung
    import evaluate

    t0 = time.time()
    with pytest.raises(SystemExit) as e:
        evaluate.parse_args(["--checkpoint", "x", "--heldout-set", "100000000"])
    assert str(e.value) == ("error: --heldout-set 100000000: must be in [1, 10000] states per task (100 gives a "
                            "+-0.1 interval; each state is one episode per policy)")
    assert time.time() - t0 < 5


def test_placement_seeds_are_unchanged_and_linear():
    seeds = heldout.placement_seeds(0, 0, 10_000)
    assert len(set(seeds)) == 10_000 and seeds[:2] == heldout.placement_seeds(0, 0, 2)


def test_evaluation_trials_past_the_suite_are_refused():
    # before: eval.trial_start=40 eval.trials_per_task=20 evaluated 10 trials (5 of 20 at trial_start 45) in silence
    from common.evaluation import eval_trials

    assert eval_trials(50, 20, 30, 10) == list(range(30, 50))
    with pytest.raises(ConfigError, match=r"evaluation trials 45\.\.64, but the suite has trials 0\.\.49"):
        eval_trials(50, 20, 45, 10)


# ---- demos

def demo_file(path, actions=None, image_dtype=np.uint8, gripper_width=2):
    steps = 4
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["bddl_file_name"] = "/x/libero_object/pick_up_the_alphabet_soup_and_place_it_in_the_basket.bddl"
        g = data.create_group("demo_0")
        g.create_dataset("actions", data=np.zeros((steps, 7)) if actions is None else actions)
        obs = g.create_group("obs")
        for key in ("agentview_rgb", "eye_in_hand_rgb"):
            obs.create_dataset(key, data=np.zeros((steps, 16, 16, 3), image_dtype))
        obs.create_dataset("ee_states", data=np.zeros((steps, 6)))
        obs.create_dataset("gripper_states", data=np.zeros((steps, gripper_width)))


def test_nan_demo_actions_are_refused(tmp_path):
    # before: accepted, and the exported action statistics were NaN
    from envs.libero import load_libero_demos

    path = str(tmp_path / "d.hdf5")
    actions = np.zeros((4, 7))
    actions[2, 3] = np.nan
    demo_file(path, actions=actions)
    with pytest.raises(ValueError, match=r"d.hdf5:demo_0/actions holds 1 NaN or infinite values"):
        load_libero_demos(path)
    demo_file(path)
    assert len(load_libero_demos(path)) == 1


@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_demo_images_that_are_not_uint8_are_refused(tmp_path, dtype):
    # before: cast to uint8 (floats in [0, 1] became 0, int16 wrapped to 251)
    from envs.libero import load_libero_demos

    path = str(tmp_path / "d.hdf5")
    demo_file(path, image_dtype=dtype)
    with pytest.raises(ValueError, match=f"agentview_rgb holds {np.dtype(dtype).name} pixels, expected uint8"):
        load_libero_demos(path)


def test_a_demo_state_of_the_wrong_width_is_refused(tmp_path):
    from envs.libero import load_libero_demos

    path = str(tmp_path / "d.hdf5")
    demo_file(path, gripper_width=5)
    with pytest.raises(ValueError, match=r"gripper_states has shape \(4, 5\), expected \(T, 2\)"):
        load_libero_demos(path)


def test_cached_demos_are_checked_too(tmp_path):
    from common.demos import load_demos_npz, save_demos_npz

    demo = {"agentview": np.zeros((3, 8, 8, 3), np.uint8), "wrist": np.zeros((3, 8, 8, 3), np.uint8),
            "state": np.zeros((3, 8), np.float32), "actions": np.zeros((3, 7), np.float32), "task_id": 0,
            "trial_id": 0, "task_description": "d", "task_name": "n"}
    save_demos_npz([demo], str(tmp_path / "ok.npz"))
    assert len(load_demos_npz(str(tmp_path / "ok.npz"))) == 1
    demo["actions"] = np.full((3, 7), np.inf, np.float32)
    save_demos_npz([demo], str(tmp_path / "bad.npz"))
    with pytest.raises(ValueError, match="demo 0: actions must be .* finite values"):
        load_demos_npz(str(tmp_path / "bad.npz"))


# ---- outcomes and held-out sets

def outcomes_file(tmp_path, edit=None):
    data = {"format": heldout.OUTCOMES_FORMAT, "checkpoint": "c",
            "heldout_set": {"name": "s", "path": "s.json", "sha256": "0" * 64, "states": 2},
            "success": {"greedy": 0.5}, "interval": {"greedy": [0.0, 1.0]}, "invalid": {"greedy": 0},
            "episodes": {"greedy": [{"state": 0, "sample": 0, "success": True, "steps": 3},
                                    {"state": 1, "sample": 0, "success": False, "steps": 8}]}}
    if edit:
        edit(data)
    path = tmp_path / "outcomes.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["episodes"]["greedy"][0].update(success=7.5), "episodes.greedy[0].success is 7.5"),
    (lambda d: d["episodes"]["greedy"][0].update(success=math.nan), "episodes.greedy[0].success is nan"),
    (lambda d: d["success"].update(greedy=7.5), "success.greedy is 7.5"),
    (lambda d: d["episodes"]["greedy"][1].update(state=2), "episodes.greedy[1].state is 2"),
    (lambda d: d["episodes"]["greedy"][1].pop("steps"), "episodes.greedy[1].its keys"),
    (lambda d: d.pop("heldout_set"), "heldout_set needs name, sha256 and states"),
])
def test_an_outcomes_file_out_of_range_is_refused_naming_the_field(tmp_path, edit, field):
    # before: success 7.5 or NaN accepted and printed as intervals; missing keys or states out of range: tracebacks
    assert heldout.per_state(heldout.read_outcomes(outcomes_file(tmp_path)), "greedy").tolist() == [1.0, 0.0]
    with pytest.raises(ValueError) as e:
        heldout.read_outcomes(outcomes_file(tmp_path, edit))
    assert field in str(e.value) and "\n" not in str(e.value) and "outcomes.json" in str(e.value)


def test_a_heldout_set_holding_a_practice_trial_is_refused(tmp_path):
    # before: a forged set (sha256 recomputed) holding trial 3 was scored as held out
    from envs import EnvConfig

    hset = heldout.build_set(EnvConfig(), [0], [48, 49], 3, 0)
    path = str(tmp_path / "set.json")
    heldout.write_json(path, hset)
    assert heldout.read_set(path)["states"][0]["trial_id"] == 48
    hset["states"][0]["trial_id"] = 3
    hset["sha256"] = heldout.states_sha256(hset["states"])
    heldout.write_json(path, hset)
    with pytest.raises(ValueError, match=r"states\[0\]: trial_id 3 is not one of the set's held-out trials 48\.\.49"):
        heldout.read_set(path)
    hset["states"][0]["trial_id"] = 48
    hset["states"][2]["state"][0] = float("nan")
    hset["sha256"] = heldout.states_sha256(hset["states"])
    heldout.write_json(path, hset)
    with pytest.raises(ValueError, match=r"states\[2\]: a drawn state needs .* finite numbers"):
        heldout.read_set(path)


# ---- checkpoint files whose manifest matches

def load(path):
    return load_training_state(path, {"actor": torch.optim.Adam(TinyPolicy().parameters())})


def test_state_json_without_iteration_is_refused(tmp_path):
    path = checkpoint(tmp_path, 2)
    (tmp_path / "checkpoints" / "iter_000002" / "state.json").write_text(json.dumps({"extra": {}}))
    rewrite_manifest(path)
    with pytest.raises(CheckpointError, match=r"state.json: 'iteration' is None, not an integer >= 0"):
        load(path)
    (tmp_path / "checkpoints" / "iter_000002" / "state.json").write_text(json.dumps({"iteration": 1000000}))
    rewrite_manifest(path)
    with pytest.raises(CheckpointError, match=r"'iteration' is 1000000 in folder iter_000002"):
        load(path)


def test_rng_pt_of_the_wrong_structure_is_refused(tmp_path):
    path = checkpoint(tmp_path, 1)
    torch.save([{"python": 1}], os.path.join(path, "rng.pt"))
    rewrite_manifest(path)
    with pytest.raises(CheckpointError, match=r"rng.pt\[0\]: 'python' is not python's random state"):
        read_rng_states(path)


def test_a_garbage_safetensors_header_is_refused_in_one_line(tmp_path):
    policy, head = TinyPolicy(), torch.nn.Linear(2, 1)
    path = save_checkpoint(str(tmp_path), 1, policy, {"actor": torch.optim.Adam(policy.parameters())},
                           modules={"value": head})
    with open(os.path.join(path, "modules", "value.safetensors"), "r+b") as f:
        f.write(b"\xff" * 16)
    rewrite_manifest(path)
    with pytest.raises(CheckpointError, match=r"modules/value.safetensors is malformed"):
        load_training_state(path, {"actor": torch.optim.Adam(policy.parameters())}, modules={"value": head})


def test_a_metrics_line_that_is_not_an_object_is_refused_naming_the_line(tmp_path):
    from common.config import LogConfig
    from common.metrics_log import Logger

    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "x": 1.0}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl:2: not a metrics row"):
        Logger(str(tmp_path), "r", {}, LogConfig(wandb=False, plots_dir=str(tmp_path / "plots")), resume_iteration=1)
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


# ---- stop signals and what a failed start removes

def test_a_failed_start_removes_only_the_folders_it_made(tmp_path):
    # before: a failed start removed <plots_dir>/<run name> (when empty) although it was there before the run
    from common.config import LogConfig
    from common.run_folder import create_run_dir, remove_if_empty

    log = LogConfig(output_dir=str(tmp_path / "runs"), plots_dir=str(tmp_path / "plots"), run_name="mine")
    (tmp_path / "plots" / "mine").mkdir(parents=True)  # someone's (empty) folder
    made = []
    create_run_dir(log, "srpo", made)
    assert made == [str(tmp_path / "runs" / "mine")]
    remove_if_empty(*made)
    assert (tmp_path / "plots" / "mine").is_dir() and not (tmp_path / "runs" / "mine").exists()
    made = []
    create_run_dir(LogConfig(output_dir=str(tmp_path / "runs"), plots_dir=str(tmp_path / "plots"), run_name="new"),
                   "srpo", made)
    assert made == [str(tmp_path / "runs" / "new"), str(tmp_path / "plots" / "new")]


@pytest.mark.slow
def test_repeated_sigterm_exits_130(tmp_path):
    # before: a stream of SIGTERMs ended the run with -15 (the handler was restored while it exited) or, when one
    # landed in matplotlib's import, a traceback from the half-imported module at the final plot
    import glob
    import signal

    from tests.test_security import FAST

    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_srpo.py"), *FAST, "train.iterations=500",
                             f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not [m for m in glob.glob(f"{tmp_path}/runs/*/metrics.jsonl") if os.path.getsize(m)]:
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-2000:]
        time.sleep(0.05)
    for _ in range(400):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.005)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr


def test_a_full_disk_during_the_metrics_rewrite_at_resume_is_one_error_and_leaves_no_tmp(tmp_path, monkeypatch):
    # before: a traceback and a leftover metrics.jsonl.tmp<pid>
    import errno

    from common.config import LogConfig
    from common.metrics_log import Logger, MetricsWriteError

    (tmp_path / "metrics.jsonl").write_text('{"iteration": 1, "x": 1.0}\n{"iteration": 2, "x": 2.0}\n')

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(MetricsWriteError, match=r"cannot rewrite .*metrics.jsonl \(No space left on device\)"):
        Logger(str(tmp_path), "r", {}, LogConfig(wandb=False, plots_dir=str(tmp_path / "plots")), resume_iteration=1)
    assert listing(tmp_path) == ["metrics.jsonl"]
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2  # as it was
