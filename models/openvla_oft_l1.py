"""OpenVLA-OFT's L1-regression checkpoints (the OFT paper's `moojink/openvla-7b-oft-finetuned-libero-*`), loaded
natively for evaluation and SFT. Facts and sources: ../shared/specs/openvla_oft.md sections 1a, 1e, 3e.

Folder layout (as published): the discrete variant's files (config.json, safetensors shards + index,
dataset_statistics.json, tokenizer; models/openvla_oft.py reads them) plus
  action_head--<step>_checkpoint.pt        L1RegressionActionHead: MLPResNet(2 blocks, 7 x LM width -> LM width -> 7)
  proprio_projector--<step>_checkpoint.pt  ProprioProjector: Linear(8, D), GELU, Linear(D, D) (optional)
torch state dicts saved from DDP (keys prefixed `module.`, stripped on load as openvla-oft's
`load_component_state_dict`). A folder holding an `action_head--*checkpoint*` file is this family
(models/policy.py `family_of_folder`); nothing else in the folder says how it was trained, so:
  - proprio is used when a proprio_projector file is there (`policy.use_proprio` overrides);
  - the number of images is 2 (agentview + wrist, the setting every published L1 LIBERO checkpoint was trained
    with: run_libero_eval.py `num_images_in_input=2`); `policy.num_images=1` for a checkpoint trained on one.

Forward: the images' patches (agentview first, then wrist), then the proprio token (the projector of the 8-d state
normalised with the checkpoint's proprio q01/q99 and clipped to [-1, 1], as openvla-oft's `normalize_proprio`), then
the same prompt, 56 zero slots and </s> as the discrete variant; the last-layer hidden states at the 56 shifted action
positions, 7 per chunk step concatenated, go through the head -> (B, 8, 7) normalised actions, un-normalised with the
checkpoint's action statistics and the gripper converted to LIBERO's sign (OFTActionTokenizer.to_env).
The 8-d proprio is the env's `state`: eef xyz, eef axis-angle, 2 gripper finger positions, built on LIBERO exactly as
run_libero_eval.py builds it (envs/libero.py); tabletop's state has the same layout (eef xyz in table units,
axis-angle always 0, fingers +-0.04 open / 0 closed), which a LIBERO checkpoint's statistics do not describe.

The head regresses actions: there are no tokens and no log-probs, so RL (every RL script here needs one or the
other) refuses this family in one line (`no_rl_message`). `act` returns (B, 0) tokens and log-probs so the rollout
code records nothing for them; greedy and sampled acting are the same deterministic action.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models.action_tokenizer import ACTION_DIM
from models.configs import OpenVLAOFTL1Config
from models.openvla_oft import (ACTION_CHUNK, PROPRIO_DIM, OpenVLAOFTPolicy, ProprioProjector, as_numpy,  # noqa: F401
                                load_component, save_component, weights_dtype)
from models.saved import HEAD, PROPRIO, PolicyLoadError, component_files, no_rl_message


class ResidualBlock(nn.Module):
    """x + ReLU(Linear(LayerNorm(x))) (`ffn.0` LayerNorm, `ffn.1` Linear, as the published keys)."""

    def __init__(self, dim: int):
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    """fc2(LN2(blocks(ReLU(fc1(LN1(x)))))), under the published key names."""

    def __init__(self, in_dim: int, width: int, out_dim: int, num_blocks: int = 2):
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(in_dim)
        self.fc1 = nn.Linear(in_dim, width)
        self.mlp_resnet_blocks = nn.ModuleList([ResidualBlock(width) for _ in range(num_blocks)])
        self.layer_norm2 = nn.LayerNorm(width)
        self.fc2 = nn.Linear(width, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1ActionHead(nn.Module):
    """(B, 56, D) action-position hidden states -> (B, 8, 7) normalised actions: the 7 states of each chunk step
    concatenated (time-major) through one MLPResNet. State-dict keys `model.*`, as the published file less `module.`."""

    def __init__(self, llm_dim: int):
        super().__init__()
        self.model = MLPResNet(ACTION_DIM * llm_dim, llm_dim, ACTION_DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.model(h.reshape(h.shape[0], ACTION_CHUNK, -1))


class OpenVLAOFTL1Policy(OpenVLAOFTPolicy):
    """The discrete policy's model, image pipeline, LoRA, save and load, plus the L1 head and proprio projector:
    act / sft_loss (L1 on normalised demo actions) / hidden / save / load / reference; no log-probs."""

    config_class = OpenVLAOFTL1Config
    l1 = True

    def paper_protocol(self) -> str:
        """openvla-oft's own evaluation: the L1-regression checkpoints are the OpenVLA-OFT paper's."""
        return "openvla-oft"

    @classmethod
    def _meta_heads(cls, net: nn.Module, core: nn.Module, cfg: OpenVLAOFTL1Config, folder: str) -> Tuple[int, int]:
        """The memory plan's network (OpenVLAOFTPolicy.memory_model) with the L1 head and, when used, the proprio
        projector (one more Llama token); the camera images per sample."""
        proprio = bool(component_files(folder, PROPRIO)) if cfg.use_proprio is None else bool(cfg.use_proprio)
        with torch.device("meta"):
            net.add_module("action_head", L1ActionHead(core.hidden_size).to(weights_dtype(cfg)))
        return super()._meta_heads(net, core, dataclasses.replace(cfg, use_proprio=proprio), folder)

    @classmethod
    def _projector_dtype(cls, cfg: OpenVLAOFTL1Config) -> torch.dtype:
        return weights_dtype(cfg)  # the published dtype with bf16_weights (evaluation and SFT)

    def __init__(self, cfg: OpenVLAOFTL1Config, _load_weights: bool = True):
        folder = cfg.init_path
        heads, projectors = component_files(folder, HEAD), component_files(folder, PROPRIO)
        if not heads:
            raise PolicyLoadError(f"{folder} has no {HEAD}--*_checkpoint.pt: not an L1-regression OpenVLA-OFT "
                                  f"checkpoint folder (a discrete one loads as policy.type=openvla_oft)")
        if len(heads) != 1 or len(projectors) > 1:
            raise PolicyLoadError(f"{folder} holds {heads + projectors}: expected one {HEAD}--*_checkpoint.pt and at "
                                  f"most one {PROPRIO}--*_checkpoint.pt")
        if component_files(folder, "noisy_action_projector"):
            raise PolicyLoadError(f"{folder} is a diffusion-head OpenVLA-OFT checkpoint (noisy_action_projector); only "
                                  f"the L1-regression and discrete variants load")
        use_proprio = bool(projectors) if cfg.use_proprio is None else bool(cfg.use_proprio)
        if use_proprio and not projectors:
            raise PolicyLoadError(f"policy.use_proprio=true but {folder} has no {PROPRIO}--*_checkpoint.pt")
        super().__init__(dataclasses.replace(cfg, use_proprio=use_proprio), _load_weights)  # + the proprio projector
        self.files[HEAD] = heads[0]
        self.action_head = L1ActionHead(self.hidden_size).to(weights_dtype(cfg))
        load_component(self.action_head, os.path.join(folder, heads[0]))

    def normalize_actions(self, actions) -> torch.Tensor:
        """Env actions (..., 7) -> the head's targets: q01/q99-normalised and clipped where mask; gripper from
        LIBERO's -1 open / +1 close to 1 - clip(g, 0, 1) (openvla-oft's libero_dataset_transform)."""
        a = np.asarray(as_numpy(torch.as_tensor(actions).detach()), np.float64).copy()
        if a.shape[-1] != ACTION_DIM:
            raise ValueError(f"actions must have shape (..., {ACTION_DIM}), got {a.shape}")
        a[..., -1] = 1.0 - np.clip(a[..., -1], 0.0, 1.0)
        tok = self.action_tokenizer
        x = np.where(tok.mask, np.clip(2.0 * (a - tok.q01) / (tok.q99 - tok.q01 + 1e-8) - 1.0, -1.0, 1.0), a)
        return torch.as_tensor(x, dtype=torch.float32)

    def _features(self, obs, instructions) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> (action-position hidden states (B, 56, D), hidden state at the last prompt position (B, D))."""
        return self._run(obs, instructions, action_hidden=True)

    def predict(self, obs, instructions: Optional[Sequence[str]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """-> (normalised actions (B, 8, 7) float32 with gradients, last-prompt hidden state (B, D))."""
        h, hidden = self._features(obs, instructions)
        return self.action_head(h.to(self.action_head.model.fc1.weight.dtype)).float(), hidden

    @torch.no_grad()
    def act(self, obs, instructions: Optional[Sequence[str]] = None, temperature: float = 1.0,
            greedy: bool = False, return_hidden: bool = False,
            generators: Optional[Sequence[torch.Generator]] = None):
        """-> actions (B, 8, 7) float32 numpy (env units), empty tokens (B, 0) and log-probs (B, 0) (a regression
        head has neither) [+ hidden (B, D)]. Deterministic: `temperature`, `greedy` and `generators` change nothing."""
        normalized, hidden = self.predict(obs, instructions)
        b = normalized.shape[0]
        actions = self.action_tokenizer.to_env(normalized.cpu().numpy())
        tokens = torch.zeros(b, 0, dtype=torch.long)
        log_probs = torch.zeros(b, 0)
        if return_hidden:
            return actions, tokens, log_probs, hidden.float()
        return actions, tokens, log_probs

    def log_prob(self, *args, **kwargs):
        raise ValueError(no_rl_message(self.cfg.init_path or "this policy"))

    def hidden(self, obs, instructions: Optional[Sequence[str]] = None) -> torch.Tensor:
        return self._features(obs, instructions)[1].float()

    def sft_loss(self, obs, instructions: Optional[Sequence[str]], actions) -> Tuple[torch.Tensor, Dict]:
        """openvla-oft's L1 loss: mean |head(hidden) - normalised demo actions| over (B, 8, 7) ->
        (loss, {"sft/loss", "sft/l1_env": mean absolute error in env units after un-normalising})."""
        pred, _ = self.predict(obs, instructions)
        target = self.normalize_actions(actions).to(pred.device)
        if target.shape != pred.shape:
            raise ValueError(f"actions have shape {tuple(target.shape)}; expected {tuple(pred.shape)}")
        loss = F.l1_loss(pred, target)
        tok = self.action_tokenizer
        with torch.no_grad():
            err = np.abs(tok.unnormalize(pred.detach().cpu().numpy()) - tok.unnormalize(target.cpu().numpy()))
        return loss, {"sft/loss": loss.item(), "sft/l1_env": float(err.mean())}

    def save(self, path: str) -> None:
        """The discrete variant's files + the head (and proprio projector) under their published names."""
        super().save(path)  # + the proprio projector
        save_component(self.action_head, os.path.join(path, self.files[HEAD]))


__all__ = ["OpenVLAOFTL1Config", "OpenVLAOFTL1Policy", "L1ActionHead", "ProprioProjector"]
