"""Masked reductions and the input checks every loss and advantage uses (verl_F's masked_mean / masked_sum): token
tensors are (B, L), masks bool or 0/1 (or weight) floats of the same shape. Pure functions."""
from __future__ import annotations

from typing import Optional

import torch


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise a ValueError that names every shape unless all the given tensors have the same shape."""
    if len({tuple(t.shape) for t in tensors.values()}) > 1:
        raise ValueError("shapes must match, got " + ", ".join(f"{k} {tuple(t.shape)}" for k, t in tensors.items()))


def check_ndim(ndim: int, **tensors: torch.Tensor) -> None:
    """Raise a ValueError naming the shape unless every given tensor has `ndim` dimensions."""
    for name, t in tensors.items():
        if t.ndim != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")


def as_float(t: torch.Tensor) -> torch.Tensor:
    """`t` itself if floating point, else `t` in torch's default float dtype."""
    return t if t.is_floating_point() else t.to(torch.get_default_dtype())


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """sum(values * mask) over all elements or `dim`; entries where mask == 0 are ignored even if NaN/inf (verl_F)."""
    check_same_shape(values=values, mask=mask)
    values = as_float(values)
    weights = mask.to(values.dtype)
    terms = torch.where(weights != 0, values * weights, torch.zeros((), dtype=values.dtype, device=values.device))
    return terms.sum() if dim is None else terms.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    """sum(values * mask) / sum(mask) (verl_F.masked_mean); a mask summing to 0 gives 0, never NaN."""
    total = masked_sum(values, mask, dim)
    weights = mask.to(total.dtype)
    count = weights.sum() if dim is None else weights.sum(dim)
    nonzero = count != 0
    return torch.where(nonzero, total / torch.where(nonzero, count, torch.ones_like(count)), torch.zeros_like(total))


def on_host(t: torch.Tensor) -> bool:
    """Whether a value check on `t` is free: on the CPU it is; on an accelerator `bool(tensor)` waits for the device,
    once per micro-batch, so the losses check their inputs' values only where that costs nothing (the CPU runs and
    the tests); shapes and dtypes are checked everywhere."""
    return t.device.type == "cpu"
