"""common/memory_plan.py: the plan's arithmetic against the tensors a real policy allocates (exact), the one-line
refusal of a run that cannot fit, --dry-run on every script (a subprocess, as a user runs it), and the estimates
against every peak docs/gpu.md measured (tests/memory_plan_check.py)."""
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.scripts import ROOT, run_script

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")
OFT_7B = os.path.join(ROOT, "tests", "fixtures", "openvla_oft_7b_config")


@pytest.mark.parametrize("lora_rank,bf16_weights", [(0, False), (4, True)])
def test_plan_arithmetic_is_the_allocated_bytes_on_cpu(lora_rank, bf16_weights):
    """The tiny OpenVLA-OFT in the published layout, planned on the meta device from its config.json, then built for
    real on the CPU: parameter bytes, gradient bytes after a backward and AdamW state bytes after a step (the
    scripts' adamw: moments + a 4-byte step per tensor) are the plan's, to the byte; full fine-tuning in float32 and
    LoRA on a bf16 base (float32 adapters)."""
    from common.memory_plan import estimate
    from common.train import adamw
    from models.configs import OpenVLAOFTConfig
    from models.openvla_oft import OpenVLAOFTPolicy

    cfg = OpenVLAOFTConfig(init_path=FIXTURE, lora_rank=lora_rank, bf16_weights=bf16_weights, image_pipeline="resize")
    model = OpenVLAOFTPolicy.memory_model(cfg, FIXTURE)
    assert {p.device.type for p in model.net.parameters()} == {"meta"}
    plan = estimate(model, micro=2, device="cpu")
    policy = OpenVLAOFTPolicy(cfg)
    assert plan.parts["weights"] == sum(p.nbytes for p in policy.parameters())
    rng = np.random.default_rng(0)
    obs = {"agentview": rng.integers(0, 256, (2, 64, 64, 3), dtype=np.uint8),
           "instructions": ["pick up the black bowl", "open the top drawer"]}
    log_prob, entropy = policy.log_prob(obs, None, torch.randint(0, 256, (2, 56)))
    (-log_prob.mean() - entropy.mean()).backward()
    params = [p for p in policy.parameters() if p.requires_grad]
    assert all(p.grad is not None for p in params)
    assert plan.parts["gradients"] == sum(p.grad.nbytes for p in params)
    optimizer = adamw(params, 1e-3, 0.0)
    optimizer.step()
    state = sum(t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    assert plan.parts["adamw"] == state
    assert plan.parts["autocast"] == 0 and plan.parts["activations"] > 0  # no autocast on the CPU
    if lora_rank:
        assert plan.parts["gradients"] < plan.parts["weights"] / 20  # only the adapters train


def _srpo_cfg(*overrides):
    import importlib

    from common.config import load_config

    return load_config(importlib.import_module("train_srpo").Config, None,
                       ["env.task_ids=[0]", "policy.type=openvla_oft", f"init.path={FIXTURE}", *overrides])


def test_a_run_that_cannot_fit_stops_in_one_line_naming_the_fixes(capsys):
    """A device too small for the plan (--device-memory-gib, here 0.92 of the tiny model's peak): `check` prints the
    table, then refuses with one line naming the fixes that fit, each with its peak; a device that holds it passes."""
    from common import memory_plan
    from common.config import ConfigError

    cfg = _srpo_cfg("train.micro_batch_size=16", "train.mini_batch_size=64", "reward.mode=binary")
    accelerator = SimpleNamespace(device=torch.device("cpu"), num_processes=1, is_main_process=True)
    peak = memory_plan.plan_run(cfg, 1).peak_gib
    try:
        memory_plan.set_cli(False, peak * 0.92 / memory_plan.MARGIN, None)
        with pytest.raises(ConfigError) as err:
            memory_plan.check(cfg, accelerator)
        line = str(err.value)
        assert "\n" not in line and line.startswith("memory plan: ") and "exceeds 95% of the" in line
        assert "fits with: " in line and "GiB)" in line
        assert "train.strategy=fsdp" in line and "train.micro_batch_size=" in line and "policy.lora_rank=32" in line
        assert "[memory plan] train_srpo.py: openvla_oft" in capsys.readouterr().out  # the table came first
        memory_plan.set_cli(False, peak * 2, None)
        assert memory_plan.check(cfg, accelerator).fits()
    finally:
        memory_plan.set_cli(False, None, None)


@pytest.mark.slow
def test_the_refusal_stops_the_script_before_anything_is_built(tmp_path):
    """train_srpo.py itself on a device planned too small: exit 1 with the one line, no run folder left behind."""
    out = run_script("train_srpo.py", ["--task-id", "0", "--no-wandb", "--device-memory-gib", "0.0001",
                                       "policy.type=openvla_oft", f"init.path={FIXTURE}", "init.mode=checkpoint",
                                       "reward.mode=binary"], outputs=tmp_path, check=False, timeout=300)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: memory plan: ") and "exceeds 95% of the 0.0001 GiB of " \
        "--device-memory-gib 0.0001" in errors[0], out.stderr[-2000:]
    assert "[memory plan] train_srpo.py" in out.stdout
    assert not os.listdir(tmp_path / "runs") if (tmp_path / "runs").exists() else True


def test_plan_flags_are_checked():
    from common import memory_plan
    from common.config import ConfigError

    with pytest.raises(ConfigError, match="--processes only plans"):
        memory_plan.set_cli(False, None, 8)
    with pytest.raises(ConfigError, match="must be positive"):
        memory_plan.set_cli(True, -1.0, None)
    memory_plan.set_cli(False, None, None)


DRY_RUNS = {  # script -> arguments: the shipped real-size recipes, planned from config.json alone
    "train_srpo.py": ["--config", "configs/srpo_libero.yaml", f"init.path={OFT_7B}"],
    "train_gae_ppo.py": ["--config", "configs/gae_ppo_libero_pi0.yaml"],
    "train_luffy.py": ["--config", "configs/luffy_libero.yaml", f"init.path={OFT_7B}"],
    "train_flowsar.py": ["--config", "configs/flowsar_libero.yaml"],
    "train_sft.py": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(DRY_RUNS))
def test_dry_run_prints_the_plan_and_exits(script, tmp_path):
    """`--dry-run` on every script: exit 0 within a minute on a CPU, the table printed, nothing written."""
    t0 = time.perf_counter()
    out = run_script(script, ["--task-id", "0", "--dry-run", "--device-memory-gib", "80", *DRY_RUNS[script]],
                     outputs=tmp_path, timeout=300)
    assert time.perf_counter() - t0 < 120
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"[memory plan] {script}: "), out.stdout
    assert any(line.strip().startswith("peak (") and "of 80.0 GiB" in line for line in lines), out.stdout
    assert not os.path.exists(tmp_path / "runs")
    if script == "train_srpo.py":  # OpenVLA-OFT 7B full fine-tuning (the shipped default) on one 80 GB GPU
        assert "weights (float32)                     27.93   7,498.2 M parameters" in out.stdout
        assert "does NOT fit" in out.stdout and "fits with: train.strategy=fsdp over 4 GPUs" in out.stdout


@pytest.mark.slow
def test_estimates_are_within_ten_percent_of_the_measured_peaks():
    """tests/memory_plan_check.py: every docs/gpu.md peak whose setting is fully known (the real-size
    architectures with random weights on an H100 / H200) within 10% of the plan."""
    from tests.memory_plan_check import rows

    table = rows()
    checked = [r for r in table if r["within"]]
    assert len(checked) >= 12
    bad = [(r["what"], r["measured"], r["estimate"]) for r in checked if abs(r["error"]) > 0.10]
    assert not bad, bad


def test_srpo_libero_help_and_dry_run_show_siirls_update(tmp_path):
    """`configs/srpo_libero.yaml --help` shows siiRL's update (64 prompts x n 8 per update, mini-batches of 32 whole
    trajectories, refill on, dual clip off, the V-JEPA 2 ViT-g/384 encoder) and `--dry-run` plans it from the 7B's
    config.json: memory is set by the micro-batch (8 policy steps), not by the 512 trajectories of the update; without
    init.path the dry-run names the folder that plans it."""
    out = run_script("train_srpo.py", ["--config", "configs/srpo_libero.yaml", "--help"]).stdout
    shown = {line.split()[0] for line in out.splitlines() if line.startswith("  ") and "=" in line.split()[0]}
    assert {"rollout.prompts_per_iteration=64", "rollout.n=8", "train.mini_batch_unit=trajectory",
            "train.mini_batch_size=32", "train.micro_batch_size=8", "rollout.refill=true",
            "algorithm.clip_ratio_c=10000.0", "algorithm.loss_agg_mode=traj-token-mean",
            "reward.encoder.kind=vjepa2", "reward.encoder.model_path=facebook/vjepa2-vitg-fpc64-384",
            "reward.encoder.num_frames=64"} <= shown, sorted(shown)
    out = run_script("train_srpo.py", ["--config", "configs/srpo_libero.yaml", "--task-id", "0", "--dry-run",
                                       "--device-memory-gib", "139.8", f"init.path={OFT_7B}"], outputs=tmp_path)
    lines = out.stdout.splitlines()
    assert lines[0] == ("[memory plan] train_srpo.py: openvla_oft (openvla_oft_7b_config), full fine-tuning; ddp over "
                        "1 process; micro-batch 8 of 32 episodes"), lines[0]
    assert any(line.split()[:2] == ["activations", "2.27"] and "micro-batch 8," in line for line in lines), out.stdout
    assert any("(vitg, 384 px: published size)" in line for line in lines), out.stdout
    assert any(line.strip().startswith("peak (update forward)") and "131.58" in line and ": fits" in line
               for line in lines), out.stdout
    assert not os.path.exists(tmp_path / "runs")
    from common.config import ConfigError
    from models.openvla_oft import OpenVLAOFTPolicy

    with pytest.raises(ConfigError, match="set init.path=.*tests/fixtures/openvla_oft_7b_config"):
        OpenVLAOFTPolicy.memory_model(None, None)  # what --dry-run without init.path answers
