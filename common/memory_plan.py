"""The memory plan: what a training run holds on each GPU, computed before anything loads, from the script's config and
the checkpoint's config.json alone (the policy is built on the meta device: shapes, dtypes and trainable flags, no
weights read, no memory taken). The policy is its family's own description (its class's `memory_model`,
models/memory.py: the network on the meta device and the transformer stacks a sample passes); this module does the
family-free arithmetic on it, and says so in one line for a family that gives none. Every script prints it at its start
(`check`, main process) and stops in one line naming the fixes when it exceeds the device; `--dry-run` prints it and
exits (`dry_run`, called by every script's main), on a machine without a GPU too (`--device-memory-gib 80` checks
against that size, `--processes 8` plans for 8 processes). docs/scale.md lists the plans of the shipped recipes and
checks this model against the measured peaks of docs/gpu.md (`tests/memory_plan_check.py` prints that comparison).

The model, per process and in bytes (W, T = all and trainable parameters, at the dtypes the policy keeps them in):
  ddp           weights W; gradients T (their dtype); AdamW moments 2 T (+ a 4-byte step per tensor): the fused
                kernel on CUDA (common/train.py `adamw`) adds nothing while it steps; with several processes the flat
                all-reduce (common/train.py average_gradients) holds two more fp32 copies of the gradients in the step
  fsdp over N   weight shards W/N, moment shards 2 T/N, gradient shards T/N, plus the gathered compute weights (bf16
                on CUDA: 2 bytes x every parameter) and their full-size bf16 gradients during the update, and the
                reduction bucket (2 x 4 bytes x up to 16 M + the largest trainable tensor) in the step;
                train.fsdp_offload=true moves the shards, moment shards and gradient shards to the host; the
                activations are those of bf16 weights (the gathered copy)
  autocast      bf16 autocast on CUDA caches a bf16 copy of every trainable float32 Linear / Conv weight for the whole
                forward (2 bytes each); frozen float32 weights are cast per use, and without gradient checkpointing
                their copies are saved for the backward (2 bytes each, where gradients flow)
  activations   per sample, per transformer stack (vision towers, language model, action expert), saved for the
                backward where a trainable parameter lies in or upstream of the stack: tokens x layers x bytes per
                token and layer (`layer_bytes`: the norms' float32 inputs, the linears' bf16 inputs, q / k / v /
                attention output and the MLP's intermediate tensors, LoRA's own input copies), times KAPPA (fitted to
                the measured peaks); with gradient checkpointing only each layer's input is kept (residual dtype) plus
                one layer's activations while it is recomputed
  phases        the peak is the largest of: the update's forward (weights, moments, autocast copies, activations, and
                the gradients when a mini-batch accumulates several micro-batches or, train_sft.py, when they are
                freed after the forward), the optimizer step, the rollout / evaluation forward (the gradients of the
                last update are still allocated then), SRPO's reward encoder while it embeds, FlowSAR's annotation
                (EMA swapped in, a copy of the trainable weights kept)
  extra models  SRPO's V-JEPA 2 reward encoder (float32 weights + its forward), GAE-PPO's value head (weights,
                gradients and AdamW state of its own), FlowSAR's EMA copy of the trainable weights (1/N under fsdp)
A plan fits when its peak is at most MARGIN of the device's memory (the CUDA context and the allocator's slack are
not in torch's max_memory_allocated, which is what the peaks here model).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from base.config_fields import ConfigError
from models.memory import Model, Stack

GIB = 2 ** 30
MARGIN = 0.95  # a plan fits when its peak is at most this fraction of the device's memory
KAPPA = 0.8  # the counted per-layer activations times this: fitted to docs/gpu.md (docs/scale.md, Memory plan)
BUCKET = 1 << 24  # common/fsdp.py's reduction bucket (elements)
CLI: Dict[str, Any] = {"dry_run": False, "device_memory_gib": None, "processes": None}  # common/config.py sets it


def add_arguments(parser: Any) -> None:
    """The plan's flags on every script's command line (common/config.py build_arg_parser)."""
    parser.add_argument("--dry-run", action="store_true",
                        help="print the memory plan (GPU memory per process) and exit, loading nothing")
    parser.add_argument("--device-memory-gib", type=float, default=None,
                        help="check the plan against a device of this many GiB (default: the GPU's own; none on a CPU)")
    parser.add_argument("--processes", type=int, default=None,
                        help="with --dry-run: plan for N processes (default: this launch's)")


def set_cli(dry_run: bool, device_memory_gib: Optional[float], processes: Optional[int]) -> None:
    """What the command line asked of the plan (parse_cli): --dry-run, --device-memory-gib, --processes."""
    if processes is not None and not dry_run:
        raise ConfigError("--processes only plans (with --dry-run): a run has as many processes as its launch "
                          "(accelerate launch --num_processes N)")
    if processes is not None and processes < 1 or device_memory_gib is not None and not device_memory_gib > 0:
        raise ConfigError(f"--processes {processes} / --device-memory-gib {device_memory_gib}: must be positive")
    CLI.update(dry_run=dry_run, device_memory_gib=device_memory_gib, processes=processes)


# ---------------------------------------------------------------- sizes
@dataclass
class Params:
    """Sizes of a module's parameters (exact: sums of numel x element size)."""
    numel: int = 0
    trainable: int = 0
    bytes: int = 0
    trainable_bytes: int = 0
    tensors: int = 0  # trainable parameter tensors
    autocast_cache: int = 0  # trainable float32 Linear / Conv elements
    largest: int = 0  # largest trainable tensor (elements)
    dtypes: str = ""  # e.g. "float32" or "bfloat16 + float32"
    idle_bytes: int = 0  # trainable parameters the forward never reads (`Model.unused`): no gradient, no state


def count(module: Any, unused: Sequence[str] = ()) -> Params:
    """`unused`: parameter names the forward never reads (trainable or not, they get no gradient and no AdamW state)."""
    import torch

    out, dtypes = Params(), {}
    for name, p in module.named_parameters():
        out.numel += p.numel()
        out.bytes += p.numel() * p.element_size()
        dtypes[str(p.dtype).replace("torch.", "")] = dtypes.get(str(p.dtype).replace("torch.", ""), 0) + p.numel()
        if p.requires_grad and any(name.endswith(u) for u in unused):
            out.idle_bytes += p.numel() * p.element_size()
        elif p.requires_grad:
            out.trainable += p.numel()
            out.trainable_bytes += p.numel() * p.element_size()
            out.tensors += 1
            out.largest = max(out.largest, p.numel())
    for m in module.modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
            out.autocast_cache += sum(p.numel() for p in m.parameters(recurse=False)
                                      if p.requires_grad and p.dtype == torch.float32)
    out.dtypes = " + ".join(k for k, _ in sorted(dtypes.items(), key=lambda kv: -kv[1]))
    return out


@dataclass
class Parts:
    """What a script's config tells the plan about its run (its `memory_parts(world)` method; `rl_parts` for the RL
    scripts): the policy it trains, the update's batch sizes per process and the models it holds beside the policy.
    The plan names no script: what differs between them is here."""
    script: str  # the script's file, for the plan's title (e.g. train_srpo.py)
    family: str  # the policy family
    folder: Optional[str]  # the folder the policy starts from (None: built from `section`)
    section: Any  # the family's config (None: the family reads it from `folder`)
    micro: int  # samples per forward / backward, per process
    mini: int  # samples per optimizer step, per process
    micro_key: str  # the key that sets `micro` (a fix names it) ...
    key_per_micro: int = 1  # ... and its value per unit of `micro` (a key that counts every process: the world)
    by_trajectory: bool = False  # mini-batches count episodes (of steps)
    grads_in_forward: bool = False  # the gradients are allocated while every forward runs (else only when a
    # mini-batch accumulates several micro-batches)
    start_note: bool = True  # a start from a folder not there yet is planned from the config (and says so)
    with_lora: Optional[Callable[[int], Any]] = None  # the config with LoRA of a rank (a fix), None: not offered
    extras: Callable[..., List["Extra"]] = lambda model, world, sharded, offload, micro: []  # the other models


def rl_parts(cfg: Any, world: int, script: str,
             extras: Optional[Callable[..., List["Extra"]]] = None) -> Parts:
    """An RL script's parts: the policy from init.path (or the config's architecture), the update's
    train.micro_batch_size / train.mini_batch_size, `extras(model, world, sharded, offload, micro)` its other models."""
    t = cfg.train
    return Parts(script, cfg.policy.type, cfg.init.path, cfg.policy, t.micro_batch_size, t.mini_batch_size,
                 "train.micro_batch_size", by_trajectory=t.mini_batch_unit == "trajectory",
                 start_note=cfg.init.mode != "scratch",
                 with_lora=lambda rank: dataclasses.replace(cfg, policy=dataclasses.replace(cfg.policy,
                                                                                             lora_rank=rank)),
                 **({"extras": extras} if extras is not None else {}))


def policy_model(parts: Parts) -> Tuple[Optional[Model], Any]:
    """(the run's policy on the meta device, its family config) for a script's `parts`, as the script builds it,
    from the family's own description (its class's `memory_model`, models/memory.py): from the folder (a published
    checkpoint folder, a saved policy) with the config's LoRA and precision keys, else from the config's
    architecture; (None, the family's name) when the family gives no plan. The config is kept on the model."""
    from models.policy import policy_class

    family, folder, section = parts.family, parts.folder, parts.section
    model = policy_class(family).memory_model(section, folder)
    if model is None:
        return None, family
    if parts.start_note and not (folder and os.path.isdir(folder)) and not getattr(section, "init_path", None):
        model.notes.append((f"init.path {folder} holds no policy yet" if folder else "no init.path given") +
                           ": planned with the config's policy architecture" +
                           (f" (policy.preset={section.preset})" if getattr(section, "preset", None) else ""))
    section = model.policy_cfg if model.policy_cfg is not None else section
    model.policy_cfg = section
    return model, section


def no_plan(family: str) -> str:
    """The one line for a family that describes no memory (its class's `memory_model` returns None)."""
    return (f"[memory plan] no plan for policy family {family!r}: its class's memory_model gives none "
            f"(models/memory.py says what one returns); nothing checked against the device")


def folder_family(folder: str) -> str:
    """The policy family of a folder (a ConfigError naming it when it holds no policy)."""
    from models.policy import family_of_folder

    try:
        return family_of_folder(folder)
    except (OSError, ValueError) as e:
        raise ConfigError(f"memory plan: {folder} is not a policy folder ({e})") from None


# ---------------------------------------------------------------- extra models
def encoder_model(enc: Any) -> Tuple[Optional[Model], int, str]:
    """SRPO's V-JEPA 2 reward encoder: (its model on the meta device, tokens per video, where the config came from);
    (None, 0, "") for the pixel encoder."""
    if enc.kind != "vjepa2":
        return None, 0, ""
    import torch
    from transformers import VJEPA2Config, VJEPA2Model

    config, source = None, "the tiny random config"
    if enc.model_path:
        try:
            config, source = VJEPA2Config.from_pretrained(enc.model_path, local_files_only=True), enc.model_path
        except (OSError, ValueError):
            config, source = _vjepa2_by_name(enc.model_path)
    else:
        config = VJEPA2Config(crop_size=enc.crop_size, frames_per_clip=enc.num_frames, patch_size=16,
                              hidden_size=enc.hidden_size, num_hidden_layers=enc.num_layers, num_attention_heads=4,
                              mlp_ratio=2.0, pred_hidden_size=32, pred_num_hidden_layers=1, pred_num_attention_heads=2,
                              num_pooler_layers=1)
    with torch.device("meta"):
        model = VJEPA2Model(config)
    tubelets = 1 if enc.pooling == "final_spatial" else enc.num_frames // config.tubelet_size
    tokens = tubelets * (config.crop_size // config.patch_size) ** 2
    stack = Stack("V-JEPA 2", "vit", config.num_hidden_layers, config.hidden_size,
                  int(config.hidden_size * config.mlp_ratio), tokens=tokens, grad=False)
    return Model("V-JEPA 2", model, [stack], config.hidden_size), tokens, source


def _vjepa2_by_name(name: str):
    """The published V-JEPA 2 sizes by hub name (facebook/vjepa2-vit{l,h,g}-fpc64-{256,384}) when its config.json is
    not on this machine: transformers' VJEPA2Config defaults are the ViT-L."""
    from transformers import VJEPA2Config

    crop = 384 if "384" in name else 256
    sizes = {"vitl": {}, "vith": dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16),
             "vitg": dict(hidden_size=1408, num_hidden_layers=40, num_attention_heads=22, mlp_ratio=48 / 11)}
    for key, kw in sizes.items():
        if key in name:
            return VJEPA2Config(crop_size=crop, **kw), f"{name} ({key}, {crop} px: published size)"
    return VJEPA2Config(), f"{name} (unknown: planned as the ViT-L)"


def value_head_numel(in_dim: int, hidden_dims: Sequence[int]) -> int:
    dims = [in_dim, *hidden_dims, 1]
    return sum(a * b + b for a, b in zip(dims[:-1], dims[1:]))


def encoder_extra(enc: Any) -> List["Extra"]:
    """A V-JEPA 2 reward encoder beside the policy (train_srpo.py): its float32 weights and its forward while it
    embeds; [] for the pixel encoder."""
    emodel, tokens, source = encoder_model(enc)
    if emodel is None:
        return []
    config = emodel.net.config
    transient = encoder_transient(emodel, tokens, enc.batch_size, enc.num_frames if enc.pooling == "mean"
                                  else config.tubelet_size, config.crop_size)
    return [Extra("V-JEPA 2 reward encoder (float32)", count(emodel.net).bytes, transient, "reward encoder forward",
                  note=f"{count(emodel.net).numel / 1e6:,.1f} M; +{transient / GIB:.2f} GiB while it embeds "
                       f"{enc.batch_size} videos ({source})")]


def value_head_extra(model: Model, hidden_dims: Sequence[int]) -> List["Extra"]:
    """A value head on the policy's hidden state (train_gae_ppo.py): weights, gradients and AdamW state, float32."""
    numel = value_head_numel(model.hidden_size, hidden_dims)
    return [Extra("value head (+ gradients, AdamW)", numel * 16, note=f"{numel / 1e6:,.2f} M float32")]


def ema_extra(model: Model, world: int, sharded: bool, offload: bool, micro: int) -> List["Extra"]:
    """An EMA copy of the trainable weights (train_flowsar.py's theta_old; 1/N under fsdp, on the host with
    offload), swapped in for a forward without gradients (the self-annotation)."""
    p = count(model.net, model.unused)
    ema = (p.trainable_bytes + p.idle_bytes) // (world if sharded else 1)
    return [Extra("EMA reference (theta_old)", 0 if offload else ema, ema + inference_bytes(model.stacks, micro, 2),
                  "self-annotation", host=ema if offload else 0,
                  note="a copy of the trainable weights" + (" (shards, on the host)" if offload else ""))]


# ---------------------------------------------------------------- activations
def layer_bytes(s: Stack, c: int) -> int:
    """Bytes one token leaves saved for the backward in one layer of `s`, computing in `c`-byte floats (2: bf16
    autocast on CUDA): the two norms' float32 inputs; the linears' inputs (shared by q/k/v and by gate/up when the norm
    output is already in the compute dtype, one cast copy per linear when it is float32); q, k, v and the attention
    output; the MLP's intermediate tensors (gated: gate, up, act(gate), their product; GELU: fc1 out, gelu out);
    LoRA's own input copies (peft casts its input to the adapter's float32, autocast back to bf16)."""
    h, i = s.hidden, s.inter
    if s.kind == "mlp":  # a projector MLP: its input and, per hidden layer, the pre- and post-activation
        return c * (h + 2 * i) + c * s.lora_inputs
    if s.kind == "vit":  # LayerNorm runs in float32 under autocast: q, k, v and fc1 each cast its output
        return 8 * h + 4 * c * h + c * (2 * s.attn + 2 * s.kv) + 2 * c * i + c * s.lora_inputs
    return (8 * h + (5 if s.cast_inputs else 2) * c * h + c * (2 * s.attn + 2 * s.kv) + 4 * c * i
            + c * s.lora_inputs)


def activation_bytes(stacks: Sequence[Stack], micro: int, c: int, autocast: bool) -> int:
    """Saved activations of one micro-batch (module docstring): the stacks where gradients flow; plus, without
    checkpointing, the bf16 copies autocast makes of frozen float32 weights there (saved for the backward)."""
    per_sample, recompute, weight_copies = 0.0, 0.0, 0
    for s in stacks:
        if not s.grad:
            continue
        layer = s.tokens * layer_bytes(s, c) * KAPPA
        keys = 2 * c * s.kv * s.extra_keys * s.layers  # the other stack's keys / values this one attends to
        if s.checkpointed:
            per_sample += s.layers * s.tokens * s.hidden * s.residual + keys
            recompute = max(recompute, layer)
        else:
            per_sample += s.layers * layer + keys
            weight_copies += 2 * s.frozen_fp32 if autocast and c == 2 else 0
    return int(micro * (per_sample + recompute) + weight_copies)


def inference_bytes(stacks: Sequence[Stack], batch: int, c: int) -> int:
    """A forward without gradients (rollout, evaluation): the residual stream and one layer's working set of the
    largest stack, plus the key / value cache another stack reads (`Stack.extra_keys`)."""
    if not stacks:
        return 0
    work = max(s.tokens * (2 * s.residual * s.hidden + c * (2 * s.hidden + 2 * s.attn + 2 * s.kv + 3 * s.inter))
               for s in stacks)
    cache = sum(2 * c * s.kv * s.extra_keys * s.layers for s in stacks)
    return int(batch * (work + cache))


def encoder_transient(model: Model, tokens: int, batch: int, num_frames: int, crop: int) -> int:
    """V-JEPA 2 embedding a batch of videos (fp16 autocast, no gradients): the preprocessed float32 frames and
    tokens x (20 h + 4 i) bytes of one layer's working set (fitted: ViT-L, 8 videos x 8,192 tokens, 3.8 GiB with its
    weights, docs/gpu.md)."""
    s = model.stacks[0]
    return int(batch * (num_frames * 3 * crop * crop * 4 + tokens * (20 * s.hidden + 4 * s.inter)))


# ---------------------------------------------------------------- the plan
@dataclass
class Extra:
    """A model beside the policy: `resident` bytes on the device all the time, `phase` bytes while `phase_name` runs."""
    label: str
    resident: int = 0
    phase: int = 0
    phase_name: str = ""
    host: int = 0
    note: str = ""


@dataclass
class Plan:
    title: str
    rows: List[Tuple[str, float, str]]  # (what, GiB per process, note)
    phases: Dict[str, int]
    host_gib: float
    peak_phase: str
    peak: int
    capacity: Optional[int] = None
    device: str = ""
    notes: List[str] = field(default_factory=list)
    parts: Dict[str, int] = field(default_factory=dict)  # bytes: weights, gradients, adamw, autocast, activations

    @property
    def peak_gib(self) -> float:
        return self.peak / GIB

    def fits(self) -> Optional[bool]:
        return None if self.capacity is None else self.peak <= MARGIN * self.capacity

    def table(self) -> str:
        lines = [f"[memory plan] {self.title}", f"  {'per process (GPU)':<34} {'GiB':>8}"]
        for what, gib, note in self.rows:
            lines.append(f"  {what:<34} {gib:8.2f}" + (f"   {note}" if note else ""))
        if self.host_gib:
            lines.append(f"  {'host memory (offloaded shards)':<34} {self.host_gib:8.2f}")
        verdict = {True: "fits", False: "does NOT fit"}.get(self.fits(), "")
        where = (f"of {_gib(self.capacity / GIB)} GiB ({self.device}): {verdict} (<= {MARGIN:.0%} fits)"
                 if self.capacity else "no GPU here: --device-memory-gib N checks it against N GiB")
        lines.append(f"  {'peak (' + self.peak_phase + ')':<34} {self.peak_gib:8.2f}   {where}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def estimate(model: Model, *, micro: int, strategy: str = "ddp", world: int = 1, offload: bool = False,
             device: str = "cuda", autocast: bool = True, grads_in_forward: bool = True, grads_kept: bool = True,
             optimizer: bool = True, inference_batch: int = 0, extras: Sequence[Extra] = (), title: str = "",
             capacity: Optional[int] = None, device_name: str = "") -> Plan:
    """The plan of `model` trained on `device` (cuda: bf16 compute, fused AdamW; cpu: float32, single-tensor AdamW)
    under `strategy` over `world` processes, `micro` samples per forward / backward. `grads_in_forward`: the gradients
    of the previous micro-batch (or step) are allocated while a forward runs; `grads_kept`: they stay allocated
    between updates (the scripts zero them at the next mini-batch); `optimizer`: AdamW state exists (a benchmark of a
    bare forward / backward has none)."""
    cuda = device == "cuda"
    c = 2 if cuda and autocast else 4
    p = count(model.net, model.unused)
    n = world if strategy == "fsdp" else 1
    adam = (2 * p.trainable_bytes + 4 * p.tensors) if optimizer else 0
    stacks = model.stacks
    if strategy == "fsdp" and cuda:  # the gathered weights are bf16: a bf16 residual stream, no float32 to cast
        stacks = [dataclasses.replace(s, residual=2, cast_inputs=False, frozen_fp32=0) for s in stacks]
    act = activation_bytes(stacks, micro, c, cuda and autocast)
    infer = inference_bytes(stacks, inference_batch, c)
    rows: List[Tuple[str, float, str]] = []
    on_dev = 0 if offload else 1
    if strategy == "ddp":
        weights, grads = p.bytes, p.trainable_bytes
        cache = 2 * p.autocast_cache if cuda and autocast else 0
        step_extra = (2 * 4 * p.trainable if world > 1 else 0) + (0 if cuda else 2 * 4 * p.largest)
        rows += [(f"weights ({p.dtypes})", weights / GIB, f"{p.numel / 1e6:,.1f} M parameters"),
                 ("gradients", grads / GIB, f"{p.trainable / 1e6:,.1f} M trainable")]
        if optimizer:
            rows.append((f"AdamW moments ({'fused' if cuda else 'single-tensor'})", adam / GIB, ""))
        if cache:
            rows.append(("bf16 autocast weight copies", cache / GIB, "while a forward runs"))
        base = weights + adam
        fwd_grads, step_grads, kept = grads, grads, grads
    else:
        gathered = p.numel * (2 if cuda else 4)
        full_grads = p.trainable * (2 if cuda else 4)
        shards, grad_shards, adam = p.bytes // n, p.trainable_bytes // n, adam // n
        cache = 0
        step_extra = 2 * 4 * min(p.trainable, BUCKET + p.largest)  # a bucket fills until it holds BUCKET
        rows += [(f"weight shards (1/{n}, {p.dtypes})", on_dev * shards / GIB,
                  f"{p.numel / 1e6:,.1f} M parameters" + (", on the host" if offload else "")),
                 ("gathered compute weights" + (" (bf16)" if cuda else ""), gathered / GIB, ""),
                 ("gradients (full, gathered)", full_grads / GIB, f"{p.trainable / 1e6:,.1f} M trainable"),
                 (f"gradient shards (1/{n})", on_dev * grad_shards / GIB, "on the host" if offload else "")]
        if optimizer:
            rows.append((f"AdamW moment shards (1/{n})", on_dev * adam / GIB, "on the host" if offload else ""))
        base = on_dev * (shards + adam) + gathered
        fwd_grads, step_grads, kept = full_grads, full_grads + on_dev * grad_shards, on_dev * grad_shards
    ckpt = any(s.checkpointed for s in stacks if s.grad)
    rows.append(("activations", act / GIB, f"micro-batch {micro}" + (", gradient checkpointing" if ckpt else "")))
    resident = sum(e.resident for e in extras)
    for e in extras:
        rows.append((e.label, e.resident / GIB, e.note))
    phases = {"update forward": base + cache + act + (fwd_grads if grads_in_forward else 0),
              "optimizer step": base + step_grads + step_extra}
    if inference_batch:
        phases["rollout forward"] = base + cache + infer + (kept if grads_kept else 0)
    for e in extras:
        if e.phase:
            phases[e.phase_name] = base + (kept if grads_kept else 0) + e.phase
    phases = {k: v + resident for k, v in phases.items()}
    peak_phase = max(phases, key=phases.get)
    host = (p.bytes // n + adam + p.trainable_bytes // n) if offload else 0
    host += sum(e.host for e in extras)
    parts = dict(weights=p.bytes, gradients=p.trainable_bytes, adamw=(2 * p.trainable_bytes + 4 * p.tensors)
                 if optimizer else 0, autocast=cache, activations=act)
    return Plan(title, rows, phases, host / GIB, peak_phase, phases[peak_phase], capacity, device_name,
                list(model.notes), parts)


# ---------------------------------------------------------------- a script's run
def plan_run(cfg: Any, world: int, capacity: Optional[int] = None, device_name: str = "",
             model: Optional[Model] = None, **override: Any) -> Plan:
    """The plan of the script whose config `cfg` is (its `memory_parts`, `Parts`) run over `world` processes on CUDA
    devices of `capacity` bytes. `override`: strategy / offload / micro to plan a variant (the fixes)."""
    from common.fsdp import check_strategy

    parts = cfg.memory_parts(world)
    strategy = override.get("strategy", getattr(cfg.train, "strategy", "ddp"))
    offload = override.get("offload", getattr(cfg.train, "fsdp_offload", False))
    try:
        check_strategy(strategy, offload)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if model is None:
        model, family = policy_model(parts)
        if model is None:
            raise ConfigError(no_plan(family)[len("[memory plan] "):])
    micro, mini = override.get("micro", parts.micro), parts.mini
    extras = parts.extras(model, world, strategy == "fsdp", offload, parts.micro)
    rollout = cfg.env.num_envs // (2 if getattr(cfg.env, "pipeline", False) else 1)
    section = model.policy_cfg if model.policy_cfg is not None else parts.section
    variant = model.variant or (f"LoRA r={section.lora_rank}" if getattr(section, "lora_rank", 0) else
                                "full fine-tuning")
    title = (f"{parts.script}: {model.label}, {variant}; {strategy}"
             f"{' + offload' if offload else ''} over {world} process{'es' if world > 1 else ''}; micro-batch "
             f"{micro} of {mini}{' episodes' if parts.by_trajectory else ''}")
    # bf16 autocast on CUDA unless the policy turns it off (bf16 weights imply it)
    autocast = bool(getattr(section, "bf16", True) or getattr(section, "bf16_weights", False))
    return estimate(model, micro=micro, strategy=strategy, world=world, offload=offload, autocast=autocast,
                    grads_in_forward=parts.grads_in_forward or mini > micro or parts.by_trajectory,
                    inference_batch=rollout, extras=extras, title=title, capacity=capacity, device_name=device_name)


def fixes(cfg: Any, world: int, capacity: int, model: Model) -> List[str]:
    """The changes that bring the plan under the device (each with its peak), cheapest first: fsdp over these
    processes (or the fewest GPUs of a node that fit), fsdp + offload, a smaller micro-batch, LoRA."""
    out: List[str] = []

    def fits(**kw) -> Optional[Plan]:
        plan = plan_run(cfg, kw.pop("world", world), capacity, model=model, **kw)
        return plan if plan.fits() else None

    ddp = getattr(cfg.train, "strategy", "ddp") == "ddp"
    counts = [world] if world > 1 else [2, 4, 8, 16]
    for offload in (False, True):
        for n in counts:
            plan = fits(world=n, strategy="fsdp", offload=offload) if (ddp or offload) else None
            if plan:
                launch = "" if world > 1 else f" over {n} GPUs (accelerate launch --multi_gpu --num_processes {n})"
                out.append(f"train.strategy=fsdp{' train.fsdp_offload=true' if offload else ''}{launch} "
                           f"({_gib(plan.peak_gib)} GiB)")
                break
        if out:
            break
    parts = cfg.memory_parts(world)
    m = parts.micro // 2
    while m >= 1:
        plan = fits(micro=m)
        if plan:
            out.append(f"{parts.micro_key}={m * parts.key_per_micro} ({_gib(plan.peak_gib)} GiB)")
            break
        m //= 2
    if parts.with_lora is not None and getattr(parts.section, "lora_rank", 1) == 0:
        plan = plan_run(parts.with_lora(32), world, capacity)
        if plan.fits():
            out.append(f"policy.lora_rank=32 ({_gib(plan.peak_gib)} GiB)")
    return out


def _gib(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.3g}"


def device_capacity(device: Any = None) -> Tuple[Optional[int], str]:
    """(bytes, name) of the device to check against: --device-memory-gib, else the CUDA device's total memory, else
    (None, "") on a CPU."""
    if CLI["device_memory_gib"]:
        return int(CLI["device_memory_gib"] * GIB), f"--device-memory-gib {CLI['device_memory_gib']:g}"
    import torch

    if torch.cuda.is_available() and (device is None or getattr(device, "type", "cuda") == "cuda"):
        props = torch.cuda.get_device_properties(device if device is not None else 0)
        return int(props.total_memory), props.name
    return None, ""


def check(cfg: Any, accelerator: Any) -> Optional[Plan]:
    """At a run's start on a GPU (or with --device-memory-gib), before the policy loads: print the plan (main process)
    and stop with one line naming the fixes when it exceeds the device. A CPU run prints nothing (--dry-run shows its
    plan). A family that gives no plan, or a plan that cannot be computed, is a printed line, never a failed start."""
    capacity, name = device_capacity(accelerator.device)
    if capacity is None:
        return None
    world = accelerator.num_processes
    try:
        model, family = policy_model(cfg.memory_parts(world))
        if model is None:
            if accelerator.is_main_process:
                print(no_plan(family), flush=True)
            return None
        plan = plan_run(cfg, world, capacity, name, model=model)
    except Exception as e:  # noqa: BLE001 - the plan informs; the start's own checks report bad input
        if accelerator.is_main_process:
            print(f"[memory plan] not computed ({type(e).__name__}: {' '.join(str(e).split())[:200]})", flush=True)
        return None
    if accelerator.is_main_process:
        print(plan.table(), flush=True)
    if plan.fits() is False:
        found = fixes(cfg, world, capacity, model)
        raise ConfigError(f"memory plan: {_gib(plan.peak_gib)} GiB per process ({plan.peak_phase}) exceeds "
                          f"{MARGIN:.0%} of the {_gib(capacity / GIB)} GiB of {name}; "
                          + (f"fits with: {'; or '.join(found)}" if found else
                             "nothing tried fits (fsdp, offload, a smaller micro-batch, LoRA): use more GPUs")
                          + " (--dry-run prints the plan of any variant)")
    return plan


def dry_run(cfg: Any) -> None:
    """--dry-run (every script's main calls it after parsing): print the plan (and the fixes when it does not fit)
    and exit 0; without --dry-run nothing."""
    if not CLI["dry_run"]:
        return
    world = CLI["processes"] or int(os.environ.get("WORLD_SIZE", "1"))
    capacity, name = device_capacity()
    try:
        model, family = policy_model(cfg.memory_parts(world))
        if model is None:
            print(no_plan(family), flush=True)
            raise SystemExit(0)
        plan = plan_run(cfg, world, capacity, name, model=model)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    print(plan.table(), flush=True)
    if plan.fits() is False:
        found = fixes(cfg, world, capacity, model)
        print(f"  fits with: {'; or '.join(found)}" if found else "  nothing tried fits: use more GPUs", flush=True)
    raise SystemExit(0)


__all__ = ["check", "dry_run", "set_cli", "plan_run", "estimate", "policy_model", "rl_parts", "Parts", "no_plan",
           "count", "Plan", "Model", "Stack", "GIB", "MARGIN", "KAPPA"]
