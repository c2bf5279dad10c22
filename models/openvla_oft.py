"""OpenVLA-OFT (the discrete parallel-decoding variant the RL papers start from), loaded natively from a published
Hugging Face folder: no remote code, no `trust_remote_code`. Facts and sources: ../shared/specs/openvla_oft.md.

Folder layout (as published): config.json (`model_type: openvla`), model.safetensors.index.json + shards (or one
model.safetensors), dataset_statistics.json, tokenizer.json (+ tokenizer_config.json ...). Loading is strict: every
key the forward pass uses must be there, and the only extra keys allowed are the documented unused ones (each
tower's last block and final norm, SigLIP's attention-pool head).

Model: DINOv2 (registers, LayerScale) and SigLIP ViTs, each cut after its second-to-last block with the prefix tokens
dropped, features concatenated per patch -> 3-layer GELU projector -> a stock transformers Llama that sees
[BOS][patches][prompt ... "_"][56 zero-embedding action slots][</s>] with full bidirectional attention (only padding
keys masked). The logits of vocabulary ids 31744..31999 read one position early (the last prompt token predicts the
first action) give a 256-way categorical per action dimension, 8 steps x 7 dims per call. The ViT blocks are
transformers' Dinov2WithRegisters / Siglip layers (timm's blocks compute the same function; the published key names
are timm's and are mapped here), because timm cannot be imported next to a CPU-only torch (it imports torchvision).

Inputs: the agent view (policy.num_images 1, the SimpleVLA-RL / siiRL checkpoints) or agent view then wrist (2, the
official OpenVLA-OFT LIBERO checkpoints), and with policy.use_proprio the 8-d state as one token after the patches
through the folder's proprio_projector--*.pt (normalised with its q01/q99, or raw: policy.proprio_norm). An
L1-regression folder (action_head--*.pt, models/openvla_oft_l1.py) is refused unless policy.from_l1_checkpoint: then
its LM's action-token logits are the policy and the head is not loaded (the GAE-PPO reference's start).

Token ids in this module's API (act / log_prob tokens) are bin indices k = vocab id - 31744 in [0, 256), as the RL
papers' 256-way categorical. Actions leave `act` in LIBERO's convention: un-normalised with the checkpoint's own
q01/q99 statistics where `mask` is set, gripper converted from the dataset's 1 = open / 0 = close to -1 = open /
+1 = close.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.action_tokenizer import ACTION_DIM
from models.configs import OFT_ACTION_CHUNK as ACTION_CHUNK, OFT_IMAGE_SIZE as IMAGE_SIZE, OpenVLAOFTConfig
from base.config_fields import ConfigError
from models.memory import Model, Stack, tuned
from models.policy import PolicyFamily, read_config_json
from models.saved import PROPRIO, PolicyLoadError, component_files, is_l1_folder, no_rl_message

N_BINS = 256
PROPRIO_DIM = 8  # LIBERO's state as OpenVLA-OFT reads it: eef xyz, eef axis-angle, 2 finger positions
LIBERO_RENDER_SIZE = 256  # the reference's LIBERO camera renders (the libero image pipeline crops/resizes to 224)
ACTION_TOKEN_BEGIN = 31744  # vocab id of bin index 0 (= 32000 - 256); ids 31744..31999 are the action tokens
VOCAB_FOR_DECODING = 32000  # text_config.vocab_size (32064) - pad_to_multiple_of (64)
BOS_ID, STOP_ID, SPACE_ID = 1, 2, 29871  # <s>, </s>, "▁" (appended to the prompt when not already last)
NUM_SLOTS = ACTION_CHUNK * ACTION_DIM
PROMPT_TOKENS = 32  # the prompt in Llama tokens (the memory plan): BOS, "In: What action should the robot take to
                    # ...?" + a LIBERO instruction (8-15 words), "Out:" and the appended space
# The processor's effective normalisation: the converter stored timm's constants rounded to bf16.
DINO_MEAN = (0.484375, 0.455078125, 0.40625)
DINO_STD = (0.228515625, 0.2236328125, 0.224609375)
SIGLIP_MEAN = SIGLIP_STD = (0.5, 0.5, 0.5)
BIN_EDGES = np.linspace(-1.0, 1.0, N_BINS)
BIN_CENTERS = (BIN_EDGES[:-1] + BIN_EDGES[1:]) / 2.0  # 255 centres; index 127 is exactly 0

# timm model id (without its pretrained tag) -> tower architecture. The published ids, plus the two small ones the
# test fixture registers (same flags, only width/depth/heads shrunk).
VIT_ARCHS = {
    "vit_large_patch14_reg4_dinov2": dict(kind="dinov2", dim=1024, depth=24, heads=16, mlp=4096),
    "vit_so400m_patch14_siglip_224": dict(kind="siglip", dim=1152, depth=27, heads=16, mlp=4304),
    "vit_test_patch14_reg4_dinov2": dict(kind="dinov2", dim=32, depth=3, heads=2, mlp=128),
    "vit_test_patch14_siglip_224": dict(kind="siglip", dim=48, depth=3, heads=3, mlp=179),
}
POLICY_CONFIG = "policy_config.json"  # this project's settings, written beside the published files by `save`
ADAPTER_FILE = "lora_adapter.safetensors"




# ---------------------------------------------------------------- action bins, statistics, gripper
def unnorm_stats(stats: Dict, key: Optional[str]) -> Tuple[str, Dict]:
    """The action statistics of `key` in dataset_statistics.json: the key itself, else `key + "_no_noops"` (the
    reference's lookup); with `key` None the only key there is."""
    if key is None:
        if len(stats) != 1:
            raise ValueError(f"dataset_statistics.json has {sorted(stats)}; set policy.unnorm_key to one of them")
        key = next(iter(stats))
    if key not in stats and f"{key}_no_noops" in stats:
        key = f"{key}_no_noops"
    if key not in stats:
        raise ValueError(f"unnorm key {key!r} is not in dataset_statistics.json (has {sorted(stats)}); set "
                         f"policy.unnorm_key to one of them")
    return key, stats[key]["action"]


class OFTActionTokenizer:
    """Bin index k in [0, 256) <-> env action (OpenVLA's 256 edges / 255 centres, the checkpoint's q01/q99 + mask,
    LIBERO's gripper sign). Same method names as ActionTokenizer (encode / decode / n_bins)."""

    n_bins = N_BINS

    def __init__(self, action_stats: Dict):
        self.q01 = np.asarray(action_stats["q01"], np.float64)
        self.q99 = np.asarray(action_stats["q99"], np.float64)
        self.mask = np.asarray(action_stats.get("mask", [True] * ACTION_DIM), bool)
        if self.q01.shape != (ACTION_DIM,) or self.q99.shape != (ACTION_DIM,) or self.mask.shape != (ACTION_DIM,):
            raise ValueError(f"action statistics must have {ACTION_DIM} entries per field")

    def normalized(self, tokens) -> np.ndarray:
        """Bin indices (...) -> normalised values in [-1, 1] (the bin centre of vocab id 31744 + k)."""
        k = np.asarray(torch.as_tensor(tokens).cpu(), np.int64)
        if k.size and (k.min() < 0 or k.max() >= N_BINS):
            raise ValueError(f"bin indices must lie in [0, {N_BINS}), got [{k.min()}, {k.max()}]")
        discretized = VOCAB_FOR_DECODING - (ACTION_TOKEN_BEGIN + k)
        return BIN_CENTERS[np.clip(discretized - 1, 0, len(BIN_CENTERS) - 1)]

    def unnormalize(self, x: np.ndarray) -> np.ndarray:
        """Normalised (..., 7) -> dataset units: 0.5 (x + 1) (q99 - q01 + 1e-8) + q01 where mask, x elsewhere."""
        return np.where(self.mask, 0.5 * (x + 1.0) * (self.q99 - self.q01 + 1e-8) + self.q01, x)

    def to_env(self, normalized) -> np.ndarray:
        """Normalised actions (..., 7) -> env actions (..., 7) float32: un-normalised, gripper binarised from the
        dataset's 1 = open / 0 = close to LIBERO's -1 = open / +1 = close (as OFT's run_libero_eval)."""
        a = self.unnormalize(np.asarray(normalized, np.float64))
        a[..., -1] = -np.sign(2.0 * a[..., -1] - 1.0)
        return a.astype(np.float32)

    def decode(self, tokens) -> np.ndarray:
        """Bin indices (..., 7) -> env actions (..., 7) float32, gripper -1 open / +1 close."""
        return self.to_env(self.normalized(tokens))

    def encode(self, actions) -> torch.Tensor:
        """Env actions (..., 7) (gripper -1 open / +1 close) -> bin indices (..., 7) long, as OpenVLA tokenises
        its training data: normalise where mask (clipped to [-1, 1]), gripper to 1 open / 0 close, digitize."""
        a = np.asarray(torch.as_tensor(actions).detach().cpu(), np.float64).copy()
        if a.shape[-1] != ACTION_DIM:
            raise ValueError(f"actions must have shape (..., {ACTION_DIM}), got {a.shape}")
        a[..., -1] = (1.0 - np.clip(a[..., -1], -1.0, 1.0)) / 2.0
        x = np.where(self.mask, 2.0 * (a - self.q01) / (self.q99 - self.q01 + 1e-8) - 1.0, a)
        ids = VOCAB_FOR_DECODING - np.digitize(np.clip(x, -1.0, 1.0), BIN_EDGES)
        return torch.as_tensor(ids - ACTION_TOKEN_BEGIN, dtype=torch.long)


# ---------------------------------------------------------------- images and prompt
def prompt_text(instruction: str) -> str:
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


def pixel_values(images, device=None) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> (B, 6, 224, 224) float32 as the published processor makes them: PIL bicubic resize to
    224 (skipped at 224), then channels 0-2 DINOv2-normalised and 3-5 SigLIP-normalised with the bf16-rounded
    constants the released preprocessor_config.json holds."""
    x = images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[-1] != 3:
        raise ValueError(f"images must be uint8 (B, H, W, 3), got {x.dtype} {tuple(x.shape)}")
    if x.shape[1:3] != (IMAGE_SIZE, IMAGE_SIZE):
        from PIL import Image

        x = np.stack([np.asarray(Image.fromarray(im).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)) for im in x])
    t = torch.as_tensor(x, device=device).permute(0, 3, 1, 2).float() / 255.0
    out = []
    for mean, std in ((DINO_MEAN, DINO_STD), (SIGLIP_MEAN, SIGLIP_STD)):
        m = torch.tensor(mean, device=t.device).view(1, 3, 1, 1)
        s = torch.tensor(std, device=t.device).view(1, 3, 1, 1)
        out.append((t - m) / s)
    return torch.cat(out, dim=1)


def _lanczos3(x: np.ndarray) -> np.ndarray:
    """TensorFlow's lanczos3 kernel: 3 sin(pi x) sin(pi x / 3) / (pi x)^2 on |x| < 3, 1 near 0."""
    x = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = 3.0 * np.sin(np.pi * x) * np.sin(np.pi * x / 3.0) / (np.pi * x) ** 2
    return np.where(x <= 1e-3, 1.0, np.where(x < 3.0, w, 0.0))


def _lanczos_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of an antialiased lanczos3 resize (tf.image.resize(..., "lanczos3", antialias=True):
    kernel widened by the downscale factor, taps outside the image dropped, rows normalised)."""
    scale = n_in / n_out
    kernel_scale = max(scale, 1.0)
    centre = (np.arange(n_out) + 0.5) * scale
    src = np.arange(n_in) + 0.5
    w = _lanczos3((src[None, :] - centre[:, None]) / kernel_scale)
    return w / w.sum(axis=1, keepdims=True)


def _crop_resize_bilinear(img: np.ndarray, crop_scale: float = 0.9) -> np.ndarray:
    """tf.image.crop_and_resize of the central box of area `crop_scale` back to the same size (bilinear, sample
    points spread from the box's first to last pixel centre), on float images in [0, 1]."""
    h, w = img.shape[:2]
    side = np.float32(np.sqrt(np.float32(crop_scale)))
    off = (np.float32(1.0) - side) / np.float32(2.0)

    def coords(n):
        return off * (n - 1) + np.arange(n) * (side * (n - 1) / (n - 1))

    ys, xs = coords(h), coords(w)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    dy, dx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    top = img[y0][:, x0] + (img[y0][:, x1] - img[y0][:, x0]) * dx
    bottom = img[y1][:, x0] + (img[y1][:, x1] - img[y1][:, x0]) * dx
    return top + (bottom - top) * dy


def libero_image(frame: np.ndarray, center_crop: bool = True, rotate: bool = True) -> np.ndarray:
    """The reference observation pipeline for this family on LIBERO (openvla-oft run_libero_eval / SimpleVLA-RL):
    a (256, 256, 3) uint8 render -> rotate 180 degrees (`rotate=False` for a frame already upright, as envs/libero.py
    returns them) -> JPEG round trip at quality 95 (4:2:0) -> lanczos3
    antialiased resize to 224, rounded -> centre crop of 0.9 area resized back to 224 (bilinear), truncated to
    uint8 as tf.image.convert_image_dtype does. The reference runs TensorFlow; here PIL encodes, simplejpeg decodes
    with TF's default fast IDCT, numpy does the rest (docs/openvla_oft.md has the measured difference). Feed the
    result to `pixel_values` (the processor)."""
    import io

    from PIL import Image

    try:
        import simplejpeg
    except ImportError:
        raise ImportError("libero_image needs simplejpeg (pip install simplejpeg): TensorFlow decodes JPEG with "
                          "libjpeg's fast integer IDCT, which PIL cannot select") from None
    img = np.asarray(frame)
    img = np.ascontiguousarray(img[::-1, ::-1] if rotate else img)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[-1] != 3:
        raise ValueError(f"frame must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=95, subsampling="4:2:0")  # = tf.image.encode_jpeg's
    img = simplejpeg.decode_jpeg(buf.getvalue(), colorspace="RGB", fastdct=True, fastupsample=False)
    img = img.astype(np.float64)
    wy, wx = _lanczos_matrix(img.shape[0], IMAGE_SIZE), _lanczos_matrix(img.shape[1], IMAGE_SIZE)
    img = np.einsum("ij,jkc->ikc", wy, np.einsum("kl,jlc->jkc", wx, img))
    img = np.clip(np.round(img), 0, 255).astype(np.uint8)
    if center_crop:
        x = _crop_resize_bilinear(img.astype(np.float32) / np.float32(255.0))
        img = np.floor(np.clip(x, 0.0, 1.0) * 255.5).clip(0, 255).astype(np.uint8)
    return img


def crop_lanczos_image(frame: np.ndarray, rotate: bool = True, crop_scale: float = 0.9) -> np.ndarray:
    """The GAE-PPO reference's observation path (image_pipeline crop_lanczos; OpenVLA-OFT-RL
    libero_rl/utils/obs_utils.py:207-231, 175-205, 268-273@f82c92f): rotate 180 degrees (`rotate=False` for a frame
    already upright) -> the central int(h sqrt(crop_scale)) x int(w sqrt(crop_scale)) crop at ((h - ch) // 2,
    (w - cw) // 2) -> PIL Lanczos resize to 224, uint8. No JPEG round trip (the `libero` pipeline's first step)."""
    from PIL import Image

    img = np.asarray(frame)
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[-1] != 3:
        raise ValueError(f"frame must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
    img = np.ascontiguousarray(img[::-1, ::-1] if rotate else img)
    h, w = img.shape[:2]
    ch, cw = int(h * np.sqrt(crop_scale)), int(w * np.sqrt(crop_scale))
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = np.ascontiguousarray(img[top:top + ch, left:left + cw])
    return np.asarray(Image.fromarray(crop).resize((IMAGE_SIZE, IMAGE_SIZE), Image.LANCZOS), dtype=np.uint8)


def apply_image_pipeline(images, pipeline: str) -> Any:
    """A batch of upright (B, H, W, 3) uint8 frames through policy.image_pipeline: libero (`libero_image`),
    crop_lanczos (`crop_lanczos_image`), else (resize) as they are (pixel_values resizes)."""
    if pipeline == "libero":
        return np.stack([libero_image(im, rotate=False) for im in as_numpy(images)])
    if pipeline == "crop_lanczos":
        return np.stack([crop_lanczos_image(im, rotate=False) for im in as_numpy(images)])
    return images


# ---------------------------------------------------------------- proprio token (the published projector file)
class ProprioProjector(nn.Module):
    """fc2(GELU(fc1(proprio))): the 8-d state -> one LM-width token (openvla-oft's ProprioProjector, its key names)."""

    def __init__(self, llm_dim: int, proprio_dim: int = PROPRIO_DIM):
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def load_component(module: nn.Module, path: str) -> None:
    """Strict load of a published `.pt` state dict (DDP's `module.` prefix stripped), one-line errors."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - truncated or not a torch file
        raise PolicyLoadError(f"{path} is unreadable ({type(e).__name__}); download it again") from None
    if not isinstance(state, dict):
        raise PolicyLoadError(f"{path} holds no state dict")
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or bad:
        raise PolicyLoadError(f"{path} does not match an L1-regression head (or proprio projector) of this LM width "
                              f"({len(missing)} missing, {len(unexpected)} unexpected, {len(bad)} misshaped keys, e.g. "
                              f"{(missing + unexpected + bad)[:2]}); a diffusion head or another model's file?")
    module.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def save_component(module: nn.Module, path: str) -> None:
    """The published form: a torch state dict with DDP's `module.` prefix."""
    torch.save({f"module.{k}": v.detach().cpu().contiguous() for k, v in module.state_dict().items()}, path)


# ---------------------------------------------------------------- model
class ViTTower(nn.Module):
    """A DINOv2-reg4 or SigLIP ViT up to (and including) its second-to-last block: patch embedding + position
    embedding (patches only; DINOv2 then prepends CLS and 4 registers), blocks 0..depth-2, prefix tokens dropped."""

    def __init__(self, kind: str, dim: int, depth: int, heads: int, mlp: int, patch: int = 14,
                 image_size: int = IMAGE_SIZE):
        super().__init__()
        self.kind, self.depth, self.dim = kind, depth, dim
        n = (image_size // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.pos_embed = nn.Parameter(torch.zeros(1, n, dim))
        if kind == "dinov2":
            from transformers import Dinov2WithRegistersConfig
            from transformers.models.dinov2_with_registers.modeling_dinov2_with_registers import \
                Dinov2WithRegistersLayer as Layer
            if mlp % dim:
                raise ValueError(f"DINOv2 MLP width {mlp} is not a multiple of {dim}")
            cfg = Dinov2WithRegistersConfig(hidden_size=dim, num_attention_heads=heads, mlp_ratio=mlp // dim,
                                            layer_norm_eps=1e-6, hidden_act="gelu", qkv_bias=True)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
            self.reg_token = nn.Parameter(torch.zeros(1, 4, dim))
        elif kind == "siglip":
            from transformers import SiglipVisionConfig
            from transformers.models.siglip.modeling_siglip import SiglipEncoderLayer as Layer
            cfg = SiglipVisionConfig(hidden_size=dim, intermediate_size=mlp, num_attention_heads=heads,
                                     layer_norm_eps=1e-6, hidden_act="gelu")
        else:
            raise ValueError(f"unknown ViT kind {kind!r}")
        cfg._attn_implementation = "sdpa"
        self.blocks = nn.ModuleList([Layer(cfg) for _ in range(depth - 1)])
        self.gradient_checkpointing = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        n_prefix = 0
        if self.kind == "dinov2":
            b = x.shape[0]
            x = torch.cat([self.cls_token.expand(b, -1, -1), self.reg_token.expand(b, -1, -1), x], dim=1)
            n_prefix = 5
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, None, use_reentrant=False)
            else:
                x = block(x, None)
        return x[:, n_prefix:]


class Projector(nn.Module):
    """fc3(gelu(fc2(gelu(fc1(x))))): fused vision width -> 4x -> LM width -> LM width."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


class OFTCore(nn.Module):
    """Vision towers + projector + LlamaForCausalLM; forward -> (action logits (B, 56, 256) float32, hidden state at
    the last prompt position (B, D))."""

    def __init__(self, hf_config: Dict):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        ids = hf_config["timm_model_ids"]
        archs = [_vit_arch(i) for i in ids]
        if [a["kind"] for a in archs] != ["dinov2", "siglip"]:
            raise PolicyLoadError(f"timm_model_ids {ids} must name a DINOv2-reg4 tower then a SigLIP tower")
        self.dino = ViTTower(**archs[0])
        self.siglip = ViTTower(**archs[1])
        text = {k: v for k, v in hf_config["text_config"].items()
                if k not in ("model_type", "torch_dtype", "dtype", "architectures", "_name_or_path")}
        lm_cfg = LlamaConfig(**text)
        lm_cfg._attn_implementation = "sdpa"
        self.language_model = LlamaForCausalLM(lm_cfg)
        self.projector = Projector(self.dino.dim + self.siglip.dim, lm_cfg.hidden_size)
        self.hidden_size = lm_cfg.hidden_size
        self.num_patches = self.dino.pos_embed.shape[1]

    def forward(self, pixels: torch.Tensor, prompt_ids: List[List[int]], extra_tokens: Optional[torch.Tensor] = None,
                action_hidden: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """pixels (B, 6 N, 224, 224): N images of 6 channels each (DINOv2 then SigLIP normalised), their patches
        concatenated in that order; `extra_tokens` (B, k, D) go after the patches (the L1 variant's proprio token).
        `action_hidden`: the last-layer hidden states at the 56 action positions (B, 56, D) instead of the logits."""
        dtype = self.projector.fc1.weight.dtype
        pixels = pixels.to(dtype)
        if pixels.shape[1] % 6:
            raise ValueError(f"pixels have {pixels.shape[1]} channels; expected 6 per image")
        patches = self.projector(torch.cat([torch.cat([self.dino(g[:, :3]), self.siglip(g[:, 3:6])], dim=2)
                                            for g in pixels.split(6, dim=1)], dim=1))
        if extra_tokens is not None:
            patches = torch.cat([patches, extra_tokens.to(patches.dtype)], dim=1)
        embed = self.language_model.get_input_embeddings()
        dev, b, p = patches.device, patches.shape[0], patches.shape[1]
        lengths = [len(ids) for ids in prompt_ids]  # incl. BOS
        total = max(lengths) + p + NUM_SLOTS + 1
        tokens = torch.full((b, total - p), STOP_ID, dtype=torch.long, device=dev)
        for i, ids in enumerate(prompt_ids):
            tokens[i, :lengths[i]] = torch.as_tensor(ids, device=dev)
        text = embed(tokens)  # (B, L - P, D): [BOS, prompt..., then slots/STOP/pad positions filled below]
        seq = torch.zeros(b, total, text.shape[-1], dtype=text.dtype, device=dev)
        valid = torch.zeros(b, total, dtype=torch.bool, device=dev)
        seq[:, :1] = text[:, :1]
        seq[:, 1:1 + p] = patches.to(text.dtype)
        for i, n in enumerate(lengths):
            seq[i, 1 + p:p + n] = text[i, 1:n]  # prompt after BOS; the 56 slots stay zero vectors
            seq[i, p + n + NUM_SLOTS] = text[i, -1]  # STOP (tokens beyond the prompt are all STOP ids)
            valid[i, :p + n + NUM_SLOTS + 1] = True
        mask = valid[:, None, None, :].expand(b, 1, total, total)  # bidirectional; only padding keys masked
        position_ids = torch.arange(total, device=dev).unsqueeze(0).expand(b, -1)
        hidden = self.language_model.model(inputs_embeds=seq, attention_mask=mask, position_ids=position_ids,
                                           use_cache=False).last_hidden_state
        start = torch.as_tensor([p + n - 1 for n in lengths], device=dev)  # last prompt token predicts slot 0
        idx = start[:, None] + torch.arange(NUM_SLOTS, device=dev)[None]
        h = hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))
        if action_hidden:
            return h, hidden[torch.arange(b, device=dev), start]
        logits = self.language_model.lm_head(h)[..., ACTION_TOKEN_BEGIN:ACTION_TOKEN_BEGIN + N_BINS]
        return logits.float(), hidden[torch.arange(b, device=dev), start]


def _vit_arch(model_id: str) -> Dict:
    base = model_id.split(".")[0]
    if base not in VIT_ARCHS:
        raise PolicyLoadError(f"unknown timm model id {model_id!r} in config.json; known: {sorted(VIT_ARCHS)}")
    return dict(VIT_ARCHS[base])


# ---------------------------------------------------------------- published key layout <-> module names
def _tower_map(prefix: str, kind: str, depth: int) -> Dict[str, str]:
    """Published (timm) key -> this module's key for one tower's used weights; q/k/v come from the fused qkv."""
    m = {f"{prefix}.pos_embed": "pos_embed", f"{prefix}.patch_embed.proj.weight": "patch_embed.weight",
         f"{prefix}.patch_embed.proj.bias": "patch_embed.bias"}
    if kind == "dinov2":
        m.update({f"{prefix}.cls_token": "cls_token", f"{prefix}.reg_token": "reg_token"})
    names = dict(norm1="norm1", norm2="norm2", attn="attention", proj="o_proj") if kind == "dinov2" else \
        dict(norm1="layer_norm1", norm2="layer_norm2", attn="self_attn", proj="out_proj")
    for i in range(depth - 1):
        src, dst = f"{prefix}.blocks.{i}", f"blocks.{i}"
        for w in ("weight", "bias"):
            m[f"{src}.norm1.{w}"] = f"{dst}.{names['norm1']}.{w}"
            m[f"{src}.norm2.{w}"] = f"{dst}.{names['norm2']}.{w}"
            m[f"{src}.attn.proj.{w}"] = f"{dst}.{names['attn']}.{names['proj']}.{w}"
            m[f"{src}.attn.qkv.{w}"] = f"{dst}.{names['attn']}.qkv.{w}"  # split on load, fused on save
            m[f"{src}.mlp.fc1.{w}"] = f"{dst}.mlp.fc1.{w}"
            m[f"{src}.mlp.fc2.{w}"] = f"{dst}.mlp.fc2.{w}"
        if kind == "dinov2":  # LayerScale: the converter renamed timm's `gamma` to `scale_factor`
            m[f"{src}.ls1.scale_factor"] = f"{dst}.layer_scale1.lambda1"
            m[f"{src}.ls2.scale_factor"] = f"{dst}.layer_scale2.lambda1"
    return m


def _unused_key(key: str, core: OFTCore) -> bool:
    """The documented keys the forward pass never reads (each tower's last block and final norm, SigLIP's head)."""
    dino_last, sig_last = core.dino.depth - 1, core.siglip.depth - 1
    return bool(re.match(rf"vision_backbone\.featurizer\.(blocks\.{dino_last}\.|norm\.)", key) or
                re.match(rf"vision_backbone\.fused_featurizer\.(blocks\.{sig_last}\.|norm\.|attn_pool\.)", key))


def key_map(core: OFTCore) -> Dict[str, str]:
    """Published key -> OFTCore state-dict key for every weight the forward pass uses."""
    m: Dict[str, str] = {}
    for prefix, name, tower in (("vision_backbone.featurizer", "dino", core.dino),
                                ("vision_backbone.fused_featurizer", "siglip", core.siglip)):
        m.update({k: f"{name}.{v}" for k, v in _tower_map(prefix, tower.kind, tower.depth).items()})
    for name in ("projector", "language_model"):
        for k in _plain_keys(getattr(core, name)):
            m[f"{name}.{k}"] = f"{name}.{k}"
    return m


def _plain_keys(module: nn.Module) -> List[str]:
    """State-dict keys without peft's LoRA additions (`base_layer.` dropped, `lora_*` skipped)."""
    return [k.replace(".base_layer.", ".") for k in module.state_dict() if "lora_" not in k]


def _weight_files(folder: str) -> List[str]:
    """The safetensors files of a published folder (its index's shards, each checked to be a file of the folder, or
    model.safetensors); PolicyLoadError when none or one is missing."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        bad = [s for s in shards if not isinstance(s, str) or os.path.basename(s) != s or s in ("", ".", "..")]
        if bad:  # a shard name is a file of this folder, never a path out of it
            raise PolicyLoadError(f"{index} names shard {bad[0]!r}, not a file name in {folder}; the index is corrupt "
                                  f"or crafted: download the checkpoint again")
    elif os.path.isfile(os.path.join(folder, "model.safetensors")):
        shards = ["model.safetensors"]
    else:
        raise PolicyLoadError(f"{folder} has no model.safetensors.index.json or model.safetensors: give the whole "
                              f"downloaded checkpoint folder")
    paths = [os.path.join(folder, shard) for shard in shards]
    for path in paths:
        if not os.path.isfile(path):
            raise PolicyLoadError(f"{path} is missing (listed in the index); finish the download of the checkpoint")
    return paths


def _read_safetensors(folder: str) -> Dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for path in _weight_files(folder):
        state.update(load_file(path))
    return state


def check_published_headers(hf_config: Dict, folder: str) -> None:
    """The OFTCore `hf_config` builds, on the meta device (no memory), against the shapes in the safetensors headers
    of `folder` (no tensor read): a config.json that disagrees with its weights (e.g. a size key set huge) is refused
    in one line before the model is built at full size."""
    from safetensors import safe_open

    with torch.device("meta"):
        with _building(torch.float32, skip_init=True):
            core = OFTCore(hf_config)
    stored: Dict[str, tuple] = {}
    for path in _weight_files(folder):
        try:
            with safe_open(path, "pt") as f:
                stored.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
        except Exception as e:  # noqa: BLE001 - a truncated or garbage header
            raise PolicyLoadError(f"{path} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                                  f"download it again") from None
    own = {k: tuple(v.shape) for k, v in core.state_dict().items()}
    for src, dst in key_map(core).items():
        if dst.endswith(("qkv.weight", "qkv.bias")):
            base, w = dst.rsplit(".qkv.", 1)
            parts = [own[f"{base}.{p}.{w}"] for p in ("q_proj", "k_proj", "v_proj")]
            want = (sum(p[0] for p in parts), *parts[0][1:])
        else:
            want = own[dst]
        if src in stored and stored[src] != want:
            raise PolicyLoadError(f"{folder}: weight {src} has shape {stored[src]}, config.json says {want}; "
                                  f"config.json and the weights disagree (refused before building the model)")


def load_published_weights(core: OFTCore, folder: str) -> None:
    """Strict load: every used key present with the right shape; extra keys only the documented unused ones."""
    state = _read_safetensors(folder)
    mapping = key_map(core)
    missing = sorted(k for k in mapping if k not in state)
    if missing:
        raise PolicyLoadError(f"{folder}: {len(missing)} weights missing (e.g. {missing[:3]}); not an OpenVLA-OFT "
                              f"checkpoint of this architecture, or an incomplete download")
    unexpected = sorted(k for k in state if k not in mapping and not _unused_key(k, core))
    if unexpected:
        raise PolicyLoadError(f"{folder}: {len(unexpected)} unexpected weights (e.g. {unexpected[:3]}); an L1/"
                              f"diffusion head or another architecture? this loader takes the discrete OFT layout")
    own = core.state_dict()
    new = {}
    for src, dst in mapping.items():
        t = state[src]
        if dst.endswith(("qkv.weight", "qkv.bias")):
            base, w = dst.rsplit(".qkv.", 1)
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), t.chunk(3, dim=0)):
                new[f"{base}.{part}.{w}"] = chunk
        else:
            new[dst] = t
    for k, t in new.items():
        if k not in own or tuple(own[k].shape) != tuple(t.shape):
            want = tuple(own[k].shape) if k in own else None
            raise PolicyLoadError(f"{folder}: weight {k} has shape {tuple(t.shape)}, the config says {want}; "
                                  f"config.json and the weights disagree")
    left = sorted(set(own) - set(new))
    if left:
        raise PolicyLoadError(f"{folder}: no published weight for {left[:3]}; loader and layout disagree")
    core.load_state_dict(new, strict=True)


def published_state_dict(core: OFTCore) -> Dict[str, torch.Tensor]:
    """OFTCore weights under the published key names (q/k/v fused back into qkv); with LoRA the base weights."""
    own = {k.replace(".base_layer.", "."): v for k, v in core.state_dict().items() if "lora_" not in k}
    out = {}
    for src, dst in key_map(core).items():
        if dst.endswith(("qkv.weight", "qkv.bias")):
            base, w = dst.rsplit(".qkv.", 1)
            out[src] = torch.cat([own[f"{base}.{p}.{w}"] for p in ("q_proj", "k_proj", "v_proj")], dim=0)
        else:
            out[src] = own[dst]
    return {k: v.detach().contiguous() for k, v in out.items()}


def write_shards(folder: str, state: Dict[str, torch.Tensor]) -> None:
    """Published-layout weights: the vision tower + projector and the language model in two safetensors shards, and
    model.safetensors.index.json mapping every key to its shard."""
    from safetensors.torch import save_file

    shards = {"model-00001-of-00002.safetensors": {k: v for k, v in state.items() if not k.startswith("language")},
              "model-00002-of-00002.safetensors": {k: v for k, v in state.items() if k.startswith("language")}}
    weight_map = {}
    for name, part in shards.items():
        save_file(part, os.path.join(folder, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    total = sum(v.numel() * v.element_size() for v in state.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)


def write_published(folder: str, core: OFTCore, hf_config: Dict, stats: Dict, tokenizer_dir: Optional[str]) -> None:
    """The published layout: config.json, two safetensors shards + index, dataset_statistics.json, tokenizer files."""
    os.makedirs(folder, exist_ok=True)
    write_shards(folder, published_state_dict(core))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    with open(os.path.join(folder, "dataset_statistics.json"), "w") as f:
        json.dump(stats, f, indent=2)
    if tokenizer_dir is not None and os.path.abspath(tokenizer_dir) != os.path.abspath(folder):
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                     "added_tokens.json", "preprocessor_config.json"):
            if os.path.isfile(os.path.join(tokenizer_dir, name)):
                shutil.copy(os.path.join(tokenizer_dir, name), os.path.join(folder, name))


def read_folder(folder: str, l1: bool = False) -> Tuple[Dict, Dict]:
    """-> (config.json, dataset_statistics.json) of a published folder, with one-line errors; `l1`: the folder may
    (must, for the L1 class) hold an L1-regression action head (models/openvla_oft_l1.py; the token family reads such
    a folder with policy.from_l1_checkpoint). A proprio projector file alone is this family's own (a token policy
    saved with use_proprio)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            hf_config = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{folder}/config.json is unreadable ({e}): give an OpenVLA-OFT checkpoint "
                              f"folder") from None
    if hf_config.get("model_type") != "openvla" or not hf_config.get("use_fused_vision_backbone", False):
        raise PolicyLoadError(f"{folder} is not a fused-backbone OpenVLA checkpoint (config.json model_type "
                              f"{hf_config.get('model_type')!r}); use an OpenVLA-OFT folder")
    heads = sorted(f for f in os.listdir(folder) if f.startswith("action_head--"))
    if heads and not l1:
        raise PolicyLoadError(no_rl_message(folder))
    if list(hf_config.get("image_sizes", [IMAGE_SIZE, IMAGE_SIZE])) != [IMAGE_SIZE, IMAGE_SIZE]:
        raise PolicyLoadError(f"{folder}: image_sizes {hf_config['image_sizes']} unsupported (224 only)")
    try:
        with open(os.path.join(folder, "dataset_statistics.json")) as f:
            stats = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{folder}/dataset_statistics.json is unreadable ({e}); copy it from the published "
                              f"checkpoint (actions cannot be un-normalised without it)") from None
    return hf_config, stats


# ---------------------------------------------------------------- the policy
class OpenVLAOFTPolicy(nn.Module, PolicyFamily):
    """act / log_prob / hidden / sft_loss / save / load / reference, as TokenPolicy (tokens are bin indices)."""

    config_class = OpenVLAOFTConfig
    published = True  # starts from a published checkpoint folder (or one this project saved from it)
    resizes_images = True  # to its vision tower's input
    l1 = False  # the L1-regression subclass (models/openvla_oft_l1.py) reads folders with an action head

    @classmethod
    def detect(cls, folder: str) -> bool:
        """A published OpenVLA-OFT folder (config.json model_type openvla; the discrete family has no action-head
        file, the L1 one has) or one this project saved from it."""
        cfg = read_config_json(folder)
        return (cfg.get("model_type") == "openvla" or cfg.get("policy_type") == "openvla_oft") and \
            is_l1_folder(folder) == cls.l1

    def paper_protocol(self) -> str:
        """SimpleVLA-RL's: the discrete OpenVLA-OFT SFT checkpoints RL starts from are theirs (and siiRL's)."""
        return "simplevla-rl"

    def reads_wrist_camera(self) -> bool:
        return self.cfg.num_images > 1  # agent view + wrist (the official OpenVLA-OFT LIBERO checkpoints' input)

    @classmethod
    def reads_folder_of(cls, found: str, policy_cfg: Any) -> bool:
        """An L1-regression folder starts this token family with policy.from_l1_checkpoint (the GAE-PPO reference's
        start from the official checkpoint, its action head not loaded)."""
        return not cls.l1 and found == "openvla_oft_l1" and bool(getattr(policy_cfg, "from_l1_checkpoint", False))

    @classmethod
    def resolve_for_suite(cls, policy_cfg: OpenVLAOFTConfig, suite: str) -> OpenVLAOFTConfig:
        """On LIBERO: the suite's statistics key (`<suite>_no_noops`) unless one is set, and image_pipeline auto ->
        libero (the reference's JPEG round trip + Lanczos + crop of a 256 px render); on the embedded suite auto ->
        resize (and the only statistics key the folder has)."""
        embedded = suite == "tabletop" or suite.startswith("tabletop_")  # the embedded suite or a variant of it
        changes = {}
        if policy_cfg.unnorm_key is None and not embedded:
            changes["unnorm_key"] = suite
        if policy_cfg.image_pipeline == "auto":
            changes["image_pipeline"] = "resize" if embedded else "libero"
            if not embedded:
                changes["image_size"] = LIBERO_RENDER_SIZE
        return dataclasses.replace(policy_cfg, **changes)

    @classmethod
    def start_from(cls, folder, policy_cfg, env_cfg, device, say):
        """The published folder's architecture (config.json) with every key of the YAML's policy section as the
        run's own (LoRA, precision, gradient checkpointing, image pipeline, statistics key), at the env's image size;
        the folder's own LoRA (a checkpoint this project saved) is merged and fresh LoRA of policy.lora_rank goes
        on top. ValueError (statistics key, wrong layout) as one line."""
        resolved = cls.resolve_for_suite(policy_cfg, env_cfg.suite)
        keys = {f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)
                if f.name not in ("type", "init_path", "lora_rank", "lora_alpha", "lora_dropout", "action_chunk")}
        keys["image_size"] = env_cfg.image_size  # the env renders it; the pipeline resizes to 224
        policy = cls.load(folder, device=device, **keys)
        policy.cfg = dataclasses.replace(policy.cfg, lora_alpha=policy_cfg.lora_alpha,
                                         lora_dropout=policy_cfg.lora_dropout, init_path=folder)
        policy.set_lora_rank(policy_cfg.lora_rank)
        if env_cfg.action_chunk != policy.action_chunk:
            say(f"env.action_chunk={env_cfg.action_chunk} -> {policy.action_chunk}: {folder} predicts "
                f"{policy.action_chunk} actions per call")
        return policy

    @classmethod
    def memory_model(cls, policy_cfg: Optional[OpenVLAOFTConfig], folder: Optional[str]) -> Model:
        """The memory plan's view of this family (models/memory.py): the network `folder`'s config.json builds on
        the meta device (`meta_network`) with the run's LoRA, precision and checkpointing keys (`policy_cfg`; None:
        those the folder saved, train_sft.py's start from it), and its stacks: the two ViT towers, the projector
        and Llama over the image, prompt and action-slot tokens."""
        folder = folder or getattr(policy_cfg, "init_path", None)
        if not folder:
            raise ConfigError(f"memory plan: policy.type={cls.family()} is built from its folder's config.json: set "
                              f"init.path=<the checkpoint folder> (a folder with only config.json plans too: the "
                              f"published 7B's is tests/fixtures/openvla_oft_7b_config)")
        if policy_cfg is None:
            saved = {}
            if os.path.isfile(os.path.join(folder, "policy_config.json")):  # a folder this project saved
                with open(os.path.join(folder, "policy_config.json")) as f:
                    saved = json.load(f)
            names = {f.name for f in dataclasses.fields(cls.config_class)}
            policy_cfg = cls.config_class(**{k: v for k, v in saved.items() if k in names}, init_path=folder)
        path = os.path.join(folder, "config.json")
        try:
            with open(path) as f:
                hf_config = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"memory plan: {path} is unreadable ({e}); point init.path at an OpenVLA-OFT folder "
                              f"(its config.json is enough to plan)") from None
        if hf_config.get("model_type") != "openvla":
            raise ConfigError(f"memory plan: {path} is not an OpenVLA config (model_type "
                              f"{hf_config.get('model_type')!r})")
        cfg = policy_cfg
        net = meta_network(hf_config, cfg)
        core = getattr(getattr(net, "base_model", None), "model", net)
        images, extra_tokens = cls._meta_heads(net, core, cfg, folder)
        patches = core.num_patches
        lm = core.language_model.config
        head_dim = getattr(lm, "head_dim", None) or lm.hidden_size // lm.num_attention_heads
        bf16 = bool(cfg.bf16_weights)
        stacks = []
        for name, tower, prefix in (("DINOv2", core.dino, 5), ("SigLIP", core.siglip, 0)):
            arch = VIT_ARCHS[next(k for k in VIT_ARCHS if VIT_ARCHS[k]["dim"] == tower.dim and VIT_ARCHS[k]["kind"] ==
                                  tower.kind)]
            stacks.append(tuned(net, Stack(name, "vit", len(tower.blocks), tower.dim, arch["mlp"], tower.dim,
                                           tower.dim, (patches + prefix) * images,
                                           checkpointed=cfg.gradient_checkpointing),
                                rf"(^|\.){'dino' if tower.kind == 'dinov2' else 'siglip'}\.blocks\.", bf16))
        vdim = core.dino.dim + core.siglip.dim
        stacks.append(tuned(net, Stack("projector", "mlp", 1, vdim, 4 * vdim + 2 * lm.hidden_size,
                                       tokens=patches * images), r"(^|\.)projector\.", bf16))
        tokens = 1 + patches * images + extra_tokens + PROMPT_TOKENS + NUM_SLOTS + 1
        stacks.append(tuned(net, Stack("Llama", "decoder", lm.num_hidden_layers, lm.hidden_size,
                                       lm.intermediate_size, lm.num_attention_heads * head_dim,
                                       lm.num_key_value_heads * head_dim, tokens,
                                       checkpointed=cfg.gradient_checkpointing),
                            r"language_model\.model\.layers\.", bf16))
        if not any(p.requires_grad for p in net.parameters()):
            for s in stacks:
                s.grad = False
        label = f"{cls.family()} ({os.path.basename(os.path.normpath(folder))})"
        return Model(label, net, stacks, core.hidden_size,
                     [f"{tokens} Llama tokens per sample ({PROMPT_TOKENS} for the prompt)"], policy_cfg=policy_cfg)

    @classmethod
    def _meta_heads(cls, net: nn.Module, core: "OFTCore", cfg: OpenVLAOFTConfig, folder: str) -> Tuple[int, int]:
        """(camera images per sample, extra Llama tokens) of the memory plan's network, with the proprio projector
        (one more Llama token) added to `net` when used; a subclass adds its heads here (the L1 variant: its action
        head)."""
        if cfg.use_proprio:
            with torch.device("meta"):
                net.add_module("proprio_projector", ProprioProjector(core.hidden_size).to(cls._projector_dtype(cfg)))
        return cfg.num_images, int(bool(cfg.use_proprio))

    @classmethod
    def _projector_dtype(cls, cfg: OpenVLAOFTConfig) -> torch.dtype:
        """The proprio projector's dtype: float32 (RL trains it whole, outside the LoRA-wrapped network, as the GAE-PPO
        reference's actor optimizer does: OpenVLA_PPO.py:316,326@f82c92f)."""
        return torch.float32

    def __init__(self, cfg: OpenVLAOFTConfig, _load_weights: bool = True):
        super().__init__()
        if cfg.image_pipeline not in ("auto", "libero", "resize", "crop_lanczos"):
            raise ValueError(f"image_pipeline must be auto, libero, resize or crop_lanczos, got {cfg.image_pipeline!r}")
        if cfg.action_chunk != ACTION_CHUNK:
            raise ValueError(f"OpenVLA-OFT predicts {ACTION_CHUNK} actions per call; set action_chunk: "
                             f"{ACTION_CHUNK} (got {cfg.action_chunk})")
        if cfg.num_images not in (1, 2):
            raise PolicyLoadError(f"policy.num_images={cfg.num_images}: 1 (agentview) or 2 (agentview + wrist)")
        if cfg.proprio_norm not in ("q99", "none"):
            raise ValueError(f"proprio_norm must be q99 or none, got {cfg.proprio_norm!r}")
        self.cfg = cfg
        folder = cfg.init_path
        self.hf_config, self.stats = read_folder(folder, l1=self.l1 or cfg.from_l1_checkpoint)
        self.unnorm_key, action_stats = unnorm_stats(self.stats, cfg.unnorm_key)
        self.action_tokenizer = OFTActionTokenizer(action_stats)
        self.tokenizer_dir = folder
        self.text_tokenizer = _load_text_tokenizer(folder)
        if _load_weights:
            check_published_headers(self.hf_config, folder)
        with _building(weights_dtype(cfg), skip_init=_load_weights):
            core = OFTCore(self.hf_config)
        if _load_weights:
            load_published_weights(core, folder)
        self.net = core
        self.hidden_size = core.hidden_size
        self.action_chunk = ACTION_CHUNK
        self.proprio_projector = None
        self.files = {}
        if cfg.use_proprio:
            self._load_proprio(folder)
        if cfg.lora_rank > 0:
            self.net = wrap_lora(core, cfg)
        if cfg.gradient_checkpointing:
            self.set_gradient_checkpointing(True)

    def _load_proprio(self, folder: str) -> None:
        """The folder's proprio_projector--*_checkpoint.pt (strict) and, for proprio_norm q99, the 8-d proprio
        q01/q99 of the statistics key; one-line errors when either is missing."""
        projectors = component_files(folder, PROPRIO)
        if len(projectors) != 1:
            raise PolicyLoadError(f"policy.use_proprio=true but {folder} has {len(projectors) or 'no'} "
                                  f"{PROPRIO}--*_checkpoint.pt (one expected: the official OpenVLA-OFT LIBERO "
                                  f"checkpoints hold one; the SimpleVLA-RL / siiRL ones read no proprio)")
        stats = self.stats[self.unnorm_key].get("proprio") or {}
        if self.cfg.proprio_norm == "q99" and not all(len(stats.get(k) or []) == PROPRIO_DIM for k in ("q01", "q99")):
            raise PolicyLoadError(f"{folder}/dataset_statistics.json has no 8-d proprio q01/q99 under "
                                  f"{self.unnorm_key!r}; the proprio token cannot be normalised (policy.proprio_norm="
                                  f"none feeds the raw state)")
        if self.cfg.proprio_norm == "q99":
            self.proprio_q01 = np.asarray(stats["q01"], np.float64)
            self.proprio_q99 = np.asarray(stats["q99"], np.float64)
            self.proprio_mask = np.asarray(stats.get("mask", [True] * PROPRIO_DIM), bool)
        self.files[PROPRIO] = projectors[0]
        self.proprio_projector = ProprioProjector(self.hidden_size).to(self._projector_dtype(self.cfg))
        load_component(self.proprio_projector, os.path.join(folder, projectors[0]))

    def normalize_proprio(self, state) -> np.ndarray:
        """(B, 8) env state -> the projector's input: proprio_norm q99: 2 (x - q01) / (q99 - q01 + 1e-8) - 1 where
        mask, clipped to [-1, 1] (openvla-oft's normalize_proprio); none: the state as it is."""
        x = np.asarray(as_numpy(state), np.float64)
        if x.ndim != 2 or x.shape[1] != PROPRIO_DIM:
            raise ValueError(f"obs['state'] must be (B, {PROPRIO_DIM}), got {x.shape}")
        if self.cfg.proprio_norm == "none":
            return x
        scaled = 2.0 * (x - self.proprio_q01) / (self.proprio_q99 - self.proprio_q01 + 1e-8) - 1.0
        return np.clip(np.where(self.proprio_mask, scaled, x), -1.0, 1.0)

    @property
    def core(self) -> OFTCore:
        from models.vla_backbone import unwrap

        return unwrap(self.net)

    @property
    def device(self) -> torch.device:
        return self.core.projector.fc1.weight.device

    def set_gradient_checkpointing(self, on: bool) -> None:
        core = self.core
        core.dino.gradient_checkpointing = core.siglip.gradient_checkpointing = on
        if on:
            core.language_model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            core.language_model.activation_checkpointing_disable()

    def prompt_ids(self, instructions: Sequence[str]) -> List[List[int]]:
        """Token ids of each prompt (BOS first, "▁" 29871 last, as the reference appends it)."""
        out = []
        for text in instructions:
            ids = self.text_tokenizer.encode(prompt_text(text)).ids
            if not ids or ids[0] != BOS_ID:  # a tokenizer.json without the BOS template: add it as HF's does
                ids = [BOS_ID] + ids
            if ids[-1] != SPACE_ID:
                ids = ids + [SPACE_ID]
            out.append(ids)
        return out

    def _run(self, obs, instructions, action_hidden: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """The network on `obs`: the agent view (then the wrist view with num_images 2) through the image pipeline and
        the processor, the proprio token after the patches with use_proprio (openvla-oft's order: patches, proprio,
        prompt), the prompt -> OFTCore's (logits or action-position hidden states, last-prompt hidden state)."""
        from models.vla_backbone import autocast

        images, instructions = check_image_obs(obs, instructions)
        views = [images]
        if self.cfg.num_images == 2:
            if "wrist" not in obs:
                raise ValueError("this policy reads the wrist camera (policy.num_images=2): obs needs a 'wrist' image "
                                 "batch")
            views.append(obs["wrist"])
        pixels = torch.cat([pixel_values(apply_image_pipeline(v, self.cfg.image_pipeline), self.device)
                            for v in views], dim=1)
        with autocast(self.device, self.cfg.bf16):
            extra = None
            if self.proprio_projector is not None:
                if "state" not in obs:
                    raise ValueError("this policy reads the proprio state (policy.use_proprio=true): obs needs a "
                                     "'state' batch (B, 8)")
                p = torch.as_tensor(self.normalize_proprio(obs["state"]), device=self.device)
                extra = self.proprio_projector(p.to(self.proprio_projector.fc1.weight.dtype))[:, None]
            return self.net(pixels, self.prompt_ids(instructions), extra_tokens=extra, action_hidden=action_hidden)

    def _forward(self, obs, instructions) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._run(obs, instructions)

    @torch.no_grad()
    def act(self, obs, instructions: Optional[Sequence[str]] = None, temperature: float = 1.0,
            greedy: bool = False, return_hidden: bool = False,
            generators: Optional[Sequence[torch.Generator]] = None):
        """-> actions (B, 8, 7) float32 numpy (env units), bin indices (B, 56) long, log-probs (B, 56) under
        softmax(logits / temperature) over the 256 action ids (argmax when `greedy`), [+ hidden (B, D)].
        `generators` (B CPU generators): row i's sample draws from generators[i] instead of the global RNG."""
        from models.token_policy import check_temperature, sample_categorical

        check_temperature(temperature)
        logits, hidden = self._forward(obs, instructions)
        scaled = logits / temperature
        tokens = scaled.argmax(-1) if greedy else sample_categorical(scaled, generators)
        log_probs = scaled.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        actions = self.action_tokenizer.decode(tokens.view(-1, ACTION_CHUNK, ACTION_DIM))
        if return_hidden:
            return actions, tokens, log_probs, hidden.float()
        return actions, tokens, log_probs

    def log_prob(self, obs, instructions: Optional[Sequence[str]], tokens: torch.Tensor, temperature: float = 1.0,
                 return_hidden: bool = False):
        """Log-probs and entropies (B, 56) of bin indices `tokens` under softmax(logits / temperature), with
        gradients [+ hidden (B, D)]."""
        from models.token_policy import check_temperature

        check_temperature(temperature)
        logits, hidden = self._forward(obs, instructions)
        b = logits.shape[0]
        tokens = torch.as_tensor(tokens, device=logits.device)
        if tokens.shape[0] != b or tokens[0].numel() != NUM_SLOTS:
            raise ValueError(f"tokens have shape {tuple(tokens.shape)}; expected ({b}, {NUM_SLOTS})")
        tokens = tokens.reshape(b, NUM_SLOTS).long()
        if int(tokens.min()) < 0 or int(tokens.max()) >= N_BINS:
            raise ValueError(f"bin indices must lie in [0, {N_BINS})")
        logp_all = (logits / temperature).log_softmax(-1)
        log_probs = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        if return_hidden:
            return log_probs, entropy, hidden.float()
        return log_probs, entropy

    def hidden(self, obs, instructions: Optional[Sequence[str]] = None) -> torch.Tensor:
        """(B, D) last-layer hidden state at the last prompt position (the value head's input, as RLinf)."""
        return self._forward(obs, instructions)[1].float()

    def sft_loss(self, obs, instructions: Optional[Sequence[str]], actions) -> Tuple[torch.Tensor, Dict]:
        """Cross-entropy over the 256 action ids on the demo actions (B, 8, 7), tokenised with the checkpoint's
        statistics and bins -> (loss, {"sft/loss", "sft/token_accuracy"})."""
        from models.token_policy import token_cross_entropy

        logits, _ = self._forward(obs, instructions)
        return token_cross_entropy(logits, actions, self.action_tokenizer, ACTION_CHUNK)

    def reference(self):
        """The frozen pre-LoRA model (peft `disable_adapter()`); ValueError without LoRA."""
        from models.vla_backbone import reference_context

        return reference_context(self.net)

    def save(self, path: str) -> None:
        """The published layout (base weights; LoRA kept apart in lora_adapter.safetensors) + policy_config.json."""
        from safetensors.torch import save_file

        cfg = dataclasses.replace(self.cfg, init_path="")
        write_published(path, self.core, self.hf_config, self.stats, self.tokenizer_dir)
        if self.proprio_projector is not None:
            save_component(self.proprio_projector, os.path.join(path, self.files[PROPRIO]))
        if cfg.lora_rank > 0:
            lora = {k: v.detach().contiguous() for k, v in self.net.state_dict().items() if "lora_" in k}
            save_file(lora, os.path.join(path, ADAPTER_FILE))
        with open(os.path.join(path, POLICY_CONFIG), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=2)

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu",
             **overrides) -> "OpenVLAOFTPolicy":
        """A published folder or one written by `save`; `lora_rank` different from the saved one merges the saved
        LoRA and adds fresh LoRA of that rank (the reference becomes the loaded model)."""
        saved = {}
        if os.path.isfile(os.path.join(path, POLICY_CONFIG)):
            with open(os.path.join(path, POLICY_CONFIG)) as f:
                saved = json.load(f)
            saved.pop("policy_type", None)  # written by earlier versions; the family is `type` now
        cfg = cls.config_class(**{**saved, **overrides, "init_path": path})
        policy = cls(cfg).to(device)
        if cfg.lora_rank > 0 and os.path.isfile(os.path.join(path, ADAPTER_FILE)):
            from safetensors.torch import load_file

            lora = load_file(os.path.join(path, ADAPTER_FILE), device=str(device))
            result = policy.net.load_state_dict(lora, strict=False)
            if result.unexpected_keys or any("lora_" in k for k in result.missing_keys):
                raise PolicyLoadError(f"{path}/{ADAPTER_FILE} does not match LoRA rank {cfg.lora_rank}")
        if lora_rank is not None and lora_rank != cfg.lora_rank:
            policy.set_lora_rank(lora_rank)
        return policy

    def set_lora_rank(self, lora_rank: int) -> None:
        """Merge any LoRA into the base weights, then add fresh LoRA of `lora_rank` (0 = none)."""
        from models.vla_backbone import merge_lora

        core = merge_lora(self.net)
        core.requires_grad_(True)
        self.cfg = dataclasses.replace(self.cfg, lora_rank=lora_rank)
        self.net = wrap_lora(core, self.cfg) if lora_rank > 0 else core
        self.train(self.training)


def weights_dtype(cfg: OpenVLAOFTConfig) -> torch.dtype:
    """The dtype the weights are built and kept in: bf16 with policy.bf16_weights, else float32."""
    return torch.bfloat16 if cfg.bf16_weights else torch.float32


def meta_network(hf_config: Dict, cfg: OpenVLAOFTConfig) -> nn.Module:
    """The network `OpenVLAOFTPolicy` builds from a folder's config.json (OFTCore, wrapped with LoRA when
    cfg.lora_rank > 0), on the meta device: every parameter's shape, dtype and trainable flag, no weights, tokenizer or
    statistics read and no memory taken (common/memory_plan.py plans a run from it)."""
    with torch.device("meta"):
        with _building(weights_dtype(cfg), skip_init=True):
            core = OFTCore(hf_config)
        return wrap_lora(core, cfg) if cfg.lora_rank > 0 else core  # adapters in float32, as the policy's


@contextlib.contextmanager
def _building(dtype: torch.dtype, skip_init: bool):
    """Build modules directly in `dtype` and, when the weights are loaded right after, without random init (a 7B
    model would otherwise be built in float32 and randomly initialised first)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # an older/newer transformers without it: only slower
        no_init_weights = contextlib.nullcontext
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with (no_init_weights() if skip_init else contextlib.nullcontext()):
            yield
    finally:
        torch.set_default_dtype(old)


def wrap_lora(core: OFTCore, cfg: OpenVLAOFTConfig) -> nn.Module:
    """peft LoRA on every nn.Linear except lm_head (peft's "all-linear", as the OFT fine-tuning script)."""
    from peft import LoraConfig, get_peft_model

    targets = [n for n, m in core.named_modules() if isinstance(m, nn.Linear) and not n.endswith("lm_head")]
    lcfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets)
    return get_peft_model(core, lcfg)


def _load_text_tokenizer(folder: str):
    from tokenizers import Tokenizer

    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise PolicyLoadError(f"{path} is missing; copy the tokenizer files of the published checkpoint there")
    return Tokenizer.from_file(path)


def as_numpy(images) -> np.ndarray:
    """A numpy array of `images` (a tensor is copied to the CPU)."""
    return images.cpu().numpy() if isinstance(images, torch.Tensor) else np.asarray(images)


def check_image_obs(obs, instructions):
    """(the agentview image batch, one instruction per row) of `obs`, the instructions from `obs` when not given;
    ValueError when either is missing or their lengths differ."""
    if not isinstance(obs, dict) or "agentview" not in obs:
        raise ValueError("obs must be a dict with an 'agentview' image batch")
    if instructions is None:
        instructions = obs.get("instructions")
    if instructions is None or isinstance(instructions, str):
        raise ValueError("instructions must be a list[str] with one string per batch row")
    images = obs["agentview"]
    if len(instructions) != images.shape[0] or images.shape[0] == 0:
        raise ValueError(f"{len(instructions)} instructions for {images.shape[0]} images")
    return images, list(instructions)


__all__ = ["OpenVLAOFTConfig", "OpenVLAOFTPolicy", "OFTActionTokenizer", "OFTCore", "pixel_values", "prompt_text",
           "meta_network", "weights_dtype",
           "libero_image", "crop_lanczos_image", "apply_image_pipeline",
           "unnorm_stats", "write_published", "load_published_weights", "VIT_ARCHS"]
