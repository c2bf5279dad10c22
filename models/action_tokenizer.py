"""Action normalisation and 256-bin discretisation (OpenVLA style), shared by the token and flow policies.

Per dimension, actions are mapped from [low, high] (1st/99th percentile of demo actions; identity [-1, 1] by default)
to [-1, 1], clipped, and cut into `n_bins` uniform bins. The gripper (last dim) is never normalised and, with
`binarize_gripper` (default), decodes to exactly -1 (open) or +1 (close): bins below the middle -> -1, above -> +1.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Union

import numpy as np
import torch

ACTION_DIM = 7
ArrayLike = Union[np.ndarray, torch.Tensor]


class ActionTokenizer:
    """Maps (..., 7) actions <-> (..., 7) integer bin ids in [0, n_bins); also normalises for the flow policy."""

    def __init__(self, low: Optional[ArrayLike] = None, high: Optional[ArrayLike] = None, n_bins: int = 256,
                 binarize_gripper: bool = True):
        if n_bins < 2:
            raise ValueError(f"n_bins must be >= 2, got {n_bins}")
        self.n_bins = int(n_bins)
        self.binarize_gripper = bool(binarize_gripper)
        self.low = np.full(ACTION_DIM, -1.0, np.float64) if low is None else np.asarray(low, np.float64).copy()
        self.high = np.full(ACTION_DIM, 1.0, np.float64) if high is None else np.asarray(high, np.float64).copy()
        if self.low.shape != (ACTION_DIM,) or self.high.shape != (ACTION_DIM,):
            raise ValueError(f"low/high must have shape ({ACTION_DIM},), got {self.low.shape} and {self.high.shape}")
        if np.any(self.high <= self.low):
            raise ValueError(f"need high > low in every dim, got low={self.low.tolist()} high={self.high.tolist()}")
        if self.binarize_gripper:
            self.low[-1], self.high[-1] = -1.0, 1.0

    @classmethod
    def fit(cls, actions: ArrayLike, n_bins: int = 256, binarize_gripper: bool = True) -> "ActionTokenizer":
        """Statistics from demo actions (..., 7): per-dim 1st/99th percentiles (a constant dim gets +-1e-3 width)."""
        a = _as_numpy(actions).reshape(-1, ACTION_DIM) if _last_dim(actions) == ACTION_DIM else None
        if a is None or a.shape[0] == 0:
            raise ValueError(f"fit needs a non-empty array of shape (..., {ACTION_DIM}), got {tuple(actions.shape)}")
        low, high = np.percentile(a, 1, axis=0), np.percentile(a, 99, axis=0)
        flat = high - low < 1e-6
        low[flat], high[flat] = low[flat] - 1e-3, high[flat] + 1e-3
        return cls(low, high, n_bins, binarize_gripper)

    # ---- continuous normalisation (flow policy) ----
    def normalize(self, actions: ArrayLike) -> torch.Tensor:
        """Actions (..., 7) in env units -> float32 tensor in [-1, 1] (clipped)."""
        a = _as_float_tensor(actions)
        low, high = self._stats(a)
        return (2.0 * (a - low) / (high - low) - 1.0).clamp(-1.0, 1.0)

    def unnormalize(self, x: ArrayLike) -> np.ndarray:
        """Normalised (..., 7) -> env actions as float32 numpy, clipped to [-1, 1]; gripper -> +-1 if binarised."""
        x = _as_float_tensor(x).clamp(-1.0, 1.0)
        low, high = self._stats(x)
        a = (x + 1.0) / 2.0 * (high - low) + low
        if self.binarize_gripper:
            a[..., -1] = torch.where(x[..., -1] > 0, 1.0, -1.0)
        return a.clamp(-1.0, 1.0).detach().cpu().numpy().astype(np.float32)

    # ---- discrete tokens (token policy) ----
    def encode(self, actions: ArrayLike) -> torch.Tensor:
        """Actions (..., 7) -> long tensor of bin ids in [0, n_bins), same shape."""
        x = self.normalize(actions)
        return ((x + 1.0) / 2.0 * self.n_bins).floor().long().clamp(0, self.n_bins - 1)

    def decode(self, tokens: ArrayLike) -> np.ndarray:
        """Bin ids (..., 7) -> float32 numpy actions at the bin centres (gripper exactly +-1 if binarised)."""
        t = torch.as_tensor(tokens)
        if _last_dim(t) != ACTION_DIM:
            raise ValueError(f"tokens must have shape (..., {ACTION_DIM}), got {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= self.n_bins):
            raise ValueError(f"token ids must lie in [0, {self.n_bins}), got [{int(t.min())}, {int(t.max())}]")
        centres = -1.0 + (t.float() + 0.5) * (2.0 / self.n_bins)
        return self.unnormalize(centres)

    # ---- persistence ----
    def state_dict(self) -> dict:
        return {"low": self.low.tolist(), "high": self.high.tolist(), "n_bins": self.n_bins,
                "binarize_gripper": self.binarize_gripper}

    @classmethod
    def from_state_dict(cls, d: dict) -> "ActionTokenizer":
        return cls(d["low"], d["high"], d["n_bins"], d["binarize_gripper"])

    def save(self, path: str) -> None:
        """Write the statistics as JSON (a file path, or a directory -> action_stats.json)."""
        if os.path.isdir(path):
            path = os.path.join(path, "action_stats.json")
        with open(path, "w") as f:
            json.dump(self.state_dict(), f, indent=2)

    @classmethod
    def load(cls, path: str) -> "ActionTokenizer":
        if os.path.isdir(path):
            path = os.path.join(path, "action_stats.json")
        with open(path) as f:
            return cls.from_state_dict(json.load(f))

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if _last_dim(like) != ACTION_DIM:
            raise ValueError(f"actions must have shape (..., {ACTION_DIM}), got {tuple(like.shape)}")
        low = torch.as_tensor(self.low, dtype=like.dtype, device=like.device)
        return low, torch.as_tensor(self.high, dtype=like.dtype, device=like.device)


def _last_dim(x: ArrayLike) -> int:
    return int(x.shape[-1]) if len(x.shape) else -1


def _as_numpy(x: ArrayLike) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _as_float_tensor(x: ArrayLike) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.float()
    return torch.as_tensor(np.asarray(x, dtype=np.float32))
