"""The thread rule (common/threads.py): torch's CPU threads from the cores a process may use and what else it runs,
an explicit count first; applied by the run (its header, config.yaml) and reused on resume."""
import os
import subprocess
import sys

import pytest
import torch

from common.threads import choose_threads, header, set_threads, usable_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("kwargs, threads", [
    (dict(cores=2), 2),  # this machine alone: both cores
    (dict(cores=16, world=2), 8),  # two processes of one run: a half each
    (dict(cores=16, world=3), 5),  # 16 // 3
    (dict(cores=16, workers=2), 14),  # 2 simulator workers step while torch computes
    (dict(cores=16, world=2, workers=3), 5),  # 8 each, less its 3 workers
    (dict(cores=2, workers=2), 1),  # never fewer than 1
    (dict(cores=2, world=4), 1),  # more processes than cores
    (dict(cores=16, gpu=True), 1),  # the GPU computes: one host thread
    (dict(cores=16, override=3), 3),  # train.threads
    (dict(cores=2, override=8), 2),  # never more than the process's cores
    (dict(cores=16, gpu=True, override=4), 4),  # the key wins on a GPU too
    (dict(cores=16, env="1"), 1),  # OMP_NUM_THREADS=1
    (dict(cores=16, env="4", override=2), 2),  # the key before OMP_NUM_THREADS
    (dict(cores=4, env="0"), 4),  # not a positive count: auto
    (dict(cores=4, env="two"), 4),
    (dict(cores=4, env=""), 4),
])
def test_the_thread_rule_by_hand(kwargs, threads):
    assert choose_threads(**kwargs)[0] == threads


def test_the_reason_names_where_the_count_came_from():
    assert choose_threads(2) == (2, "auto: 2 cores")
    assert choose_threads(16, world=2, workers=3) == (5, "auto: 16 cores / 2 processes - 3 simulator workers")
    assert choose_threads(16, gpu=True) == (1, "auto: the GPU computes, 1 host thread")
    assert choose_threads(2, override=8) == (2, "train.threads=8, capped at the 2 cores this process may use")
    assert choose_threads(8, env="3") == (3, "OMP_NUM_THREADS=3")
    assert choose_threads(8, override=2, key="--threads") == (2, "--threads=2")
    assert header(2, "auto: 2 cores") == \
        f"torch threads 2 (auto: 2 cores; OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']})"


def test_the_waits_are_passive_once_common_is_imported():
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"  # tests import common (conftest), as every script does
    out = subprocess.run([sys.executable, "-c", "import common, os; print(os.environ['OMP_WAIT_POLICY'])"], cwd=ROOT,
                         env={k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", "import common, os; print(os.environ['OMP_WAIT_POLICY'])"], cwd=ROOT,
                         env={**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ACTIVE"  # a user's own choice is kept


def test_set_threads_applies_the_rule_to_torch(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        assert usable_cores() == 4
        assert set_threads(world=2) == (2, "auto: 4 cores / 2 processes") and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert set_threads(override=3) == (3, "train.threads=3") and torch.get_num_threads() == 3
        assert set_threads() == (1, "OMP_NUM_THREADS=1") and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_run_sets_the_count_and_writes_it_into_its_config(tmp_path, monkeypatch):
    """Run (common/run.py) applies the rule and puts the count chosen in the config it saves as config.yaml, so a
    resume (which loads config.yaml) takes the same count whatever OMP_NUM_THREADS says then."""
    from common.config import load_config, save_config
    from common.run import Run
    from train_srpo import Config

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = load_config(Config, None, [f"log.output_dir={tmp_path}", "log.wandb=false"])
    assert cfg.train.threads == 0
    try:
        run = Run(cfg, "srpo")
        run.release_lock()
        assert run.threads == (3, "auto: 3 cores") and torch.get_num_threads() == 3 and cfg.train.threads == 3
        save_config(cfg, str(tmp_path / "config.yaml"))
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        again = load_config(Config, str(tmp_path / "config.yaml"), [f"log.output_dir={tmp_path}/b"])
        assert again.train.threads == 3
        run = Run(again, "srpo")
        run.release_lock()
        assert run.threads == (3, "train.threads=3") and torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # two short train_srpo.py runs (~40 s)
def test_the_header_shows_the_count_and_a_resume_reuses_it(tmp_path):
    if usable_cores() < 2:
        pytest.skip("one core: auto and OMP_NUM_THREADS=1 give the same count")
    fast = ["--task-id", "0", "init.mode=scratch", "env.num_envs=4", "env.max_steps=16", "rollout.n=4",
            "rollout.prompts_per_iteration=1", "rollout.train_trials=10", "eval.every=0", "--no-wandb",
            "algorithm.filter_accuracy=false", "log.checkpoint_every=1", f"log.output_dir={tmp_path}",
            f"log.plots_dir={tmp_path}/plots", "reward.encoder.num_frames=4"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(PYTHONPATH=ROOT, WANDB_MODE="disabled")
    out = subprocess.run([sys.executable, "train_srpo.py", *fast, "train.iterations=1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    n = usable_cores()
    assert f"| torch threads {n} (auto: {n} cores; OMP_WAIT_POLICY=PASSIVE)\n" in out.stdout  # the header's end
    (run_dir,) = [os.path.join(tmp_path, d) for d in os.listdir(tmp_path) if d != "plots"]
    with open(os.path.join(run_dir, "config.yaml")) as f:
        assert f"  threads: {n}\n" in f.read()
    out = subprocess.run([sys.executable, "train_srpo.py", "--resume", run_dir, "train.iterations=2"], cwd=ROOT,
                         env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"| resumed at iteration 1 | torch threads {n} (train.threads={n}; OMP_WAIT_POLICY=PASSIVE)\n" in out.stdout
