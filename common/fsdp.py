"""train.strategy=fsdp: the policy's weights, gradients and optimizer state sharded over the processes with stock
torch FSDP2 (`fully_shard` per transformer layer / vision block, then the root), one code path on CPU (gloo) and GPUs
(NCCL). Public torch APIs only: fully_shard, register_fsdp_forward_method, FSDPModule's unshard / reshard /
reset_iter_state / set_reshard_after_forward / set_reshard_after_backward / set_requires_gradient_sync,
DTensor.full_tensor / from_local, torch.distributed.checkpoint and its get/set_*_state_dict, Module's
register_state_dict_post_hook.

Two modes, each entered by one collective on every process:
  rollouts   every module's weights gathered once (`unshard`, reshard_after_forward off) and kept while rollouts,
             evaluation, reference log-probs (peft's disable_adapter), values and FlowSAR's self-annotation run:
             processes run different numbers of forwards there (episodes end early, evaluation trials are split), so
             no forward may be a collective. `gather_weights`; the mode a run starts in (`register`) and returns to.
  update     `sharded(policy)`, around every script's update loop: the layers are resharded; FSDP gathers each one
             for its forward, keeps it through its backward (RESHARD_AFTER_FORWARD), reshards it and reduce-scatters
             its gradients itself, in fp32 (MixedPrecisionPolicy reduce_dtype). Every process runs the same number
             of micro-batches (common/train.py `micro_batches` pads the short ones with zero-weight micro-batches), so
             every collective has a partner. Gradient accumulation over a mini-batch's micro-batches
             (`sync_gradients`), in fp32 either way: on GPUs every micro-batch's backward reduce-scatters and the
             fp32 gradient shards accumulate (1/N of the gradients held: the memory FSDP is for); on CPU (fp32
             throughout) the micro-batches accumulate unreduced and the last one's backward reduce-scatters, so the
             sums are ddp's sums in ddp's order (equal bitwise at 2 processes, tests/test_distributed.py; a
             reduce-scatter per micro-batch differs from ddp by float rounding, REDUCE_EVERY_MICRO_BATCH).
The root: the scripts call the policy's methods (act, log_prob, velocity, ...), never its forward, so FSDP's hooks on
the root (the weights outside the layers: embeddings, heads, projector) would never run. `shard_policy` runs them
once through a no-op method registered as a forward method (`register_fsdp_forward_method`), which makes the policy
FSDP's root (its backward callback then reduce-scatters the root's gradients with the layers'); the root's own
weights stay gathered through the update too (a few % of a VLA's weights) and are gathered again after each
optimizer step.

Checkpoints (common/checkpoint.py, written atomically with the manifest as under ddp; every script saves and resumes
through its `save_run_checkpoint` / `load_run_checkpoint`, which ask this module for the shards under fsdp): `policy/`
holds the full weights (the fp32 master copy where the policy keeps fp32 weights, as under ddp), written by process 0
from a CPU copy gathered parameter by parameter (`DTensor.full_tensor`; one process loads the folder: evaluate.py,
init.path); `shards/` is a torch.distributed.checkpoint folder where every process writes its own shards of the
trainable weights, of the optimizer state and of extra modules that hold shards (FlowSAR's EMA copy) (`save_shards`),
which a resume at the same world size reads back into place (`load_shards`).
"""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch

STRATEGIES = ("ddp", "fsdp")
BLOCK_LISTS = ("layers", "blocks", "layer", "h")  # nn.ModuleList names holding decoder layers / vision blocks
FRESH_OPTIMIZERS = "fresh_optimizers.json"  # in shards/: the optimizers that had not stepped yet (no state)
ROOT_FORWARD = "fsdp_root_forward"  # the no-op method through which the root's FSDP hooks run once (shard_policy)
REDUCE_EVERY_MICRO_BATCH: Optional[bool] = None  # None: yes on GPUs, on CPU only a mini-batch's last (sync_gradients)
# In the update, a layer gathered for its forward is kept until its backward is done (False), or freed after its
# forward and gathered again for its backward (True: a layer's weights at a time, ZeRO-3). True needs layers whose
# every output leaves through their forward's return value, where FSDP hooks the backward's gather: the token
# policies (run so on CPU) and, by their structure, OpenVLA-OFT; not pi0, whose language layers hand their keys and
# values to the action expert through the KV cache (its backward then reads a freed layer: "setStorage: ... storage
# of size 0", FlowSAR on CPU). A family-level switch would belong in models/ (docs/scale.md).
RESHARD_AFTER_FORWARD = False


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


def is_dtensor(t: Any) -> bool:
    """Whether `t` is a DTensor (a shard of a sharded parameter, its gradient, ...)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


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
    """`policy` sharded as `run.cfg.train.strategy` says (ddp: returned unchanged), before its optimizer is built (the
    optimizer steps the shards). The scripts call it right after `initial_policy`; it reads train.strategy and
    train.fsdp_offload. Collective. Returns the policy sharded; Run.attach (`register`) gathers it for the rollouts."""
    strategy = getattr(run.cfg.train, "strategy", "ddp")
    if strategy == "ddp":
        return policy
    from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard,
                                        register_fsdp_forward_method)

    mesh = _process_group(run.device, run.world)
    # GPUs: bf16 compute weights and gradients, the gradients accumulated and reduce-scattered in fp32; CPU: fp32
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if run.device.type == "cuda" else MixedPrecisionPolicy()
    offload = CPUOffloadPolicy(pin_memory=run.device.type == "cuda") if run.cfg.train.fsdp_offload else OffloadPolicy()
    for block in _blocks(policy):
        fully_shard(block, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    fully_shard(policy, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
    # the root's FSDP hooks, once, before any layer runs: the policy becomes FSDP's root (its lazy initialisation
    # covers every sharded module, and its backward callback reduce-scatters the root's gradients too)
    setattr(policy, ROOT_FORWARD, types.MethodType(lambda self: None, policy))
    register_fsdp_forward_method(policy, ROOT_FORWARD)
    getattr(policy, ROOT_FORWARD)()  # collective: gathers the root's own weights
    policy.set_reshard_after_backward(False, recurse=False)  # the root stays gathered through an update
    policy.reshard()
    every = REDUCE_EVERY_MICRO_BATCH
    setattr(policy, SHARDING, Sharding(reduce_every=run.device.type == "cuda" if every is None else every))
    return policy


# ---- the two modes

SHARDING = "fsdp_sharding"  # the attribute of a sharded policy that holds its `Sharding` (set by shard_policy)


@dataclass
class Sharding:
    """What this module keeps about one sharded policy, on the policy itself (`getattr(policy, SHARDING)`)."""

    reduce_every: bool  # every micro-batch's backward reduce-scatters (GPUs); else only the mini-batch's last (CPU)
    updating: bool = False  # in the update mode (`sharded`); else in the rollout mode (`gather_weights`)


def sharding(policy: torch.nn.Module) -> Sharding:
    """The `Sharding` that shard_policy put on the sharded `policy` (a policy sharded otherwise gets the defaults:
    only a mini-batch's last backward reduce-scatters)."""
    if getattr(policy, SHARDING, None) is None:
        setattr(policy, SHARDING, Sharding(reduce_every=False))
    return getattr(policy, SHARDING)


def gather_weights(policy: torch.nn.Module) -> None:
    """The rollout mode: every module's weights gathered from the current shards and kept through forwards, which
    are then no collectives. Collective: every process calls it the same times. ddp: nothing."""
    if not is_sharded(policy):
        return
    sharding(policy).updating = False
    modules = fsdp_modules(policy)
    for m in modules:
        m.reshard()
    for m in modules:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()


@contextlib.contextmanager
def sharded(policy: torch.nn.Module) -> Iterator[None]:
    """The update mode, for the update loop of every script (common/train.py `sharded_update`) and train_sft.py's
    steps: the layers' weights sharded, gathered by FSDP for each micro-batch (RESHARD_AFTER_FORWARD), gradients
    reduce-scattered by FSDP; on the way out the weights are gathered again for rollouts and evaluation
    (`gather_weights`; not after an exception). Collective on entry and exit; every process must then run the same
    forwards and backwards in the same order. ddp: nothing."""
    if not is_sharded(policy):
        yield
        return
    # every module back to its shards, and FSDP's record of the forwards so far cleared: it orders the backward's
    # prefetching by them, and the rollout's differ between processes
    policy.reset_iter_state()
    for m in fsdp_modules(policy)[:-1]:
        m.set_reshard_after_forward(RESHARD_AFTER_FORWARD, recurse=False)
    policy.unshard()  # the root's own weights: its forward never runs, so they stay gathered (`after_step`)
    sharding(policy).updating = True
    yield
    gather_weights(policy)


def sync_gradients(policy: torch.nn.Module, last: bool) -> None:
    """Before each micro-batch's backward (common/train.py MicroBatches; `last`: the mini-batch's last): whether it
    reduce-scatters the gradients. On GPUs every one does and FSDP adds each result to the fp32 gradient shards; on
    CPU only the last, the earlier ones accumulating full size and unreduced, as ddp's (REDUCE_EVERY_MICRO_BATCH,
    set before shard_policy, decides instead when not None). ddp: nothing."""
    if is_sharded(policy):
        policy.set_requires_gradient_sync(last or sharding(policy).reduce_every)


def after_step(policy: torch.nn.Module) -> None:
    """After an optimizer step moved the shards (common/train.py optimizer_step calls it; no hook watches the
    optimizers): in the update the root's gathered weights from its new shards (the layers gather theirs in their
    next forward); else every module's. Not sharded: nothing."""
    if not is_sharded(policy):
        return
    if sharding(policy).updating:
        policy.reshard()
        policy.unshard()
    else:
        gather_weights(policy)


def register(policy: torch.nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """After the optimizers are built on the shards (and a resume has read its shards back): check one holds the
    shards and enter the rollout mode (collective). Run.attach calls it. Each optimizer step that moves the shards is
    followed by `after_step` (explicitly: common/train.py optimizer_step)."""
    if not is_sharded(policy):
        return
    if not any(holds_shards(policy, opt) for opt in optimizers):
        raise RuntimeError("train.strategy=fsdp: no optimizer holds the policy's shards (build it on "
                           "policy.parameters() after shard_policy, before Run.attach)")
    gather_weights(policy)


def holds_shards(policy: torch.nn.Module, opt: torch.optim.Optimizer) -> bool:
    """Whether `opt` steps shards of the sharded `policy` (DTensor parameters)."""
    return is_sharded(policy) and any(is_dtensor(p) for g in opt.param_groups for p in g["params"])


def reshard(policy: torch.nn.Module) -> None:
    """Back to the shards only, on this process (no collective; `gather_weights` gathers again)."""
    for m in fsdp_modules(policy):
        m.reshard()


def full_tensor(norm: torch.Tensor) -> torch.Tensor:
    """A plain tensor of `norm` (clip_grad_norm_ returns a DTensor when the gradients are sharded)."""
    return norm.full_tensor() if is_dtensor(norm) else norm


# ---- checkpoints: policy/ from a CPU copy of the full weights (process 0), shards/ by every process (DCP)

def gathered_copy(policy: torch.nn.Module, keep: bool = True) -> Dict[int, torch.Tensor]:
    """{id(shard): a CPU copy of its full weight} for every sharded parameter (a tied one once), gathered parameter
    by parameter (`DTensor.full_tensor`, in the master dtype): collective, every process calls it; `keep=False`
    only takes part (process 0 alone keeps the copy a save writes). Leaves the policy resharded."""
    from torch.distributed.tensor import DTensor

    reshard(policy)  # the registered parameters are the shards again
    out: Dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for p in policy.parameters():
            if not isinstance(p, DTensor):
                continue
            local = p.to_local()
            if local.device.type != p.device_mesh.device_type:  # offloaded shard: gathered on the mesh's device
                local = local.to(p.device_mesh.device_type)
            full = DTensor.from_local(local, p.device_mesh, p.placements, shape=p.shape, stride=p.stride(),
                                      run_check=False).full_tensor()
            if keep:
                out[id(p)] = full.to("cpu", copy=True)
            del full
    return out


@contextlib.contextmanager
def plain_state_dicts(policy: torch.nn.Module, weights: Optional[Dict[int, torch.Tensor]] = None) -> Iterator[None]:
    """Within it, `state_dict()` of the policy and of its submodules holds the full weights (CPU copies) instead of
    the shards, so `policy.save(dir)` writes the one-process folder. `weights`: those copies (`gathered_copy`),
    made earlier; without, every process gathers them here (collective). state_dict() leaves the policy resharded
    (FSDP's own pre-hook): every process calls `gather_weights` before it runs again."""
    if not is_sharded(policy):
        yield
        return
    full = weights if weights is not None else gathered_copy(policy)

    def hook(module, state, prefix, _meta):  # FSDP's pre-hook registered the shards: put the full weights instead
        for name, p in module.named_parameters(recurse=False):
            if id(p) in full and prefix + name in state:
                state[prefix + name] = full[id(p)]

    handles = [m.register_state_dict_post_hook(hook) for m in policy.modules()]
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


def holds_dtensors(module: torch.nn.Module) -> bool:
    """Whether `module` (a tracked extra module, e.g. FlowSAR's EMA copy) holds shards (DTensors) rather than a
    replica: its state then goes into the checkpoint's shards/ instead of modules/<name>.safetensors."""
    return any(is_dtensor(t) for t in module.state_dict().values())


def shard_state(policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer],
                modules: Optional[Dict[str, torch.nn.Module]] = None) -> Dict[str, Any]:
    """This process's shards as torch.distributed.checkpoint saves and loads them: the trainable weights (fp32 master
    shards, DTensors), the state of every optimizer in `optimizers` (all holding shards), keyed by parameter name,
    and the state of every sharded extra module in `modules` (`holds_dtensors`). Frozen weights are not in it: they
    never change, so the checkpoint's policy/ holds them. state_dict() reshards the policy."""
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
