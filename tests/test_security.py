"""Issue 55: a shared run folder, config or demo file cannot run code, leak secrets or clobber another job. One test
per hole; each fails on the code before the fix (a pickled rng.pt ran its code, `${oc.env:...}` was resolved, two
resumes of one run interleaved, the export was deleted before its replacement was renamed in, every demo was read
before sft.num_demos chose, ...)."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
import warnings

import h5py
import numpy as np
import pytest
import torch
import yaml

from common import checkpoint as ckpt
from common.checkpoint import CheckpointError, latest_checkpoint, read_rng_states, save_checkpoint, verify_checkpoint
from common.config import ConfigError, check_ranges, load_config
from tests.test_checkpoint import TinyPolicy

torch.set_num_threads(1)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
FAST = ["--task-id", "0", "init.mode=scratch", "env.num_envs=4", "env.max_steps=8", "rollout.n=2",
        "rollout.prompts_per_iteration=2", "rollout.train_trials=10", "eval.every=0", "reward.encoder.num_frames=4",
        "--no-wandb", "algorithm.filter_accuracy=false"]


def a_checkpoint(tmp_path, iteration=1, keep_last=10):
    policy = TinyPolicy()
    opt = torch.optim.Adam(policy.parameters())
    return save_checkpoint(str(tmp_path), iteration, policy, {"actor": opt}, keep_last=keep_last)


def rewrite_manifest(path):
    """What whoever wrote the folder can do: refresh the sha256 manifest over altered files."""
    files = {}
    for dirpath, _, names in os.walk(path):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            if rel not in (ckpt.MANIFEST, "MANIFEST.sig"):
                files[rel] = {"size": os.path.getsize(full), "sha256": ckpt.file_sha256(full)}
    with open(os.path.join(path, ckpt.MANIFEST), "w") as f:
        json.dump({"iteration": 1, "files": files}, f)


class RunsCode:
    """Unpickling this creates the file `marker` (a stand-in for any code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


# ---- 1. nothing a run folder holds is unpickled

def test_a_pickled_rng_pt_that_would_run_code_is_refused(tmp_path):
    path = a_checkpoint(tmp_path)
    marker = tmp_path / "code_ran"
    torch.save([{"python": RunsCode(str(marker))}], os.path.join(path, "rng.pt"))
    rewrite_manifest(path)
    verify_checkpoint(path)  # the manifest cannot help: it was rewritten too
    with pytest.raises(CheckpointError, match="holds objects other than tensors and plain values"):
        read_rng_states(path)
    assert not marker.exists()


def test_optimizer_state_holding_code_is_refused_too(tmp_path):
    path = a_checkpoint(tmp_path)
    marker = tmp_path / "code_ran"
    torch.save({"actor": RunsCode(str(marker))}, os.path.join(path, "optimizers.pt"))
    rewrite_manifest(path)
    with pytest.raises(CheckpointError, match="refused"):
        ckpt.load_training_state(path, {"actor": torch.optim.Adam(TinyPolicy().parameters())})
    assert not marker.exists()


def test_fsdp_checkpoint_is_trusted_only_when_written_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "here"))
    path = a_checkpoint(tmp_path / "run")
    assert ckpt.untrusted_message(path) is None  # no shards/: nothing is unpickled, no trust needed
    os.makedirs(os.path.join(path, "shards"))
    assert ckpt.written_here(path) and ckpt.untrusted_message(path) is None
    assert oct(os.stat(ckpt.trust_key_path()).st_mode & 0o777) == "0o600"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "elsewhere"))  # another machine (or user): another key
    message = ckpt.untrusted_message(path)
    assert "\n" not in message and "not written on this machine" in message and "--trust-run" in message
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "here"))
    with open(os.path.join(path, ckpt.MANIFEST), "a") as f:  # an edited manifest no longer carries the signature
        f.write(" ")
    assert not ckpt.written_here(path)


@pytest.fixture(scope="module")
def srpo_run(tmp_path_factory):
    """One finished tiny SRPO run (2 iterations, a checkpoint)."""
    out = tmp_path_factory.mktemp("srpo")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), *FAST, "train.iterations=2",
                           f"log.output_dir={out}/runs", f"log.plots_dir={out}/plots"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (name,) = os.listdir(out / "runs")
    return str(out / "runs" / name)


@pytest.mark.slow
def test_resume_of_an_fsdp_folder_not_written_here_says_so_in_one_line(srpo_run, tmp_path):
    last = latest_checkpoint(srpo_run)
    os.makedirs(os.path.join(last, "shards"), exist_ok=True)  # what an fsdp run's checkpoint holds
    try:
        env = dict(ENV, XDG_CACHE_HOME=str(tmp_path / "another_machine"))
        out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", srpo_run,
                              "train.iterations=3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode != 0 and out.stderr.strip().count("\n") == 0, out.stderr[-2000:]
        assert "not written on this machine" in out.stderr and "--trust-run" in out.stderr
        assert not os.path.exists(os.path.join(srpo_run, "run.lock"))  # let go when the start is refused
    finally:
        os.rmdir(os.path.join(last, "shards"))


# ---- 2. configs never read the environment

def test_interpolation_is_refused_in_overrides_and_files(tmp_path, monkeypatch):
    from train_srpo import Config

    monkeypatch.setenv("SECRET_FOR_TEST", "hunter2")
    with pytest.raises(ConfigError, match=r"log.run_name=.*interpolation") as e:
        load_config(Config, None, ["log.run_name=${oc.env:SECRET_FOR_TEST}"])
    assert "hunter2" not in str(e.value)
    path = tmp_path / "shared.yaml"
    path.write_text("log:\n  run_name: x\ninit:\n  sft_args: ['a=1', 'b=${oc.env:SECRET_FOR_TEST}']\n")
    with pytest.raises(ConfigError, match=r"init.sft_args\[1\]=.*interpolation"):
        load_config(Config, str(path))


# ---- 3. one job per run folder

@pytest.mark.slow
def test_a_second_resume_of_a_running_run_is_refused_naming_its_pid_and_host(srpo_run):
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", srpo_run,
                              "train.iterations=400"], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not os.path.exists(os.path.join(srpo_run, "run.lock")):
            assert first.poll() is None and time.time() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.05)
        second = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", srpo_run,
                                 "train.iterations=400"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                                timeout=600)
        assert first.poll() is None, "the first resume ended before the second was refused"
        assert second.returncode != 0 and second.stderr.strip().count("\n") == 0, second.stderr[-2000:]
        assert f"in use by pid {first.pid} on {socket.gethostname()}" in second.stderr
    finally:
        first.kill()
        first.communicate()
    os.unlink(os.path.join(srpo_run, "run.lock"))  # left by the killed job (a stale lock, taken over below)


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    from common.run_folder import lock_run_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "run.lock").write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname()}))
    lock = lock_run_dir(str(tmp_path), "--resume")
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()} on {socket.gethostname()}"):
        lock_run_dir(str(tmp_path), "--resume")  # held: refused, even within one process
    lock.release()
    assert not (tmp_path / "run.lock").exists()
    lock_run_dir(str(tmp_path), "--resume").release()


def test_the_cpu_launch_file_fixes_no_port():
    with open(os.path.join(ROOT, "configs", "accelerate", "cpu_2proc.yaml")) as f:
        assert yaml.safe_load(f)["main_process_port"] == 0  # accelerate picks a free port


# ---- 4. auto_sft's shared export

def test_two_auto_sft_runs_racing_make_the_sft_start_once(tmp_path, monkeypatch):
    import common.policy_start as init

    made = []

    def slow_sft(cfg, path, family):
        made.append(threading.current_thread().name)
        time.sleep(0.5)
        os.makedirs(path)

    monkeypatch.setattr(init, "run_auto_sft", slow_sft)
    path = str(tmp_path / "checkpoints" / "sft_tabletop_task0")
    threads = [threading.Thread(target=init.make_sft_start, args=(None, path, "token"), name=f"seed{i}")
               for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 1 and os.path.isdir(path)


def test_the_export_replaces_the_old_folder_without_a_moment_where_it_is_missing(tmp_path, monkeypatch):
    import shutil

    import train_sft

    src, dst = tmp_path / "best", tmp_path / "exported"
    for folder, text in ((src, "new"), (dst, "old")):
        folder.mkdir()
        (folder / "model.safetensors").write_text(text)
    seen = []
    real_replace, real_rmtree = os.replace, shutil.rmtree

    def watched(fn):
        def call(*args, **kwargs):
            seen.append(dst.is_dir())
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(os, "replace", watched(real_replace))
    monkeypatch.setattr(shutil, "rmtree", watched(real_rmtree))
    train_sft.copy_policy(str(src), str(dst))
    assert all(seen) and (dst / "model.safetensors").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "exported"]


def test_an_export_written_by_another_run_meanwhile_is_not_replaced(tmp_path):
    import train_sft

    cfg = train_sft.Config()
    cfg.sft.output_path = str(tmp_path / "exported")
    (tmp_path / "best").mkdir()
    (tmp_path / "exported").mkdir()  # another run exported here after this one's start-up check
    (tmp_path / "exported" / train_sft.EXPORTED_BY).write_text("/elsewhere/run\n")
    with pytest.raises(ConfigError, match="written since this run started"):
        train_sft.export_policy(str(tmp_path / "best"), cfg, str(tmp_path / "run"))
    assert (tmp_path / "exported" / train_sft.EXPORTED_BY).read_text() == "/elsewhere/run\n"


def test_replace_folder_into_a_new_place(tmp_path):
    from common.run_folder import replace_folder

    (tmp_path / "a").mkdir()
    replace_folder(str(tmp_path / "a"), str(tmp_path / "b"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


def test_folder_lock_waits_for_its_holder(tmp_path):
    from common.run_folder import FolderLock

    first, second = FolderLock(str(tmp_path / "x.lock")), FolderLock(str(tmp_path / "x.lock"))
    assert first.acquire() is None and second.acquire() == (os.getpid(), socket.gethostname())
    threading.Timer(0.3, first.release).start()
    t0 = time.time()
    assert second.acquire(wait=True) is None and time.time() - t0 >= 0.2
    second.release()


# ---- 5. reads sized before they happen

def big_demo_file(path, demos=8, steps=40, size=128):
    """A LIBERO-layout file of `demos` demos with `size` px images (gzip: a small file, large once read)."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["bddl_file_name"] = "/x/libero_object/pick_up_the_alphabet_soup_and_place_it_in_the_basket.bddl"
        for i in range(demos):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=np.zeros((steps, 7)))
            obs = g.create_group("obs")
            for key in ("agentview_rgb", "eye_in_hand_rgb"):
                obs.create_dataset(key, data=np.zeros((steps, size, size, 3), np.uint8), compression="gzip")
            obs.create_dataset("ee_states", data=np.zeros((steps, 6)))
            obs.create_dataset("gripper_states", data=np.zeros((steps, 2)))


def test_num_demos_one_reads_one_demo_of_a_file_of_many(tmp_path, monkeypatch):
    import envs
    from common.demos import load_hdf5_demos
    from envs import EnvConfig

    name = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"
    monkeypatch.setattr(envs, "suite_tasks", lambda cfg: [{"name": name, "max_steps": 280}])  # no simulator

    path = str(tmp_path / "pick_up_the_alphabet_soup_and_place_it_in_the_basket_demo.hdf5")
    big_demo_file(path, demos=16)  # 16 demos x 2 views x 40 x 128 x 128 x 3 bytes = 63 MB once read
    cfg = EnvConfig(suite="libero_object", task_ids=[0], image_size=128)
    tracemalloc.start()
    try:
        demos = load_hdf5_demos([path], cfg, num_per_task=1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(demos) == 1
    # one demo is 3.9 MB (twice that turned upright); copies made while reading it vary with what ran before
    assert peak < 30e6, f"peak {peak / 1e6:.1f} MB: the whole file (63 MB) was read, not one demo"


def test_demo_shapes_are_checked_before_reading(tmp_path):
    from envs.libero import load_libero_demos

    path = str(tmp_path / "d.hdf5")
    big_demo_file(path, demos=1, steps=4, size=16)
    with h5py.File(path, "a") as f:
        del f["data/demo_0/obs/agentview_rgb"]
        f["data/demo_0/obs"].create_dataset("agentview_rgb", shape=(4, 4096, 4096, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"agentview_rgb has shape \(4, 4096, 4096, 3\)"):
        load_libero_demos(path)
    with h5py.File(path, "a") as f:
        del f["data/demo_0/actions"]
        f["data/demo_0"].create_dataset("actions", data=np.zeros((4, 9)))
    with pytest.raises(ValueError, match=r"actions has shape \(4, 9\), expected \(T, 7\)"):
        load_libero_demos(path)


def test_a_policy_config_that_disagrees_with_its_weights_is_refused_before_building(tmp_path):
    from common.checkpoint import load_saved_policy
    from models.saved import PolicyLoadError
    from models.token_policy import TokenPolicy

    TokenPolicy().save(str(tmp_path))
    hf = json.loads((tmp_path / "hf_configs.json").read_text())
    hf["lm"]["vocab_size"] = 4_000_000  # 4M x 128 floats: 2 GB, were it built before the weights are read
    (tmp_path / "hf_configs.json").write_text(json.dumps(hf))
    t0 = time.time()
    with pytest.raises(PolicyLoadError, match="refused before building the model"):
        load_saved_policy(str(tmp_path))
    assert time.time() - t0 < 20


@pytest.mark.parametrize("override", ["env.max_steps=1000000000", "rollout.n=100000", "sft.batch_size=10000000",
                                      "env.num_steps_wait=100000000"])
def test_size_keys_have_upper_bounds(override):
    import train_sft
    from train_srpo import Config

    schema = train_sft.Config if override.startswith("sft.") else Config
    with pytest.raises(ConfigError, match="must be in"):
        check_ranges(load_config(schema, None, [override]))


# ---- 6. the smaller holes

@pytest.mark.parametrize("manifest", [[], {"files": []}, {"files": {"rng.pt": {"sha256": "x"}}},
                                      {"files": {"../../etc/passwd": {"size": 1, "sha256": "x"}}}])
def test_a_malformed_manifest_is_a_one_line_checkpoint_error_and_falls_back(tmp_path, manifest):
    good = a_checkpoint(tmp_path, 1)
    bad = a_checkpoint(tmp_path, 2)
    with open(os.path.join(bad, ckpt.MANIFEST), "w") as f:
        json.dump(manifest, f)
    with pytest.raises(CheckpointError):
        verify_checkpoint(bad)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert latest_checkpoint(str(tmp_path)) == good


def test_a_corrupt_newer_checkpoint_holds_no_retention_slot(tmp_path):
    a_checkpoint(tmp_path, 1, keep_last=1)
    corrupt = a_checkpoint(tmp_path, 5, keep_last=10)
    os.remove(os.path.join(corrupt, ckpt.MANIFEST))  # a resume skips it and continues from iteration 1
    written = a_checkpoint(tmp_path, 2, keep_last=1)
    assert os.path.isdir(written)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["iter_000002", "iter_000005"]


def test_shard_names_of_a_weights_index_stay_in_the_folder(tmp_path):
    from models.openvla_oft import _read_safetensors
    from models.saved import PolicyLoadError
    from safetensors.torch import save_file

    (tmp_path / "ckpt").mkdir()
    save_file({"w": torch.zeros(1)}, str(tmp_path / "outside.safetensors"))
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "../outside.safetensors"}}))
    with pytest.raises(PolicyLoadError, match="not a file name"):
        _read_safetensors(str(tmp_path / "ckpt"))


def test_evaluate_reads_no_config_yaml_of_unrelated_parent_folders(tmp_path):
    import evaluate
    from models.token_policy import TokenPolicy

    (tmp_path / "config.yaml").write_text("env:\n  suite: libero_10\n")  # someone's folder, three levels up
    policy = tmp_path / "a" / "b" / "policy"
    TokenPolicy().save(str(policy))
    assert evaluate.saved_train_config(str(policy)) == {}


def test_trust_run_is_a_flag_of_every_script(monkeypatch):
    from common import run_folder
    from common.config import parse_cli
    from train_srpo import Config

    monkeypatch.setattr(run_folder, "_trust_run", False)
    parse_cli(Config, "configs/srpo.yaml", argv=["--trust-run"], script="srpo")
    assert run_folder.trust_run()
    parse_cli(Config, "configs/srpo.yaml", argv=[], script="srpo")
    assert not run_folder.trust_run()


def test_a_published_folder_whose_config_disagrees_with_its_weights_is_refused_before_building(tmp_path):
    import shutil

    from models.openvla_oft import OpenVLAOFTConfig, OpenVLAOFTPolicy
    from models.saved import PolicyLoadError

    folder = tmp_path / "oft"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["text_config"]["hidden_size"] = 4096  # the weights hold 32: a 7B-sized build, were it made first
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(PolicyLoadError, match="refused before building the model"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=str(folder), bf16_weights=False))
