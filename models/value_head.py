"""Critic for GAE-PPO (as the OpenVLA GAE-PPO reference): an MLP on the policy's pooled hidden state,
in_dim -> 1024 -> 512 -> 1."""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from models.configs import ValueHeadConfig




class ValueHead(nn.Module):
    """(B, in_dim) features -> (B,) values; GELU MLP, last layer initialised to output ~0 (small weights, 0 bias)."""

    def __init__(self, in_dim: int, cfg: ValueHeadConfig | None = None):
        super().__init__()
        cfg = cfg if cfg is not None else ValueHeadConfig()
        if in_dim < 1 or any(h < 1 for h in cfg.hidden_dims):
            raise ValueError(f"in_dim and hidden_dims must be >= 1, got in_dim={in_dim}, hidden_dims={cfg.hidden_dims}")
        layers: List[nn.Module] = []
        dims = [in_dim] + list(cfg.hidden_dims)
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.GELU()] + ([nn.Dropout(cfg.dropout)] if cfg.dropout > 0 else [])
        last = nn.Linear(dims[-1], 1)
        nn.init.normal_(last.weight, std=0.01)
        nn.init.zeros_(last.bias)
        self.net = nn.Sequential(*layers, last)
        self.in_dim = in_dim

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if hidden.ndim != 2 or hidden.shape[1] != self.in_dim:
            raise ValueError(f"value head input has shape {tuple(hidden.shape)}; expected (B, {self.in_dim})")
        return self.net(hidden.float()).squeeze(-1)
