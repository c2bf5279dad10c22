"""The processes of a run: accelerate's Accelerator (CPU when there is no GPU; each process's threads: common/threads.py),
gathering Python objects from every process, and a clean end of the process group.

    accelerator = make_accelerator()      # refuses a launch that asked for N processes but started 1
    rows = gather_objects(world, [...])   # the concatenation of every process's list (world 1: the list itself)
    close_process_group(together)         # before interpreter exit: no gloo thread left to abort the process

Why a multi-process run could abort at its very end ("terminate called without an active exception", SIGABRT, exit
-6, after everything was written): torch.distributed.nn.functional evaluates `group=group.WORLD` as default arguments
when it is imported, and transformers imports it (through torch.distributed.fsdp) only when a policy module is
loaded, after accelerate made the process group. Those defaults held the group, so destroy_process_group() only
unregistered it: gloo's worker threads lived on into interpreter finalization, and a worker thread that dropped the
last reference to a finished collective's tensors then (a window of microseconds, long on a loaded machine) needed
the GIL, which a finalizing interpreter answers with pthread_exit; unwinding through a noexcept destructor is
std::terminate. make_accelerator imports that module before the group exists, so destroy_process_group frees the
group and joins its threads (releasing the GIL) while the interpreter is whole.
"""
from __future__ import annotations

import os
import re
import time
from typing import List

import torch

from base.config_fields import ConfigError

QUIET_LAUNCH = "--num_machines 1 --mixed_precision no --dynamo_backend no"  # accelerate warns when it picks these


def launched_alone_for_several() -> bool:
    """True when `accelerate launch` was asked for several processes but ran this one alone: its one-process launcher
    (no multi-process config) marks the process with ACCELERATE_USE_CPU and, for --num_processes > 1, MASTER_PORT,
    while a real multi-process launch gives every process its WORLD_SIZE."""
    env = os.environ
    return "ACCELERATE_USE_CPU" in env and "MASTER_PORT" in env and "WORLD_SIZE" not in env


def select_gpu(index: int) -> None:
    """`--gpu N`: only CUDA device N is visible to this process (set before CUDA starts); a ConfigError (one line)
    when torch sees no CUDA device N here, instead of running on the CPU in silence."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    if index >= 0 and torch.cuda.device_count() > 0:  # device_count() reads CUDA_VISIBLE_DEVICES, caches nothing
        return                                        # before CUDA is initialised
    present = len([d for d in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", d)]) if os.path.isdir("/dev") else 0
    if torch.version.cuda is None or present == 0:
        where = "no CUDA device on this machine" + (" (this torch is a CPU build)" if torch.version.cuda is None
                                                     and present else "")
    else:
        where = f"no CUDA device {index} on this machine (it has {present}: --gpu 0..{present - 1})"
    raise ConfigError(f"--gpu {index}: {where}; drop --gpu to run on the CPU")


def make_accelerator():
    """An Accelerator (CPU when no GPU), refusing in one line a launch that asked for several processes but started
    one."""
    from accelerate import Accelerator
    import torch.distributed.nn  # noqa: F401 - imported before the process group exists (module docstring)

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if accelerator.num_processes == 1 and launched_alone_for_several():
        raise ConfigError("accelerate launch asked for several processes but started 1 (without a multi-process "
                          "config it runs one): use `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml "
                          f"...` (or 8gpu.yaml, ...), or `accelerate launch --multi_gpu --num_processes N {QUIET_LAUNCH} "
                          "...` (works on CPU machines too)")
    return accelerator  # torch's threads: common/threads.py (Run sets them)


def gather_objects(world: int, items: List) -> List:
    """accelerate's gather_object: the concatenation of every process's list (a collective when world > 1)."""
    if world == 1:
        return list(items)
    from accelerate.utils import gather_object

    return gather_object(list(items))


def close_process_group(together: bool) -> None:
    """Tear the process group down before interpreter exit (module docstring: left to the finaliser, gloo's threads
    can abort the process), after a barrier when every process got here together (a run that ended, or stopped at
    the same safe point): none leaves while another still writes (the stop's checkpoint) or has work in flight on the
    connections (fsdp's weight gather after the last step). Under train.strategy=fsdp the sharded policy still holds
    the group until the process ends (FSDP's mesh), so its threads outlive this call."""
    if torch.distributed.is_initialized():
        several = torch.distributed.get_world_size() > 1
        if together and several:
            try:
                torch.distributed.barrier()
            except RuntimeError:  # a process is gone already (killed): nothing left to wait for
                pass
        torch.distributed.destroy_process_group()
        if several:  # threads that outlive the group (fsdp's mesh) drop the last collective's tensors now, while the
            # interpreter can still give them the GIL (module docstring): seen as 1 abort in 4-8 fsdp runs on a
            # loaded 2-core machine without this wait
            time.sleep(0.5)


def launch_command(world: int) -> str:
    """How to start a script with `world` processes: `python`, or accelerate's multi-process launch."""
    return f"accelerate launch --multi_gpu --num_processes {world} {QUIET_LAUNCH}" if world > 1 else "python"
