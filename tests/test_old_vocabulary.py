"""Issue 69's one update vocabulary: the four RL scripts name the update's keys alike (train.update_epochs,
mini_batch_size, micro_batch_size, lr, grad_clip; rollout.prompts_per_iteration), and a run folder written with the
old names (train.ppo_epochs, ppo_mini_batch_size, ..., GAE-PPO's actor_lr, FlowSAR's flow_sar_*) still resumes: its
config.yaml is read with the names mapped (common/renamed_keys.py) and a printed note, bitwise the run it would have
been."""
import os
import subprocess
import sys

import torch

from common import renamed_keys
from common.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_SILENT="true", WANDB_MODE="offline")
UPDATE_KEYS = ["train.update_epochs", "train.mini_batch_size", "train.micro_batch_size", "train.lr",
               "train.grad_clip", "rollout.prompts_per_iteration"]


def test_the_four_rl_scripts_name_the_update_keys_alike_in_their_help():
    for script in ("train_srpo.py", "train_luffy.py", "train_gae_ppo.py", "train_flowsar.py"):
        out = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], env=ENV, capture_output=True,
                             text=True, timeout=120)
        keys = {line.split("=")[0].strip() for line in out.stdout.splitlines() if line.startswith("  ") and "=" in line}
        assert set(UPDATE_KEYS) <= keys, (script, set(UPDATE_KEYS) - keys)
        assert not [k for k in keys if k.split(".")[-1] in {old.split(".")[1] for old in renamed_keys.RENAMED}]
        assert not [k for k in keys if "flow_sar_" in k]


def test_a_yaml_of_the_old_names_is_read_with_them_mapped_and_a_note(tmp_path, capsys):
    import train_flowsar
    import train_gae_ppo

    path = tmp_path / "old.yaml"
    path.write_text("train:\n  ppo_epochs: 3\n  ppo_mini_batch_size: 16\n  ppo_micro_batch_size: 4\n"
                    "  actor_lr: 0.002\n  actor_max_grad_norm: 0.5\n  critic_max_grad_norm: 0.25\n"
                    "rollout:\n  episodes_per_iteration: 6\n")
    cfg = load_config(train_gae_ppo.Config, str(path))
    t = cfg.train
    assert (t.update_epochs, t.mini_batch_size, t.micro_batch_size, t.lr, t.grad_clip, t.critic_grad_clip) == \
        (3, 16, 4, 0.002, 0.5, 0.25) and cfg.rollout.prompts_per_iteration == 6
    note = capsys.readouterr().out.strip()
    assert note.startswith(f"note: {path} uses the update keys' old names") and "train.actor_lr -> train.lr" in note

    path.write_text("algorithm:\n  flow_sar_beta: 0.5\n  flow_sar_loss_variant: softplus_kl\n  flow_sar_t_max: 0.7\n")
    cfg = load_config(train_flowsar.Config, str(path))
    assert (cfg.algorithm.beta, cfg.algorithm.loss_variant, cfg.algorithm.t_max) == (0.5, "softplus_kl", 0.7)
    assert "algorithm.flow_sar_beta -> algorithm.beta" in capsys.readouterr().out


def _srpo(args):
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), *args], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_a_run_folder_of_the_old_names_resumes_bitwise(tmp_path):
    """An SRPO run saved at iteration 1 with its config.yaml in the old names (as a run started before issue 69 left
    it) resumed to iteration 2 is bitwise the uninterrupted 2-iteration run: the same metrics and weights."""
    import json

    from safetensors.torch import load_file

    fast = ["--task-id", "0", "init.mode=scratch", "env.num_envs=8", "env.max_steps=16", "rollout.n=4",
            "rollout.prompts_per_iteration=2", "rollout.train_trials=10", "eval.every=1", "eval.trials_per_task=2",
            "eval.samples_per_trial=0", "--no-wandb", "algorithm.filter_accuracy=false", "reward.mode=binary",
            "algorithm.entropy_coeff=0.01", "log.checkpoint_every=1", "train.lr_schedule=constant",
            "train.mini_batch_size=4", "train.micro_batch_size=16", "train.update_epochs=2"]
    _srpo([*fast, "train.iterations=2", f"log.output_dir={tmp_path}/a", f"log.plots_dir={tmp_path}/plots"])
    _srpo([*fast, "train.iterations=1", f"log.output_dir={tmp_path}/b", f"log.plots_dir={tmp_path}/plots"])
    (a,), (b,) = ([os.path.join(tmp_path, d, n) for n in os.listdir(tmp_path / d)] for d in ("a", "b"))
    config = os.path.join(b, "config.yaml")
    text = open(config).read()
    old = text
    for old_key, new_key in renamed_keys.RENAMED.items():
        section, key = old_key.split(".")
        old = old.replace(f"\n  {new_key.split('.')[1]}: ", f"\n  {key}: ") if section == "train" and \
            key.startswith("ppo_") else old
    assert old != text and "  ppo_epochs: 2\n" in old and "  ppo_mini_batch_size: 4\n" in old
    open(config, "w").write(old)

    out = _srpo(["--resume", b, "train.iterations=2"])
    assert "uses the update keys' old names (issue 69), read as: train.ppo_epochs -> train.update_epochs" in out.stdout
    assert "resumed at iteration 1" in out.stdout
    assert open(config).read() == old  # a run's config.yaml is never rewritten

    def rows(run):
        with open(os.path.join(run, "metrics.jsonl")) as f:
            return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/") and k != "charts/SPS"}
                    for line in f]

    assert rows(a) == rows(b)
    wa, wb = (load_file(os.path.join(r, "checkpoints", "iter_000002", "policy", "model.safetensors")) for r in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
