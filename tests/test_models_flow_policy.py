"""Flow policy (a wrapper around transformers' PI0ForConditionalGeneration): exact Euler integration on an analytic
velocity field, a short run trained to a constant action, prefix caching (and agreement with PI0's own sample_actions
and loss), the flow-matching loss by hand, LoRA reference, save/load, loading a pi0 checkpoint through
`pretrained_path`, openpi's time numerics (float64 sinusoid, float32 time grid) and prompt, and input validation."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import PI0ForConditionalGeneration
from transformers.models.pi0.modeling_pi0 import PI0TimestepEmbeddings

from models.action_tokenizer import ActionTokenizer
from models.flow_policy import FlowPolicy, FlowPolicyConfig, OpenpiTimestepEmbeddings, openpi_time_grid, tiny_pi0_config
from models.text_tokenizer import ByteTokenizer
from tests.test_models_token_policy import INSTR, make_obs

SMALL = dict(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, action_chunk=2, image_size=32)


def pi0_inputs(obs, instructions, image_tokens, image_id=259, state_dim=8, views=("agentview", "wrist")):
    """PI0Processor's layout built by hand, independently of FlowPolicy: image tokens per camera, BOS, UTF-8 bytes,
    newline, right padding; pixels in [-1, 1]; state zero-padded."""
    rows = [[257] + list((s + "\n").encode()) for s in instructions]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), 256)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
    n_img = image_tokens * len(views)
    b = len(rows)
    pixels = torch.stack([torch.from_numpy(obs[v]).permute(0, 3, 1, 2).float() / 127.5 - 1 for v in views], 1)
    state = F.pad(torch.from_numpy(obs["state"]), (0, state_dim - 8))
    return dict(input_ids=torch.cat([torch.full((b, n_img), image_id), ids], 1),
                attention_mask=torch.cat([torch.ones(b, n_img, dtype=torch.long), mask], 1), pixel_values=pixels,
                pixel_attention_mask=torch.ones(b, len(views), dtype=torch.bool), state=state)


def test_euler_is_exact_for_the_straight_path_velocity():
    """With v(x, t) = (x - a) / t (the true field when the data is the single chunk a), Euler from t = 1 lands on a
    exactly for any number of steps: x_t - a = t (eps - a) stays on the line."""
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    target = torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 0.9]).expand(3, 2, 7)
    calls = []

    def field(obs, instructions, x, t, prefix=None):
        calls.append(prefix)
        t = torch.as_tensor(t, dtype=torch.float32).expand(3)
        return (x - target) / t[:, None, None]

    policy.velocity = field
    obs, noise = make_obs(3, 32), torch.randn(3, 2, 7)
    one = policy.sample(obs, INSTR[:3], num_steps=1, noise=noise)
    ten = policy.sample(obs, INSTR[:3], num_steps=10, noise=noise)
    torch.testing.assert_close(one.x0, target, atol=1e-6, rtol=0)
    torch.testing.assert_close(ten.x0, target, atol=1e-5, rtol=0)
    assert torch.equal(one.noise, noise)
    np.testing.assert_allclose(one.actions[..., :6], target[..., :6].numpy(), atol=1e-6)  # identity stats
    assert np.all(one.actions[..., 6] == 1.0)  # gripper 0.9 > 0 -> close
    assert len(calls) == 11 and all(p is calls[1] for p in calls[1:])  # one prefix per sample(), reused per step


def test_trained_to_a_constant_action_one_step_matches_ten_steps():
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**{**SMALL, "hidden_size": 64, "expert_dim": 64}))
    chunk = np.array([[0.3, -0.2, 0.1, 0.0, 0.5, -0.4, 1.0]] * 2, np.float32)
    opt = torch.optim.AdamW(policy.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.05, 400)
    for step in range(400):
        loss, metrics = policy.flow_matching_loss(make_obs(16, 32, seed=step), [INSTR[0]] * 16,
                                                  np.repeat(chunk[None], 16, axis=0))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    assert metrics["sft/flow_mse"] < 0.1  # from ~2 (|eps - a|^2 per element) at init
    policy.eval()
    obs, noise = make_obs(8, 32, seed=1000), torch.randn(8, 2, 7)
    one = policy.sample(obs, [INSTR[0]] * 8, num_steps=1, noise=noise)
    ten = policy.sample(obs, [INSTR[0]] * 8, num_steps=10, noise=noise)
    # v(x, 1) must be x - a (identity minus a constant): one step is as good as ten once that is learned.
    # Measured (seeds 0/1/2): last-batch mse 0.006-0.06, mean |error| 0.09-0.12 (1 step), 0.02-0.04 (10 steps), 1 vs
    # 10 steps 0.07-0.11, from ~0.8 for pure noise.
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
    # ... and PI0's own sample_actions (max_action_dim = 7 in the tiny config: no padding) gives the same chunk
    ref = policy.core.sample_actions(noise=noise, num_steps=5, **pi0_inputs(obs, INSTR, policy.image_tokens))
    torch.testing.assert_close(cached.x0, ref, atol=1e-5, rtol=0)
    prefix = policy.prefix(obs, INSTR)
    length = prefix.past_key_values.get_seq_length()
    x_t, t = torch.randn(4, 2, 7), torch.tensor([0.1, 0.5, 0.9, 1.0])
    v1 = policy.velocity(obs, INSTR, x_t, t)
    v2 = policy.velocity(None, None, x_t, t, prefix=prefix)
    v3 = policy.velocity(None, None, x_t, t, prefix=prefix)
    assert prefix.past_key_values.get_seq_length() == length  # velocity never grows the cached prefix
    torch.testing.assert_close(v1, v2)
    assert torch.equal(v2, v3)
    assert v1.shape == (4, 2, 7) and v1.requires_grad
    torch.testing.assert_close(policy.velocity(None, None, x_t, 0.5, prefix), policy.velocity(
        None, None, x_t, torch.full((4,), 0.5), prefix))
    # instruction padding does not change a row's velocity (row 2 alone vs batched with longer instructions)
    alone = policy.velocity({k: v[2:3] for k, v in obs.items()}, INSTR[2:3], x_t[2:3], t[2:3])
    torch.testing.assert_close(alone, v1[2:3], atol=1e-5, rtol=0)
    # gradients reach the prefix through the cache (a FlowSAR step may train the whole model)
    policy.velocity(None, None, x_t, t, policy.prefix(obs, INSTR)).sum().backward()
    assert policy.core.model.vlm.multi_modal_projector.linear.weight.grad.abs().sum() > 0


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
    # PI0's own training loss (actions given as labels) is the same number
    ref = policy.core(actions=a, noise=eps, timestep=t, **pi0_inputs(obs, INSTR[:2], policy.image_tokens)).loss
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=1e-5)
    # default times follow pi0's Beta(1.5, 1) scaled to [0.001, 1]
    times = policy.sample_time(4000)
    assert times.min() >= 0.001 and times.max() <= 1.0 and abs(times.mean().item() - (0.999 * 0.6 + 0.001)) < 0.02


def test_time_embedding_and_time_grid_are_openpis():
    """openpi's pi0_pytorch.py: the time sinusoid in float64 (periods 4e-3 * 1000^f, f = linspace(0, 1, D / 2), angle
    2 pi / period * t, [sin, cos]) cast to float32; the sampler's times t = 1, t += float32(-1 / N) in float32 while
    t >= -dt / 2. Both by hand in numpy; transformers' float32 sinusoid is ~1e-4 off (angles up to 1571 t)."""
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()  # expert_dim 32: 16 frequencies
    module = policy.core.embed_action_time.sinusoid_embeds
    assert isinstance(module, OpenpiTimestepEmbeddings)
    t = np.float32([0.6999999, 0.123456, 1.0])
    frac = np.linspace(0.0, 1.0, 16)
    angle = (1.0 / (4e-3 * (4.0 / 4e-3) ** frac) * 2 * np.pi)[None] * t.astype(np.float64)[:, None]
    want = np.concatenate([np.sin(angle), np.cos(angle)], 1).astype(np.float32)
    got = module(torch.from_numpy(t))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, atol=1e-7, rtol=0)
    float32_module = PI0TimestepEmbeddings(policy.pi0_config)
    assert np.abs(float32_module(torch.from_numpy(t)).numpy() - want).max() > 1e-5
    # the grid, by hand: float32 accumulation of -0.1 drifts below 1 - i / 10; N = 4 is exact
    assert openpi_time_grid(10) == [float(np.float32(x)) for x in (1.0, 0.9, 0.79999995, 0.6999999, 0.5999999,
                                                                   0.4999999, 0.39999992, 0.29999992, 0.19999993,
                                                                   0.09999993)]
    assert openpi_time_grid(4) == [1.0, 0.75, 0.5, 0.25]
    assert all(len(openpi_time_grid(n)) == n for n in range(1, 301))
    # sample() asks for the velocity exactly at those times and steps x - v / N
    seen = []

    def field(obs, instructions, x, t, prefix=None):
        seen.append(torch.as_tensor(t, dtype=torch.float32).item())
        return torch.ones_like(x)

    real = policy.velocity
    policy.velocity = field
    out = policy.sample(make_obs(1, 32), INSTR[:1], num_steps=10, noise=torch.zeros(1, 2, 7))
    assert seen == openpi_time_grid(10)
    torch.testing.assert_close(out.x0, torch.full((1, 2, 7), -10 * np.float32(0.1)), atol=1e-6, rtol=0)
    # the float64 module survives LoRA (peft copies the time embedding into modules_to_save) and save / load
    policy.velocity = real
    policy.set_lora_rank(2)
    kinds = {type(m) for m in policy.net.modules() if isinstance(m, PI0TimestepEmbeddings)}
    assert kinds == {OpenpiTimestepEmbeddings}


def test_prompt_is_bos_text_then_the_newline_on_its_own():
    """openpi's prompt: BOS + encode(text) + encode("\\n"), cut to max_text_len, padded with 0. One encode of
    text + "\\n" (PI0Processor's) differs where the tokenizer merges across the newline (here "l\\n" -> 300); with
    the byte tokenizer of the tests the two are the same ids."""
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    text = ["pick up the bowl", "x" * 60]
    ids, mask = policy._prompt_tokens(text)
    one_call, one_mask = ByteTokenizer(48)([s + "\n" for s in text])
    assert ids[0, :18].tolist() == [257] + list(b"pick up the bowl\n") and mask[0].tolist() == [1] * 18 + [0] * 30
    assert ids[1].tolist() == [257] + [ord("x")] * 47  # BOS + 47 bytes: the newline is cut, as openpi's
    assert torch.equal(ids[mask.bool()], one_call[one_mask.bool()]) and torch.equal(mask, one_mask)

    class Merging(ByteTokenizer):
        """Bytes, but "l" followed by a newline is one token (300)."""

        def __call__(self, texts):
            rows = []
            for t in texts:
                row = [self.bos_token_id]
                for x in t.encode():
                    if x == 10 and row[-1] == 108:
                        row[-1] = 300
                    else:
                        row.append(x)
                rows.append(row)
            width = max(map(len, rows))
            ids = torch.tensor([r + [self.pad_token_id] * (width - len(r)) for r in rows])
            return ids, torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])

    merging = Merging(48)
    assert merging(["bowl\n"])[0].tolist() == [[257, 98, 111, 119, 300]]  # one call merges
    policy.text_tokenizer = merging
    ids, mask = policy._prompt_tokens(["bowl"], pad_to=8)
    assert ids.tolist() == [[257, 98, 111, 119, 108, 10, 0, 0]] and mask.tolist() == [[1] * 6 + [0, 0]]


def test_lora_reference_and_save_load(tmp_path):
    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    obs, noise = make_obs(2, 32), torch.randn(2, 2, 7)
    base = policy.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0
    policy.set_lora_rank(4)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert all(("lora_" in n) or (".modules_to_save." in n) for n in trainable)
    assert any("action_out_proj.modules_to_save" in n for n in trainable)
    assert any(".dit.layers.0.mlp.up_proj.lora_A" in n for n in trainable)
    assert any(".language_model.layers.0.self_attn.q_proj.lora_A" in n for n in trainable)
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
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["policy_type"] == "flow" and (tmp_path / "model.safetensors").is_file()
    back = FlowPolicy.load(str(tmp_path)).eval()
    assert back.cfg == policy.cfg
    assert torch.equal(back.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, moved)
    with back.reference():
        assert torch.equal(back.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, base)
    merged = FlowPolicy.load(str(tmp_path), lora_rank=0).eval()  # LoRA folded into the weights
    assert merged.cfg.lora_rank == 0
    torch.testing.assert_close(merged.sample(obs, INSTR[:2], num_steps=3, noise=noise).x0, moved, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="needs LoRA"):
        merged.reference()


def test_loads_a_pi0_checkpoint_through_pretrained_path(tmp_path):
    """A random tiny PI0ForConditionalGeneration saved with save_pretrained (+ its tokenizer) and loaded through
    FlowPolicyConfig(pretrained_path=...) -- the LIBERO code path -- gives the saved model's outputs; its 32-dim
    state/action padding (pi0's) is applied."""
    torch.manual_seed(0)
    pi0_cfg = tiny_pi0_config(FlowPolicyConfig(**SMALL), ByteTokenizer.vocab_size)
    pi0_cfg.max_state_dim = pi0_cfg.max_action_dim = 32
    model = PI0ForConditionalGeneration(pi0_cfg).eval()
    model.save_pretrained(str(tmp_path))
    ByteTokenizer().save_pretrained(str(tmp_path))
    policy = FlowPolicy(FlowPolicyConfig(pretrained_path=str(tmp_path), action_chunk=2, image_size=32)).eval()
    assert policy.pi0_config.max_action_dim == 32 and policy.core.action_out_proj.out_features == 32
    for name, p in model.state_dict().items():
        assert torch.equal(policy.core.state_dict()[name], p), name
    obs, x_t, t = make_obs(3, 32), torch.randn(3, 2, 7), torch.tensor([0.2, 0.6, 1.0])
    inputs = pi0_inputs(obs, INSTR[:3], policy.image_tokens, state_dim=32)
    with torch.no_grad():
        ref = model(noise=F.pad(x_t, (0, 25)), timestep=t, **inputs).logits  # padded action dims are 0
        v = policy.velocity(obs, INSTR[:3], x_t, t)
        one = policy.sample(obs, INSTR[:3], num_steps=1, noise=x_t)
        ref_one = model.sample_actions(noise=F.pad(x_t, (0, 25)), num_steps=1, **inputs)
    torch.testing.assert_close(v, ref[..., :7], atol=1e-5, rtol=0)
    torch.testing.assert_close(one.x0, ref_one[..., :7], atol=1e-5, rtol=0)
    # 64-px cameras are resized to the checkpoint's 32-px SigLIP input (as PI0Processor resizes to 224)
    big = {k: v.repeat(2, 1).repeat(2, 2) if k != "state" else v for k, v in obs.items()}
    wide = FlowPolicy(FlowPolicyConfig(pretrained_path=str(tmp_path), action_chunk=2, image_size=64)).eval()
    with torch.no_grad():
        torch.testing.assert_close(wide.velocity(big, INSTR[:3], x_t, t), v, atol=0.05, rtol=0)
    policy.save(str(tmp_path / "policy"))  # a policy built from a checkpoint reloads without it
    back = FlowPolicy.load(str(tmp_path / "policy")).eval()
    assert torch.equal(back.sample(obs, INSTR[:3], num_steps=1, noise=x_t).x0, one.x0)


def test_bad_inputs():
    policy = FlowPolicy(FlowPolicyConfig(**SMALL)).eval()
    obs = make_obs(2, 32)
    with pytest.raises(ValueError, match=r"x_t has shape \(2, 3, 7\); expected \(2, 2, 7\)"):
        policy.velocity(obs, INSTR[:2], torch.zeros(2, 3, 7), 0.5)
    with pytest.raises(ValueError, match=r"t has shape \(3,\); expected a float or \(2,\)"):
        policy.velocity(obs, INSTR[:2], torch.zeros(2, 2, 7), torch.ones(3))
    with pytest.raises(ValueError, match="num_steps >= 1"):
        policy.sample(obs, INSTR[:2], num_steps=0)
    with pytest.raises(ValueError, match=r"noise has shape \(2, 2, 6\); expected \(2, 2, 7\)"):
        policy.sample(obs, INSTR[:2], noise=torch.zeros(2, 2, 6))
    with pytest.raises(ValueError, match=r"len\(instructions\)=1 but agentview has batch size 2"):
        policy.sample(obs, INSTR[:1])
    with pytest.raises(ValueError, match=r"obs\['agentview'\] has shape \(2, 32, 32, 3\); expected \(B, 64, 64, 3\)"):
        FlowPolicy(FlowPolicyConfig(**{**SMALL, "image_size": 64})).sample(obs, INSTR[:2])
    with pytest.raises(ValueError, match=r"actions have shape \(2, 8, 7\); expected \(2, 2, 7\)"):
        policy.flow_matching_loss(obs, INSTR[:2], np.zeros((2, 8, 7), np.float32))
    with pytest.raises(ValueError, match="time_sampling"):
        FlowPolicy(FlowPolicyConfig(**SMALL, time_sampling="logit"))
    with pytest.raises(ValueError, match="expert_layers=2 but PI0's action expert must match the LM"):
        FlowPolicy(FlowPolicyConfig(**SMALL, expert_layers=2))
    with pytest.raises(ValueError, match="no instruction tokenizer at .*; set tokenizer_path"):
        FlowPolicy(FlowPolicyConfig(pretrained_path="/nonexistent/pi0_checkpoint"))
    with pytest.raises(ValueError, match="preset"):
        FlowPolicy(FlowPolicyConfig(**{**SMALL, "preset": "minivla"}))
