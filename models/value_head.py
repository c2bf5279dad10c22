"""Critic for GAE-PPO (as the OpenVLA GAE-PPO reference): an MLP on the policy's pooled hidden state,
in_dim -> hidden_dims -> 1 (the reference: 1024, 512, ReLU)."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from models.configs import ValueHeadConfig


ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}  # value_head.activation
INITS = ("small_last", "torch", "rlinf")  # value_head.init


class ValueHead(nn.Module):
    """(B, in_dim) features -> (B,) values; an MLP (value_head.activation between the layers, GELU by default), its
    weights initialised as value_head.init says (default: the last layer small, so values start near 0)."""

    def __init__(self, in_dim: int, cfg: ValueHeadConfig | None = None):
        super().__init__()
        cfg = cfg if cfg is not None else ValueHeadConfig()
        if in_dim < 1 or any(h < 1 for h in cfg.hidden_dims):
            raise ValueError(f"in_dim and hidden_dims must be >= 1, got in_dim={in_dim}, hidden_dims={cfg.hidden_dims}")
        if cfg.activation not in ACTIVATIONS:
            raise ValueError(f"value_head.activation must be one of {sorted(ACTIVATIONS)}, got {cfg.activation!r}")
        if cfg.init not in INITS:
            raise ValueError(f"value_head.init must be one of {INITS}, got {cfg.init!r}")
        layers: List[nn.Module] = []
        dims = [in_dim] + list(cfg.hidden_dims)
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), ACTIVATIONS[cfg.activation]()]
            layers += [nn.Dropout(cfg.dropout)] if cfg.dropout > 0 else []
        last = nn.Linear(dims[-1], 1)
        if cfg.init == "small_last":
            nn.init.normal_(last.weight, std=0.01)
            nn.init.zeros_(last.bias)
        elif cfg.init == "rlinf":  # RLinf rlinf/models/embodiment/modules/value_head.py:52-64@a3816b5
            for m in layers:
                if isinstance(m, nn.Linear):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity=cfg.activation)
                    nn.init.zeros_(m.bias)
            nn.init.normal_(last.weight, std=0.02)
            nn.init.zeros_(last.bias)
        self.net = nn.Sequential(*layers, last)
        self.in_dim = in_dim

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, in_dim) -> (B,); (B, S, in_dim) -> (B,), the mean of the S values (a pi0 policy with value_input
        expert records its features at each of S denoising steps: RLinf's rollout value is their values' mean)."""
        if hidden.ndim not in (2, 3) or hidden.shape[-1] != self.in_dim:
            raise ValueError(f"value head input has shape {tuple(hidden.shape)}; expected (B, {self.in_dim}) or "
                             f"(B, S, {self.in_dim})")
        values = self.net(hidden.float()).squeeze(-1)
        return values.mean(-1) if hidden.ndim == 3 else values
