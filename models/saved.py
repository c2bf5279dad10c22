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
    return os.path.isfile(os.path.join(path, "config.json")) and (
        os.path.isfile(os.path.join(path, "model.safetensors")) or
        os.path.isfile(os.path.join(path, "model.safetensors.index.json")))  # sharded: a published OpenVLA-OFT


def policy_type(policy_dir: str) -> str:
    """The policy family ('token', 'flow', 'openvla_oft'; models/policy.py FAMILIES), from the saved config."""
    from models.policy import family_of_folder

    try:
        return family_of_folder(policy_dir)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{policy_dir}/config.json is unreadable ({e}): not a saved policy") from None
    except ValueError as e:
        raise PolicyLoadError(str(e)) from None


def readable_files(folder: str) -> None:
    """Give every file under `folder` the mode a normally created file gets (0666 less the umask, usually 0644):
    safetensors writes its files 0600, which colleagues sharing a cluster cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~umask)
