"""Saved policies on disk: find the policy folder under any path a user gives (policy folder, training checkpoint,
run folder), tell token from flow, and load it with a one-line error for anything that is not a good checkpoint."""
from __future__ import annotations

import json
import os
from typing import Optional

TRAIN_CONFIG = "train_config.yaml"  # the training run's resolved config, saved beside an exported policy


class PolicyLoadError(ValueError):
    """A path that holds no loadable policy; the message is one line naming the path, the problem and the fix."""


def _is_policy_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors"))


def resolve_policy_dir(path: str) -> str:
    """The folder holding `config.json` + `model.safetensors`: `path` itself, its policy/, best/ or last/, or for a
    run folder the policy of its newest complete checkpoint (checked against its manifest)."""
    from common.checkpoint import CheckpointError, latest_checkpoint, verify_checkpoint

    if not os.path.exists(path):
        raise PolicyLoadError(f"{path}: no such file or folder")
    if os.path.isfile(os.path.join(path, "MANIFEST.json")) or os.path.basename(path.rstrip("/")).startswith("iter_"):
        try:  # a training checkpoint: refuse a truncated or altered one instead of loading garbage
            verify_checkpoint(path)
        except CheckpointError as e:
            raise PolicyLoadError(f"{e}; use an earlier checkpoint of the run") from None
    candidates = [path, os.path.join(path, "policy"), os.path.join(path, "best"), os.path.join(path, "last")]
    if os.path.isdir(os.path.join(path, "checkpoints")):  # a run folder of an RL script
        newest = latest_checkpoint(path)
        if newest is not None:
            candidates.append(os.path.join(newest, "policy"))
    for candidate in candidates:
        if _is_policy_dir(candidate):
            return candidate
    raise PolicyLoadError(f"no saved policy at {path} (expected config.json + model.safetensors there, in its policy/, "
                          f"best/ or last/ subfolder, or a complete checkpoint in its checkpoints/); train one with "
                          f"`python train_sft.py` first")


def policy_type(policy_dir: str) -> str:
    """'flow' or 'token', from the saved policy config; a pi0 checkpoint folder (openpi / RLinf, LeRobot) is 'flow'."""
    from models.pi0_checkpoint import is_pi0_folder

    if is_pi0_folder(policy_dir):
        return "flow"
    try:
        with open(os.path.join(policy_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{policy_dir}/config.json is unreadable ({e}): not a saved policy") from None
    if not isinstance(cfg, dict):
        raise PolicyLoadError(f"{policy_dir}/config.json is not a policy config")
    return "flow" if cfg.get("policy_type") == "flow" or "expert_dim" in cfg else "token"


def load_saved_policy(path: str, device: str = "cpu", lora_rank: Optional[int] = None):
    """TokenPolicy or FlowPolicy from any path `resolve_policy_dir` accepts, in eval mode; PolicyLoadError (one line)
    for a missing, truncated or garbage checkpoint."""
    policy_dir = resolve_policy_dir(path)
    kind = policy_type(policy_dir)
    try:
        if kind == "flow":
            from models.flow_policy import FlowPolicy as cls
        else:
            from models.token_policy import TokenPolicy as cls
        policy = cls.load(policy_dir, lora_rank=lora_rank, device=device)
    except PolicyLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, json, shape and key errors all mean "not a good checkpoint"
        msg = " ".join(str(e).split())[:300]
        raise PolicyLoadError(f"could not load the {kind} policy in {policy_dir}: {type(e).__name__}: {msg}") from None
    return policy.eval()
