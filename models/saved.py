"""Saved policy folders (`config.json` + `model.safetensors`): the one-line errors for a path that holds no loadable
policy or one RL cannot train, and file helpers shared by the families. Which family a folder holds is each
family's own `detect` (models/policy.py `family_of_folder`); finding the policy under a run or checkpoint folder and
loading it is `common.checkpoint.load_saved_policy`."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, List

TRAIN_CONFIG = "train_config.yaml"  # the training run's resolved config, saved beside an exported policy


class PolicyLoadError(ValueError):
    """A path that holds no loadable policy; the message is one line naming the path, the problem and the fix."""


def is_policy_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) and (
        os.path.isfile(os.path.join(path, "model.safetensors")) or
        os.path.isfile(os.path.join(path, "model.safetensors.index.json")))  # sharded: a published OpenVLA-OFT


@contextlib.contextmanager
def load_errors(folder: str, family: str = "") -> Iterator[None]:
    """The one place that turns any error while loading a policy folder into one line (PolicyLoadError): a
    truncated safetensors shard, broken JSON, a missing tokenizer, shape and key mismatches all mean "not a good
    checkpoint", for every family and every script (evaluate.py, train_sft.py policy.init_path, the RL scripts'
    init.path)."""
    try:
        yield
    except PolicyLoadError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors, json, tokenizer, shape and key errors alike
        msg = " ".join(str(e).split())[:300]
        raise PolicyLoadError(f"could not load the {family + ' ' if family else ''}policy in {folder}: "
                              f"{type(e).__name__}: {msg}") from None


HEAD, PROPRIO = "action_head", "proprio_projector"
DISCRETE_CHECKPOINTS = ("Haozhan72/Openvla-oft-SFT-libero{10,-spatial,-object,-goal}-traj1 (SimpleVLA-RL) or "
                        "Sylvest/OpenVLA-AC-PD-1traj-libero-{object,spatial,goal,long} (SRPO/siiRL)")


def no_rl_message(folder: str) -> str:
    """The one line every RL script stops with when given an L1-regression checkpoint."""
    return (f"{folder} is an OpenVLA-OFT L1-regression checkpoint: its action head regresses continuous actions, so "
            f"it has no log-probs for RL to train; evaluate it (evaluate.py) or fine-tune it "
            f"(train_sft.py policy.init_path=...), and start RL from a discrete OpenVLA-OFT SFT checkpoint instead: "
            f"{DISCRETE_CHECKPOINTS} (or, as the GAE-PPO reference, from its LM's untrained action tokens: "
            f"policy.type=openvla_oft policy.from_l1_checkpoint=true)")


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


def check_weights_fit(build: Callable[[], Any], file: str) -> None:
    """Build the network `build()` returns on the meta device (shapes only, no memory) and compare every weight's
    shape with `file`'s safetensors header (read alone, no tensor data): a config.json that would build a model
    other than the weights it sits beside (e.g. a size key set huge) is refused in one line before anything is
    allocated. ValueError (callers load under `load_errors`, which makes it the family's one-line PolicyLoadError)."""
    import torch
    from safetensors import safe_open

    with torch.device("meta"):
        net = build()
    expected = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    try:
        with safe_open(file, "pt") as f:
            stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # noqa: BLE001 - a truncated or garbage header
        raise ValueError(f"{file} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
    for key, shape in expected.items():
        if stored.get(key) != shape:
            held = f"shape {list(stored[key])}" if key in stored else "no such weight"
            raise ValueError(f"config.json builds {key} of shape {list(shape)} but {os.path.basename(file)} holds "
                             f"{held}; the folder's config and weights disagree (refused before building the model)")
    extra = sorted(set(stored) - set(expected))
    if extra:
        raise ValueError(f"{os.path.basename(file)} holds {extra[0]!r}, which the model config.json builds does not "
                         f"have; the folder's config and weights disagree")
