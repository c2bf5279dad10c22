"""What made an SFT start, recorded beside it, and whether it is the start an RL run's init.mode=auto_sft asks for.

An exported SFT start (train_sft.py's sft.output_path) holds `train_config.yaml` (the SFT run's resolved config) and
`made_by.yaml` (this file writes it: the code commit and whether tracked files differed from it (common/provenance.py),
the command line, the held-out score of the exported policy).
`differences(expected, folder)` compares the folder's train_config.yaml with the config the RL run's auto-SFT command
would train (both resolved through train_sft.py's Config, so `sft.steps=1000` given or left at its default is the
same); the output folder, log and resume keys are not part of what made a start.

    write_made_by(folder, {"step": 1000, "success": 0.4})   # train_sft.py, when it exports
    describe(folder)        # "made by `python train_sft.py --task-id 0` at commit 559570f, held-out success 40% ..."
    differences(sft_config(args), folder)   # ["sft.steps=2 (auto_sft: 1000)"], [] = the same start, None = no record
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import yaml

from common.config import ROOT, ConfigError, flatten_config, load_config

MADE_BY = "made_by.yaml"  # in an exported SFT start: commit, command line, held-out score
NOT_WHAT_MADE_IT = ("log.", "resume", "sft.output_path")  # where it was written, not how


def write_made_by(folder: str, best: Optional[Dict[str, Any]] = None, argv: Sequence[str] = ()) -> None:
    """`folder`/made_by.yaml: the commit, the command line and the exported policy's held-out score (`best`: step,
    success)."""
    from common.provenance import code_state

    argv = list(argv) or [os.path.basename(sys.argv[0])] + sys.argv[1:]
    record = {**code_state(), "command": "python " + " ".join(argv)}  # commit (None outside git), dirty
    if best is not None and best.get("success") is not None:
        record["heldout_success"] = round(float(best["success"]), 4)
        record["step"] = int(best.get("step") or 0)
    with open(os.path.join(folder, MADE_BY), "w") as f:
        yaml.safe_dump(record, f, sort_keys=False)


def read_made_by(folder: str) -> Dict[str, Any]:
    try:
        with open(os.path.join(folder, MADE_BY)) as f:
            record = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}
    return record if isinstance(record, dict) else {}


def describe(folder: str) -> str:
    """How the start in `folder` was made, in one phrase (for the run's [init] lines)."""
    record = read_made_by(folder)
    if not record:
        return provenance_only(folder) or \
            "no record of what made it (made before starts recorded it, or not by train_sft.py)"
    score = f", held-out success {record['heldout_success']:.0%} at step {record.get('step')}" \
        if isinstance(record.get("heldout_success"), (int, float)) else ""
    commit = str(record.get("commit") or "unknown")[:10] + (" with uncommitted changes" if record.get("dirty") else "")
    return f"made by `{record.get('command', '?')}` at commit {commit}{score}"


def provenance_only(folder: str) -> Optional[str]:
    """A committed start made before made_by.yaml (e.g. docs/data/libero_learning/libero_spatial_t0/
    sft_start_2026-12-07) carries the provenance.json of the run that trained it: its commit, said in one phrase."""
    from common.provenance import read_run

    first = (read_run(folder) or [{}])[0]
    if not first.get("commit"):
        return None
    dirty = " with uncommitted changes" if first.get("dirty") else ""
    return (f"trained at commit {str(first['commit'])[:10]}{dirty} (its provenance.json; train_config.yaml says how; "
            f"no command line recorded)")


def _train_sft_config_class() -> Any:
    """train_sft.py's Config (the script is not a package module: loaded from its file once)."""
    module = sys.modules.get("train_sft")
    if module is None or not hasattr(module, "Config"):
        spec = importlib.util.spec_from_file_location("train_sft", os.path.join(ROOT, "train_sft.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["train_sft"] = module
        spec.loader.exec_module(module)
    return module.Config


def sft_config(args: Sequence[str]) -> Any:
    """The resolved train_sft.py config of the command-line arguments `args` (`--task-ids N ...` then overrides), as
    train_sft.py resolves it from configs/sft.yaml."""
    args, overrides = list(args), []
    if args and args[0] == "--task-ids":
        ids = []
        args = args[1:]
        while args and not args[0].startswith("-") and "=" not in args[0]:
            ids.append(args.pop(0))
        overrides.append(f"env.task_ids=[{','.join(ids)}]")
    return load_config(_train_sft_config_class(), os.path.join(ROOT, "configs", "sft.yaml"), overrides + args)


def _what_made_it(cfg: Any) -> Dict[str, Any]:
    return {k: v for k, v in flatten_config(cfg).items() if not any(k.startswith(p) for p in NOT_WHAT_MADE_IT)}


def differences(expected: Any, folder: str) -> Optional[List[str]]:
    """The keys (`key=its value (auto_sft: the expected value)`) in which the SFT start in `folder` was made otherwise
    than `expected` (a train_sft.py config); [] when none; None when the folder has no readable train_config.yaml."""
    from models.saved import TRAIN_CONFIG

    saved_path = os.path.join(folder, TRAIN_CONFIG)
    if not os.path.isfile(saved_path):
        return None
    try:
        saved = _what_made_it(load_config(_train_sft_config_class(), saved_path))
    except (ConfigError, OSError):
        return None
    wanted = _what_made_it(expected)
    return [f"{k}={saved.get(k)!r} (auto_sft: {v!r})" for k, v in wanted.items() if saved.get(k) != v]


def keyed_path(path: str, expected: Any) -> str:
    """Where auto_sft puts the start `expected` when `path` holds another one: `path`__<8 hex digits of its config>."""
    text = yaml.safe_dump(_what_made_it(expected), sort_keys=True)
    return f"{path.rstrip('/')}__{hashlib.sha1(text.encode()).hexdigest()[:8]}"


__all__ = ["MADE_BY", "write_made_by", "read_made_by", "describe", "sft_config", "differences", "keyed_path"]
