"""GAE-PPO on the flow (pi0) family, as RLinf trains pi0 with PPO: the flow-SDE step's transition log-prob by hand
(over the executed part only), the rollout's log-probs recomputed at update time (ratio 1), the value head's input,
bad combinations as one line; then train_gae_ppo.py from a tiny pi0 folder (openpi / RLinf layout with statistics:
horizon 10, 5 executed, 32-dim model space) on the embedded suite with the expert-only recipe (two iterations, the
frozen PaliGemma unchanged, the expert moved, exact resume) and from configs/gae_ppo_libero_pi0.yaml on real LIBERO."""
import math
import os

import numpy as np
import pytest
import torch

from common.config import ConfigError, load_config
from common.rollout import collect_rollouts, flatten_steps
from common.checkpoint import load_saved_policy
from envs import EnvConfig, make_vector_env
from models.flow_policy import FlowPolicy, FlowPolicyConfig
from models.text_tokenizer import ByteTokenizer
from tests.scripts import read_metrics, run_script
from tests.test_flowsar_pi0_folder import run_on_libero_from_pi0_folder
from tests.test_models_pi0_checkpoint import tiny_pi0, write_openpi
from tests.test_models_token_policy import INSTR, make_obs
from train_gae_ppo import Config, check_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, image_size=32, noise_method="flow_sde")


def test_transition_log_prob_by_hand():
    """v(x, t) = c t (c = 2), noise level s = 0.5, N = 2 steps (dt = 0.5), x_t = 1, x_next = 0.5 everywhere; horizon 3
    with 2 executed, 7 dims: 2 x 7 = 14 elements count.
    row 0, step 0 (t = 1): sigma = s sqrt(1 / (1 - 1/2)) = 0.7071, std = sqrt(0.5) sigma = 0.5; x0 = x - v = -1,
      x1 = x + 0 = 1; mean = 0.5 x0 + (0.5 - 0.5^2 * 0.5 / 2) x1 = -0.5 + 0.375 = -0.125; residual 0.625:
      log p = -0.625^2 / 0.5 - log 0.5 - log(2 pi) / 2 = -1.0070413 per element -> -14.098578.
    row 1, step 1 (t = 0.5): sigma = 0.5 sqrt(0.5 / 0.5) = 0.5, std = 0.353553; v = 1: x0 = 0.5, x1 = 1.5;
      mean = (1 - 0.5 + 0.5) 0.5 + (0.5 - 0.5 - 0.25 * 0.5 / 1) 1.5 = 0.3125; residual 0.1875:
      log p = -0.1875^2 / 0.25 + 1.0397208 - 0.9189385 = -0.0198428 per element -> -0.277799."""
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL, action_chunk=2, horizon=3, num_steps=2))
    seen = []

    def velocity(obs, instructions, x, t, prefix=None):
        seen.append(torch.as_tensor(t).tolist())
        return 2.0 * torch.as_tensor(t, dtype=torch.float32)[:, None, None] * torch.ones_like(x)

    policy.velocity = velocity
    obs, instr = make_obs(2, 32), INSTR[:2]
    x_t, x_next = torch.ones(2, 3, 7), torch.full((2, 3, 7), 0.5)
    x_next[:, 2] = 100.0  # the third horizon step is never executed: it carries no density
    lp = policy.transition_log_prob(obs, instr, torch.tensor([0, 1]), x_t, x_next, noise_level=0.5)
    assert seen == [[1.0, 0.5]]
    per_element = np.array([-0.625 ** 2 / 0.5 - math.log(0.5), -0.1875 ** 2 / 0.25 - math.log(math.sqrt(0.125))])
    np.testing.assert_allclose(lp.detach().numpy(), 14 * (per_element - 0.5 * math.log(2 * math.pi)), rtol=1e-6)
    np.testing.assert_allclose(lp.detach().numpy(), [-14.098578, -0.277799], atol=2e-6)
    with pytest.raises(ValueError, match="sde_step must hold 2 step indices in"):
        policy.transition_log_prob(obs, instr, torch.tensor([0, 2]), x_t, x_next, noise_level=0.5)


def test_rollout_log_probs_are_recomputed_at_update_time_with_gradients():
    """collect_rollouts on the embedded suite keeps each policy step's chain data; transition_log_prob over the
    flattened steps, in micro-batches that mix episodes and steps differently from the rollout's calls, gives the
    rollout's log-probs (PPO ratio 1 at the first update), with gradients on the expert only (train_expert_only), and
    the value-head input is the rollout's."""
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL, action_chunk=4, num_steps=3, train_expert_only=True))
    env = make_vector_env(EnvConfig(num_envs=3, image_size=32, max_steps=12, action_chunk=4))
    try:
        batch = collect_rollouts(env, policy, [0, 0, 0], [0, 1, 2], flow_noise_level=0.5, keep_hidden=True,
                                 keep_chain=True, progress=False)
    finally:
        env.close()
    steps = flatten_steps(batch)
    assert len(steps) == 9 and steps.data["old_log_probs"].shape == (9, 1)
    assert set(steps.data["sde_step"].tolist()) <= {0, 1, 2} and steps.data["x_t"].shape == (9, 4, 7)
    lp, hidden = [], []
    for rows in (slice(0, 4), slice(4, 9)):
        part = steps.take(rows)
        out, h = policy.transition_log_prob(part.obs, part.instructions, part.tensor("sde_step"), part.tensor("x_t"),
                                            part.tensor("x_next"), 0.5, return_hidden=True)
        lp.append(out)
        hidden.append(h)
    lp = torch.cat(lp)
    np.testing.assert_allclose(lp.detach().numpy(), steps.data["old_log_probs"][:, 0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(torch.cat(hidden).numpy(), steps.data["hidden"], rtol=1e-5, atol=1e-5)
    lp.sum().backward()
    grads = {n: p.grad for n, p in policy.net.named_parameters()}
    assert all(g is None for n, g in grads.items() if ".vlm." in f".{n}")
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith("model.dit."))
    # the value head's input is a function of the observation alone
    np.testing.assert_allclose(policy.hidden(steps.take(slice(0, 2)).obs, steps.instructions[:2]).numpy(),
                               steps.data["hidden"][:2], rtol=1e-5, atol=1e-5)
    assert policy.hidden_size == 32


def test_value_input_expert_reads_the_action_experts_output():
    """value_input expert (RLinf's pi0 critic, openpi_action_model.py:176-179,1154-1163,1274-1284@a3816b5): the
    expert's last hidden state over the horizon (PI0's `last_hidden_state[:, -chunk_size:]`, what the action
    projection reads) mean-pooled, expert_dim wide; a rollout records it at each of the S denoising steps and the value
    head averages the S values (RLinf's rollout value); the update's `transition_log_prob` gives the flow-SDE step's,
    equal to the rollout's record at that step; `hidden` (the bootstrap) an ODE chain's S steps."""
    from models.value_head import ValueHead

    torch.manual_seed(0)
    cfg = dict(SMALL, expert_dim=24, action_chunk=4, num_steps=3, train_expert_only=True)
    policy = FlowPolicy(FlowPolicyConfig(**cfg, value_input="expert"))
    assert policy.hidden_size == 24 and FlowPolicy(FlowPolicyConfig(**cfg)).hidden_size == 32  # prefix: PaliGemma's
    obs, instr = make_obs(2, 32), INSTR[:2]
    prefix = policy.prefix(obs, instr)
    x = torch.randn(2, policy.horizon, policy.model_dim)
    v, features = policy.velocity(None, None, x, 0.5, prefix, return_features=True)
    with torch.no_grad():  # by hand: PI0's own forward, its expert output over the horizon, mean-pooled
        from models.flow_policy import _fresh_cache

        t = torch.full((2,), 0.5)
        embeds = policy.core.embed_action_time(prefix.state, policy._pad_actions(x), t)
        out = policy.core.model(attention_mask=prefix.attention_mask, action_embeds=embeds,
                                past_key_values=_fresh_cache(prefix.past_key_values))
        want = out.last_hidden_state[:, -policy.horizon:].float().mean(1)
    np.testing.assert_allclose(features.detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v.detach().numpy(), policy.velocity(None, None, x, 0.5, prefix).detach().numpy())
    env = make_vector_env(EnvConfig(num_envs=3, image_size=32, max_steps=12, action_chunk=4))
    try:
        batch = collect_rollouts(env, policy, [0, 0, 0], [0, 1, 2], flow_noise_level=0.5, keep_hidden=True,
                                 keep_chain=True, progress=False)
    finally:
        env.close()
    steps = flatten_steps(batch)
    assert steps.data["hidden"].shape == (9, 3, 24)  # 9 policy steps x 3 denoising steps x expert width
    part = steps.take(slice(0, 4))
    _, h = policy.transition_log_prob(part.obs, part.instructions, part.tensor("sde_step"), part.tensor("x_t"),
                                      part.tensor("x_next"), 0.5, return_hidden=True)
    rows = np.arange(4)
    np.testing.assert_allclose(h.detach().numpy(), steps.data["hidden"][rows, steps.data["sde_step"][:4]],
                               rtol=1e-5, atol=1e-5)
    head = ValueHead(24)
    per_step = torch.stack([head(torch.as_tensor(steps.data["hidden"][:, s])) for s in range(3)], 1)
    np.testing.assert_allclose(head(torch.as_tensor(steps.data["hidden"])).detach().numpy(),
                               per_step.mean(1).detach().numpy(), rtol=1e-6)  # the mean of the S values
    assert policy.hidden(part.obs, part.instructions).shape == (4, 3, 24)
    with pytest.raises(ValueError, match="value_input must be one of"):
        FlowPolicy(FlowPolicyConfig(**cfg, value_input="suffix"))


@pytest.mark.parametrize("override, message", [
    ("policy.noise_method=additive", "GAE-PPO on a flow policy needs policy.noise_method=flow_sde and "
                                     "rollout.flow_noise_level > 0"),
    ("rollout.flow_noise_level=0", "rollout.flow_noise_level=0.0: GAE-PPO on a flow policy needs"),
    ("algorithm.entropy_coeff=0.01", "algorithm.entropy_coeff=0.01: a flow policy's flow-SDE std is fixed"),
])
def test_bad_flow_combinations_are_one_line(override, message):
    cfg = load_config(Config, os.path.join(ROOT, "configs/gae_ppo_libero_pi0.yaml"), [override])
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)
    if not override.startswith("policy."):  # token policies: no matter
        check_config(load_config(Config, os.path.join(ROOT, "configs/gae_ppo.yaml"), [override]))


FAST = ["--task-id", "0", "--no-wandb", "init.mode=checkpoint", "policy.type=flow", "policy.noise_method=flow_sde",
        "policy.train_expert_only=true", "policy.bf16_weights=true", "policy.num_steps=2", "env.num_envs=4",
        "env.max_steps=20", "env.action_chunk=5", "rollout.prompts_per_iteration=4", "train.lr=1e-3",
        "train.lr_warmup_steps=0", "train.micro_batch_size=8", "eval.every=0"]


@pytest.mark.slow
def test_gae_ppo_from_a_pi0_folder_two_iterations_then_resume_is_exact(tmp_path):
    """4 episodes x 4 policy steps per iteration, one mini-batch of 16 in micro-batches of 8 (one epoch): the update's
    ratio is 1 (ppo_kl ~ 0, nothing clipped), the losses are finite, the value loss is there; the frozen PaliGemma is
    the checkpoint's (bf16), the expert moved; a run interrupted after iteration 2 and resumed to 3 logs the numbers
    of one never interrupted."""
    model = tiny_pi0(chunk=10)
    folder = write_openpi(tmp_path / "pi0", model)
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    args = [*FAST, f"init.path={folder}", f"policy.tokenizer_path={tmp_path}/tok", "log.checkpoint_every=1"]
    run_script("train_gae_ppo.py", [*args, "train.iterations=2"], outputs=tmp_path / "a")
    run_dir = next((tmp_path / "a" / "runs").iterdir())
    rows = read_metrics(str(run_dir))
    assert [r["iteration"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/env_steps"] == 80 and r["rollout/truncated_fraction"] == 1.0
        assert np.isfinite(r["train/pg_loss"]) and np.isfinite(r["train/value_loss"]) and r["train/value_loss"] > 0
        assert abs(r["train/ppo_kl"]) < 1e-4 and r["train/pg_clipfrac"] == 0.0
        assert r["train/grad_norm"] > 0 and r["train/critic_grad_norm"] > 0 and "train/entropy" not in r
    trained = load_saved_policy(str(run_dir))
    assert trained.stats is not None and trained.horizon == 10 and trained.action_chunk == 5
    start, end = model.state_dict(), trained.core.state_dict()
    assert all(torch.equal(end[k], v.to(end[k].dtype)) for k, v in start.items() if k.startswith("model.vlm."))
    assert any(not torch.equal(end[k], v) for k, v in start.items() if k.startswith("model.dit.layers"))

    out = run_script("train_gae_ppo.py", [*args, "train.iterations=3", "--resume", str(run_dir)],
                     outputs=tmp_path / "a")
    assert "resumed at iteration 2" in out.stdout
    run_script("train_gae_ppo.py", [*args, "train.iterations=3"], outputs=tmp_path / "b")
    straight = read_metrics(str(next((tmp_path / "b" / "runs").iterdir())))
    resumed = read_metrics(str(run_dir))
    timing = ("time/", "charts/SPS")
    assert [r["iteration"] for r in resumed] == [1, 2, 3]
    for a, b in zip(resumed, straight):
        assert {k: v for k, v in a.items() if not k.startswith(timing)} == \
               {k: v for k, v in b.items() if not k.startswith(timing)}


@pytest.mark.real_libero
def test_libero_config_one_iteration_from_a_pi0_folder(tmp_path):
    """configs/gae_ppo_libero_pi0.yaml as shipped (expert-only, bf16 weights, flow-SDE, 5 of the horizon executed,
    value head on the pooled prefix) on the real simulator from a tiny pi0 folder in RLinf's layout: one iteration."""
    row, run_dir = run_on_libero_from_pi0_folder(tmp_path, "train_gae_ppo.py", "configs/gae_ppo_libero_pi0.yaml",
                                                 ["rollout.prompts_per_iteration=2", "train.mini_batch_size=4",
                                                  "train.micro_batch_size=4"])
    assert row["rollout/env_steps"] == 20 and np.isfinite(row["train/pg_loss"]) and np.isfinite(row["train/value_loss"])
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "iter_000001", "modules", "value_head.safetensors"))
