"""Saved policy folders (`config.json` + `model.safetensors`): which family a folder holds (from its files alone, no
model code imported), and the one-line errors for a path that holds no loadable policy or one RL cannot train. Finding the policy under a run or checkpoint folder and loading it is
`common.checkpoint.load_saved_policy`."""
from __future__ import annotations

import json
import os
from typing import List

TRAIN_CONFIG = "train_config.yaml"  # the training run's resolved config, saved beside an exported policy


class PolicyLoadError(ValueError):
    """A path that holds no loadable policy; the message is one line naming the path, the problem and the fix."""


def is_policy_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and (
        os.path.isfile(os.path.join(path, "model.safetensors")) or
        os.path.isfile(os.path.join(path, "model.safetensors.index.json")))  # sharded: a published OpenVLA-OFT


def policy_type(policy_dir: str) -> str:
    """The policy family ('token', 'flow', 'openvla_oft', 'openvla_oft_l1'; models/configs.py FAMILIES), from the
    saved config."""
    try:
        return family_of_folder(policy_dir)
    except (OSError, json.JSONDecodeError) as e:
        raise PolicyLoadError(f"{policy_dir}/config.json is unreadable ({e}): not a saved policy") from None
    except ValueError as e:
        raise PolicyLoadError(str(e)) from None


def family_of_folder(folder: str) -> str:
    """The family of a saved or published policy folder, from its config.json (a pi0 checkpoint folder of openpi /
    RLinf or LeRobot, which may have none, is 'flow')."""
    from models.pi0_checkpoint import is_pi0_folder

    if is_pi0_folder(folder):
        return "flow"
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    if not isinstance(cfg, dict):
        raise ValueError(f"{folder}/config.json is not a policy config")
    if cfg.get("model_type") == "openvla" or cfg.get("policy_type") == "openvla_oft":
        return "openvla_oft_l1" if is_l1_folder(folder) else "openvla_oft"
    if cfg.get("policy_type") == "flow" or cfg.get("type") == "flow" or "expert_dim" in cfg:
        return "flow"
    return "token"


HEAD, PROPRIO = "action_head", "proprio_projector"
DISCRETE_CHECKPOINTS = ("Haozhan72/Openvla-oft-SFT-libero{10,-spatial,-object,-goal}-traj1 (SimpleVLA-RL) or "
                        "Sylvest/OpenVLA-AC-PD-1traj-libero-{object,spatial,goal,long} (SRPO/siiRL)")


def no_rl_message(folder: str) -> str:
    """The one line every RL script stops with when given an L1-regression checkpoint."""
    return (f"{folder} is an OpenVLA-OFT L1-regression checkpoint: its action head regresses continuous actions, so "
            f"it has no log-probs for RL to train; evaluate it (evaluate.py) or fine-tune it "
            f"(train_sft.py policy.init_path=...), and start RL from a discrete OpenVLA-OFT SFT checkpoint instead: "
            f"{DISCRETE_CHECKPOINTS}")


def component_files(folder: str, name: str) -> List[str]:
    """The folder's `<name>--*` checkpoint files (openvla-oft's `find_checkpoint_file`: name and 'checkpoint' in
    the file name)."""
    try:
        return sorted(f for f in os.listdir(folder) if f.startswith(f"{name}--") and "checkpoint" in f)
    except OSError:
        return []


def is_l1_folder(folder: str) -> bool:
    return bool(component_files(folder, HEAD))


def readable_files(folder: str) -> None:
    """Give every file under `folder` the mode a normally created file gets (0666 less the umask, usually 0644):
    safetensors writes its files 0600, which colleagues sharing a cluster cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o666 & ~umask)
