"""The policy interface the rollout, evaluation, SFT and RL scripts rely on, and the one table from a policy family to
its class. A family is named by the config (`policy.type`: an RL script's `policy` section then takes the keys of
that family's config class, common/config.py) or told by a saved folder (`family_of_folder`); `common.run.
initial_policy` builds or loads it, so adding a family means a class that satisfies one of the protocols below, a
config dataclass with a `type` field and a row in FAMILIES, both in models/configs.py (no script changes).

Every family:
  save(path) / cls.load(path, lora_rank=None, device="cpu")   a folder with config.json; `load` takes any folder
                                                             `save` wrote (and, for openvla_oft, a published one)
  reference()          context manager: the frozen pre-LoRA model (ValueError without LoRA)
  set_lora_rank(r)     merge any LoRA, add fresh LoRA of rank r (0 = full fine-tuning)
  cfg.action_chunk, cfg.image_size, cfg.lora_rank, action_chunk, device
Token families (discrete actions; SRPO, GAE-PPO, LUFFY, SFT), also hidden_size (the value head's input width):
  act(obs, instructions, temperature, greedy, return_hidden, generators) -> actions (B, chunk, 7) env units,
      tokens (B, chunk*7) in [0, action_tokenizer.n_bins), log-probs (B, chunk*7) at that temperature
      [, hidden (B, hidden_size)]; `generators` (None, or one torch.Generator per row): where row i draws its sample
  log_prob(obs, instructions, tokens, temperature, return_hidden) -> log-probs, entropies (B, chunk*7) with grads
  hidden(obs, instructions) -> (B, hidden_size) value-head input
  sft_loss(obs, instructions, actions (B, chunk, 7)) -> (loss, {"sft/loss", "sft/token_accuracy"})
  action_tokenizer: encode(actions) -> tokens, decode(tokens) -> actions, n_bins
Regression families (continuous deterministic actions, no log-probs; evaluation and SFT, refused by RL): act as the
token families with (B, 0) tokens and log-probs, sft_loss, hidden (models/openvla_oft_l1.py).
Flow families (continuous actions; FlowSAR, GAE-PPO, SFT): sample(obs, instructions, num_steps, noise_level,
generators) / velocity / flow_matching_loss / normalize_actions (see models/flow_policy.py), and for GAE-PPO:
  sample(...) with flow-SDE noise (noise_method flow_sde, noise_level > 0) also returns the chain data of its one SDE
      step: sde_step (B,) the denoising step index, x_t / x_next (B, horizon, D) the model-space x before and after
      it, log_prob (B,) its Gaussian log-density, and hidden (B, hidden_size); evaluation samples at noise_level 0
      (the deterministic ODE)
  transition_log_prob(obs, instructions, sde_step, x_t, x_next, noise_level, num_steps, return_hidden) -> (B,)
      with grads: log N(x_next; mean, std^2) under flow_sde_step at that step, summed over the executed part (the
      first action_chunk steps x 7 env dims: what the env ran; RLinf's chunk-level log-prob) [, hidden]
  hidden(obs, instructions) -> (B, hidden_size) value-head input: PaliGemma's output mean-pooled over the valid
      image and prompt tokens; hidden_size
"""
from __future__ import annotations

import importlib
from typing import Any, ContextManager, Dict, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from models.configs import FAMILIES, _family, action_kind, config_class  # noqa: F401 - re-exported
from models.saved import family_of_folder  # noqa: F401 - re-exported


@runtime_checkable
class SavedPolicy(Protocol):
    action_chunk: int
    cfg: Any

    def save(self, path: str) -> None: ...

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu") -> "SavedPolicy": ...

    def reference(self) -> ContextManager: ...

    def set_lora_rank(self, lora_rank: int) -> None: ...


@runtime_checkable
class TokenActionPolicy(SavedPolicy, Protocol):
    action_tokenizer: Any
    hidden_size: int

    def act(self, obs: Dict, instructions: Optional[Sequence[str]] = None, temperature: float = 1.0,
            greedy: bool = False, return_hidden: bool = False,
            generators: Optional[Sequence[torch.Generator]] = None) -> Tuple: ...

    def log_prob(self, obs: Dict, instructions: Optional[Sequence[str]], tokens: torch.Tensor,
                 temperature: float = 1.0, return_hidden: bool = False) -> Tuple: ...

    def hidden(self, obs: Dict, instructions: Optional[Sequence[str]] = None) -> torch.Tensor: ...

    def sft_loss(self, obs: Dict, instructions: Optional[Sequence[str]], actions) -> Tuple[torch.Tensor, Dict]: ...


@runtime_checkable
class FlowActionPolicy(SavedPolicy, Protocol):
    hidden_size: int

    def sample(self, obs: Dict, instructions: Optional[Sequence[str]] = None, **kwargs) -> Any: ...

    def transition_log_prob(self, obs: Dict, instructions: Optional[Sequence[str]], sde_step: torch.Tensor,
                            x_t: torch.Tensor, x_next: torch.Tensor, noise_level: float, *args, **kwargs) -> Any: ...

    def hidden(self, obs: Dict, instructions: Optional[Sequence[str]] = None) -> torch.Tensor: ...

    def velocity(self, obs: Optional[Dict], instructions: Optional[Sequence[str]], x_t: torch.Tensor,
                 *args, **kwargs) -> torch.Tensor: ...

    def flow_matching_loss(self, obs: Dict, instructions: Optional[Sequence[str]], actions,
                           *args, **kwargs) -> Tuple[torch.Tensor, Dict]: ...


def policy_class(family: str):
    """The policy class of a family (its module is imported here, on first use)."""
    module, cls, _, _ = _family(family)
    return getattr(importlib.import_module(module), cls)


__all__ = ["SavedPolicy", "TokenActionPolicy", "FlowActionPolicy", "FAMILIES", "policy_class", "config_class",
           "action_kind", "family_of_folder"]
