"""train_flowsar.py started from a pi0 checkpoint folder (init.path, openpi / RLinf layout with norm_stats.json, a
tiny PI0 written by tests/test_models_pi0_checkpoint.py's writer) on the embedded suite with RLinf's recipe
(train_expert_only, bf16 frozen weights, flow-SDE rollouts, horizon 10 with 5 executed): two iterations run, the
frozen PaliGemma is unchanged, the action expert moved, and the saved policy carries the checkpoint's statistics; a
pi0.5 folder stops with one line. The same from configs/flowsar_libero.yaml on real LIBERO."""
import numpy as np
import pytest
import torch

from common.checkpoint import load_saved_policy
from models.text_tokenizer import ByteTokenizer
from tests.scripts import read_metrics, run_script
from tests.test_models_pi0_checkpoint import tiny_pi0, write_lerobot, write_openpi

FAST = ["--task-id", "0", "init.mode=checkpoint", "env.num_envs=4", "env.max_steps=20", "env.action_chunk=5",
        "rollout.n=2", "rollout.prompts_per_iteration=2", "rollout.flow_steps=2", "rollout.flow_noise_level=0.5",
        "policy.noise_method=flow_sde", "policy.train_expert_only=true", "policy.bf16_weights=true",
        "policy.lora_rank=0", "train.iterations=2", "train.lr=1e-3", "train.mini_batch_size=8", "train.micro_batch_size=4", "eval.every=0", "--no-wandb"]


def test_flowsar_from_a_pi0_folder(tmp_path):
    model = tiny_pi0(chunk=10)
    folder = write_openpi(tmp_path / "pi0", model)
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    run_script("train_flowsar.py", [*FAST, f"init.path={folder}", f"policy.tokenizer_path={tmp_path}/tok"],
               outputs=tmp_path)
    run_dir = next((tmp_path / "runs").iterdir())
    rows = [r for r in read_metrics(str(run_dir)) if "train/flow_sar_loss" in r]
    assert len(rows) == 2 and all(np.isfinite(r["train/flow_sar_loss"]) for r in rows)
    trained = load_saved_policy(str(run_dir))
    assert trained.stats is not None and trained.stats.delta_dims == 6 and trained.horizon == 10
    assert trained.action_chunk == 5 and trained.cfg.train_expert_only
    start, end = model.state_dict(), trained.core.state_dict()
    # the frozen PaliGemma is the checkpoint's, cast once to bf16 (openpi's fp32 exceptions kept) and never moved
    assert all(torch.equal(end[k], v.to(end[k].dtype)) for k, v in start.items() if k.startswith("model.vlm."))
    assert end["model.vlm.language_model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert end["model.dit.layers.0.mlp.up_proj.weight"].dtype == torch.float32
    assert any(not torch.equal(end[k], v) for k, v in start.items() if k.startswith("model.dit.layers"))


def test_a_pi05_folder_stops_with_one_line(tmp_path):
    folder = write_lerobot(tmp_path / "pi05", tiny_pi0(chunk=4), pi05=True)
    out = run_script("train_flowsar.py", [*FAST, f"init.path={folder}"], outputs=tmp_path, check=False)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("error: init.path") and "pi0.5 checkpoint" in last and "Traceback" not in out.stderr


def run_on_libero_from_pi0_folder(tmp_path, script: str, config: str, args) -> tuple:
    """`script --config config` for one iteration on the real simulator (skipped without LIBERO), from a tiny pi0
    folder in RLinf's layout (horizon 10, 5 executed): its one metrics row and run folder, after checking that the
    trained policy it saved kept the folder's statistics and chunking."""
    folder = write_openpi(tmp_path / "pi0", tiny_pi0(chunk=10))
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    run_script(script, ["--config", config, "--task-id", "0", "--no-wandb", f"init.path={folder}",
                        f"policy.tokenizer_path={tmp_path}/tok", "env.image_size=64", "env.num_envs=2",
                        "env.max_steps=10", "env.fast_render=true", "eval.protocol=heldout", "train.iterations=1",
                        "eval.every=0", *args],
               outputs=tmp_path)
    run_dir = next((tmp_path / "runs").iterdir())
    (row,) = read_metrics(str(run_dir))
    trained = load_saved_policy(str(run_dir))
    assert trained.stats is not None and trained.horizon == 10 and trained.action_chunk == 5
    return row, str(run_dir)


@pytest.mark.real_libero
def test_libero_config_one_iteration_from_a_pi0_folder(tmp_path):
    """configs/flowsar_libero.yaml as shipped (expert-only, bf16 weights, flow-SDE, 5 of the horizon executed) on the
    real simulator, started from a tiny pi0 folder in RLinf's layout: one iteration."""
    row, _ = run_on_libero_from_pi0_folder(tmp_path, "train_flowsar.py", "configs/flowsar_libero.yaml",
                                           ["rollout.n=2", "rollout.prompts_per_iteration=1",
                                            "train.mini_batch_size=4", "train.micro_batch_size=4"])
    assert row["rollout/env_steps"] == 20 and np.isfinite(row["train/flow_sar_loss"])
