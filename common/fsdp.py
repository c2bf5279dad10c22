"""train.strategy=fsdp: the policy's weights and optimizer state sharded over the processes with torch's FSDP2
(`fully_shard` per transformer layer / vision block, then the root), one code path on CPU (gloo) and GPUs (NCCL).

How it runs (every piece of the scripts stays as it is):
  at rest        each process holds its shard (DTensor parameters; fp32 master weights; with train.fsdp_offload on
                 the CPU) and the optimizer state of its shard only: that is what grows with the model.
  compute        the full weights are gathered once (`unshard`) and kept while rollouts, evaluation, reference
                 log-probs (peft's disable_adapter) and the update's micro-batches run: processes may run different
                 numbers of forward / backward passes (episodes end early, dynamic sampling leaves different row
                 counts), so nothing inside a forward or backward may be a collective. On CUDA the gathered weights
                 are bf16 (MixedPrecisionPolicy), on CPU fp32, so CPU tests compare to one process exactly.
  gradients      `average_gradients` (common/run.py), the one mechanism of every script: the gathered gradients of
                 every process are averaged in fp32 in one all-reduce, exactly as with ddp, and each process keeps the
                 slice of its shard; the optimizer steps the shards; a step hook gathers the new weights again.
So the saving is the optimizer state, master weights and (offloaded) their device memory (ZeRO-1 style): gathered
weights and gradients are full size during compute. docs/scale.md has the numbers.

Checkpoints (common/checkpoint.py, written atomically with the manifest as under ddp; every script saves and resumes
through `save_checkpoint` / `load_checkpoint` below, sharded or not): `policy/` holds the gathered weights, written by
process 0 from the copy it already computes with (one process loads it: evaluate.py, init.path); `shards/` is a
torch.distributed.checkpoint folder where every process writes its own shards of the trainable weights, of the
optimizer state and of extra modules that hold shards (FlowSAR's EMA copy) (`save_shards`), which a resume at the same
world size reads back into place (`load_shards`): nothing is gathered onto one process, so process 0's host memory for
a save is the weights' CPU copy for policy/, as under ddp.
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

STRATEGIES = ("ddp", "fsdp")
BLOCK_LISTS = ("layers", "blocks", "layer", "h")
FRESH_OPTIMIZERS = "fresh_optimizers.json"  # in shards/: the optimizers that had not stepped yet (no state)  # nn.ModuleList names holding decoder layers / vision blocks


def check_strategy(strategy: str, offload: bool) -> None:
    """Refuse an unknown strategy, or offload without fsdp, in one line (a ValueError, like ConfigError)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"train.strategy={strategy!r}: use one of {', '.join(STRATEGIES)}")
    if offload and strategy != "fsdp":
        raise ValueError("train.fsdp_offload=true needs train.strategy=fsdp")


def fsdp_modules(module: torch.nn.Module) -> List[Any]:
    """Every FSDP2-sharded module under (and including) `module`, root last."""
    from torch.distributed.fsdp import FSDPModule

    found = [m for m in module.modules() if isinstance(m, FSDPModule)]
    return found[1:] + found[:1] if found and found[0] is module else found


def is_sharded(module: Optional[torch.nn.Module]) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _blocks(policy: torch.nn.Module) -> List[torch.nn.Module]:
    """The transformer decoder layers and vision blocks: elements of ModuleLists named in BLOCK_LISTS."""
    out = []
    for name, m in policy.named_modules():
        if isinstance(m, torch.nn.ModuleList) and name.rsplit(".", 1)[-1] in BLOCK_LISTS:
            out += [b for b in m if any(True for _ in b.parameters())]
    return out


def _process_group(device: torch.device, world: int):
    """The default process group (accelerate made it when several processes run; one process gets its own)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        store = dist.HashStore()
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (world,))


def shard_policy(run: Any, policy: torch.nn.Module) -> torch.nn.Module:
    """`policy` sharded as `run.cfg.train.strategy` says (ddp: returned unchanged), before its optimizer is built.
    The scripts call it right after `initial_policy`; it reads train.strategy and train.fsdp_offload."""
    strategy = getattr(run.cfg.train, "strategy", "ddp")
    if strategy == "ddp":
        return policy
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mesh = _process_group(run.device, run.world)
    # bf16 gathered weights on GPUs; the gradients stay in that dtype until average_gradients reduces them in fp32
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) \
        if run.device.type == "cuda" else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=run.device.type == "cuda") if run.cfg.train.fsdp_offload else OffloadPolicy()
    for block in _blocks(policy):
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    fully_shard(policy, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    for m in fsdp_modules(policy):
        m.set_requires_gradient_sync(False)  # average_gradients reduces, once per optimizer step
        m.set_reshard_after_backward(False)
    return policy  # still sharded: the optimizer is built on the shards; Run.attach (`register`) gathers them


def gather_weights(policy: torch.nn.Module) -> None:
    """Replace the gathered weights by the current shards' (collective: every process calls it the same times)."""
    modules = fsdp_modules(policy)
    for m in modules:
        m.reshard()
    for m in modules:
        m.unshard()


def sharded_owners(params: Sequence[torch.nn.Parameter]) -> Dict[int, Any]:
    """{id(sharded parameter): its FSDPParam} for the parameters of `params` that FSDP2 shards ({} under ddp)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in params):
        return {}
    return {id(fp.sharded_param): fp for root in _ROOTS for fp in _fsdp_params(root)}


def _fsdp_params(policy: torch.nn.Module) -> List[Any]:
    """FSDP2's per-parameter records (sharded_param, unsharded_param, _module_info) of every sharded module."""
    out = []
    for m in fsdp_modules(policy):
        group = m._get_fsdp_state()._fsdp_param_group  # noqa: SLF001 - the gathered tensors' owner
        out += group.fsdp_params if group is not None else []
    return out


_ROOTS: List[torch.nn.Module] = []  # the sharded policies of this process (Run.attach registers them)


def register(policy: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Remember a sharded policy (for `average_gradients`), gather its weights after each optimizer step that moves
    its shards, and gather them now. Called once the optimizers are built on the shards."""
    if not is_sharded(policy):
        return
    if policy not in _ROOTS:
        _ROOTS.append(policy)
    if not any(holds_shards(policy, opt) for opt in optimizers):
        raise RuntimeError("train.strategy=fsdp: no optimizer holds the policy's shards (build it on "
                           "policy.parameters() after shard_policy, before Run.attach)")
    for opt in optimizers:
        if holds_shards(policy, opt):
            opt.register_step_post_hook(lambda *_: gather_weights(policy))
    gather_weights(policy)


BUCKET = 1 << 24  # elements per all-reduce (64 MiB of fp32): the reduction's buffer does not grow with the model


def average_sharded(accelerator: Any, params: Sequence[torch.nn.Parameter], owners: Dict[int, Any]) -> None:
    """average_gradients under fsdp: every gathered gradient (zeros where a process has none) averaged in fp32, in
    buckets of BUCKET elements (the same sums as one flat reduction), then each sharded parameter gets its slice as a
    DTensor gradient and its gathered gradient is freed; plain parameters (a value head) get the average itself."""
    bucket: List[torch.nn.Parameter] = []
    size = 0
    for p in params:
        bucket.append(p)
        size += _full(p, owners).numel()
        if size >= BUCKET:
            _average_bucket(accelerator, bucket, owners)
            bucket, size = [], 0
    if bucket:
        _average_bucket(accelerator, bucket, owners)


def _full(p: torch.nn.Parameter, owners: Dict[int, Any]) -> torch.Tensor:
    return p if id(p) not in owners else owners[id(p)].unsharded_param


def _average_bucket(accelerator: Any, params: Sequence[torch.nn.Parameter], owners: Dict[int, Any]) -> None:
    from torch.distributed.tensor import DTensor

    grads = []
    for p in params:
        full = _full(p, owners)
        grads.append(full.grad if full.grad is not None else torch.zeros_like(full))
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    if accelerator.num_processes > 1:
        flat = accelerator.reduce(flat, reduction="mean")
    offset, rank, world = 0, accelerator.process_index, accelerator.num_processes
    for p, g in zip(params, grads):
        mean = flat[offset:offset + g.numel()].view(g.shape)
        offset += g.numel()
        fp = owners.get(id(p))
        if fp is None:
            p.grad = mean.to(p.dtype).clone()
            continue
        fp.unsharded_param.grad = None
        chunks = mean.chunk(world, 0)  # FSDP2 shards dim 0 as torch.chunk does
        local = chunks[rank] if rank < len(chunks) else mean[:0]
        if local.shape != p.to_local().shape:
            raise RuntimeError(f"fsdp: a gradient slice of shape {tuple(local.shape)} for a shard of shape "
                               f"{tuple(p.to_local().shape)} (this torch shards differently from torch.chunk)")
        p.grad = DTensor.from_local(local.to(device=p.to_local().device, dtype=p.dtype, copy=True).contiguous(),
                                    p.device_mesh, p.placements, shape=p.shape, stride=p.stride(), run_check=False)


def full_tensor(norm: torch.Tensor) -> torch.Tensor:
    """A plain tensor of `norm` (clip_grad_norm_ returns a DTensor when the gradients are sharded)."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


# ---- checkpoints: policy/ from the gathered copy (process 0), shards/ by every process (DCP)

@contextlib.contextmanager
def plain_state_dicts(policy: torch.nn.Module, weights: Optional[Dict[int, torch.Tensor]] = None) -> Iterator[None]:
    """Within it, `state_dict()` of the policy and of its submodules holds the gathered (full, plain) weights instead
    of the shards, so `policy.save(dir)` writes the one-process folder (a CPU copy, made without a collective).
    state_dict() leaves the policy resharded: every process calls `gather_weights` before it runs again.
    `weights`: that copy, made earlier by `gathered_copy`."""
    if not is_sharded(policy):
        yield
        return
    records = _fsdp_params(policy)
    full = weights if weights is not None else gathered_copy(policy)
    owned = {id(m): {} for m in policy.modules()}  # module -> {name: sharded parameter}
    for fp in records:
        owned[id(fp._module_info.module)][fp._module_info.param_name] = fp.sharded_param  # noqa: SLF001

    def hook(module, state, prefix, _meta):
        for name, p in owned[id(module)].items():
            if prefix + name in state:
                state[prefix + name] = full[id(p)]
        return state

    handles = [m._register_state_dict_hook(hook) for m in policy.modules()]  # noqa: SLF001
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class GatheredSave:
    """Stands for a sharded policy in save_checkpoint: `save(dir)` writes its one-process folder from `weights`
    (`gathered_copy`), while other state_dict() calls (the shards' own, `shard_state`) still see the shards."""

    def __init__(self, policy: torch.nn.Module, weights: Dict[int, torch.Tensor]):
        self.policy, self.weights = policy, weights

    def save(self, path: str) -> None:
        with plain_state_dicts(self.policy, self.weights):
            self.policy.save(path)


def gathered_copy(policy: torch.nn.Module) -> Dict[int, torch.Tensor]:
    """{id(shard): a CPU copy of its gathered weight}: state_dict() reshards (FSDP2's pre-hook frees the gathered
    copy), so what a save writes is copied first."""
    return {id(fp.sharded_param): fp.unsharded_param.detach().to("cpu", copy=True) for fp in _fsdp_params(policy)}


def reshard(policy: torch.nn.Module) -> None:
    """Back to the shards only, on this process (no collective; `gather_weights` gathers again)."""
    for m in fsdp_modules(policy):
        m.reshard()


def holds_dtensors(module: torch.nn.Module) -> bool:
    """Whether `module` (a tracked extra module, e.g. FlowSAR's EMA copy) holds shards (DTensors) rather than a
    replica: its state then goes into the checkpoint's shards/ instead of modules/<name>.safetensors."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(t, DTensor) for t in module.state_dict().values())


def shard_state(policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer],
                modules: Optional[Dict[str, torch.nn.Module]] = None) -> Dict[str, Any]:
    """This process's shards as torch.distributed.checkpoint saves and loads them: the trainable weights (fp32 master
    shards, DTensors), the state of every optimizer in `optimizers` (all holding shards), keyed by parameter name,
    and the state of every sharded extra module in `modules` (`holds_dtensors`). Frozen weights are not in it: they
    never change, so the checkpoint's policy/ holds them. The policy must be resharded (state_dict() keys the
    shards)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(policy, options=StateDictOptions(ignore_frozen_params=True)),
             "optimizers": {name: get_optimizer_state_dict(policy, opt) for name, opt in optimizers.items()}}
    if modules:
        state["modules"] = {name: m.state_dict() for name, m in modules.items()}
    return state


def save_shards(policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer], folder: str,
                modules: Optional[Dict[str, torch.nn.Module]] = None) -> None:
    """Every process writes its own shards into `folder` (`__<rank>_0.distcp`, process 0 adds `.metadata`); nothing
    is gathered. Collective; a failure on any process raises on every process."""
    import torch.distributed.checkpoint as dcp

    dcp.save(shard_state(policy, optimizers, modules), checkpoint_id=folder)


def load_shards(policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer], folder: str,
                modules: Optional[Dict[str, torch.nn.Module]] = None) -> None:
    """Inverse of `save_shards` at the same world size: each process reads its shards of the trainable weights, of
    the optimizer state and of the sharded `modules` into place (collective; call before `register`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    state = shard_state(policy, optimizers, modules)  # a fresh optimizer gets its state allocated by a zero-lr step
    dcp.load(state, checkpoint_id=folder)
    set_model_state_dict(policy, state["model"], options=StateDictOptions(ignore_frozen_params=True, strict=False))
    for name, opt in optimizers.items():
        set_optimizer_state_dict(policy, opt, state["optimizers"][name])
    for name, m in (modules or {}).items():
        m.load_state_dict(state["modules"][name])


def save_checkpoint(run_dir: str, iteration: int, policy: Any, optimizers: Dict[str, torch.optim.Optimizer],
                    schedulers: Optional[Dict[str, Any]] = None, modules: Optional[Dict[str, torch.nn.Module]] = None,
                    rank: int = 0, gather: Optional[Any] = None, **kwargs: Any) -> Optional[str]:
    """common.checkpoint.save_checkpoint for a policy sharded or not (every script's checkpoint goes through it).
    Not sharded: process 0 writes everything, other processes return None at once. Sharded (every process calls it,
    with `gather`): process 0 writes policy/ from a CPU copy of its gathered weights, every process writes into
    shards/ its shards of the trainable weights, of the optimizers that step them and of the modules that hold shards
    (`holds_dtensors`); the rest is written as under ddp, and the weights are gathered again after (a failed write
    too). `kwargs`: save_checkpoint's config, extra, keep_last, rng_states."""
    from common.checkpoint import save_checkpoint as write

    if not is_sharded(policy):
        return write(run_dir, iteration, policy, optimizers, schedulers, modules, **kwargs) if rank == 0 else None
    saved = GatheredSave(policy, gathered_copy(policy)) if rank == 0 else None  # policy/
    sharded = {k: o for k, o in optimizers.items() if holds_shards(policy, o)}
    held = {k: m for k, m in (modules or {}).items() if holds_dtensors(m)}
    # an optimizer that never stepped (no update yet: dynamic sampling kept no group) has no state to shard; torch's
    # get_optimizer_state_dict would make some with a zero-lr step (whose post-hook gathers the weights mid-save)
    # and its AdamW step count 1 would make the resumed run differ: it is recorded as fresh instead
    fresh = sorted(k for k, o in sharded.items() if not o.state)

    def write_shards(folder: str) -> None:
        save_shards(policy, {k: o for k, o in sharded.items() if k not in fresh}, folder, held)
        if rank == 0:
            with open(os.path.join(folder, FRESH_OPTIMIZERS), "w") as f:
                json.dump(fresh, f)

    reshard(policy)
    try:
        return write(run_dir, iteration, saved, {k: o for k, o in optimizers.items() if k not in sharded}, schedulers,
                     {k: m for k, m in (modules or {}).items() if k not in held}, shards=write_shards, rank=rank,
                     gather=gather, **kwargs)
    finally:
        gather_weights(policy)  # collective: every process reaches it, after a failed write too


def load_checkpoint(path: str, policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer],
                    schedulers: Optional[Dict[str, Any]] = None, modules: Optional[Dict[str, torch.nn.Module]] = None,
                    rank: int = 0) -> tuple:
    """common.checkpoint.load_training_state for a policy sharded or not: optimizers, schedulers, modules and process
    `rank`'s RNG states; under fsdp the optimizers that step shards and the modules that hold shards from shards/
    (collective; before `register`). The policy's weights themselves are the caller's (from `<path>/policy`, before
    sharding). Returns (iteration, extra); ValueError (one line) for an fsdp resume of a checkpoint without shards/."""
    from common.checkpoint import load_training_state

    sharded = {k: o for k, o in optimizers.items() if is_sharded(policy) and holds_shards(policy, o)}
    held = {k: m for k, m in (modules or {}).items() if holds_dtensors(m)}
    iteration, extra = load_training_state(path, {k: o for k, o in optimizers.items() if k not in sharded},
                                           schedulers, {k: m for k, m in (modules or {}).items() if k not in held},
                                           rank=rank)
    if sharded:  # each process reads its shards of the trainable weights, optimizer state and sharded modules
        shards = os.path.join(path, "shards")
        if not os.path.isdir(shards):
            raise ValueError(f"--resume: checkpoint {path} has no shards/ (the weights and optimizer state that "
                             f"train.strategy=fsdp saves per process): it was written under train.strategy=ddp or by "
                             f"an older version; start a new run from its policy/ ({path}/policy)")
        fresh_file = os.path.join(shards, FRESH_OPTIMIZERS)
        fresh = json.load(open(fresh_file)) if os.path.isfile(fresh_file) else []  # never stepped: stay fresh
        load_shards(policy, {k: o for k, o in sharded.items() if k not in fresh}, shards, held)
    return iteration, extra


def holds_shards(policy: torch.nn.Module, opt: torch.optim.Optimizer) -> bool:
    """Whether `opt` steps shards of the sharded `policy`."""
    mine = {id(fp.sharded_param) for fp in _fsdp_params(policy)}
    return any(id(p) in mine for g in opt.param_groups for p in g["params"])
