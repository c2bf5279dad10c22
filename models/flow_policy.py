"""pi0-style flow policy: the same observation/instruction prefix (run once through the LM) and a small action expert
(transformer decoder: self-attention over the chunk, cross-attention to the prefix) predicting the velocity field.

Convention (spec section 4): t = 0 clean, t = 1 noise, x_t = (1 - t) a + t eps, target u = eps - a. Actions live in
the ActionTokenizer's normalised space ([-1, 1] per dim). Sampling integrates Euler from t = 1 to 0:
x <- x - v / N, plus, with noise_level s > 0, s * sqrt(1/N) * z after every step but the last (exploration).
Trainable parameters: as the token policy; with LoRA the projector, state projection, prefix->expert
projection and the whole action expert train.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.vla_backbone import (Obs, PrefixEncoder, autocast, load_policy, reference_context, replace_lora,
                                 save_checkpoint, unwrap, wrap_lora)

TRAINABLE_WITH_LORA = ["projector", "state_proj", "memory_proj", "expert"]


@dataclass
class FlowPolicyConfig:
    preset: str = "tiny"  # tiny (CNN + small Llama, CPU) | minivla (SigLIP-base/16 + Qwen2.5-0.5B architecture)
    image_size: int = 64  # square camera images (px); multiple of 16
    action_chunk: int = 8  # actions per policy call
    n_bins: int = 256  # only for the shared ActionTokenizer (its statistics normalise the actions)
    use_wrist: bool = True
    vision_path: Optional[str] = None  # SigLIP checkpoint (hub id or dir); None = random init
    backbone_path: Optional[str] = None  # LM checkpoint + tokenizer; None = random init, byte tokenizer
    hidden_size: int = 128  # tiny preset LM width
    num_layers: int = 2  # tiny preset LM depth
    num_heads: int = 4  # tiny preset LM attention heads
    max_text_len: int = 48
    expert_dim: int = 128  # action expert width
    expert_layers: int = 2  # action expert decoder layers
    expert_heads: int = 4
    num_steps: int = 10  # default Euler steps for sample()
    time_sampling: str = "beta"  # training t: beta (pi0: t = 0.999 * Beta(1.5, 1) + 0.001, favours noisy t) | uniform
    lora_rank: int = 0  # 0 = full fine-tuning; > 0 = LoRA on the LM attention projections
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_vision: bool = False
    bf16: bool = True  # bf16 autocast on CUDA


class Prefix(NamedTuple):
    """Cached prefix: LM hidden states projected to the expert width (B, P, E), key validity (B, P) bool, and each
    expert layer's cross-attention keys/values of that memory (so an ODE step runs only the action tokens)."""
    memory: torch.Tensor
    valid: torch.Tensor
    kv: Tuple[Tuple[torch.Tensor, torch.Tensor], ...]


class FlowSample(NamedTuple):
    actions: np.ndarray  # (B, chunk, 7) float32 env actions (unnormalised, clipped, gripper +-1 if binarised)
    x0: torch.Tensor  # (B, chunk, 7) the integrated sample in normalised space (before clipping/binarising)
    noise: torch.Tensor  # (B, chunk, 7) the initial noise x_1


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding (B,) -> (B, dim) with periods from 4e-3 to 4 (pi0's choice for t in [0, 1])."""
    half = dim // 2
    periods = 4e-3 * (4.0 / 4e-3) ** torch.linspace(0, 1, half, device=t.device)
    ang = 2 * math.pi * t[:, None] / periods[None]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class ExpertBlock(nn.Module):
    """Pre-norm block: self-attention over the chunk, cross-attention to the prefix memory, GELU MLP."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.qkv, self.out1 = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm2, self.q, self.kv, self.out2 = nn.LayerNorm(dim), nn.Linear(dim, dim), nn.Linear(dim, 2 * dim), \
            nn.Linear(dim, dim)
        self.norm3 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # (B, L, D) -> (B, H, L, D/H)

    def memory_kv(self, memory: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        k, v = self.kv(memory).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(self, h: torch.Tensor, kv: Tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (self.split(x) for x in self.qkv(self.norm1(h)).chunk(3, dim=-1))
        h = h + self.out1(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        q = self.split(self.q(self.norm2(h)))
        h = h + self.out2(F.scaled_dot_product_attention(q, *kv, attn_mask=mask).transpose(1, 2).flatten(2))
        return h + self.mlp(self.norm3(h))


class ActionExpert(nn.Module):
    """v(x_t, t, prefix): action + time + position embeddings -> ExpertBlocks over the prefix -> (B, chunk, 7)."""

    def __init__(self, chunk: int, dim: int, layers: int, heads: int):
        super().__init__()
        if dim % heads or dim % 2:
            raise ValueError(f"expert_dim ({dim}) must be even and divisible by expert_heads ({heads})")
        self.dim = dim
        self.action_in = nn.Linear(ACTION_DIM, dim)
        self.time_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.pos = nn.Embedding(chunk, dim)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.blocks = nn.ModuleList(ExpertBlock(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.action_out = nn.Linear(dim, ACTION_DIM)

    def memory_kv(self, memory: torch.Tensor) -> Tuple[Tuple[torch.Tensor, torch.Tensor], ...]:
        return tuple(block.memory_kv(memory) for block in self.blocks)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, prefix: Prefix) -> torch.Tensor:
        h = self.action_in(x_t) + self.pos.weight[None] + self.time_mlp(time_embedding(t, self.dim))[:, None]
        mask = prefix.valid[:, None, None, :]  # (B, 1, 1, P): padded instruction tokens are not attended
        for block, kv in zip(self.blocks, prefix.kv):
            h = block(h, kv, mask)
        return self.action_out(self.norm(h))


class FlowCore(nn.Module):
    def __init__(self, cfg: FlowPolicyConfig, lm_config=None, vision_config=None, tokenizer_dir=None):
        super().__init__()
        self.encoder = PrefixEncoder(cfg, lm_config, vision_config, tokenizer_dir)
        self.memory_proj = nn.Linear(self.encoder.hidden_size, cfg.expert_dim)  # prefix -> expert width
        self.expert = ActionExpert(cfg.action_chunk, cfg.expert_dim, cfg.expert_layers, cfg.expert_heads)

    def prefix(self, obs: Obs, instructions: Optional[Sequence[str]]) -> Prefix:
        embeds, valid = self.encoder.embed_prefix(obs, instructions)
        hidden = self.encoder.run(embeds, valid, suffix_len=0)
        memory = self.memory_proj(hidden).float()
        return Prefix(memory, valid, self.expert.memory_kv(memory))


class FlowPolicy(nn.Module):
    """prefix / velocity / sample / flow_matching_loss / save / load / reference."""

    def __init__(self, cfg: Optional[FlowPolicyConfig] = None, action_tokenizer: Optional[ActionTokenizer] = None,
                 _hf=(None, None, None)):
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else FlowPolicyConfig()
        if cfg.action_chunk < 1:
            raise ValueError(f"action_chunk must be >= 1, got {cfg.action_chunk}")
        if cfg.time_sampling not in ("beta", "uniform"):
            raise ValueError(f"time_sampling must be 'beta' or 'uniform', got {cfg.time_sampling!r}")
        self.action_tokenizer = action_tokenizer or ActionTokenizer(n_bins=cfg.n_bins)
        core = FlowCore(cfg, *_hf)
        self.net = wrap_lora(core, cfg, core.encoder.use_siglip, TRAINABLE_WITH_LORA) if cfg.lora_rank > 0 else core
        self.hidden_size = core.encoder.hidden_size
        self.action_chunk = cfg.action_chunk

    @property
    def core(self) -> FlowCore:
        return unwrap(self.net)

    @property
    def device(self) -> torch.device:
        return self.core.encoder.device

    def prefix(self, obs: Obs, instructions: Optional[Sequence[str]] = None) -> Prefix:
        """Run the observation/instruction prefix once; pass the result to velocity()/sample() to reuse it."""
        with autocast(self.device, self.cfg.bf16):
            return self.core.prefix(obs, instructions)

    def velocity(self, obs: Optional[Obs], instructions: Optional[Sequence[str]], x_t: torch.Tensor,
                 t: Union[float, torch.Tensor], prefix: Optional[Prefix] = None) -> torch.Tensor:
        """v(x_t, t | obs, instruction), (B, chunk, 7) float32, with gradients; `t` a float or (B,) tensor."""
        if prefix is None:
            prefix = self.prefix(obs, instructions)
        b = prefix.memory.shape[0]
        x_t = torch.as_tensor(x_t, dtype=torch.float32, device=self.device)
        if tuple(x_t.shape) != (b, self.action_chunk, ACTION_DIM):
            raise ValueError(f"x_t has shape {tuple(x_t.shape)}; expected ({b}, {self.action_chunk}, 7)")
        t = torch.as_tensor(t, dtype=torch.float32, device=self.device)
        t = t.expand(b) if t.ndim == 0 else t
        if tuple(t.shape) != (b,):
            raise ValueError(f"t has shape {tuple(t.shape)}; expected a float or ({b},)")
        with autocast(self.device, self.cfg.bf16):
            return self.core.expert(x_t, t, prefix).float()

    @torch.no_grad()
    def sample(self, obs: Obs, instructions: Optional[Sequence[str]] = None, num_steps: Optional[int] = None,
               noise_level: float = 0.0, noise: Optional[torch.Tensor] = None, prefix: Optional[Prefix] = None,
               reuse_prefix: bool = True) -> FlowSample:
        """Euler from t = 1 (noise) to t = 0 in `num_steps` (default cfg.num_steps) steps -> FlowSample(actions,
        x0, noise). `reuse_prefix=False` recomputes the prefix at every step (only to measure the cache)."""
        num_steps = self.cfg.num_steps if num_steps is None else num_steps
        if num_steps < 1 or noise_level < 0:
            raise ValueError(f"need num_steps >= 1 and noise_level >= 0, got {num_steps}, {noise_level}")
        if prefix is None:
            prefix = self.prefix(obs, instructions)
        b = prefix.memory.shape[0]
        shape = (b, self.action_chunk, ACTION_DIM)
        x = torch.randn(shape, device=self.device) if noise is None else noise.to(self.device, torch.float32)
        if tuple(x.shape) != shape:
            raise ValueError(f"noise has shape {tuple(x.shape)}; expected {shape}")
        x1, dt = x.clone(), 1.0 / num_steps
        for i in range(num_steps):
            step_prefix = prefix if reuse_prefix else self.prefix(obs, instructions)
            x = x - dt * self.velocity(None, None, x, 1.0 - i * dt, step_prefix)
            if noise_level > 0 and i < num_steps - 1:
                x = x + noise_level * math.sqrt(dt) * torch.randn_like(x)
        return FlowSample(self.action_tokenizer.unnormalize(x), x, x1)

    def normalize_actions(self, actions) -> torch.Tensor:
        """Env actions (B, chunk, 7) -> normalised float32 tensor on the policy's device."""
        return self.action_tokenizer.normalize(actions).to(self.device)

    def flow_matching_loss(self, obs: Obs, instructions: Optional[Sequence[str]], actions,
                           t: Optional[torch.Tensor] = None, noise: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, Dict[str, float]]:
        """SFT loss mean((v(x_t, t) - (eps - a))^2) on demo actions (B, chunk, 7) -> (loss, {"sft/flow_mse"})."""
        prefix = self.prefix(obs, instructions)
        b = prefix.memory.shape[0]
        if tuple(actions.shape) != (b, self.action_chunk, ACTION_DIM):
            raise ValueError(f"actions have shape {tuple(actions.shape)}; expected ({b}, {self.action_chunk}, 7)")
        a = self.normalize_actions(actions)
        eps = torch.randn_like(a) if noise is None else noise.to(a)
        if t is None:
            if self.cfg.time_sampling == "beta":
                t = 0.999 * torch.distributions.Beta(1.5, 1.0).sample((b,)).to(a.device) + 0.001
            else:
                t = torch.rand(b, device=a.device)
        t = t.to(a)
        x_t = (1 - t)[:, None, None] * a + t[:, None, None] * eps
        loss = F.mse_loss(self.velocity(None, None, x_t, t, prefix), eps - a)
        return loss, {"sft/flow_mse": loss.item()}

    def reference(self):
        """Context manager running the frozen pre-LoRA model (peft `disable_adapter()`); ValueError without LoRA."""
        return reference_context(self.net)

    def save(self, path: str) -> None:
        save_checkpoint(path, self.net, self.cfg, self.core.encoder, self.action_tokenizer)

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu") -> "FlowPolicy":
        """Rebuild from `save` (no download); `lora_rank` as in TokenPolicy.load."""
        return load_policy(cls, FlowPolicyConfig, path, lora_rank, device)

    def set_lora_rank(self, lora_rank: int) -> None:
        """Merge any LoRA into the base weights, then add fresh LoRA of `lora_rank` (0 = none)."""
        replace_lora(self, lora_rank, TRAINABLE_WITH_LORA)
