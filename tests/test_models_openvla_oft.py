"""OpenVLA-OFT loaded natively (models/openvla_oft.py): strict loading of the published layout, outputs equal to the
reference implementation on the tiny fixture, the bin <-> action mapping by hand, LoRA / reference / save / load.

The golden numbers (tests/fixtures/tiny_openvla_oft_golden.*) come from running openvla-oft's own modeling and
processing code (transformers fork 4.40.1 with bidirectional SDPA, timm 0.9.10, tokenizers 0.19.1, fp32) on
tests/fixtures/tiny_openvla_oft; see the JSON's "note" for what each array is.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

from models.openvla_oft import (ACTION_TOKEN_BEGIN, BIN_CENTERS, OFTActionTokenizer, OpenVLAOFTConfig,
                                OpenVLAOFTPolicy, pixel_values, unnorm_stats)
from models.saved import PolicyLoadError
from tests.scripts import golden_image

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
TINY = os.path.join(FIXTURES, "tiny_openvla_oft")
GOLDEN = os.path.join(FIXTURES, "tiny_openvla_oft_golden")


@pytest.fixture(scope="module")
def policy():
    torch.manual_seed(0)
    return OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, unnorm_key="libero_10")).eval()


@pytest.fixture(scope="module")
def golden():
    with open(GOLDEN + ".json") as f:
        meta = json.load(f)
    return meta, dict(np.load(GOLDEN + ".npz"))


# ---------------------------------------------------------------- equal to the reference implementation
def test_prompt_ids_and_pixels_match_reference(policy, golden):
    meta, g = golden
    cases = meta["cases"]
    assert policy.prompt_ids([c["instruction"] for c in cases]) == [c["input_ids"] for c in cases]
    assert all(c["input_ids"][0] == 1 and c["input_ids"][-1] == 29871 for c in cases)
    pv = pixel_values(np.stack([golden_image(c["image_seed"], 224) for c in cases])).double()
    np.testing.assert_allclose(pv.sum(dim=(1, 2, 3)).numpy(), g["pixels224_sum"], rtol=1e-6)
    np.testing.assert_allclose(pv.abs().sum(dim=(1, 2, 3)).numpy(), g["pixels224_abs_sum"], rtol=1e-6)
    np.testing.assert_array_equal(pv[:, :, ::8, ::8].float().numpy(), g["pixels224_sub"])
    pv256 = pixel_values(golden_image(7, 256)[None])[0]  # a 256 px render goes through PIL's bicubic resize to 224
    np.testing.assert_allclose(pv256[:, ::8, ::8].numpy(), g["pixels256_sub"], atol=1e-6)


def test_logits_hidden_and_greedy_actions_match_reference(policy, golden):
    """Batched (3 prompts of different lengths, so padding is exercised) fp32 logits of the 256 action ids at the
    56 shifted positions within 1e-4 of the reference's batch-1 runs (RMSNorm eps 1e-5 instead of 1e-6 moves them by
    ~0.5, unrounded pixel constants by ~0.07), the value-head hidden state, and greedy bins -> env actions."""
    meta, g = golden
    cases = meta["cases"]
    images = np.stack([golden_image(c["image_seed"], 224) for c in cases])
    texts = [c["instruction"] for c in cases]
    with torch.no_grad():
        logits, hidden = policy.net(pixel_values(images), policy.prompt_ids(texts))
    assert logits.shape == (3, 56, 256)
    np.testing.assert_allclose(logits.numpy(), g["logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(hidden.numpy(), g["hidden"], atol=1e-4, rtol=0)
    actions, tokens, log_probs = policy.act({"agentview": images}, texts, greedy=True)
    for i, c in enumerate(cases):
        assert tokens[i].tolist() == c["greedy_bins"]
        np.testing.assert_allclose(actions[i], np.array(c["greedy_actions_env"]), atol=1e-6)
    assert np.isin(actions[..., -1], [-1.0, 1.0]).all()


# ---------------------------------------------------------------- strict loading
def _copy_fixture(tmp_path, edit=None):
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    if edit is not None:
        from safetensors.torch import load_file, save_file

        shard = dst / "model-00001-of-00002.safetensors"
        state = load_file(str(shard))
        edit(state)
        save_file(state, str(shard))
        index = json.loads((dst / "model.safetensors.index.json").read_text())
        first = "model-00001-of-00002.safetensors"
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != first}
        index["weight_map"].update({k: first for k in state})
        (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(dst)


def test_missing_weight_is_a_one_line_error(tmp_path):
    path = _copy_fixture(tmp_path, lambda s: s.pop("vision_backbone.featurizer.blocks.0.ls1.scale_factor"))
    with pytest.raises(PolicyLoadError, match="1 weights missing") as e:
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=path))
    assert "\n" not in str(e.value)


def test_unexpected_weight_is_refused_but_documented_unused_ones_are_optional(tmp_path):
    path = _copy_fixture(tmp_path, lambda s: s.update({"action_head.model.fc1.weight": torch.zeros(2, 2)}))
    with pytest.raises(PolicyLoadError, match="unexpected weights"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=path))
    unused = ("vision_backbone.featurizer.blocks.2.", "vision_backbone.featurizer.norm.",
              "vision_backbone.fused_featurizer.attn_pool.", "vision_backbone.fused_featurizer.blocks.2.")
    path2 = _copy_fixture(tmp_path / "b", lambda s: [s.pop(k) for k in list(s) if k.startswith(unused)])
    OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=path2))


def test_bad_folder_errors_name_the_fix(tmp_path):
    with pytest.raises(PolicyLoadError, match="config.json is unreadable"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=str(tmp_path)))
    path = _copy_fixture(tmp_path)
    os.remove(os.path.join(path, "dataset_statistics.json"))
    with pytest.raises(PolicyLoadError, match="dataset_statistics.json is unreadable"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=path))
    path_l1 = _copy_fixture(tmp_path / "l1")
    open(os.path.join(path_l1, "action_head--150000_checkpoint.pt"), "wb").close()
    with pytest.raises(PolicyLoadError, match="L1-regression .* no log-probs for RL"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=path_l1))
    with pytest.raises(ValueError, match="libero_spatial"):
        OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, unnorm_key="libero_spatial"))


# ---------------------------------------------------------------- bins, statistics, gripper by hand
IDENTITY = {"q01": [-1.0] * 7, "q99": [1.0] * 7, "mask": [True] * 6 + [False]}


def test_bin_index_decodes_to_openvla_bin_centres():
    tok = OFTActionTokenizer(IDENTITY)
    # k = id - 31744; discretized = 32000 - id = 256 - k; centre index clip(255 - k, 0, 254); centre_i = -1 + (2i+1)/255
    k = np.array([0, 1, 127, 128, 254, 255])
    np.testing.assert_allclose(tok.normalized(k), [254 / 255, 254 / 255, 2 / 255, 0.0, -252 / 255, -254 / 255],
                               atol=1e-12)
    assert BIN_CENTERS[127] == 0.0 and ACTION_TOKEN_BEGIN == 31744
    with pytest.raises(ValueError):
        tok.normalized(np.array([256]))


def test_encode_digitizes_like_openvla():
    tok = OFTActionTokenizer(IDENTITY)
    # x = 2 (a - q01) / (q99 - q01 + 1e-8) - 1, clipped; d = digitize(x, linspace(-1, 1, 256)); k = 256 - d.
    # a = q99 gives x = 1 - 5e-9 -> d 255 -> k 1 (same centre as k 0); 0 -> d 128 (edges i <= 127.5) -> k 128;
    # -1 -> d 1 -> k 255; 0.5 -> x just under 0.5 -> edges i <= 191.25 -> d 192 -> k 64; beyond +-1 clips.
    # The gripper is not normalised: env -1 (open) -> dataset 1 -> d 256 -> k 0.
    acts = torch.tensor([[1.0, 0.0, -1.0, 2.0, -2.0, 0.5, -1.0], [0.0] * 6 + [1.0]])
    k = tok.encode(acts)
    assert k[0].tolist() == [1, 128, 255, 0, 255, 64, 0]
    assert k[1, -1].item() == 128  # close (+1) -> dataset 0 -> bin of 0
    back = tok.decode(k)
    np.testing.assert_allclose(back[0, :3], [254 / 255, 0.0, -254 / 255], atol=1e-6)
    assert back[0, -1] == -1.0 and back[1, -1] == 1.0  # gripper round trip: open stays open, close stays close


def test_unnormalize_with_q01_q99_and_mask():
    stats = {"q01": [-0.5, 0.0, -2.0, 0, 0, 0, 0.0], "q99": [1.5, 1.0, 2.0, 1, 1, 1, 1.0], "mask": [True] * 6 + [False]}
    tok = OFTActionTokenizer(stats)
    x = np.array([254 / 255, 0.0, -254 / 255, 1.0, -1.0, 0.0, 254 / 255])
    # 0.5 (x + 1)(q99 - q01 + 1e-8) + q01 where mask; the gripper (mask False) passes through unchanged
    want = [0.5 * (x[0] + 1) * (2 + 1e-8) - 0.5, 0.5 * (1 + 1e-8), 0.5 * (x[2] + 1) * (4 + 1e-8) - 2.0,
            1 + 1e-8, 0.0, 0.5 * (1 + 1e-8), 254 / 255]
    np.testing.assert_allclose(tok.unnormalize(x), want, atol=1e-12)


def test_gripper_converted_to_libero_convention():
    tok = OFTActionTokenizer(IDENTITY)
    k = np.zeros((2, 7), np.int64)
    k[0, -1], k[1, -1] = 0, 128  # dataset 0.996 (open) / 0.0 (close)
    a = tok.decode(k)
    assert a[0, -1] == -1.0 and a[1, -1] == 1.0  # sign(2g - 1) then negate: -1 open, +1 close


def test_unnorm_key_lookup_rule():
    stats = {"libero_10_no_noops": {"action": IDENTITY}, "libero_goal": {"action": IDENTITY}}
    assert unnorm_stats(stats, "libero_10")[0] == "libero_10_no_noops"
    assert unnorm_stats(stats, "libero_goal")[0] == "libero_goal"
    with pytest.raises(ValueError, match="set policy.unnorm_key"):
        unnorm_stats(stats, None)
    assert unnorm_stats({"x": {"action": IDENTITY}}, None)[0] == "x"


# ---------------------------------------------------------------- RL interface
def _obs(b=2):
    texts = ["open the drawer", "put the bowl on the plate"][:b]
    return {"agentview": np.stack([golden_image(i, 224) for i in range(b)])}, texts


def test_log_prob_matches_act_at_the_same_temperature(policy):
    obs, texts = _obs()
    torch.manual_seed(1)
    actions, tokens, lp_act, h_act = policy.act(obs, texts, temperature=1.6, return_hidden=True)
    assert actions.shape == (2, 8, 7) and tokens.shape == (2, 56) and 0 <= tokens.min() and tokens.max() < 256
    lp, ent, h = policy.log_prob(obs, texts, tokens, temperature=1.6, return_hidden=True)
    np.testing.assert_allclose(lp.detach().numpy(), lp_act.numpy(), atol=1e-5)
    np.testing.assert_allclose(h.detach().numpy(), h_act.numpy(), atol=1e-5)
    assert (ent > 0).all() and (ent <= np.log(256) + 1e-4).all()
    lp1, _ = policy.log_prob(obs, texts, tokens, temperature=1.0)
    assert not torch.allclose(lp1, lp)  # the temperature is applied
    with pytest.raises(ValueError):
        policy.log_prob(obs, texts, tokens + 256)


def test_lora_reference_gradients_and_save_load(tmp_path):
    torch.manual_seed(0)
    pol = OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, unnorm_key="libero_10", lora_rank=4, lora_alpha=8))
    obs, texts = _obs()
    _, tokens, _ = pol.act(obs, texts, greedy=True)
    base, _ = pol.log_prob(obs, texts, tokens)
    with torch.no_grad():
        for n, p in pol.net.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    moved, _ = pol.log_prob(obs, texts, tokens)
    with pol.reference(), torch.no_grad():
        ref, _ = pol.log_prob(obs, texts, tokens)
    assert (moved - base).abs().max() > 1e-3
    np.testing.assert_allclose(ref.numpy(), base.detach().numpy(), atol=1e-5)
    trainable = {n for n, p in pol.net.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any("dino" in n for n in trainable) and any("projector" in n for n in trainable)
    assert not any("lm_head" in n for n in trainable)
    moved.sum().backward()
    assert all(p.grad is not None for n, p in pol.net.named_parameters() if p.requires_grad and "lora_A" in n)
    pol.save(str(tmp_path / "saved"))
    back = OpenVLAOFTPolicy.load(str(tmp_path / "saved"))
    assert back.cfg.lora_rank == 4 and back.unnorm_key == "libero_10_no_noops"
    again, _ = back.log_prob(obs, texts, tokens)
    np.testing.assert_allclose(again.detach().numpy(), moved.detach().numpy(), atol=1e-5)
    with back.reference(), torch.no_grad():
        np.testing.assert_allclose(back.log_prob(obs, texts, tokens)[0].numpy(), base.detach().numpy(), atol=1e-5)
    merged = OpenVLAOFTPolicy.load(str(tmp_path / "saved"), lora_rank=0)  # fold LoRA in: full fine-tuning
    np.testing.assert_allclose(merged.log_prob(obs, texts, tokens)[0].detach().numpy(),
                               moved.detach().numpy(), atol=1e-4)


def test_sft_loss_and_gradient_checkpointing_give_the_same_gradients():
    obs, texts = _obs()
    acts = torch.tensor(np.random.RandomState(0).uniform(-0.5, 0.5, (2, 8, 7)), dtype=torch.float32)
    acts[..., -1] = torch.tensor([-1.0, 1.0]).repeat(8, 1).T
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(0)
        pol = OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, unnorm_key="libero_10", gradient_checkpointing=ckpt))
        pol.train()
        assert pol.core.language_model.model.layers[0].gradient_checkpointing == ckpt
        assert pol.core.dino.gradient_checkpointing == ckpt
        loss, info = pol.sft_loss(obs, texts, acts)
        loss.backward()
        grads.append(torch.cat([pol.core.dino.blocks[0].mlp.fc1.weight.grad.flatten(),
                                pol.core.language_model.model.layers[0].self_attn.q_proj.weight.grad.flatten()]))
        assert 0 <= info["sft/token_accuracy"] <= 1 and info["sft/loss"] > 0
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------- the reference LIBERO observation pipeline
def test_lanczos_resize_weights():
    from models.openvla_oft import _lanczos3, _lanczos_matrix

    np.testing.assert_allclose(_lanczos_matrix(8, 8), np.eye(8), atol=1e-12)  # same size: sinc zeros at integers
    w = _lanczos_matrix(256, 224)
    np.testing.assert_allclose(w.sum(1), 1.0, atol=1e-12)
    # output pixel 100 samples input position 100.5 * 256/224 = 114.857; kernel widened by 256/224
    centre, ks = 100.5 * 256 / 224, 256 / 224
    taps = np.arange(256) + 0.5 - centre
    raw = np.where(np.abs(taps / ks) < 3, _lanczos3(taps / ks), 0.0)
    np.testing.assert_allclose(w[100], raw / raw.sum(), atol=1e-12)
    assert np.count_nonzero(w[100]) == 7  # radius 3 * 1.143 = 3.43 -> 7 taps
    x = 0.5
    assert abs(_lanczos3(np.array([x]))[0] - 3 * np.sin(np.pi * x) * np.sin(np.pi * x / 3) / (np.pi * x) ** 2) < 1e-12


def test_center_crop_samples_the_central_box():
    from models.openvla_oft import _crop_resize_bilinear

    ramp = np.tile(np.arange(224, dtype=np.float32)[None, :, None], (224, 1, 3))  # value = column index
    out = _crop_resize_bilinear(ramp, 0.9)
    side = np.sqrt(0.9)
    want = (1 - side) / 2 * 223 + np.arange(224) * side  # first to last pixel centre of the box, evenly spaced
    np.testing.assert_allclose(out[0, :, 0], want, atol=1e-4)
    assert abs(out[0, 0, 0] - 0.02566 * 223) < 0.01


def test_libero_image_rotates_and_keeps_flat_colours():
    pytest.importorskip("simplejpeg", reason="libero_image needs simplejpeg (pip install simplejpeg)")
    from models.openvla_oft import libero_image

    flat = np.full((256, 256, 3), 77, np.uint8)
    np.testing.assert_array_equal(libero_image(flat), flat[:224, :224])
    frame = np.zeros((256, 256, 3), np.uint8)
    frame[:128, :128] = 255  # white top-left quadrant -> bottom-right after the 180 degree rotation
    out = libero_image(frame)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8
    assert out[-30:, -30:].min() > 245 and out[:30, :30].max() < 10
    assert out[:30, -30:].max() < 10 and out[-30:, :30].max() < 10


# ---------------------------------------------------------------- two images + proprio from the official layout
L1 = os.path.join(FIXTURES, "tiny_openvla_oft_l1")  # the official OpenVLA-OFT LIBERO checkpoints' published layout
TWO = dict(from_l1_checkpoint=True, num_images=2, use_proprio=True)


def _two_view_obs():
    texts = ["open the drawer", "put the bowl on the plate"]
    state = np.array([[0.05, -0.1, 1.0, 3.0, 0.2, -0.1, 0.03, -0.03], [-0.2, 0.1, 0.9, 2.9, -0.1, 0.0, 0.01, -0.01]],
                     np.float32)
    return {"agentview": np.stack([golden_image(i, 224) for i in (0, 1)]),
            "wrist": np.stack([golden_image(i, 224) for i in (5, 6)]), "state": state}, texts


def test_token_family_reads_two_images_and_proprio_from_the_official_layout():
    """The GAE-PPO reference's start (OpenVLA-OFT-RL start:119-127, vla_oft/min_vla/config.py:11,198,211,233
    @f82c92f): the official checkpoint's layout (action head + proprio projector files) read by the token family with
    from_l1_checkpoint (the head not loaded), agent view then wrist, the projector's token after the patches. Its
    backbone pass equals the L1 family's (golden-tested against openvla-oft's predict_action) exactly; the log-probs
    move with the wrist image and with the state."""
    from models.openvla_oft_l1 import OpenVLAOFTL1Policy

    with pytest.raises(PolicyLoadError, match="L1-regression .* policy.from_l1_checkpoint=true"):
        OpenVLAOFTPolicy.load(L1)  # refused unless asked: its action tokens were never trained
    pol = OpenVLAOFTPolicy.load(L1, **TWO).eval()
    assert pol.reads_wrist_camera() and not hasattr(pol, "action_head") and pol.cfg.proprio_norm == "q99"
    assert pol.proprio_projector.fc1.weight.shape == (32, 8) and pol.proprio_projector.fc1.weight.dtype == torch.float32
    obs, texts = _two_view_obs()
    l1 = OpenVLAOFTL1Policy.load(L1).eval()
    np.testing.assert_array_equal(pol.hidden(obs, texts).detach().numpy(), l1.hidden(obs, texts).detach().numpy())
    _, tokens, lp_act = pol.act(obs, texts, greedy=True)
    lp, _ = pol.log_prob(obs, texts, tokens)
    assert tokens.shape == lp.shape == (2, 56)
    np.testing.assert_allclose(lp.detach().numpy(), lp_act.numpy(), atol=1e-5)
    wrist = pol.log_prob(dict(obs, wrist=obs["wrist"][::-1].copy()), texts, tokens)[0]
    state = pol.log_prob(dict(obs, state=obs["state"] + np.float32(0.05)), texts, tokens)[0]
    assert (wrist - lp).abs().max() > 1e-3 and (state - lp).abs().max() > 1e-3
    one = OpenVLAOFTPolicy.load(L1, from_l1_checkpoint=True).eval()  # agent view only, no proprio
    assert not one.reads_wrist_camera() and one.proprio_projector is None
    assert (one.log_prob({"agentview": obs["agentview"]}, texts, tokens)[0] - lp).abs().max() > 1e-3
    with pytest.raises(ValueError, match="wrist"):
        pol.log_prob({"agentview": obs["agentview"], "state": obs["state"]}, texts, tokens)
    with pytest.raises(ValueError, match="state"):
        pol.log_prob({"agentview": obs["agentview"], "wrist": obs["wrist"]}, texts, tokens)
    with pytest.raises(PolicyLoadError, match="use_proprio=true but .* no proprio_projector"):
        OpenVLAOFTPolicy.load(TINY, use_proprio=True)  # SimpleVLA-RL's layout: no projector


def test_proprio_normalisation_by_hand():
    """q99 (OpenVLA-OFT's): 2 (x - q01) / (q99 - q01) - 1 clipped, the fixture's x bounds -0.25 / 0.15; none (the
    GAE-PPO reference's token path, OpenVLA_PPO.py:775-779,849-853@f82c92f): the raw state reaches the projector."""
    state = np.zeros((2, 8), np.float32)
    state[0, 0], state[1, 0] = -0.05, 0.5
    q99 = OpenVLAOFTPolicy.load(L1, **TWO)
    p = q99.normalize_proprio(state)
    assert abs(p[0, 0]) < 1e-6 and p[1, 0] == 1.0
    raw = OpenVLAOFTPolicy.load(L1, **TWO, proprio_norm="none")
    np.testing.assert_array_equal(raw.normalize_proprio(state), state.astype(np.float64))
    obs, texts = _two_view_obs()
    _, tokens, _ = q99.act(obs, texts, greedy=True)
    assert (raw.log_prob(obs, texts, tokens)[0] - q99.log_prob(obs, texts, tokens)[0]).abs().max() > 1e-3
    with pytest.raises(ValueError, match="proprio_norm"):
        OpenVLAOFTPolicy.load(L1, **TWO, proprio_norm="mean_std")


def test_two_view_policy_trains_its_projector_saves_and_reloads_as_the_token_family(tmp_path):
    """LoRA on the backbone, the projector trained whole (the reference's actor optimizer holds it:
    OpenVLA_PPO.py:316,326@f82c92f); the saved folder holds the projector but no action head, so it is the token
    family's and reloads to the same log-probs; the memory plan counts two images and the proprio token."""
    from models.policy import family_of_folder

    torch.manual_seed(0)
    pol = OpenVLAOFTPolicy.load(L1, **TWO, lora_rank=4)
    trainable = {n for n, p in pol.named_parameters() if p.requires_grad}
    assert {"proprio_projector.fc1.weight", "proprio_projector.fc2.bias"} <= trainable
    assert all("lora_" in n for n in trainable if not n.startswith("proprio_projector."))
    obs, texts = _two_view_obs()
    _, tokens, _ = pol.act(obs, texts, greedy=True)
    pol.log_prob(obs, texts, tokens)[0].sum().backward()
    assert pol.proprio_projector.fc1.weight.grad.abs().max() > 0
    with torch.no_grad():
        pol.proprio_projector.fc2.bias.add_(0.1)
        for n, p in pol.net.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    moved = pol.log_prob(obs, texts, tokens)[0]
    pol.save(str(tmp_path / "saved"))
    files = os.listdir(tmp_path / "saved")
    assert "proprio_projector--150000_checkpoint.pt" in files and not any(f.startswith("action_head") for f in files)
    assert family_of_folder(str(tmp_path / "saved")) == "openvla_oft"
    back = OpenVLAOFTPolicy.load(str(tmp_path / "saved"))
    assert back.cfg.num_images == 2 and back.cfg.use_proprio is True
    np.testing.assert_allclose(back.log_prob(obs, texts, tokens)[0].detach().numpy(), moved.detach().numpy(),
                               atol=1e-5)
    one = OpenVLAOFTPolicy.memory_model(OpenVLAOFTConfig(init_path=L1, from_l1_checkpoint=True), L1)
    two = OpenVLAOFTPolicy.memory_model(OpenVLAOFTConfig(init_path=L1, **TWO), L1)
    patches = 256  # (224 / 14)^2 per image
    assert int(one.notes[0].split()[0]) + patches + 1 == int(two.notes[0].split()[0])


# ---------------------------------------------------------------- the family table
def test_family_table_and_saved_folder_dispatch(tmp_path, policy):
    from models.openvla_oft import OpenVLAOFTPolicy as Cls
    from models.policy import (FAMILIES, FlowActionPolicy, TokenActionPolicy, action_kind, family_of_folder,
                               policy_class)
    from common.checkpoint import load_saved_policy
    from models.token_policy import TokenPolicy, TokenPolicyConfig

    assert set(FAMILIES) == {"token", "flow", "openvla_oft", "openvla_oft_l1"}
    assert policy_class("openvla_oft") is Cls and action_kind("openvla_oft") == "token"
    assert action_kind("flow") == "flow" and policy_class("token") is TokenPolicy
    with pytest.raises(ValueError, match="unknown policy family"):
        policy_class("pi05")
    assert isinstance(policy, TokenActionPolicy) and not isinstance(policy, FlowActionPolicy)
    assert isinstance(TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2)), TokenActionPolicy)
    from models.flow_policy import FlowPolicy, FlowPolicyConfig

    flow = FlowPolicy(FlowPolicyConfig(hidden_size=32, expert_dim=32, num_layers=1, num_heads=2))
    assert isinstance(flow, FlowActionPolicy) and not isinstance(flow, TokenActionPolicy)
    assert family_of_folder(TINY) == "openvla_oft"
    loaded = load_saved_policy(TINY)  # a published folder (sharded, with index) is a policy folder
    assert isinstance(loaded, Cls) and not loaded.training and loaded.unnorm_key == "libero_10_no_noops"
    policy.save(str(tmp_path / "saved"))
    assert family_of_folder(str(tmp_path / "saved")) == "openvla_oft"
    assert isinstance(load_saved_policy(str(tmp_path / "saved")), Cls)


def test_bf16_weights_give_close_logits(policy):
    pol = OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, bf16_weights=True)).eval()
    assert {p.dtype for p in pol.parameters()} == {torch.bfloat16}
    obs, texts = _obs()
    with torch.no_grad():
        lb, hb = pol.net(pixel_values(obs["agentview"]), pol.prompt_ids(texts))
        lf, _ = policy.net(pixel_values(obs["agentview"]), policy.prompt_ids(texts))
    assert lb.dtype == torch.float32 and hb.shape == (2, 32)
    assert (lb - lf).abs().max() < 0.5 and (lb - lf).abs().max() > 0  # bf16 rounding, same model


def _synthetic_frames(n: int) -> np.ndarray:
    """256 px test frames (smooth colour waves, hard-edged boxes, light noise), as the TF golden script made them."""
    rs = np.random.RandomState(0)
    yy, xx = np.mgrid[0:256, 0:256] / 255.0
    frames = []
    for _ in range(n):
        img = np.zeros((256, 256, 3))
        for c in range(3):
            img[..., c] = 0.5 + 0.4 * np.sin(2 * np.pi * (rs.uniform(0.5, 3) * xx + rs.uniform(0.5, 3) * yy +
                                                          rs.uniform()))
        for _ in range(6):
            y0, x0 = rs.randint(0, 220, 2)
            h, w = rs.randint(10, 60, 2)
            img[y0:y0 + h, x0:x0 + w] = rs.uniform(0, 1, 3)
        img += rs.normal(0, 0.02, img.shape)
        frames.append((img.clip(0, 1) * 255).round().astype(np.uint8))
    return np.stack(frames)


def test_libero_image_matches_tensorflow_reference():
    """Golden outputs of the reference's TF code (tf.image.encode_jpeg / decode_image / resize lanczos3 antialias /
    round / crop_and_resize / convert_image_dtype, TF 2.21) on two frames: at most 0.1% of values off, by 1 level."""
    pytest.importorskip("simplejpeg", reason="libero_image needs simplejpeg (pip install simplejpeg)")
    from models.openvla_oft import libero_image

    g = np.load(os.path.join(FIXTURES, "libero_image_tf_golden.npz"))
    for frame, resized, final in zip(_synthetic_frames(2), g["tf_resized"], g["tf_final"]):
        for mine, ref in ((libero_image(frame, center_crop=False), resized), (libero_image(frame), final)):
            d = np.abs(mine.astype(int) - ref.astype(int))
            assert d.max() <= 1 and (d > 0).mean() < 1e-3


def test_published_7b_layout_key_and_parameter_counts():
    """The 7B config on the meta device (no memory): 939 used + 43 documented unused keys = the published 982, and
    7,541,237,184 parameters in the files (spec section 1f)."""
    from models.openvla_oft import OFTCore, key_map

    cfg = {"model_type": "openvla", "use_fused_vision_backbone": True, "image_sizes": [224, 224],
           "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
           "text_config": {"model_type": "llama", "vocab_size": 32064, "pad_token_id": 32000}}
    with torch.device("meta"):
        core = OFTCore(cfg)
    assert core.language_model.config.rms_norm_eps == 1e-6 and core.hidden_size == 4096
    assert len(key_map(core)) == 982 - 43
    used = sum(p.numel() for p in core.parameters())

    def block(d, mlp):  # norms, qkv, proj, fc1, fc2 (+ LayerScale for DINOv2 added below)
        return 4 * d + 3 * d * d + 3 * d + d * d + d + 2 * mlp * d + mlp + d

    d, m = 1152, 4304
    attn_pool = d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + 2 * d + (m * d + m) + (d * m + d)
    unused = block(1024, 4096) + 2 * 1024 + 2 * 1024 + block(d, m) + 2 * d + attn_pool
    assert used + unused == 7_541_237_184


def test_rollout_on_the_embedded_suite_through_the_token_interface():
    """collect_rollouts (as the RL scripts call it) drives the family on tabletop: 64 px renders resized to 224,
    3 chunks of 8 actions, bin tokens and their log-probs at the rollout temperature, hidden states for a value head."""
    from common.config import EnvConfig
    from common.rollout import collect_rollouts
    from envs import make_vector_env

    torch.manual_seed(0)
    pol = OpenVLAOFTPolicy(OpenVLAOFTConfig(init_path=TINY, lora_rank=4)).eval()
    batch = collect_rollouts(make_vector_env(EnvConfig(num_envs=2, max_steps=24)), pol, [0, 0], [0, 1],
                             temperature=1.6, keep_hidden=True, progress=False)
    assert batch.tokens.shape == (2, 3, 56) and batch.actions.shape == (2, 3, 8, 7)
    assert batch.extras["hidden"].shape[-1] == pol.hidden_size
    obs = {k: v[:, 0] for k, v in batch.obs.items()}  # the first call's observations, replayed with gradients
    assert obs["agentview"].shape == (2, 64, 64, 3)
    lp, _ = pol.log_prob(obs, list(batch.instructions), torch.as_tensor(batch.tokens[:, 0]), temperature=1.6)
    np.testing.assert_allclose(lp.detach().numpy(), batch.old_log_probs[:, 0], atol=1e-4)
