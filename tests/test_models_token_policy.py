"""Token policy: sample-then-score consistency, attention mask, LoRA/reference, save/load, pretrained loading through
from_pretrained (tiny models saved offline), input validation, and a short SFT run that needs vision AND language."""
import copy

import numpy as np
import pytest
import torch

from models.action_tokenizer import ActionTokenizer
from models.text_tokenizer import HFTextTokenizer
from models.token_policy import TokenPolicy, TokenPolicyConfig, count_parameters, sample_categorical
from models.vla_backbone import block_attention_mask
from tests.test_models_tokenizers import save_tiny_hf_tokenizer

SMALL = dict(hidden_size=64, num_layers=1, num_heads=2, action_chunk=2, image_size=32)


def make_obs(b: int, size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"agentview": rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8),
            "wrist": rng.integers(0, 256, (b, size, size, 3), dtype=np.uint8),
            "state": rng.normal(size=(b, 8)).astype(np.float32)}


INSTR = ["put the red block on the blue plate", "stack the yellow block on the green block", "open the drawer",
         "put the bowl on the plate"]


def test_block_attention_mask_hand_values():
    valid = torch.tensor([[True, True, False, True, True]])  # one padded prefix key at position 2
    m = block_attention_mask(valid, suffix_len=2)[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 0, 0, 0],
                 [1, 1, 0, 1, 1],  # suffix rows see the whole valid prefix and each other (bidirectional)
                 [1, 1, 0, 1, 1]]


def test_sample_then_score_consistency_default_tiny():
    torch.manual_seed(0)
    policy = TokenPolicy().eval()  # the default tiny preset: 64 px, chunk 8
    obs = make_obs(4, 64)
    for temperature in (1.0, 1.6):
        actions, tokens, logp = policy.act(obs, INSTR, temperature=temperature)
        assert actions.shape == (4, 8, 7) and actions.dtype == np.float32
        assert tokens.shape == (4, 56) and tokens.dtype == torch.long and logp.shape == (4, 56)
        assert np.all(np.abs(actions) <= 1.0) and set(np.unique(actions[..., 6])) <= {-1.0, 1.0}
        np.testing.assert_array_equal(actions, policy.action_tokenizer.decode(tokens.view(4, 8, 7)))
        scored, entropy = policy.log_prob(obs, INSTR, tokens, temperature=temperature)
        torch.testing.assert_close(scored, logp, atol=1e-5, rtol=0)
        assert scored.requires_grad and torch.all(entropy > 0) and torch.all(entropy <= np.log(256) + 1e-4)
    # greedy picks the argmax: its log-prob is the row maximum, and the same obs gives the same tokens
    _, g1, lp1 = policy.act(obs, INSTR, greedy=True)
    _, g2, _ = policy.act(obs, INSTR, greedy=True)
    assert torch.equal(g1, g2) and torch.all(lp1 > np.log(1 / 256))
    # padding invariance: one row alone equals the same row inside a padded batch
    _, _, alone = policy.act({k: v[2:3] for k, v in obs.items()}, INSTR[2:3], greedy=True)
    torch.testing.assert_close(alone[0], lp1[2], atol=1e-5, rtol=0)
    h = policy.hidden(obs, INSTR)
    assert h.shape == (4, policy.hidden_size) == (4, 128)
    torch.testing.assert_close(policy.act(obs, INSTR, greedy=True, return_hidden=True)[3], h)


def test_sample_categorical_matches_probabilities():
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([0.1, 0.2, 0.7])).expand(20000, 3)
    counts = torch.bincount(sample_categorical(logits), minlength=3).float() / 20000
    torch.testing.assert_close(counts, torch.tensor([0.1, 0.2, 0.7]), atol=0.015, rtol=0)


def test_lora_keeps_base_weights_and_reference_is_the_base_model():
    torch.manual_seed(0)
    base = TokenPolicy(TokenPolicyConfig(**SMALL)).eval()
    policy = copy.deepcopy(base)
    policy.set_lora_rank(4)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert all(("lora_" in n) or (".modules_to_save." in n) for n in trainable)
    assert any("action_head.modules_to_save" in n for n in trainable)
    assert not any(".vision." in n for n in trainable) and not any("embed_tokens" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    obs = make_obs(3, 32)
    _, tokens, base_logp = base.act(obs, INSTR[:3], greedy=True)
    torch.testing.assert_close(policy.log_prob(obs, INSTR[:3], tokens)[0], base_logp, atol=0, rtol=0)
    opt = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = -policy.log_prob(obs, INSTR[:3], torch.randint(0, 256, (3, 14)))[0].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for n, p in policy.named_parameters():
        if n in frozen:
            assert torch.equal(p, frozen[n]), n
    moved = policy.log_prob(obs, INSTR[:3], tokens)[0]
    assert (moved - base_logp).abs().max() > 1e-2
    with policy.reference(), torch.no_grad():
        ref = policy.log_prob(obs, INSTR[:3], tokens)[0]
    assert torch.equal(ref, base_logp)  # bit-identical: LoRA and the trainable copies are bypassed
    torch.testing.assert_close(policy.log_prob(obs, INSTR[:3], tokens)[0], moved)  # adapter back on after
    with pytest.raises(ValueError, match="needs LoRA"):
        base.reference()


def test_save_load_identical_outputs(tmp_path):
    torch.manual_seed(0)
    stats = ActionTokenizer(low=[-0.5] * 6 + [-1], high=[0.4] * 6 + [1])
    policy = TokenPolicy(TokenPolicyConfig(**SMALL, lora_rank=4), stats).eval()
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if "lora_B" in n:
                p.normal_()  # make the adapter non-trivial
    obs = make_obs(2, 32)
    _, tokens, logp = policy.act(obs, INSTR[:2])
    policy.save(str(tmp_path))
    back = TokenPolicy.load(str(tmp_path)).eval()
    assert back.cfg == policy.cfg and back.action_tokenizer.state_dict() == stats.state_dict()
    assert torch.equal(back.log_prob(obs, INSTR[:2], tokens)[0], policy.log_prob(obs, INSTR[:2], tokens)[0])
    with back.reference(), policy.reference():
        assert torch.equal(back.log_prob(obs, INSTR[:2], tokens)[0], policy.log_prob(obs, INSTR[:2], tokens)[0])
    merged = TokenPolicy.load(str(tmp_path), lora_rank=0).eval()  # LoRA folded into the base weights
    assert merged.cfg.lora_rank == 0 and count_parameters(merged) < count_parameters(back)
    torch.testing.assert_close(merged.log_prob(obs, INSTR[:2], tokens)[0], logp, atol=1e-4, rtol=0)


@pytest.mark.parametrize("lm_kind", ["llama", "qwen2"])
def test_pretrained_siglip_and_lm_through_from_pretrained(tmp_path, lm_kind):
    from transformers import (LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model, SiglipVisionConfig,
                              SiglipVisionModel)

    torch.manual_seed(0)
    vis = SiglipVisionModel(SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=2, image_size=32, patch_size=16))
    vis.save_pretrained(tmp_path / "siglip")
    lm_kw = dict(vocab_size=10, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=2)
    lm = LlamaModel(LlamaConfig(**lm_kw)) if lm_kind == "llama" else Qwen2Model(Qwen2Config(**lm_kw))
    lm.save_pretrained(tmp_path / "lm")
    save_tiny_hf_tokenizer(str(tmp_path / "lm"))
    cfg = TokenPolicyConfig(image_size=32, action_chunk=2, vision_path=str(tmp_path / "siglip"),
                            backbone_path=str(tmp_path / "lm"))
    policy = TokenPolicy(cfg).eval()
    enc = policy.core.encoder
    assert enc.use_siglip and isinstance(enc.text_tokenizer, HFTextTokenizer)
    assert type(enc.backbone).__name__ == type(lm).__name__ and policy.hidden_size == 32
    torch.testing.assert_close(enc.backbone.layers[0].self_attn.q_proj.weight, lm.layers[0].self_attn.q_proj.weight)
    saved = dict(vis.named_parameters())
    assert len(saved) > 5 and all(torch.equal(p, saved[n]) for n, p in enc.vision.named_parameters())
    obs = make_obs(2, 32)
    _, tokens, logp = policy.act(obs, ["put the red block", "put the block on the blue plate"])
    policy.save(str(tmp_path / "ckpt"))
    back = TokenPolicy.load(str(tmp_path / "ckpt")).eval()  # rebuilt from saved configs + tokenizer, no hub
    assert isinstance(back.core.encoder.text_tokenizer, HFTextTokenizer)
    assert torch.equal(back.log_prob(obs, ["put the red block", "put the block on the blue plate"], tokens)[0],
                       policy.log_prob(obs, ["put the red block", "put the block on the blue plate"], tokens)[0])


def test_bad_inputs_raise_value_errors_naming_shapes():
    policy = TokenPolicy(TokenPolicyConfig(**SMALL)).eval()
    obs = make_obs(2, 32)
    with pytest.raises(ValueError, match=r"shape \(2, 64, 64, 3\); expected \(B, 32, 32, 3\)"):
        policy.act(make_obs(2, 64), INSTR[:2])
    with pytest.raises(ValueError, match="instructions is empty"):
        policy.act(obs, [])
    with pytest.raises(ValueError, match=r"len\(instructions\)=3 but agentview has batch size 2"):
        policy.act(obs, INSTR[:3])
    with pytest.raises(ValueError, match=r"wrist.*batch 1 != agentview batch 2"):
        policy.act({**obs, "wrist": obs["wrist"][:1]}, INSTR[:2])
    with pytest.raises(ValueError, match=r"state'\] has shape \(2, 7\); expected \(2, 8\)"):
        policy.act({**obs, "state": obs["state"][:, :7]}, INSTR[:2])
    with pytest.raises(ValueError, match="must be uint8"):
        policy.act({**obs, "agentview": obs["agentview"].astype(np.float32)}, INSTR[:2])
    with pytest.raises(ValueError, match=r"tokens have shape \(2, 13\); expected \(2, 14\)"):
        policy.log_prob(obs, INSTR[:2], torch.zeros(2, 13, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 256\)"):
        policy.log_prob(obs, INSTR[:2], torch.full((2, 14), 256))
    with pytest.raises(ValueError, match="temperature must be > 0"):
        policy.act(obs, INSTR[:2], temperature=0.0)
    with pytest.raises(ValueError, match=r"actions have shape \(2, 3, 7\); expected \(2, 2, 7\)"):
        policy.sft_loss(obs, INSTR[:2], np.zeros((2, 3, 7), np.float32))
    with pytest.raises(ValueError, match="preset must be one of"):
        TokenPolicy(TokenPolicyConfig(preset="huge"))
    with pytest.raises(ValueError, match="multiple of 16"):
        TokenPolicy(TokenPolicyConfig(image_size=40))


def two_cue_batch(rng: np.random.Generator, b: int, size: int = 32):
    """A bright square in the left or right half of agentview; 'move with' / 'move against' the block.
    Target chunk: dims 0-2 = +-0.5 by the square's side (vision), dims 3-5 = +-0.5 and gripper = +-1 by the verb
    (language). Ignoring vision caps token accuracy at 1 - 3/7 * 0.5 = 0.79, ignoring language at 0.71."""
    img = np.zeros((b, size, size, 3), np.uint8)
    right = rng.integers(0, 2, b)
    with_ = rng.integers(0, 2, b)
    for i in range(b):
        x0 = rng.integers(size // 2, size - 8) if right[i] else rng.integers(0, size // 2 - 8)
        y0 = rng.integers(0, size - 8)
        img[i, y0:y0 + 8, x0:x0 + 8] = 255
    side, verb = np.where(right, 1.0, -1.0), np.where(with_, 1.0, -1.0)
    chunk = np.stack([0.5 * side] * 3 + [0.5 * verb] * 3 + [verb], axis=-1).astype(np.float32)
    obs = {"agentview": img, "wrist": np.zeros_like(img), "state": np.zeros((b, 8), np.float32)}
    return obs, ["move with the block" if w else "move against the block" for w in with_], np.repeat(chunk[:, None],
                                                                                                     2, axis=1)


def test_short_sft_learns_a_task_needing_image_and_instruction():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    policy = TokenPolicy(TokenPolicyConfig(**SMALL))
    opt = torch.optim.AdamW(policy.parameters(), lr=2e-3)
    for _ in range(200):
        loss, metrics = policy.sft_loss(*two_cue_batch(rng, 16))
        opt.zero_grad()
        loss.backward()
        opt.step()
    policy.eval()
    obs, instr, actions = two_cue_batch(np.random.default_rng(1), 64)
    with torch.no_grad():
        _, held_out = policy.sft_loss(obs, instr, actions)
    greedy = policy.act(obs, instr, greedy=True)[0]
    assert held_out["sft/token_accuracy"] > 0.95, held_out
    sign_ok = np.sign(greedy) == np.sign(actions)
    assert sign_ok[..., :3].mean() > 0.95 and sign_ok[..., 3:].mean() > 0.95  # vision and language both used
