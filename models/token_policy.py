"""OpenVLA-OFT-style token policy: prefix (images, state, instruction) + chunk x 7 action slots decoded in parallel
(bidirectional inside the action block), each slot predicting one of 256 action bins.

Trainable parameters: with `lora_rank: 0` everything (full fine-tuning). With `lora_rank > 0`: LoRA on the LM's
attention projections (+ the vision tower's with `lora_vision`), plus full copies (peft `modules_to_save`) of the
projector, state projection, action slot embeddings and action head; the vision tower and LM base weights are frozen.
`policy.reference()` (peft `disable_adapter()`) then runs the exact pre-LoRA model, original head included.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.configs import TokenPolicyConfig
from models.memory import Model, Stack, trainable, tuned
from models.policy import PolicyFamily
from models.vla_backbone import (Obs, PrefixEncoder, autocast, read_checkpoint, rebuild_policy, reference_context,
                                 replace_lora, save_policy_files, unwrap, wrap_lora)

TRAINABLE_WITH_LORA = ["projector", "state_proj", "action_queries", "action_head"]




class TokenCore(nn.Module):
    """PrefixEncoder + action slot embeddings + a linear head over the action bins."""

    def __init__(self, cfg: TokenPolicyConfig, lm_config=None, vision_config=None, tokenizer_dir=None):
        super().__init__()
        self.encoder = PrefixEncoder(cfg, lm_config, vision_config, tokenizer_dir)
        dim = self.encoder.hidden_size
        self.num_slots = cfg.action_chunk * ACTION_DIM
        self.action_queries = nn.Embedding(self.num_slots, dim)
        nn.init.normal_(self.action_queries.weight, std=0.02)
        self.action_head = nn.Linear(dim, cfg.n_bins)

    def forward(self, obs: Obs, instructions: Optional[Sequence[str]]) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> logits (B, chunk*7, n_bins) float32, action-slot hidden states (B, chunk*7, D)."""
        embeds, valid = self.encoder.embed_prefix(obs, instructions)
        b = embeds.shape[0]
        slots = self.action_queries.weight.unsqueeze(0).expand(b, -1, -1).to(embeds.dtype)
        embeds = torch.cat([embeds, slots], dim=1)
        valid = torch.cat([valid, torch.ones(b, self.num_slots, dtype=torch.bool, device=valid.device)], dim=1)
        hidden = self.encoder.run(embeds, valid, self.num_slots)[:, -self.num_slots:]
        return self.action_head(hidden).float(), hidden


class TokenPolicy(nn.Module, PolicyFamily):
    """act / log_prob / hidden / sft_loss / save / load / reference, as the RL scripts call them."""

    config_class = TokenPolicyConfig

    @classmethod
    def memory_model(cls, policy_cfg: TokenPolicyConfig, folder: Optional[str]) -> Model:
        """The memory plan's view of this family (models/memory.py): the policy of `policy_cfg` on the meta device,
        with the architecture of the saved policy in `folder` when there is one (its config.json + hf_configs.json;
        the run's LoRA and precision keys kept), or of backbone_path / vision_path's config.json; its stacks: the
        SigLIP tower (when used), the projector and the LM over the image, instruction and action tokens."""
        cfg, lm_cfg, vis_cfg = policy_cfg, None, None
        if folder and os.path.isfile(os.path.join(folder, "hf_configs.json")):
            saved, lm_cfg, vis_cfg, _ = read_checkpoint(folder)
            keep = {k: getattr(cfg, k) for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_vision", "bf16")}
            cfg = dataclasses.replace(type(cfg)(**saved), **keep)
        else:
            if cfg.backbone_path:
                from transformers import AutoConfig

                lm_cfg = AutoConfig.from_pretrained(cfg.backbone_path)
            if cfg.vision_path:
                from transformers import SiglipVisionConfig

                vis_cfg = SiglipVisionConfig.from_pretrained(cfg.vision_path, vision_use_head=False)
        built = dataclasses.replace(cfg, backbone_path=None, vision_path=None)  # architecture from the configs only
        with torch.device("meta"):
            policy = cls(built, _hf=(lm_cfg, vis_cfg, None))
        net, enc = policy.net, policy.core.encoder
        lm = enc.backbone.config
        head_dim = getattr(lm, "head_dim", None) or lm.hidden_size // lm.num_attention_heads
        views = 2 if cfg.use_wrist else 1
        stacks = []
        vision_grad = trainable(net, r"encoder\.vision\.")
        if enc.use_siglip:
            vc = enc.vision.config
            patches = (cfg.image_size // vc.patch_size) ** 2
            stacks.append(tuned(net, Stack("SigLIP", "vit", vc.num_hidden_layers, vc.hidden_size, vc.intermediate_size,
                                           vc.hidden_size, vc.hidden_size, patches * views, grad=vision_grad),
                                r"encoder\.vision\..*layers\.", False))
        else:
            patches = (cfg.image_size // 16) ** 2 + 1  # SmallCNN: patch tokens + one keypoint token (its convs: small)
        front = vision_grad or trainable(net, r"encoder\.projector") or trainable(net, r"encoder\.state_proj")
        stacks.append(tuned(net, Stack("projector", "mlp", 1, enc.vision.config.hidden_size if enc.use_siglip else
                                       lm.hidden_size, lm.hidden_size, tokens=patches * views, grad=front),
                            r"encoder\.projector\.", False))
        tokens = patches * views + 1 + cfg.max_text_len + cfg.action_chunk * ACTION_DIM
        stacks.append(tuned(net, Stack(type(enc.backbone).__name__.replace("Model", ""), "decoder",
                                       lm.num_hidden_layers, lm.hidden_size, lm.intermediate_size,
                                       lm.num_attention_heads * head_dim, lm.num_key_value_heads * head_dim, tokens,
                                       grad=front or trainable(net, r"encoder\.backbone\.")),
                            r"encoder\.backbone\.layers\.", False))
        for s in stacks:  # bf16 autocast on CUDA: the residual stream is bf16 (projector output), norm outputs float32
            s.residual = 2
        return Model(f"token ({cfg.preset})", net, stacks, policy.hidden_size,
                     [f"{tokens} LM tokens per sample ({views} camera(s), {cfg.max_text_len} instruction tokens)"],
                     policy_cfg=policy_cfg)

    def __init__(self, cfg: Optional[TokenPolicyConfig] = None, action_tokenizer: Optional[ActionTokenizer] = None,
                 _hf=(None, None, None)):
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else TokenPolicyConfig()
        if cfg.action_chunk < 1:
            raise ValueError(f"action_chunk must be >= 1, got {cfg.action_chunk}")
        self.action_tokenizer = action_tokenizer or ActionTokenizer(n_bins=cfg.n_bins)
        if self.action_tokenizer.n_bins != cfg.n_bins:
            raise ValueError(f"action tokenizer has {self.action_tokenizer.n_bins} bins, config has {cfg.n_bins}")
        core = TokenCore(cfg, *_hf)
        self.net = wrap_lora(core, cfg, core.encoder.use_siglip, TRAINABLE_WITH_LORA) if cfg.lora_rank > 0 else core
        self.hidden_size = core.encoder.hidden_size
        self.action_chunk = cfg.action_chunk

    @property
    def core(self) -> TokenCore:
        return unwrap(self.net)

    @property
    def device(self) -> torch.device:
        return self.core.encoder.device

    def _forward(self, obs: Obs, instructions: Optional[Sequence[str]]) -> Tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.device, self.cfg.bf16):
            return self.core(obs, instructions)

    @torch.no_grad()
    def act(self, obs: Obs, instructions: Optional[Sequence[str]] = None, temperature: float = 1.0,
            greedy: bool = False, return_hidden: bool = False,
            generators: Optional[Sequence[torch.Generator]] = None):
        """-> actions (B, chunk, 7) float32 numpy, tokens (B, chunk*7) long, log_probs (B, chunk*7) float
        (log-softmax of logits / temperature, also for greedy), and the pooled hidden (B, D) if `return_hidden`.
        `generators` (B CPU generators): row i's sample draws from generators[i] instead of the global RNG."""
        check_temperature(temperature)
        logits, hidden = self._forward(obs, instructions)
        scaled = logits / temperature
        if greedy:
            tokens = scaled.argmax(-1)
        else:
            tokens = sample_categorical(scaled, generators)
        log_probs = scaled.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        actions = self.action_tokenizer.decode(tokens.view(-1, self.action_chunk, ACTION_DIM))
        if return_hidden:
            return actions, tokens, log_probs, hidden.float().mean(1)
        return actions, tokens, log_probs

    def log_prob(self, obs: Obs, instructions: Optional[Sequence[str]], tokens: torch.Tensor,
                 temperature: float = 1.0, return_hidden: bool = False):
        """Log-probs and entropies (B, chunk*7) of `tokens` under softmax(logits / temperature), with gradients
        (+ pooled hidden (B, D) if `return_hidden`)."""
        check_temperature(temperature)
        logits, hidden = self._forward(obs, instructions)
        tokens = self._check_tokens(tokens, logits.shape[0])
        logp_all = (logits / temperature).log_softmax(-1)
        log_probs = logp_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        if return_hidden:
            return log_probs, entropy, hidden.float().mean(1)
        return log_probs, entropy

    def hidden(self, obs: Obs, instructions: Optional[Sequence[str]] = None) -> torch.Tensor:
        """Pooled features (B, hidden_size) for a value head: the mean of the action slots' last hidden states."""
        return self._forward(obs, instructions)[1].float().mean(1)

    def sft_loss(self, obs: Obs, instructions: Optional[Sequence[str]], actions) -> Tuple[torch.Tensor, Dict]:
        """Cross-entropy on the tokenised demo actions (B, chunk, 7) -> (loss, {"sft/loss", "sft/token_accuracy"})."""
        logits, _ = self._forward(obs, instructions)
        return token_cross_entropy(logits, actions, self.action_tokenizer, self.action_chunk)

    def reference(self):
        """Context manager running the frozen pre-LoRA model (peft `disable_adapter()`); ValueError without LoRA."""
        return reference_context(self.net)

    def save(self, path: str) -> None:
        """Weights (safetensors), config, architecture configs, action statistics and instruction tokenizer."""
        save_policy_files(path, self.net, self.cfg, self.core.encoder, self.action_tokenizer)

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu") -> "TokenPolicy":
        """Rebuild from `save` (no download). `lora_rank` different from the saved one: merge the saved LoRA into
        the base weights, then add fresh LoRA of that rank (0 = full fine-tuning); the reference becomes the loaded
        model."""
        return rebuild_policy(cls, TokenPolicyConfig, path, lora_rank, device)

    def set_lora_rank(self, lora_rank: int) -> None:
        """Merge any LoRA into the base weights, then add fresh LoRA of `lora_rank` (0 = none, full fine-tuning)."""
        replace_lora(self, lora_rank, TRAINABLE_WITH_LORA)

    def _check_tokens(self, tokens: torch.Tensor, batch: int) -> torch.Tensor:
        n = self.action_chunk * ACTION_DIM
        tokens = torch.as_tensor(tokens, device=self.device)
        if tokens.shape[0] != batch or tokens[0].numel() != n:
            raise ValueError(f"tokens have shape {tuple(tokens.shape)}; expected ({batch}, {n}) or ({batch}, "
                             f"{self.action_chunk}, 7)")
        tokens = tokens.reshape(batch, n).long()
        lo, hi = torch.stack(torch.aminmax(tokens)).tolist()  # one host sync
        if lo < 0 or hi >= self.cfg.n_bins:
            raise ValueError(f"token ids must lie in [0, {self.cfg.n_bins}), got [{lo}, {hi}]")
        return tokens


def token_cross_entropy(logits: torch.Tensor, actions, action_tokenizer, chunk: int) -> Tuple[torch.Tensor, Dict]:
    """Cross-entropy of logits (B, chunk*7, n_bins) on the demo actions (B, chunk, 7) tokenised by `action_tokenizer`
    -> (loss, {"sft/loss", "sft/token_accuracy"}): every token family's SFT loss."""
    b = logits.shape[0]
    if tuple(actions.shape) != (b, chunk, ACTION_DIM):
        raise ValueError(f"actions have shape {tuple(actions.shape)}; expected ({b}, {chunk}, 7)")
    target = action_tokenizer.encode(actions).to(logits.device).view(b, -1)
    loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
    acc = (logits.argmax(-1) == target).float().mean()
    return loss, {"sft/loss": loss.item(), "sft/token_accuracy": acc.item()}


def sample_categorical(logits: torch.Tensor, generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
    """One draw per row of softmax(logits) (..., K) by inverse CDF (one uniform per row; much faster on CPU than
    torch.multinomial, which draws K exponentials per row). `generators`: one CPU generator per batch row (dim 0)
    for its uniforms, so a row's draw does not depend on the other rows."""
    cdf = logits.softmax(-1).cumsum(-1)
    shape = cdf.shape[:-1] + (1,)
    if generators is None:
        u = torch.rand(shape, device=cdf.device)
    else:
        if len(generators) != shape[0]:
            raise ValueError(f"need one generator per row: {shape[0]} rows, {len(generators)} generators")
        u = torch.stack([torch.rand(shape[1:], generator=g) for g in generators]).to(cdf.device)
    u = u * cdf[..., -1:]
    return torch.searchsorted(cdf, u).squeeze(-1).clamp(max=logits.shape[-1] - 1)


def check_temperature(temperature: float) -> None:
    """ValueError unless `temperature` > 0 (sampling divides the logits by it)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def count_parameters(module: nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


__all__ = ["TokenPolicy", "TokenPolicyConfig", "TokenCore", "count_parameters"]
