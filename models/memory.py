"""What a policy family tells the memory plan (common/memory_plan.py) about itself: its network on the meta device
(the parameter groups: shapes, dtypes, trainable flags, no weights) and the transformer stacks one sample pushes
through it (the activations). A family's class answers `memory_model(policy_cfg, folder)` with a `Model` (models/
policy.py PolicyFamily; None: the family gives no plan, and --dry-run says so in one line); the plan's arithmetic on
it is the family-free part, in common/memory_plan.py."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, List, Tuple


@dataclass
class Stack:
    """A run of identical transformer layers (or one MLP) and what one sample pushes through it."""
    name: str
    kind: str  # decoder (RMSNorm, gated MLP) | vit (LayerNorm, GELU MLP) | mlp (one projector: hidden -> inter...)
    layers: int
    hidden: int
    inter: int  # MLP width (mlp: the summed widths of its hidden layers)
    attn: int = 0  # query / attention-output width (heads x head_dim)
    kv: int = 0  # key / value width (kv heads x head_dim)
    tokens: int = 0  # per sample
    grad: bool = True  # a trainable parameter in or upstream: its activations are saved for the backward
    lora_inputs: int = 0  # summed input widths of one layer's LoRA linears (LoRA keeps its own bf16 input copies)
    residual: int = 2  # bytes per element of the residual stream (float32 weights: 4)
    cast_inputs: bool = False  # the norm output is float32 under autocast: every linear makes its own bf16 copy
    frozen_fp32: int = 0  # frozen float32 Linear / Conv elements (autocast casts them per use)
    extra_keys: int = 0  # tokens of another stack this one attends to (pi0's expert: the prefix's keys / values)
    checkpointed: bool = False


@dataclass
class Model:
    """A policy (or other network) on the meta device, what the plan reads of it."""
    label: str
    net: Any
    stacks: List[Stack]
    hidden_size: int = 0
    notes: List[str] = field(default_factory=list)
    unused: Tuple[str, ...] = ()  # names of parameters the forward never reads: no gradient, no AdamW state
    policy_cfg: Any = None  # the family config it was built from (LoRA rank, precision)
    variant: str = ""  # what trains, when the family says more than "LoRA r=N" / "full fine-tuning"


def under(net: Any, pattern: str) -> List[Tuple[str, Any]]:
    """The (name, parameter) pairs of `net` whose name matches the regular expression `pattern`."""
    return [(n, p) for n, p in net.named_parameters() if re.search(pattern, n)]


def trainable(net: Any, pattern: str) -> bool:
    return any(p.requires_grad for _, p in under(net, pattern))


def frozen_fp32(net: Any, pattern: str) -> int:
    """Frozen float32 Linear / Conv elements of the modules under `pattern` (autocast casts them per use)."""
    import torch

    total = 0
    for name, m in net.named_modules():
        if re.search(pattern, name + ".") and isinstance(m, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d)):
            total += sum(p.numel() for p in m.parameters(recurse=False)
                         if not p.requires_grad and p.dtype == torch.float32)
    return total


def lora_inputs(net: Any, pattern: str, layers: int) -> int:
    """Summed input widths of the LoRA A matrices under `pattern`, per layer."""
    total = sum(p.shape[1] for n, p in under(net, pattern) if ".lora_A." in n and n.endswith(".weight"))
    return total // max(1, layers)


def tuned(net: Any, stack: Stack, pattern: str, bf16_weights: bool) -> Stack:
    """Fill a stack's LoRA, residual and frozen-weight fields from the meta model (its layers under `pattern`)."""
    stack.lora_inputs = lora_inputs(net, pattern, stack.layers)
    stack.residual = 2 if bf16_weights else 4
    stack.cast_inputs = not bf16_weights
    stack.frozen_fp32 = frozen_fp32(net, pattern)
    return stack


__all__ = ["Stack", "Model", "under", "trainable", "frozen_fp32", "lora_inputs", "tuned"]
