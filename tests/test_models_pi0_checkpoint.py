"""pi0 checkpoints in the openpi / RLinf and LeRobot layouts (tiny PI0 written here in each layout with its
statistics): they load with no missing key and the written weights; pi0.5, LeRobot's legacy layout and a missing
weight stop with one line; the checkpoint's protocol by hand (z-scored state, un-normalised and delta-to-absolute
actions, the first 5 of 50 executed, openpi's prompt); RLinf's flow-SDE step; train_expert_only; bf16 weights; and
openpi's own PyTorch pi0 on a tiny openpi-layout checkpoint (golden numbers, tests/fixtures/tiny_pi0_openpi_golden.md):
prompt tokens, state, image resize, velocity, 10-step sampled actions and the training loss."""
import hashlib
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import PI0ForConditionalGeneration

from models.flow_policy import FlowPolicy, FlowPolicyConfig, flow_sde_step, openpi_resize_with_pad, tiny_pi0_config
from models.pi0_checkpoint import Pi0CheckpointError, Pi0Stats, load_pi0_stats, pi0_layout
from common.checkpoint import load_saved_policy
from models.policy import family_of_folder as policy_type
from models.text_tokenizer import ByteTokenizer
from tests.test_models_token_policy import INSTR, make_obs

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, image_size=32)
STATE_MEAN = [0.1, -0.2, 0.3, 1.0, -1.0, 0.5, 0.02, -0.02]
STATE_STD = [2.0, 0.5, 1.0, 4.0, 0.25, 1.0, 0.01, 0.02]
ACTION_MEAN = [0.05, -0.1, 0.2, 0.0, 0.01, -0.02, -0.3]
ACTION_STD = [0.5, 0.25, 2.0, 0.1, 0.2, 0.4, 0.9]


def tiny_pi0(chunk: int = 50) -> PI0ForConditionalGeneration:
    """A random tiny PI0 with pi0's 32-dim state/action padding and horizon `chunk`."""
    torch.manual_seed(0)
    cfg = tiny_pi0_config(FlowPolicyConfig(**TINY, action_chunk=chunk), ByteTokenizer.vocab_size)
    cfg.max_state_dim = cfg.max_action_dim = 32
    return PI0ForConditionalGeneration(cfg).eval()


def openpi_keys(model, scratch) -> dict:
    """The model's weights under openpi-PyTorch names (as RLinf ships them): transformers' save_pretrained writes
    openpi names; SigLIP's `vision_model.` level and the LM's `lm_head` copy are put back as openpi has them."""
    model.save_pretrained(str(scratch))
    out = {}
    for k, v in load_file(str(scratch / "model.safetensors")).items():
        k = k.replace("paligemma.model.language_model.model.", "paligemma.model.language_model.")
        k = k.replace("paligemma.model.vision_tower.", "paligemma.model.vision_tower.vision_model.")
        out[k] = v.clone()
    out["paligemma_with_expert.paligemma.lm_head.weight"] = \
        out["paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"].clone()
    return out


def write_openpi(path, model, extra=None, drop=()) -> str:
    """RLinf / openpi-PyTorch folder: model.safetensors (+ RLinf's value head), config.json, norm_stats.json."""
    os.makedirs(path / "physical-intelligence" / "libero", exist_ok=True)
    keys = openpi_keys(model, path / "_tf")
    keys["value_head.weight"] = torch.ones(1, 32)  # RLinf PPO extra: ignored
    keys.update(extra or {})
    for k in drop:
        keys.pop(k)
    save_file(keys, str(path / "model.safetensors"))
    model.config.save_pretrained(str(path))
    stats = {"norm_stats": {"state": {"mean": STATE_MEAN + [0.0] * 24, "std": STATE_STD + [1.0] * 24,
                                      "q01": [0.0] * 32, "q99": [1.0] * 32},
                            "actions": {"mean": ACTION_MEAN + [0.0] * 25, "std": ACTION_STD + [1.0] * 25,
                                        "q01": [0.0] * 32, "q99": [1.0] * 32}}}
    (path / "physical-intelligence" / "libero" / "norm_stats.json").write_text(json.dumps(stats))
    return str(path)


def write_lerobot(path, model, legacy=False, relative=False, pi05=False) -> str:
    """LeRobot >= 0.4 folder: "model." + openpi names with the LM embedding only as lm_head, config.json "type":
    "pi0" (lerobot fields + the tiny architecture), and the pre/postprocessor normaliser files (flat keys)."""
    os.makedirs(path, exist_ok=True)
    keys = {}
    for k, v in openpi_keys(model, path / "_tf").items():
        if k.endswith("language_model.embed_tokens.weight"):
            continue
        if legacy:  # before lerobot 0.4: paligemma.language_model.model.*, paligemma.vision_tower.*
            k = k.replace("paligemma.model.language_model.", "paligemma.language_model.model.")
            k = k.replace("paligemma.model.", "paligemma.")
        keys["model." + k] = v
    save_file(keys, str(path / "model.safetensors"))
    tf_cfg = model.config.to_dict()
    cfg = {"type": "pi05" if pi05 else "pi0", "n_obs_steps": 1, "chunk_size": tf_cfg["chunk_size"],
           "n_action_steps": tf_cfg["chunk_size"], "max_state_dim": 32, "max_action_dim": 32,
           "num_inference_steps": 10, "tokenizer_max_length": 48, "use_relative_actions": relative,
           "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
           "vlm_config": tf_cfg["vlm_config"], "dit_config": tf_cfg["dit_config"]}
    (path / "config.json").write_text(json.dumps(cfg))
    stats = {"observation.state.mean": torch.tensor(STATE_MEAN), "observation.state.std": torch.tensor(STATE_STD),
             "action.mean": torch.tensor(ACTION_MEAN), "action.std": torch.tensor(ACTION_STD)}
    save_file(stats, str(path / "policy_preprocessor_step_4_normalizer_processor.safetensors"))
    save_file({k: v for k, v in stats.items() if k.startswith("action.")},
              str(path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors"))
    steps = [{"registry_name": "rename_observations_processor", "config": {}},
             {"registry_name": "normalizer_processor", "config": {"eps": 1e-8},
              "state_file": "policy_preprocessor_step_4_normalizer_processor.safetensors"}]
    (path / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": steps}))
    return str(path)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    ByteTokenizer().save_pretrained(str(path))
    return str(path)


def policy_for(folder, tok_dir, **kw) -> FlowPolicy:
    cfg = dict(pretrained_path=folder, tokenizer_path=tok_dir, image_size=64, action_chunk=5)
    return FlowPolicy(FlowPolicyConfig(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("layout", ["openpi", "lerobot"])
def test_layouts_load_with_the_written_weights_and_statistics(tmp_path, tok_dir, layout):
    model = tiny_pi0()
    folder = (write_openpi if layout == "openpi" else write_lerobot)(tmp_path / layout, model)
    assert pi0_layout(folder) == layout and policy_type(folder) == "flow"
    policy = policy_for(folder, tok_dir)  # load_pi0_model raises on any missing or mis-shaped weight
    loaded = policy.core.state_dict()
    for name, p in model.state_dict().items():
        assert torch.equal(loaded[name], p), name
    assert policy.horizon == 50 and policy.action_chunk == 5 and policy.model_dim == 32
    s = policy.stats
    assert s.source == layout and s.state_mean[:8] == pytest.approx(STATE_MEAN)
    assert s.action_std[:7] == pytest.approx(ACTION_STD)
    assert (s.eps, s.unnorm_eps, s.delta_dims) == ((1e-6, 1e-6, 6) if layout == "openpi" else (1e-8, 0.0, 0))
    # the whole policy saves and reloads with its statistics (a training checkpoint of it)
    policy.save(str(tmp_path / "saved"))
    back = load_saved_policy(str(tmp_path / "saved"))
    assert back.stats == s and back.horizon == 50
    obs, noise = make_obs(2, 64), torch.randn(2, 50, 32)
    torch.testing.assert_close(back.sample(obs, INSTR[:2], num_steps=2, noise=noise).actions,
                               policy.sample(obs, INSTR[:2], num_steps=2, noise=noise).actions)


def test_velocity_equals_pi0s_own_forward_on_the_processed_inputs(tmp_path, tok_dir):
    """The checkpoint's protocol feeds PI0 the z-scored, zero-padded state, the 48-token cleaned prompt and
    32-dim x_t: velocity() equals PI0's forward on those inputs built by hand."""
    model = tiny_pi0()
    policy = policy_for(write_openpi(tmp_path / "o", model), tok_dir)
    obs = make_obs(2, 64)
    instr = ["  pick_up the\nbowl ", "put it in the basket"]
    inputs = policy.model_inputs(obs, instr)
    state = torch.from_numpy(obs["state"])
    want = (state - torch.tensor(STATE_MEAN)) / (torch.tensor(STATE_STD) + 1e-6)
    torch.testing.assert_close(inputs["state"][:, :8], want)
    assert torch.all(inputs["state"][:, 8:] == 0) and inputs["state"].shape == (2, 32)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    n_img = 2 * policy.image_tokens
    text = [257] + list(b"pick up the bowl\n")  # BOS + cleaned text + newline
    assert ids.shape == (2, n_img + 48) and ids[0, n_img:n_img + len(text)].tolist() == text
    assert mask[0, n_img:].tolist() == [1] * len(text) + [0] * (48 - len(text))
    x_t, t = torch.randn(2, 50, 32), torch.tensor([0.3, 0.9])
    inputs.pop("raw_state")
    with torch.no_grad():
        ref = model(noise=x_t, timestep=t, **inputs).logits
        v = policy.velocity(obs, instr, x_t, t)
    torch.testing.assert_close(v, ref, atol=1e-5, rtol=0)


def test_actions_unnormalised_made_absolute_and_first_5_of_50_executed(tmp_path, tok_dir):
    """Hand-computed: env action = x0 * (std + 1e-6) + mean, + state[:6] on the first 6 dims (gripper excluded),
    first 7 of 32 dims, first 5 of 50 steps; normalize_actions inverts it; velocity stubbed so x0 is known."""
    policy = policy_for(write_openpi(tmp_path / "o", tiny_pi0()), tok_dir)
    obs = make_obs(2, 64)
    state = obs["state"]
    target = torch.randn(2, 50, 32)

    def field(o, i, x, t, prefix=None):  # the exact straight-path field to `target`: Euler lands on it
        return (x - target) / torch.as_tensor(t, dtype=torch.float32).reshape(-1, 1, 1)

    policy.velocity = field
    out = policy.sample(obs, INSTR[:2], num_steps=4, noise=torch.randn(2, 50, 32))
    torch.testing.assert_close(out.x0, target, atol=1e-5, rtol=0)
    assert out.actions.shape == (2, 5, 7) and out.actions.dtype == np.float32
    x = target.numpy()
    for b in range(2):
        for step in range(5):
            for d in range(7):
                want = x[b, step, d] * (ACTION_STD[d] + 1e-6) + ACTION_MEAN[d] + (state[b, d] if d < 6 else 0.0)
                assert out.actions[b, step, d] == pytest.approx(want, abs=1e-5)
    # normalize_actions (SFT on demos of the whole horizon) is the inverse of the 7 real dims
    full = policy.stats.to_absolute(policy.stats.unnormalize_actions(target), torch.from_numpy(state))[..., :7]
    back = policy.normalize_actions(full.numpy(), state)
    torch.testing.assert_close(back[..., :7], target[..., :7], atol=1e-4, rtol=0)
    assert torch.all(back[..., 7:] == 0)
    with pytest.raises(ValueError, match="whole horizon"):
        policy.normalize_actions(full[:, :5].numpy(), state)
    # delta_action_dims overrides the checkpoint's convention (0 = absolute actions)
    absolute = policy_for(str(tmp_path / "o"), tok_dir, delta_action_dims=0)
    absolute.velocity = field
    out0 = absolute.sample(obs, INSTR[:2], num_steps=1, noise=torch.randn(2, 50, 32))
    np.testing.assert_allclose(out0.actions[..., :6], out.actions[..., :6] - state[:, None, :6], atol=1e-5)


def test_lerobot_statistics_by_hand(tmp_path):
    """LeRobot: (x - mean) / (std + 1e-8) in, x * std + mean out; relative actions only when the config says so."""
    folder = write_lerobot(tmp_path / "l", tiny_pi0(chunk=4), relative=False)
    s = load_pi0_stats(folder)
    state = torch.tensor([STATE_MEAN]) + torch.tensor([STATE_STD])  # one std above the mean
    torch.testing.assert_close(s.normalize_state(state), torch.tensor([[std / (std + 1e-8) for std in STATE_STD]]))
    x = torch.ones(1, 1, 32)
    a = s.unnormalize_actions(x)
    torch.testing.assert_close(a[0, 0, :7], torch.tensor(ACTION_MEAN) + torch.tensor(ACTION_STD))
    assert torch.all(a[0, 0, 7:] == 1.0)  # padded dims: mean 0, std 1
    assert s.delta_dims == 0
    (tmp_path / "r").mkdir()
    assert load_pi0_stats(write_lerobot(tmp_path / "r", tiny_pi0(chunk=4), relative=True)).delta_dims == 6
    openpi = Pi0Stats([1.0], [3.0], [0.5], [2.0], 1e-6, 1e-6, 1)
    torch.testing.assert_close(openpi.normalize_state(torch.tensor([[4.0, 7.0]])),
                               torch.tensor([[3.0 / (3.0 + 1e-6), 7.0 / (1.0 + 1e-6)]]))
    torch.testing.assert_close(openpi.to_absolute(torch.tensor([[[1.0, 1.0]]]), torch.tensor([[10.0, 20.0]])),
                               torch.tensor([[[11.0, 1.0]]]))


@pytest.mark.parametrize("case", ["legacy", "pi05_keys", "pi05_config", "missing"])
def test_refusals_are_one_line(tmp_path, tok_dir, case):
    model = tiny_pi0(chunk=4)
    if case == "legacy":
        folder, match = write_lerobot(tmp_path / "l", model, legacy=True), "legacy pi0 layout"
    elif case == "pi05_keys":
        ada = {"paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.weight": torch.zeros(96, 32)}
        folder, match = write_openpi(tmp_path / "o", model, extra=ada), "pi0.5 checkpoint"
    elif case == "pi05_config":
        folder, match = write_lerobot(tmp_path / "l", model, pi05=True), "pi0.5 checkpoint"
    else:
        folder = write_openpi(tmp_path / "o", model, drop=["state_proj.weight"])
        match = r"1 missing weights \(e.g. embed_action_time.state_proj.weight\)"
    with pytest.raises(Pi0CheckpointError, match=match) as err:
        policy_for(folder, tok_dir)
    assert "\n" not in str(err.value)


def test_flow_sde_step_by_hand_and_one_noisy_step_per_call(tmp_path, tok_dir):
    x, v = torch.tensor([[[1.0, -2.0]]]), torch.tensor([[[0.5, 1.0]]])
    mean, std = flow_sde_step(x, v, 1.0, 0.25, 0.5, 4)  # sigma = 0.5 sqrt(1 / (1 - 0.75)) = 1
    x0p, x1p = x - v, x  # t = 1
    torch.testing.assert_close(mean, x0p * 0.25 + x1p * (0.75 - 0.125))
    torch.testing.assert_close(std, torch.full_like(x, 0.5))
    mean, std = flow_sde_step(x, v, 0.5, 0.25, 0.5, 4)  # sigma = 0.5 sqrt(0.5 / 0.5) = 0.5
    torch.testing.assert_close(mean, (x - 0.5 * v) * 0.75 + (x + 0.5 * v) * (0.25 - 0.25 * 0.25 / 1.0))
    torch.testing.assert_close(std, torch.full_like(x, 0.25))
    torch.testing.assert_close(flow_sde_step(x, v, 0.5, 0.25, 0.0, 4)[0], x - 0.25 * v)  # sigma 0: Euler
    policy = policy_for(write_openpi(tmp_path / "o", tiny_pi0(chunk=6)), tok_dir, noise_method="flow_sde",
                        action_chunk=2)
    obs, noise = make_obs(2, 64), torch.randn(2, 6, 32)
    ode = policy.sample(obs, INSTR[:2], num_steps=4, noise=noise)
    assert torch.equal(policy.sample(obs, INSTR[:2], num_steps=4, noise=noise).x0, ode.x0)  # deterministic at 0
    calls = []
    real = policy.velocity
    policy.velocity = lambda *a, **k: calls.append(a[2].clone()) or real(*a, **k)
    noisy = policy.sample(obs, INSTR[:2], num_steps=4, noise=noise, noise_level=0.5)
    assert (noisy.x0 - ode.x0).abs().max() > 1e-3
    # exactly one transition left the ODE path: replay the inputs of each velocity call
    ode_steps = [torch.allclose(calls[i + 1], calls[i] - 0.25 * real(obs, INSTR[:2], calls[i], 1 - 0.25 * i),
                                atol=1e-5) for i in range(3)]
    assert sum(ode_steps) >= 2


def test_train_expert_only_and_bf16_weights(tmp_path, tok_dir):
    folder = write_openpi(tmp_path / "o", tiny_pi0(chunk=4))
    policy = policy_for(folder, tok_dir, train_expert_only=True, action_chunk=2)
    trainable = {n for n, p in policy.core.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith(("model.dit.layers", "model.dit.norm", "embed_action_time",
                                           "action_out_proj")) for n in trainable)
    assert any(n.startswith("embed_action_time.state_proj") for n in trainable)
    assert any(n.startswith("model.dit.layers.0.mlp") for n in trainable)
    loss, _ = policy.flow_matching_loss(make_obs(2, 64), INSTR[:2], np.zeros((2, 4, 7), np.float32))
    loss.backward()
    assert policy.core.model.vlm.multi_modal_projector.linear.weight.grad is None
    assert policy.core.model.dit.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
    policy.set_lora_rank(2)  # LoRA stays an option: the VLM's adapters stay frozen too
    assert not any(".vlm." in n for n, p in policy.named_parameters() if p.requires_grad)
    fp32 = policy_for(folder, tok_dir, action_chunk=2)
    bf16 = policy_for(folder, tok_dir, action_chunk=2, bf16_weights=True, train_expert_only=True)
    dtypes = {n: p.dtype for n, p in bf16.core.named_parameters()}
    assert dtypes["model.vlm.vision_tower.embeddings.patch_embedding.weight"] == torch.float32
    assert dtypes["model.vlm.vision_tower.embeddings.position_embedding.weight"] == torch.float32
    assert dtypes["model.vlm.language_model.layers.0.input_layernorm.weight"] == torch.float32
    assert dtypes["model.dit.layers.0.post_attention_layernorm.weight"] == torch.float32
    assert dtypes["model.dit.norm.weight"] == torch.float32
    assert dtypes["model.dit.layers.0.self_attn.q_proj.weight"] == torch.float32  # trained: fp32 master weights
    assert dtypes["action_out_proj.weight"] == torch.float32
    assert dtypes["model.dit.embed_tokens.weight"] == torch.bfloat16  # frozen (unused)
    assert dtypes["model.vlm.vision_tower.encoder.layers.0.layer_norm1.weight"] == torch.float32
    assert dtypes["model.vlm.vision_tower.encoder.layers.0.mlp.fc1.weight"] == torch.bfloat16
    assert dtypes["model.vlm.language_model.layers.0.self_attn.q_proj.weight"] == torch.bfloat16
    assert dtypes["model.vlm.multi_modal_projector.linear.weight"] == torch.bfloat16
    obs, x_t = make_obs(2, 64), torch.randn(2, 4, 32)
    with torch.no_grad():
        v32, v16 = fp32.velocity(obs, INSTR[:2], x_t, 0.5), bf16.velocity(obs, INSTR[:2], x_t, 0.5)
    assert v16.dtype == torch.float32 and (v16 - v32).abs().max() < 0.1 * v32.abs().max()


# ---------------------------------------------------------------- openpi's own numbers (golden)
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
OPENPI_DIR = os.path.join(FIXTURES, "tiny_pi0_openpi")  # openpi's PI0Pytorch, random weights, as openpi saves it
OPENPI_GOLDEN = os.path.join(FIXTURES, "tiny_pi0_openpi_golden.npz")  # how it was made: tiny_pi0_openpi_golden.md


@pytest.fixture(scope="module")
def openpi_case(tok_dir):
    """The golden inputs (row 0: a real LIBERO libero_object render at 256 px, row 1: its mirror image) and our
    policy loaded from the same folder with openpi's LIBERO protocol (256 px in, 10 steps, first 5 of 50 executed)."""
    gold = dict(np.load(OPENPI_GOLDEN))
    policy = FlowPolicy(FlowPolicyConfig(pretrained_path=OPENPI_DIR, tokenizer_path=tok_dir, image_size=256,
                                         action_chunk=5, num_steps=10)).eval()
    obs = {"agentview": np.stack([gold["agentview"], gold["agentview"][:, ::-1]]),
           "wrist": np.stack([gold["wrist"], gold["wrist"][:, ::-1]]), "state": gold["state"]}
    return policy, obs, [str(p) for p in gold["prompts"]], gold


def test_openpi_golden_prompt_state_and_image_resize(openpi_case):
    """openpi's transforms on the same request: the prompt tokens (openpi's PaligemmaTokenizer.tokenize with a
    byte-level stand-in for the SentencePiece model: BOS + text, then the newline encoded on its own; row 0 is cut at
    48 tokens, which drops the newline, row 1 is cleaned to "put the bowl on the plate"), the z-scored state (float64
    in openpi, cast to float32 by PI0), and the 256 -> 224 resize (openpi_client's uint8 PIL resize_with_pad), bit for
    bit."""
    policy, obs, instr, gold = openpi_case
    inputs = policy.model_inputs(obs, instr)
    n_img = 2 * policy.image_tokens
    ids, mask = inputs["input_ids"][:, n_img:].numpy(), inputs["attention_mask"][:, n_img:].numpy().astype(bool)
    assert mask.sum(1).tolist() == [48, 27] and np.array_equal(mask, gold["openpi_token_mask"])
    assert np.array_equal(ids[mask], gold["openpi_tokens"][mask])
    assert ids[1, :27].tolist() == [257] + list(b"put the bowl on the plate\n")
    np.testing.assert_array_equal(inputs["state"].numpy(), gold["openpi_state"].astype(np.float32))
    for v, key in enumerate(("agentview", "wrist")):
        resized = openpi_resize_with_pad(obs[key], 224)
        assert [hashlib.sha256(r.tobytes()).hexdigest() for r in resized] == list(gold["openpi_image_sha256"][:, v])
        pixels = torch.from_numpy(resized).permute(0, 3, 1, 2).float() / 255.0 * 2.0 - 1.0  # openpi's from_dict
        assert torch.equal(inputs["pixel_values"][:, v], pixels)


def test_openpi_golden_velocity_sampled_actions_and_loss(openpi_case):
    """Our PI0 (transformers) equals openpi's PI0Pytorch (float32, CPU) on the same folder: the velocity at fixed
    (x_t, t), the 10-step ODE sample from fixed noise (model space, and the env actions after un-normalising and
    making the first 6 dims absolute), and the flow-matching loss of a demo chunk at fixed (noise, t). Measured on
    the machine that made the goldens: 2.2e-6, 9.5e-7, 2.4e-7, 0 (docs/pi0.md); the bound 1e-5 fails with
    transformers' float32 sinusoid (velocity 2.5e-5), the exact time grid (sample 2.1e-5) or the float resize (8e-4)."""
    policy, obs, instr, gold = openpi_case
    with torch.no_grad():
        v = policy.velocity(obs, instr, torch.from_numpy(gold["x_t"]), torch.from_numpy(gold["t"]))
        out = policy.sample(obs, instr, num_steps=10, noise=torch.from_numpy(gold["noise"]))
        loss, _ = policy.flow_matching_loss(obs, instr, gold["train_actions"], t=torch.from_numpy(gold["train_time"]),
                                            noise=torch.from_numpy(gold["train_noise"]))
    assert np.abs(gold["openpi_velocity"]).max() > 1.0  # the numbers compared are O(1)
    assert np.abs(v.numpy() - gold["openpi_velocity"]).max() < 1e-5
    assert np.abs(out.x0.numpy() - gold["openpi_x0"]).max() < 1e-5
    assert out.actions.shape == (2, 5, 7)
    assert np.abs(out.actions - gold["openpi_actions"][:, :5]).max() < 1e-5
    assert loss.item() == pytest.approx(float(gold["openpi_loss"]), rel=1e-6, abs=0)
