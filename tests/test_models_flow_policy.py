"""Flow policy: exact Euler integration on an analytic velocity field, a short run trained to a constant action,
prefix caching, the flow-matching loss by hand, LoRA reference, save/load and input validation."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models.action_tokenizer import ActionTokenizer
from models.flow_policy import FlowPolicy, FlowPolicyConfig, time_embedding
from tests.test_models_token_policy import INSTR, make_obs

SMALL = dict(hidden_size=64, num_layers=1, num_heads=2, action_chunk=2, image_size=32, expert_dim=64,
             expert_layers=1, expert_heads=2)


def test_euler_is_exact_for_the_straight_path_velocity():
    """With v(x, t) = (x - a) / t (the true field when the data is the single chunk a), Euler from t = 1 lands on a
    exactly for any number of steps: x_t - a = t (eps - a) stays on the line."""
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    target = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.9]).expand(3, 2, 7)
    policy.core.expert.forward = lambda x, t, prefix: (x - target) / t[:, None, None]
    obs, noise = make_obs(3, 32), torch.randn(3, 2, 7)
    one = policy.sample(obs, INSTR[:3], num_steps=1, noise=noise)
    ten = policy.sample(obs, INSTR[:3], num_steps=10, noise=noise)
    torch.testing.assert_close(one.x0, target, atol=1e-6, rtol=0)
    torch.testing.assert_close(ten.x0, target, atol=1e-5, rtol=0)
    assert torch.equal(one.noise, noise)
    np.testing.assert_allclose(one.actions[..., :6], target[..., :6].numpy(), atol=1e-6)  # identity stats
    assert np.all(one.actions[..., 6] == 1.0)  # gripper 0.9 > 0 -> close


def test_trained_to_a_constant_action_one_step_matches_ten_steps():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL))
    chunk = np.array([[0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 1.0]] * 2, np.float32)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    for step in range(300):
        loss, metrics = policy.flow_matching_loss(make_obs(16, 32, seed=step), [INSTR[0]] * 16,
                                                  np.repeat(chunk[None], 16, axis=0))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert metrics["sft/flow_mse"] < 0.1  # from ~2 (|eps - a|^2 per element) at init
    policy.eval()
    obs, noise = make_obs(8, 32, seed=1000), torch.randn(8, 2, 7)
    one = policy.sample(obs, [INSTR[0]] * 8, num_steps=1, noise=noise)
    ten = policy.sample(obs, [INSTR[0]] * 8, num_steps=10, noise=noise)
    # v(x, 1) must be x - a (identity minus a constant): one step is as good as ten once that is learned.
    # Measured after 300 steps: mean |error| ~0.09 (1 step) and ~0.03 (10 steps), from ~0.8 for pure noise.
    assert (one.x0 - torch.from_numpy(chunk)).abs().mean() < 0.15
    assert (ten.x0 - torch.from_numpy(chunk)).abs().mean() < 0.1
    assert (one.x0 - ten.x0).abs().mean() < 0.15
    assert np.all(one.actions[..., 6] == 1.0) and np.all(ten.actions[..., 6] == 1.0)
    # injected noise explores: different chunks, same noise_level 0 -> identical (deterministic ODE)
    noisy = policy.sample(obs, [INSTR[0]] * 8, num_steps=10, noise=noise, noise_level=0.5)
    assert (noisy.x0 - ten.x0).abs().max() > 1e-3
    assert torch.equal(policy.sample(obs, [INSTR[0]] * 8, num_steps=10, noise=noise).x0, ten.x0)


def test_prefix_cache_gives_the_same_samples_and_velocities():
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    obs, noise = make_obs(4, 32), torch.randn(4, 2, 7)
    cached = policy.sample(obs, INSTR, num_steps=5, noise=noise)
    fresh = policy.sample(obs, INSTR, num_steps=5, noise=noise, reuse_prefix=False)
    torch.testing.assert_close(cached.x0, fresh.x0, atol=1e-6, rtol=0)
    prefix = policy.prefix(obs, INSTR)
    x_t, t = torch.randn(4, 2, 7), torch.tensor([0.1, 0.5, 0.9, 1.0])
    v1 = policy.velocity(obs, INSTR, x_t, t)
    v2 = policy.velocity(None, None, x_t, t, prefix=prefix)
    torch.testing.assert_close(v1, v2)
    assert v1.shape == (4, 2, 7) and v1.requires_grad
    torch.testing.assert_close(policy.velocity(None, None, x_t, 0.5, prefix), policy.velocity(
        None, None, x_t, torch.full((4,), 0.5), prefix))


def test_flow_matching_loss_by_hand():
    torch.manual_seed(0)
    stats = ActionTokenizer(low=[-0.5] * 6 + [-1], high=[0.5] * 6 + [1])
    policy = FlowPolicy(FlowPolicyConfig(**SMALL), stats).eval()
    obs = make_obs(2, 32)
    actions = np.array([[[0.25, -0.5, 0.0, 0.5, 0.1, -0.1, 1.0]] * 2] * 2, np.float32)
    a = torch.tensor([[[0.5, -1.0, 0.0, 1.0, 0.2, -0.2, 1.0]] * 2] * 2)  # normalised by hand: 2 (x + .5) - 1
    torch.testing.assert_close(policy.normalize_actions(actions), a)
    eps, t = torch.randn(2, 2, 7), torch.tensor([0.25, 0.75])
    loss, metrics = policy.flow_matching_loss(obs, INSTR[:2], actions, t=t, noise=eps)
    x_t = 0.75 * a[:1] + 0.25 * eps[:1], 0.25 * a[1:] + 0.75 * eps[1:]
    v = policy.velocity(obs, INSTR[:2], torch.cat(x_t), t)
    torch.testing.assert_close(loss, F.mse_loss(v, eps - a))
    assert metrics["sft/flow_mse"] == pytest.approx(loss.item())


def test_time_embedding_values():
    emb = time_embedding(torch.tensor([0.0, 1.0]), 8)
    assert emb.shape == (2, 8)
    torch.testing.assert_close(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))
    # the longest period is 4: sin(2 pi * 1 / 4) = 1
    assert emb[1, 3].item() == pytest.approx(1.0, abs=1e-6)


def test_lora_reference_and_save_load(tmp_path):
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    obs, noise = make_obs(2, 32), torch.randn(2, 2, 7)
    base = policy.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0
    policy.set_lora_rank(4)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert all(("lora_" in n) or (".modules_to_save." in n) for n in trainable)
    assert any("expert.modules_to_save" in n for n in trainable)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss, _ = policy.flow_matching_loss(obs, INSTR[:2], np.zeros((2, 2, 7), np.float32))
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = policy.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0
    assert (moved - base).abs().max() > 1e-3
    with policy.reference():
        assert torch.equal(policy.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, base)
    policy.save(str(tmp_path))
    back = FlowPolicy.load(str(tmp_path)).eval()
    assert back.cfg == policy.cfg
    assert torch.equal(back.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, moved)
    with back.reference():
        assert torch.equal(back.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, base)


def test_bad_inputs():
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    obs = make_obs(2, 32)
    with pytest.raises(ValueError, match=r"x_t has shape \(2, 3, 7\); expected \(2, 2, 7\)"):
        policy.velocity(obs, INSTR[:2], torch.zeros(2, 3, 7), 0.5)
    with pytest.raises(ValueError, match=r"t has shape \(3,\); expected a float or \(2,\)"):
        policy.velocity(obs, INSTR[:2], torch.zeros(2, 2, 7), torch.ones(3))
    with pytest.raises(ValueError, match="num_steps >= 1"):
        policy.sample(obs, INSTR[:2], num_steps=0)
    with pytest.raises(ValueError, match=r"len\(instructions\)=1 but agentview has batch size 2"):
        policy.sample(obs, INSTR[:1])
    with pytest.raises(ValueError, match=r"actions have shape \(2, 8, 7\); expected \(2, 2, 7\)"):
        policy.flow_matching_loss(obs, INSTR[:2], np.zeros((2, 8, 7), np.float32))
    with pytest.raises(ValueError, match="time_sampling"):
        FlowPolicy(FlowPolicyConfig(**SMALL, time_sampling="logit"))
