"""Crash-safe training checkpoints: written to a temp folder, fsynced, checked by a manifest, then renamed into place.

Layout of `<run_dir>/checkpoints/iter_XXXXXX/`:
  policy/                 `policy.save(dir)` (safetensors weights + config + action-tokenizer statistics);
                          reload with `TokenPolicy.load(path + "/policy")` / `FlowPolicy.load(...)`
  modules/<name>.safetensors   extra nn.Modules (value head, EMA copy, ...)
  optimizers.pt, schedulers.pt  state dicts by name
  shards/                 train.strategy=fsdp: a torch.distributed.checkpoint folder, one `__<rank>_0.distcp` per
                          process (its shards of the trainable weights and of the optimizers that step them, which
                          are then not in optimizers.pt) + `.metadata`; read back at the same world size
  rng.pt                  one dict per process: python, numpy, torch (and CUDA) RNG states, plus the script's own
                          streams (prompt sampler, environments) under extra keys
  state.json              iteration + `extra` (JSON)
  config.yaml             the resolved config (when given)
  MANIFEST.json           size + sha256 of every file above; written last, so no manifest = incomplete
  MANIFEST.sig            HMAC-SHA256 of MANIFEST.json under this machine's key (`trust_key_path()`): a resume of an
                          fsdp checkpoint checks it, since torch's DCP reads `shards/.metadata` with pickle (a folder
                          written elsewhere is trusted like code: refused unless `--trust-run`)

Nothing here unpickles: optimizers.pt, schedulers.pt and rng.pt are read with `torch.load(weights_only=True)` (tensors
and plain python values only); a file holding anything else is refused as a corrupt checkpoint.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import pickle
import random
import shutil
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from common import fsdp
from models.saved import PolicyLoadError, is_policy_dir, load_errors, readable_files  # noqa: F401 - re-exported

MANIFEST = "MANIFEST.json"
SIGNATURE = "MANIFEST.sig"


class CheckpointError(RuntimeError):
    """A checkpoint folder is incomplete or corrupt; the message names the folder and the problem."""


def file_sha256(path: str) -> str:
    """The hex SHA-256 of the file at `path` (read in 1 MiB blocks), as a checkpoint's manifest records it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def capture_rng_state() -> Dict[str, Any]:
    """This process's python, numpy, torch (and CUDA) RNG states, as `rng.pt` stores them."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Dict[str, Any]) -> None:
    """Set the global RNGs from `capture_rng_state()`'s dict (extra keys are the caller's)."""
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The bare module under DDP / torch.compile / accelerate wrappers."""
    while hasattr(module, "module") and isinstance(module.module, torch.nn.Module):
        module = module.module
    return getattr(module, "_orig_mod", module)


def module_file(name: str) -> str:
    """Where a checkpoint keeps the extra module `name` (a value head, an EMA copy), relative to the checkpoint."""
    return os.path.join("modules", f"{name}.safetensors")


def iteration_dirs(run_dir: str) -> List[str]:
    """The run's checkpoint folders (<run>/checkpoints/iter_NNNNNN), oldest first, complete or not."""
    root = os.path.join(run_dir, "checkpoints")
    if not os.path.lexists(root):
        return []
    real_run = os.path.realpath(run_dir)
    if os.path.islink(root) or os.path.realpath(root) != os.path.join(real_run, "checkpoints"):
        raise CheckpointError(f"{root} is a symbolic link (to {os.path.realpath(root)}): a run's checkpoints must be "
                              f"inside its folder (a resume would continue, and prune, another run's); replace the "
                              f"link with that folder's copy, or resume the run it points to")
    if not os.path.isdir(root):
        return []
    names = sorted((d for d in os.listdir(root) if d.startswith("iter_") and d[5:].isdigit()), key=lambda d: int(d[5:]))
    for d in names:
        path = os.path.join(root, d)
        if os.path.islink(path):
            raise CheckpointError(f"{path} is a symbolic link (to {os.path.realpath(path)}): a run's checkpoints must "
                                  f"be inside its folder; remove the link (or copy the checkpoint in its place)")
    return [os.path.join(root, d) for d in names]


def save_checkpoint(run_dir: str, iteration: int, policy: Any, optimizers: Dict[str, torch.optim.Optimizer],
                    schedulers: Optional[Dict[str, Any]] = None, modules: Optional[Dict[str, torch.nn.Module]] = None,
                    config: Any = None, extra: Optional[Dict[str, Any]] = None, keep_last: int = 2,
                    rng_states: Optional[List[Dict[str, Any]]] = None,
                    shards: Optional[Callable[[str], None]] = None, rank: int = 0,
                    gather: Optional[Callable[[List], List]] = None) -> str:
    """Write `<run_dir>/checkpoints/iter_XXXXXX/` atomically, prune to the newest `keep_last`; returns its path.
    `rng_states`: one RNG dict per process (default: this process's). Any failure (full disk, ...) removes the
    temporary folder and raises CheckpointError; the previous checkpoints are untouched.

    `shards(folder)` (train.strategy=fsdp): a collective that writes every process's shards into `<checkpoint>/shards`;
    then every process calls save_checkpoint with its `rank` and `gather` (accelerate's gather_object), only process 0
    writes the other files and the manifest (which covers the shards), and a failure on any process raises the same
    CheckpointError on every process."""
    root = os.path.join(run_dir, "checkpoints")
    final = os.path.join(root, f"iter_{iteration:06d}")
    share = gather if gather is not None else list
    main = rank == 0
    tmp = share([os.path.join(root, f".tmp_iter_{iteration:06d}_{os.getpid()}")] if main else [])[0]
    try:
        json.dumps(extra or {})
    except TypeError as e:
        raise TypeError(f"save_checkpoint: `extra` must be JSON-serialisable ({e}); put tensors in `modules`") from None

    def step(write: Callable[[], None], error: Optional[str]) -> Optional[str]:
        """`write` unless an earlier step failed; the first failure of any process, the same on every process."""
        if error is None:
            try:
                write()
            except BaseException as e:  # noqa: BLE001 - safetensors' SafetensorError, torch.save's RuntimeError,
                # DCP's CheckpointException (a BaseException: a full disk during an fsdp shards/ write), ...
                if main:
                    shutil.rmtree(tmp, ignore_errors=True)
                if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):  # cleaned up, then on their way
                    raise
                reason = e.strerror if isinstance(e, OSError) and e.strerror else " ".join(str(e).split())[:200]
                error = f"{type(e).__name__}: {reason}"
        if shards is None:
            return error
        return next((e for e in share([error]) if e is not None), None)

    def prepare() -> None:
        if main:
            iteration_dirs(run_dir)  # refuses a checkpoints/ that leads out of the run folder before writing there
            os.makedirs(root, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)

    def finish() -> None:
        if not main:
            return
        _write_files(tmp, iteration, policy, optimizers, schedulers, modules, config, extra,
                     rng_states if rng_states is not None else [capture_rng_state()])
        if os.path.exists(final):  # re-saving the same iteration: move the old one aside first
            old = final + f".old{os.getpid()}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(root)

    error = step(prepare, None)
    if shards is not None:
        error = step(lambda: shards(os.path.join(tmp, "shards")), error)
    error = step(finish, error)
    if error is not None:
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"could not write checkpoint {final}: {error} (no partial checkpoint was left; earlier "
                              f"checkpoints are intact)")
    if main:  # the newest keep_last up to this one (a corrupt newer leftover a resume skipped holds no slot)
        older = [d for d in iteration_dirs(run_dir) if int(os.path.basename(d)[5:]) <= iteration]
        for old in older[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        for name in os.listdir(root):  # leftovers of a crash in the middle of a save
            if name.startswith(".tmp_iter_") and not name.endswith(f"_{os.getpid()}"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return final


def _write_files(tmp: str, iteration: int, policy: Any, optimizers: Dict[str, torch.optim.Optimizer],
                 schedulers: Optional[Dict[str, Any]], modules: Optional[Dict[str, torch.nn.Module]], config: Any,
                 extra: Optional[Dict[str, Any]], rng_states: List[Dict[str, Any]]) -> None:
    """Every file of a checkpoint into `tmp`, fsynced, the manifest last."""
    if policy is not None:
        _unwrap(policy).save(os.path.join(tmp, "policy"))
    if modules:
        os.makedirs(os.path.join(tmp, "modules"))
        for name, module in modules.items():
            state = {k: v.detach().contiguous().cpu() for k, v in _unwrap(module).state_dict().items()}
            save_file(state, os.path.join(tmp, module_file(name)))
    torch.save({name: opt.state_dict() for name, opt in optimizers.items()}, os.path.join(tmp, "optimizers.pt"))
    if schedulers:
        torch.save({name: s.state_dict() for name, s in schedulers.items()}, os.path.join(tmp, "schedulers.pt"))
    torch.save(list(rng_states), os.path.join(tmp, "rng.pt"))
    with open(os.path.join(tmp, "state.json"), "w") as f:
        json.dump({"iteration": int(iteration), "time": time.time(), "extra": extra or {}}, f, indent=1)
    if config is not None:  # the resolved config as common.config.config_to_yaml writes it (that module imports this)
        from omegaconf import OmegaConf

        with open(os.path.join(tmp, "config.yaml"), "w") as f:
            f.write(OmegaConf.to_yaml(OmegaConf.structured(config)))
    files = {}
    readable_files(tmp)
    for dirpath, _, filenames in os.walk(tmp):
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
            files[os.path.relpath(path, tmp)] = {"size": os.path.getsize(path), "sha256": file_sha256(path)}
    with open(os.path.join(tmp, MANIFEST), "w") as f:
        json.dump({"iteration": int(iteration), "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    try:
        signature = _manifest_hmac(tmp)
    except OSError as e:  # no writable cache folder: the checkpoint is complete, only unsigned (a resume says so)
        warnings.warn(f"cannot use the trust key {trust_key_path()} ({e.strerror or e}); checkpoint left unsigned",
                      stacklevel=2)
    else:
        with open(os.path.join(tmp, SIGNATURE), "w") as f:
            f.write(signature)
            f.flush()
            os.fsync(f.fileno())
    for dirpath, _, _ in os.walk(tmp):
        _fsync_dir(dirpath)


def verify_checkpoint(path: str, check_hashes: bool = True) -> None:
    """Raise CheckpointError naming `path` and the problem if a file is missing, truncated or altered."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise CheckpointError(f"checkpoint {path} has no {MANIFEST}: it was not completely written")
    try:
        with open(manifest_path) as f:
            files = json.load(f)["files"]
        if not isinstance(files, dict) or not all(
                isinstance(info, dict) and isinstance(info.get("size"), int) and isinstance(info.get("sha256"), str)
                for info in files.values()):
            raise ValueError("each file needs an entry with an integer size and a sha256")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {path}: {MANIFEST} is unreadable or malformed ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:120]})") from None
    for rel, info in files.items():
        full = os.path.join(path, rel)
        if os.path.isabs(rel) or os.path.normpath(rel).startswith(os.pardir):
            raise CheckpointError(f"checkpoint {path}: {MANIFEST} names {rel!r}, outside the checkpoint folder")
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint {path}: file {rel} is missing")
        size = os.path.getsize(full)
        if size != info["size"]:
            raise CheckpointError(f"checkpoint {path}: file {rel} is truncated or altered "
                                  f"({size} bytes, manifest says {info['size']})")
        if check_hashes and file_sha256(full) != info["sha256"]:
            raise CheckpointError(f"checkpoint {path}: file {rel} is corrupt (sha256 differs from the manifest)")


def latest_checkpoint(run_dir: str, check_hashes: bool = True) -> Optional[str]:
    """Newest checkpoint of `run_dir` that verifies; corrupt ones are skipped with a warning. None when there is none."""
    for path in reversed(iteration_dirs(run_dir)):
        try:
            verify_checkpoint(path, check_hashes)
            return path
        except CheckpointError as e:
            warnings.warn(f"{e}; skipping it and using the previous checkpoint", stacklevel=2)
    return None


def load_training_state(path: str, optimizers: Dict[str, torch.optim.Optimizer],
                        schedulers: Optional[Dict[str, Any]] = None,
                        modules: Optional[Dict[str, torch.nn.Module]] = None,
                        rank: int = 0) -> Tuple[int, Dict[str, Any]]:
    """Restore optimizers, schedulers, extra modules and process `rank`'s RNG states from `path`; returns
    (iteration, extra). The script's own streams are in `read_rng_state(path, rank)`.

    The policy itself is loaded by the script from `<path>/policy` (e.g. `TokenPolicy.load(path + "/policy")`).
    """
    verify_checkpoint(path, check_hashes=False)
    state = read_state(path)
    rng = read_rng_state(path, rank)
    opt_states = _named_states(path, "optimizers.pt")
    for name, opt in optimizers.items():
        if name not in opt_states:
            raise CheckpointError(f"checkpoint {path} has no optimizer {name!r} (it has {sorted(opt_states)})")
        with _corrupt(path, f"optimizers.pt[{name!r}]"):
            opt.load_state_dict(opt_states[name])
    if schedulers:
        sched_path = os.path.join(path, "schedulers.pt")
        sched_states = _named_states(path, "schedulers.pt") if os.path.isfile(sched_path) else {}
        for name, sched in schedulers.items():
            if name not in sched_states:
                raise CheckpointError(f"checkpoint {path} has no scheduler {name!r} (it has {sorted(sched_states)})")
            with _corrupt(path, f"schedulers.pt[{name!r}]"):
                sched.load_state_dict(sched_states[name])
    for name, module in (modules or {}).items():
        file = os.path.join(path, module_file(name))
        if not os.path.isfile(file):
            raise CheckpointError(f"checkpoint {path} has no module {name!r} (expected {file})")
        with _corrupt(path, module_file(name)):
            _unwrap(module).load_state_dict(load_file(file))
    with _corrupt(path, f"rng.pt[{rank}]"):
        restore_rng_state(rng)
    return state["iteration"], state["extra"]


@contextlib.contextmanager
def _corrupt(path: str, what: str):
    """Errors of restoring `what` (a malformed state dict, a garbage safetensors header) as one CheckpointError."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors' SafetensorError, torch's KeyError/ValueError/RuntimeError
        raise CheckpointError(f"checkpoint {path}: {what} is malformed ({type(e).__name__}: "
                              f"{' '.join(str(e).split())[:160]}); resume from an earlier checkpoint of the run, or "
                              f"start a new run") from None


def _named_states(path: str, name: str) -> Dict[str, Any]:
    states = safe_torch_load(os.path.join(path, name))
    if not isinstance(states, dict):
        raise CheckpointError(f"checkpoint {path}: {name} holds {type(states).__name__}, not a dict of state dicts by "
                              f"name; resume from an earlier checkpoint of the run")
    return states


def read_state(path: str) -> Dict[str, Any]:
    """A checkpoint's state.json, checked: {"iteration": int >= 0 (the folder's own number), "extra": dict}.
    CheckpointError naming the file and field otherwise."""
    file = os.path.join(path, "state.json")
    try:
        with open(file) as f:
            state = json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{file}: unreadable ({type(e).__name__}: {' '.join(str(e).split())[:120]}); resume "
                              f"from an earlier checkpoint of the run") from None
    fix = "resume from an earlier checkpoint of the run (these scripts write it)"
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds {type(state).__name__}, not an object; {fix}")
    iteration = state.get("iteration")
    if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
        raise CheckpointError(f"{file}: 'iteration' is {iteration!r}, not an integer >= 0; {fix}")
    name = os.path.basename(os.path.normpath(path))
    if name.startswith("iter_") and name[5:].isdigit() and int(name[5:]) != iteration:
        raise CheckpointError(f"{file}: 'iteration' is {iteration} in folder {name}; {fix}")
    extra = state.get("extra", {})
    if not isinstance(extra, dict) or not isinstance(extra.get("state", {}), dict):
        raise CheckpointError(f"{file}: 'extra' (and its 'state') must be objects; {fix}")
    return {**state, "extra": extra}


def read_rng_state(path: str, rank: int = 0) -> Dict[str, Any]:
    """Process `rank`'s RNG dict from a checkpoint (`capture_rng_state()` keys + the script's extra streams)."""
    states = read_rng_states(path)
    if rank >= len(states):
        raise CheckpointError(f"checkpoint {path} holds RNG states of {len(states)} process(es); resume with that "
                              f"many processes (this is process {rank})")
    return states[rank]


def read_rng_states(path: str) -> List[Dict[str, Any]]:
    """Every process's RNG dict of a checkpoint (one per process of the run that wrote it)."""
    states = safe_torch_load(os.path.join(path, "rng.pt"))
    states = [states] if isinstance(states, dict) else states
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise CheckpointError(f"checkpoint {path}: rng.pt holds {type(states).__name__}, not one RNG dict per process")
    for rank, state in enumerate(states):
        numpy_state = state.get("numpy")
        problem = ("'python' is not python's random state" if not isinstance(state.get("python"), (tuple, list)) else
                   "'torch' is not a uint8 tensor" if not (isinstance(state.get("torch"), torch.Tensor) and
                                                          state["torch"].dtype == torch.uint8) else
                   "'numpy' lacks name, keys, pos, has_gauss or cached_gaussian" if not (
                       isinstance(numpy_state, dict) and isinstance(numpy_state.get("keys"), torch.Tensor) and
                       {"name", "pos", "has_gauss", "cached_gaussian"} <= set(numpy_state)) else None)
        if problem:
            raise CheckpointError(f"checkpoint {path}: rng.pt[{rank}]: {problem} (as capture_rng_state writes it); "
                                  f"resume from an earlier checkpoint of the run")
    return states


def safe_torch_load(file: str) -> Any:
    """`torch.load(file, weights_only=True)`: tensors and plain python values only, never code. A file holding other
    objects (a pickle that would run code) is refused with a one-line CheckpointError."""
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "unsupported object"
        raise CheckpointError(f"{file} holds objects other than tensors and plain values ({first[:160]}); refused: "
                              f"this project never unpickles a checkpoint (use a checkpoint written by these "
                              f"scripts)") from None


# ---- trust: a checkpoint written on this machine carries an HMAC of its manifest under a key only this user reads

def trust_key_path() -> str:
    """This user's machine-local key: $XDG_CACHE_HOME/vla-rl/trust.key (default ~/.cache/vla-rl/trust.key), mode 600,
    made on first use."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "vla-rl", "trust.key")


def _trust_key() -> bytes:
    path = trust_key_path()
    try:
        with open(path, "rb") as f:
            key = f.read()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(32))
    try:  # the first writer wins when two processes make it at once; the others read its key
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path, "rb") as f:
        return f.read()


def _manifest_hmac(path: str) -> str:
    with open(os.path.join(path, MANIFEST), "rb") as f:
        return hmac.new(_trust_key(), f.read(), hashlib.sha256).hexdigest()


def written_here(path: str) -> bool:
    """Whether checkpoint `path`'s manifest carries this machine's signature (it was written by this user here, and
    the manifest, hence every file it lists, is unchanged since)."""
    try:
        with open(os.path.join(path, SIGNATURE)) as f:
                signature = f.read().strip()
        return hmac.compare_digest(signature, _manifest_hmac(path))
    except (OSError, UnicodeDecodeError, TypeError):
        return False


def untrusted_message(path: str) -> Optional[str]:
    """One line when resuming `path` would unpickle what it holds and it was not written here (None: safe to load).
    Only an fsdp checkpoint (shards/: torch DCP reads `.metadata` with pickle) needs the trust."""
    if not os.path.isdir(os.path.join(path, "shards")) or written_here(path):
        return None
    return (f"--resume: {path} holds fsdp shards, whose .metadata torch reads with pickle (it can run code), and it "
            f"was not written on this machine (no valid {SIGNATURE} under {trust_key_path()}); resume it only if you "
            f"trust whoever wrote it, like code, with --trust-run")


# ---- saved policies under any folder a user gives: a policy folder, an SFT run's best/last, an RL checkpoint

def resolve_policy_dir(path: str) -> str:
    """The folder holding `config.json` + `model.safetensors`: `path` itself, its policy/, best/ or last/, or for a
    run folder the policy of its newest complete checkpoint (checked against its manifest)."""
    if not os.path.exists(path):
        raise PolicyLoadError(f"{path}: no such file or folder")
    if os.path.isfile(os.path.join(path, "MANIFEST.json")) or os.path.basename(path.rstrip("/")).startswith("iter_"):
        try:  # a training checkpoint: refuse a truncated or altered one instead of loading garbage
            verify_checkpoint(path)
        except CheckpointError as e:
            raise PolicyLoadError(f"{e}; use an earlier checkpoint of the run") from None
    candidates = [path, os.path.join(path, "policy"), os.path.join(path, "best"), os.path.join(path, "last")]
    if os.path.isdir(os.path.join(path, "checkpoints")):  # a run folder of an RL script
        try:
            newest = latest_checkpoint(path)
        except CheckpointError as e:
            raise PolicyLoadError(str(e)) from None
        if newest is not None:
            candidates.append(os.path.join(newest, "policy"))
    for candidate in candidates:
        if is_policy_dir(candidate):
            return candidate
    raise PolicyLoadError(f"no saved policy at {path} (expected config.json + model.safetensors there, in its policy/, "
                          f"best/ or last/ subfolder, or a complete checkpoint in its checkpoints/); train one with "
                          f"`python train_sft.py` first")


def load_saved_policy(path: str, device: str = "cpu", lora_rank: Optional[int] = None):
    """The saved policy (class from models/policy.py's FAMILIES) from any path `resolve_policy_dir` accepts, in eval
    mode; PolicyLoadError (one line) for a missing, truncated or garbage checkpoint."""
    policy_dir = resolve_policy_dir(path)
    from models.policy import family_of_folder, policy_class

    kind = family_of_folder(policy_dir)

    with load_errors(policy_dir, kind):
        policy = policy_class(kind).load(policy_dir, lora_rank=lora_rank, device=device)
    return policy.eval()


def save_run_checkpoint(run_dir: str, iteration: int, policy: Any, optimizers: Dict[str, torch.optim.Optimizer],
                        schedulers: Optional[Dict[str, Any]] = None,
                        modules: Optional[Dict[str, torch.nn.Module]] = None, rank: int = 0,
                        gather: Optional[Any] = None, **kwargs: Any) -> Optional[str]:
    """A run's checkpoint, its policy sharded or not (every script's checkpoint goes through it, common/run.py Run.save;
    the one place that asks common/fsdp.py for shards). Not sharded: process 0 writes everything (`save_checkpoint`),
    other processes return None at once. Sharded (every process calls it, with `gather`, in the rollout mode): the full
    weights are gathered parameter by parameter into a CPU copy on process 0, which writes policy/ from it; every
    process writes into shards/ its shards of the trainable weights, of the optimizers that step them and of the modules
    that hold shards (`fsdp.holds_dtensors`); the rest is written as under ddp, and the weights are gathered again after
    (a failed write too). `kwargs`: save_checkpoint's config, extra, keep_last, rng_states."""
    if not fsdp.is_sharded(policy):
        return save_checkpoint(run_dir, iteration, policy, optimizers, schedulers, modules, **kwargs) \
            if rank == 0 else None
    sharded_opts = {k: o for k, o in optimizers.items() if fsdp.holds_shards(policy, o)}
    held = {k: m for k, m in (modules or {}).items() if fsdp.holds_dtensors(m)}
    # an optimizer that never stepped (no update yet: dynamic sampling kept no group) has no state to shard; torch's
    # get_optimizer_state_dict would make some with a zero-lr step, and its AdamW step count 1 would make the resumed
    # run differ: it is recorded as fresh instead
    fresh = sorted(k for k, o in sharded_opts.items() if not o.state)

    def write_shards(folder: str) -> None:
        fsdp.save_shards(policy, {k: o for k, o in sharded_opts.items() if k not in fresh}, folder, held)
        if rank == 0 and fresh:  # no file: every optimizer has state (the layout is the shards alone)
            with open(os.path.join(folder, fsdp.FRESH_OPTIMIZERS), "w") as f:
                json.dump(fresh, f)

    try:
        weights = fsdp.gathered_copy(policy, keep=rank == 0)  # collective; policy/ is written from process 0's copy
        saved = fsdp.GatheredSave(policy, weights) if rank == 0 else None
        return save_checkpoint(run_dir, iteration, saved,
                               {k: o for k, o in optimizers.items() if k not in sharded_opts}, schedulers,
                               {k: m for k, m in (modules or {}).items() if k not in held}, shards=write_shards,
                               rank=rank, gather=gather, **kwargs)
    finally:
        fsdp.gather_weights(policy)  # collective: every process reaches it, after a failed write too


def load_run_checkpoint(path: str, policy: torch.nn.Module, optimizers: Dict[str, torch.optim.Optimizer],
                        schedulers: Optional[Dict[str, Any]] = None,
                        modules: Optional[Dict[str, torch.nn.Module]] = None, rank: int = 0) -> tuple:
    """`load_training_state` for a policy sharded or not (Run.attach's resume): optimizers, schedulers, modules and
    process `rank`'s RNG states; under fsdp the optimizers that step shards and the modules that hold shards from
    shards/
    (collective; before `register`). The policy's weights themselves are the caller's (from `<path>/policy`, before
    sharding). Returns (iteration, extra); ValueError (one line) for an fsdp resume of a checkpoint without shards/."""
    sharded_opts = {k: o for k, o in optimizers.items() if fsdp.holds_shards(policy, o)}
    held = {k: m for k, m in (modules or {}).items() if fsdp.holds_dtensors(m)}
    iteration, extra = load_training_state(path, {k: o for k, o in optimizers.items() if k not in sharded_opts},
                                           schedulers, {k: m for k, m in (modules or {}).items() if k not in held},
                                           rank=rank)
    if sharded_opts:  # each process reads its shards of the trainable weights, optimizer state and sharded modules
        shards = os.path.join(path, "shards")
        if not os.path.isdir(shards):
            raise ValueError(f"--resume: checkpoint {path} has no shards/ (the weights and optimizer state that "
                             f"train.strategy=fsdp saves per process): it was written under train.strategy=ddp or by "
                             f"an older version; start a new run from its policy/ ({path}/policy)")
        fresh_file = os.path.join(shards, fsdp.FRESH_OPTIMIZERS)
        fresh = json.load(open(fresh_file)) if os.path.isfile(fresh_file) else []  # never stepped: stay fresh
        fsdp.load_shards(policy, {k: o for k, o in sharded_opts.items() if k not in fresh}, shards, held)
    return iteration, extra
