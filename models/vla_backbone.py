"""The observation + instruction prefix shared by both policies: vision tower -> projector, state -> token, instruction
-> LM embeddings, all run through a causal LM backbone (`LlamaModel` / `Qwen2Model` from `transformers`).

Presets (the architecture used for random init; a `*_path` loads real weights with `from_pretrained` instead):
  tiny    - 3-conv CNN (16x16 px patches) + a small Llama (hidden_size/num_layers/num_heads fields), byte tokenizer.
  minivla - SigLIP-base/16 vision tower (google/siglip-base-patch16-224) + Qwen2.5-0.5B LM (Qwen/Qwen2.5-0.5B).
Sequence layout: [agentview patches][wrist patches][state][instruction tokens, right-padded][suffix slots].
Position ids count valid tokens only, so outputs do not depend on how much padding a batch has.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from torch import nn
from transformers import (AutoConfig, AutoModel, LlamaConfig, PretrainedConfig, Qwen2Config, SiglipVisionConfig,
                          SiglipVisionModel)

from models.text_tokenizer import load_text_tokenizer

PRESETS = ("tiny", "minivla")
STATE_DIM = 8
Obs = Dict[str, Union[np.ndarray, torch.Tensor]]


def minivla_vision_config() -> SiglipVisionConfig:
    """SigLIP-base/16 at 224 px (the architecture of google/siglip-base-patch16-224), without the pooling head."""
    return SiglipVisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              image_size=224, patch_size=16, vision_use_head=False)


def minivla_lm_config() -> Qwen2Config:
    """The architecture of Qwen/Qwen2.5-0.5B (494M params)."""
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)


def tiny_lm_config(cfg, vocab_size: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size, intermediate_size=2 * cfg.hidden_size,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                       num_key_value_heads=cfg.num_heads, max_position_embeddings=1024, rms_norm_eps=1e-6)


class SmallCNN(nn.Module):
    """(B, 3, H, W) -> (B, (H/16)*(W/16) + 1, out_dim): patch tokens from three strided convs plus learned patch
    positions (as a ViT), and one keypoint token (spatial soft-argmax of the H/8 feature map, as robomimic's
    SpatialSoftmax) that states where things are -- attention alone learns "where" slowly. The fast tiny tower."""

    def __init__(self, out_dim: int, image_size: int, width: int = 32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 4, 4), nn.GELU(), nn.Conv2d(width, 2 * width, 2, 2), nn.GELU())
        self.patch = nn.Conv2d(2 * width, out_dim, 2, 2)
        self.pos = nn.Parameter(torch.randn(1, (image_size // 16) ** 2, out_dim) * 0.5)
        self.keypoints = nn.Linear(4 * width, out_dim)
        grid = torch.linspace(-1.0, 1.0, image_size // 8)
        self.register_buffer("grid_x", grid.repeat(image_size // 8), persistent=False)
        self.register_buffer("grid_y", grid.repeat_interleave(image_size // 8), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.stem(x)  # (B, 2w, H/8, W/8)
        attn = feat.flatten(2).softmax(-1)  # per-channel spatial softmax
        kp = torch.cat([attn @ self.grid_x, attn @ self.grid_y], dim=-1)  # (B, 4w) expected x, y per channel
        tokens = self.patch(feat).flatten(2).transpose(1, 2) + self.pos
        return torch.cat([tokens, self.keypoints(kp).unsqueeze(1)], dim=1)


class Projector(nn.Module):
    """Vision features -> LM width (2-layer MLP, as OpenVLA), plus a learned embedding per camera view."""

    def __init__(self, in_dim: int, dim: int, num_views: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(in_dim, dim), nn.GELU(), nn.Linear(dim, dim))
        self.view = nn.Parameter(torch.randn(num_views, 1, dim) * 0.02)

    def forward(self, feats: torch.Tensor, view: int) -> torch.Tensor:
        return self.mlp(feats) + self.view[view]


class PrefixEncoder(nn.Module):
    """Vision tower + projector + state projection + LM backbone; `cfg` is a TokenPolicyConfig or FlowPolicyConfig."""

    def __init__(self, cfg, lm_config: Optional[PretrainedConfig] = None,
                 vision_config: Optional[SiglipVisionConfig] = None, tokenizer_dir: Optional[str] = None):
        super().__init__()
        if cfg.preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {cfg.preset!r}")
        if cfg.image_size % 16 != 0 or cfg.image_size <= 0:
            raise ValueError(f"image_size must be a positive multiple of 16, got {cfg.image_size}")
        self.image_size, self.use_wrist = cfg.image_size, cfg.use_wrist
        self.text_tokenizer = load_text_tokenizer(tokenizer_dir or cfg.backbone_path, cfg.max_text_len)
        # language backbone: saved config (load) > checkpoint (from_pretrained) > preset config (random init)
        if lm_config is not None:
            self.backbone = AutoModel.from_config(lm_config, attn_implementation="sdpa")
        elif cfg.backbone_path is not None:
            self.backbone = AutoModel.from_pretrained(cfg.backbone_path, attn_implementation="sdpa",
                                                      dtype=torch.float32)
        elif cfg.preset == "minivla":
            self.backbone = AutoModel.from_config(minivla_lm_config(), attn_implementation="sdpa")
        else:
            self.backbone = AutoModel.from_config(tiny_lm_config(cfg, self.text_tokenizer.vocab_size),
                                                  attn_implementation="sdpa")
        if self.backbone.get_input_embeddings().num_embeddings < self.text_tokenizer.vocab_size:
            raise ValueError(f"LM vocab {self.backbone.get_input_embeddings().num_embeddings} is smaller than the "
                             f"tokenizer's {self.text_tokenizer.vocab_size}")
        dim = self.backbone.config.hidden_size
        # vision tower
        self.use_siglip = cfg.preset == "minivla" or cfg.vision_path is not None or vision_config is not None
        if vision_config is not None:
            self.vision = SiglipVisionModel(vision_config)
        elif cfg.vision_path is not None:
            self.vision = SiglipVisionModel.from_pretrained(cfg.vision_path, vision_use_head=False,
                                                            dtype=torch.float32)
        elif self.use_siglip:
            self.vision = SiglipVisionModel(minivla_vision_config())
        else:
            self.vision = SmallCNN(dim, cfg.image_size)
        vdim = self.vision.config.hidden_size if self.use_siglip else dim
        self.projector = Projector(vdim, dim, 2 if cfg.use_wrist else 1)
        self.state_proj = nn.Linear(STATE_DIM, dim)
        self.hidden_size = dim

    @property
    def device(self) -> torch.device:
        return self.state_proj.weight.device

    def embed_prefix(self, obs: Obs, instructions: Optional[Sequence[str]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> prefix embeddings (B, P, D) and key validity (B, P) bool (False = instruction padding)."""
        agent, wrist, state, instructions = check_obs(obs, instructions, self.image_size, self.use_wrist)
        dev = self.device
        views = [agent, wrist] if self.use_wrist else [agent]
        pixels = torch.cat([to_pixels(v, dev) for v in views], dim=0)  # (V*B, 3, H, W) in [-1, 1]
        if self.use_siglip:
            interp = self.image_size != self.vision.config.image_size
            feats = self.vision(pixel_values=pixels, interpolate_pos_encoding=interp).last_hidden_state
        else:
            feats = self.vision(pixels)
        b = agent.shape[0]
        vis = torch.cat([self.projector(f, i) for i, f in enumerate(feats.split(b, dim=0))], dim=1)  # (B, V*N, D)
        st = self.state_proj(torch.as_tensor(state, dtype=torch.float32, device=dev)).unsqueeze(1)
        ids, mask = self.text_tokenizer(instructions)
        txt = self.backbone.get_input_embeddings()(ids.to(dev))
        embeds = torch.cat([vis, st.to(vis.dtype), txt.to(vis.dtype)], dim=1)
        valid = torch.cat([torch.ones(b, vis.shape[1] + 1, dtype=torch.bool, device=dev), mask.to(dev).bool()], 1)
        return embeds, valid

    def run(self, embeds: torch.Tensor, valid: torch.Tensor, suffix_len: int) -> torch.Tensor:
        """LM over (B, L, D) embeddings: causal on the first L - suffix_len tokens, bidirectional inside the suffix,
        the suffix sees the whole (valid) prefix; padded keys are masked. -> last hidden states (B, L, D)."""
        mask = block_attention_mask(valid, suffix_len)
        position_ids = (valid.long().cumsum(1) - 1).clamp(min=0)
        out = self.backbone(inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids, use_cache=False)
        return out.last_hidden_state


def block_attention_mask(valid: torch.Tensor, suffix_len: int) -> torch.Tensor:
    """(B, L) key validity -> (B, 1, L, L) bool mask (True = may attend): prefix causal, suffix block bidirectional."""
    length = valid.shape[1]
    idx = torch.arange(length, device=valid.device)
    causal = idx[None, :] <= idx[:, None]
    in_suffix = idx >= length - suffix_len
    allowed = (causal | (in_suffix[:, None] & in_suffix[None, :]))[None] & valid[:, None, :]
    return allowed[:, None]


def check_obs(obs: Obs, instructions: Optional[Sequence[str]], image_size: int, use_wrist: bool = True):
    """Validate an observation batch -> (agentview, wrist, state, instructions list); ValueError names the shapes."""
    if not isinstance(obs, dict):
        raise ValueError(f"obs must be a dict with agentview/wrist/state, got {type(obs).__name__}")
    if instructions is None:
        instructions = obs.get("instructions")
    if instructions is None or isinstance(instructions, str):
        raise ValueError("instructions must be a list[str] with one string per batch row")
    instructions = list(instructions)
    keys = ["agentview", "state"] + (["wrist"] if use_wrist else [])
    missing = [k for k in keys if k not in obs]
    if missing:
        raise ValueError(f"obs is missing keys {missing}; has {sorted(obs.keys())}")
    agent = obs["agentview"]
    want = (image_size, image_size, 3)
    for k in ["agentview"] + (["wrist"] if use_wrist else []):
        x = obs[k]
        if len(x.shape) != 4 or tuple(x.shape[1:]) != want:
            raise ValueError(f"obs[{k!r}] has shape {tuple(x.shape)}; expected (B, {image_size}, {image_size}, 3) "
                             f"for image_size={image_size}")
        if x.dtype not in (np.uint8, torch.uint8):
            raise ValueError(f"obs[{k!r}] must be uint8, got {x.dtype}")
        if x.shape[0] != agent.shape[0]:
            raise ValueError(f"obs[{k!r}] batch {x.shape[0]} != agentview batch {agent.shape[0]}")
    b = agent.shape[0]
    if b == 0:
        raise ValueError("observation batch is empty (B=0)")
    state = obs["state"]
    if tuple(state.shape) != (b, STATE_DIM):
        raise ValueError(f"obs['state'] has shape {tuple(state.shape)}; expected ({b}, {STATE_DIM})")
    if len(instructions) == 0:
        raise ValueError(f"instructions is empty; need one string per batch row (B={b})")
    if len(instructions) != b:
        raise ValueError(f"len(instructions)={len(instructions)} but agentview has batch size {b}")
    return agent, obs.get("wrist"), state, instructions


def to_pixels(images: Union[np.ndarray, torch.Tensor], device: torch.device) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float (B, 3, H, W) in [-1, 1] (SigLIP's mean 0.5 / std 0.5 normalisation)."""
    x = torch.as_tensor(images).to(device)
    return x.permute(0, 3, 1, 2).float().div_(127.5).sub_(1.0)


def lora_target_regex(use_siglip: bool, lora_vision: bool) -> str:
    """Module-name regex for LoRA: the LM's attention projections (+ the vision tower's if `lora_vision`)."""
    pat = r".*backbone\.layers\.\d+\.self_attn\.(q_proj|k_proj|v_proj|o_proj)"
    if lora_vision:
        vis = r".*vision\..*self_attn\.(q_proj|k_proj|v_proj|out_proj)" if use_siglip else \
            r".*vision\.(stem\.\d+|patch|keypoints)"
        pat = f"({pat})|({vis})"
    return pat


def hf_configs(enc: PrefixEncoder) -> Tuple[dict, Optional[dict]]:
    """The backbone's and (SigLIP) vision tower's configs as dicts, to rebuild the architecture without a download."""
    vis = enc.vision.config.to_dict() if enc.use_siglip else None
    return enc.backbone.config.to_dict(), vis


def configs_from_dicts(lm: dict, vis: Optional[dict]) -> Tuple[PretrainedConfig, Optional[SiglipVisionConfig]]:
    lm_cfg = AutoConfig.for_model(**lm)
    return lm_cfg, (SiglipVisionConfig(**vis) if vis is not None else None)


def autocast(device: torch.device, enabled: bool):
    """bf16 autocast on CUDA when enabled, else a no-op context."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


__all__: List[str] = ["PrefixEncoder", "SmallCNN", "block_attention_mask", "check_obs", "lora_target_regex",
                      "PRESETS"]


# ---------------------------------------------------------------- LoRA and checkpoints (used by both policies)
def wrap_lora(core: nn.Module, cfg, use_siglip: bool, modules_to_save: List[str]) -> nn.Module:
    """peft LoRA (rank cfg.lora_rank) on the LM attention projections; `modules_to_save` stay fully trainable and
    revert to their original copy inside `disable_adapter()`. Everything else is frozen."""
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=lora_target_regex(use_siglip, cfg.lora_vision), modules_to_save=modules_to_save)
    return get_peft_model(core, lcfg)


def unwrap(net: nn.Module) -> nn.Module:
    """The plain model inside a PeftModel (same object, LoRA layers injected), or `net` itself."""
    from peft import PeftModel

    return net.base_model.model if isinstance(net, PeftModel) else net


def merge_lora(net: nn.Module) -> nn.Module:
    """Fold LoRA deltas (and modules_to_save copies) into a plain model; identity when `net` has no LoRA."""
    from peft import PeftModel

    return net.merge_and_unload() if isinstance(net, PeftModel) else net


def reference_context(net: nn.Module):
    """peft's `disable_adapter()` (the frozen pre-LoRA model); ValueError without LoRA (there is no reference)."""
    from peft import PeftModel

    if not isinstance(net, PeftModel):
        raise ValueError("reference() needs LoRA (lora_rank > 0): with full fine-tuning the base weights move, so "
                         "there is no reference inside the policy; keep a frozen copy (copy.deepcopy) instead")
    return net.disable_adapter()


def save_policy_files(path: str, net: nn.Module, cfg, encoder: PrefixEncoder, action_tokenizer) -> None:
    """model.safetensors (all weights, LoRA structure kept), config.json, hf_configs.json, action_stats.json,
    tokenizer/ (the instruction tokenizer)."""
    import dataclasses
    import json
    import os

    from safetensors.torch import save_model

    from models.saved import readable_files

    os.makedirs(path, exist_ok=True)
    save_model(net, os.path.join(path, "model.safetensors"))
    readable_files(path)  # safetensors writes 0600: shared-cluster colleagues must read the weights
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(dataclasses.asdict(cfg), f, indent=2)
    lm, vis = hf_configs(encoder)
    with open(os.path.join(path, "hf_configs.json"), "w") as f:
        json.dump({"lm": lm, "vision": vis}, f, indent=2)
    action_tokenizer.save(os.path.join(path, "action_stats.json"))
    encoder.text_tokenizer.save_pretrained(os.path.join(path, "tokenizer"))


def read_checkpoint(path: str) -> Tuple[dict, PretrainedConfig, Optional[SiglipVisionConfig], str]:
    """-> (config dict, LM config, vision config or None, tokenizer dir) of a saved policy."""
    import json
    import os

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(path, "hf_configs.json")) as f:
        hf = json.load(f)
    lm_cfg, vis_cfg = configs_from_dicts(hf["lm"], hf["vision"])
    return cfg, lm_cfg, vis_cfg, os.path.join(path, "tokenizer")


def load_weights(net: nn.Module, path: str) -> None:
    import os

    from safetensors.torch import load_model

    load_model(net, os.path.join(path, "model.safetensors"), strict=True, device=str(next(net.parameters()).device))


def rebuild_policy(cls, cfg_cls, path: str, lora_rank: Optional[int], device: str):
    """Rebuild a TokenPolicy/FlowPolicy saved with `save_policy_files` (no download), optionally with a new LoRA rank."""
    from models.action_tokenizer import ActionTokenizer

    import os

    from models.saved import check_weights_fit

    cfg_dict, lm_cfg, vis_cfg, tok_dir = read_checkpoint(path)
    tokenizer = ActionTokenizer.load(path)
    check_weights_fit(lambda: cls(cfg_cls(**cfg_dict), tokenizer, _hf=(lm_cfg, vis_cfg, tok_dir)).net,
                      os.path.join(path, "model.safetensors"))  # shapes first: nothing allocated for a bad config
    policy = cls(cfg_cls(**cfg_dict), tokenizer, _hf=(lm_cfg, vis_cfg, tok_dir)).to(device)
    load_weights(policy.net, path)
    if lora_rank is not None and lora_rank != policy.cfg.lora_rank:
        policy.set_lora_rank(lora_rank)
    return policy


def replace_lora(policy: nn.Module, lora_rank: int, modules_to_save: List[str]) -> None:
    """Merge any LoRA of `policy.net` into its base weights, then add fresh LoRA of `lora_rank` (0 = none)."""
    import dataclasses

    core = merge_lora(policy.net)
    core.requires_grad_(True)
    policy.cfg = dataclasses.replace(policy.cfg, lora_rank=lora_rank)
    policy.net = wrap_lora(core, policy.cfg, core.encoder.use_siglip, modules_to_save) if lora_rank > 0 else core
    policy.train(policy.training)  # peft leaves new modules in train mode
