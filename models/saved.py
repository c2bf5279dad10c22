"""Saved policy folders (`config.json` + `model.safetensors`): tell token from flow, and the one-line error for a path
that holds no loadable policy. Finding the policy under a run or checkpoint folder and loading it is
`common.checkpoint.load_saved_policy`."""
from __future__ import annotations

import json
import os

TRAIN_CONFIG = "train_config.yaml"  # the training run's resolved config, saved beside an exported policy


class PolicyLoadError(ValueError):
    """A path that holds no loadable policy; the message is one line naming the path, the problem and the fix."""


def is_policy_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors"))


def policy_type(policy_dir: str) -> str:
    """'flow' or 'token', from the saved policy config."""
    try:
        with open(os.path.join(policy_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{policy_dir}/config.json is unreadable ({e}): not a saved policy") from None
    if not isinstance(cfg, dict):
        raise PolicyLoadError(f"{policy_dir}/config.json is not a policy config")
    return "flow" if cfg.get("policy_type") == "flow" or "expert_dim" in cfg else "token"
