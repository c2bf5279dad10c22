"""Every training script on a CUDA GPU (`--gpu 0`): each RL script from scratch for 2 iterations with its default tiny
policy, then train_sft.py for 20 steps; each exits 0 with its metrics rows, an RL run's last at iteration 2 with its
peak GPU memory (docs/gpu.md, "Every training script on CUDA"; `-s` prints each peak). Skipped without CUDA."""
import os
import subprocess
import sys

import pytest
import torch

from tests.scripts import ENV, ROOT, only_run_metrics

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(),
                                                   reason="needs a CUDA GPU (run it on the GPU machine)")]

SCRIPTS = {  # small settings of each RL script (formerly benchmarks/gpu_check.py --part scripts)
    "train_srpo.py": ["env.num_envs=8", "env.max_steps=16", "rollout.n=4", "rollout.prompts_per_iteration=2",
                      "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=2",
                      "reward.encoder.num_frames=4"],
    "train_gae_ppo.py": ["env.num_envs=8", "env.max_steps=16", "rollout.prompts_per_iteration=8", "eval.every=1",
                         "eval.trials_per_task=2", "eval.samples_per_trial=2", "train.lr_warmup_steps=1"],
    "train_flowsar.py": ["env.num_envs=8", "env.max_steps=16", "rollout.n=2", "rollout.prompts_per_iteration=2",
                         "rollout.flow_steps=2", "eval.every=1", "eval.trials_per_task=2"],
    "train_luffy.py": ["env.num_envs=8", "env.max_steps=32", "rollout.n=4", "rollout.prompts_per_iteration=2",
                       "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=0"],
}


def run_on_gpu(script, args, out):
    p = subprocess.run([sys.executable, script, "--task-id", "0", "--gpu", "0", "--no-wandb", *args,
                        f"log.output_dir={out}/runs", f"log.plots_dir={out}/plots"], cwd=ROOT,
                       env=dict(ENV, WANDB_MODE="disabled"), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, (p.stdout + p.stderr)[-2000:]


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_each_rl_script_runs_two_iterations_on_cuda(script, tmp_path):
    run_on_gpu(script, ["init.mode=scratch", "train.iterations=2", *SCRIPTS[script]], tmp_path)
    last = only_run_metrics(tmp_path)[-1]
    assert last["iteration"] == 2 and last["perf/max_memory_allocated_gb"] > 0
    print(f"{script}: peak GPU memory {last['perf/max_memory_allocated_gb']:.2f} GiB")


def test_sft_runs_on_cuda(tmp_path):
    run_on_gpu("train_sft.py", ["sft.num_demos=2", "sft.steps=20", "sft.eval_every=10",
                                f"sft.output_path={tmp_path}/sft_export"], tmp_path)
    assert only_run_metrics(tmp_path) and os.path.isfile(os.path.join(tmp_path, "sft_export", "config.json"))
