"""Config keys renamed by issue 69's one update vocabulary (every RL script: train.update_epochs, mini_batch_size,
micro_batch_size, lr, grad_clip; rollout.prompts_per_iteration; FlowSAR's algorithm keys without their flow_sar_
prefix): old dotted key -> new. A YAML file written with the old names (a run folder's config.yaml: its --resume) is
read with them mapped (`upgrade`), and the mapping is printed once, so an old run still resumes exactly."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

RENAMED: Dict[str, str] = {
    "train.ppo_epochs": "train.update_epochs",
    "train.ppo_mini_batch_size": "train.mini_batch_size",
    "train.ppo_micro_batch_size": "train.micro_batch_size",
    "train.actor_lr": "train.lr",
    "train.actor_max_grad_norm": "train.grad_clip",
    "train.critic_max_grad_norm": "train.critic_grad_clip",
    "rollout.episodes_per_iteration": "rollout.prompts_per_iteration",
    **{f"algorithm.flow_sar_{k}": f"algorithm.{k}"
       for k in ("beta", "temperature", "tau_mid", "ema_schedule", "ema_beta", "ema_eta_rate", "ema_eta_max",
                 "energy_type", "loss_variant", "kl_coeff", "t_min", "t_max", "w_min", "w_max")},
}


def upgrade(data: Any) -> Tuple[Any, List[Tuple[str, str]]]:
    """(`data` with every old key of RENAMED renamed in place of the new one, the (old, new) pairs renamed); a key
    whose new name is there too is left for the strict check to name."""
    if not isinstance(data, dict):
        return data, []
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    done = []
    for old, new in RENAMED.items():
        section, key = old.split(".")
        node = out.get(section)
        new_key = new.split(".")[1]
        if isinstance(node, dict) and key in node and new_key not in node:
            node[new_key] = node.pop(key)
            done.append((old, new))
    return out, done


def note(source: str, done: List[Tuple[str, str]]) -> str:
    """The printed line for a file read with renamed keys."""
    return (f"note: {source} uses the update keys' old names (issue 69), read as: "
            + ", ".join(f"{old} -> {new}" for old, new in done))
