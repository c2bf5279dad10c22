"""The policy interface the rollout, evaluation, SFT and RL scripts rely on, and the one table from a policy family to
its class. A family is named by the config (`policy.type`: an RL script's `policy` section then takes the keys of
that family's config class, common/config.py) or told by a saved folder (`family_of_folder`, which asks every
family's `detect`). Everything family-specific lives in the family's module: its class inherits `PolicyFamily` and
overrides what differs (how to `detect` its folders, its defaults per suite in
`resolve_for_suite`, its start from a folder in `start_from`), so a new family is one module plus one row in FAMILIES
(models/configs.py) and no script changes (tests/test_policy_families.py adds a toy one).

Every family:
  kind                 'token' (discrete actions with log-probs), 'flow' (continuous, sampled) or 'regression'
                       (continuous, deterministic, no log-probs: evaluation and SFT only); stated once, in the
                       family's FAMILIES row, and set on its class from there
  published            True: starts only from a published checkpoint folder (no scratch policy, no auto-SFT)
  paper_protocol()     the evaluation protocol of the paper its published checkpoints come from (evaluate.py)
  reads_wrist_camera() whether the env must render the wrist camera for it
  reads_folder_of(found, policy_cfg)  whether RL starts this family from another family's folder (default: never)
  resizes_images       True: takes camera images of any size (else exactly cfg.image_size)
  detect(folder)       does the folder hold a policy of this family (from its files; default: config.json's type)
  resolve_for_suite(policy_cfg, suite) -> policy_cfg   suite-dependent defaults (e.g. OpenVLA-OFT's image pipeline)
  start_from(folder, policy_cfg, env_cfg, device, say) -> policy   the RL start from a folder of this family
  cls.fresh(policy_cfg, demo_actions) -> policy   SFT's start from nothing (default: the demo actions' statistics)
  rollout_step(obs, instructions, ...) -> actions, record   one rollout call and what the update needs of it per row
                       (tokens / old_log_probs / noise, other keys kept as extras); the default is a token family's
  ppo_log_prob(obs, instructions, record, temperature, noise_level, executed) -> log-probs (B, A), entropies or None,
                       hidden: PPO's log-probs of a rollout's actions with grads (default: a token family's `log_prob`)
  memory_model(policy_cfg, folder) -> models.memory.Model or None   what the memory plan reads (common/memory_plan.py):
                       the network on the meta device and its activation stacks; None (the default): no plan
  save(path) / cls.load(path, lora_rank=None, device="cpu")   a folder with config.json; `load` takes any folder
                                                             `save` wrote (and, for openvla_oft, a published one)
  sft_loss(obs, instructions, actions (B, chunk, 7)) -> (loss, {"sft/...": float})   train_sft.py's objective
  reference()          context manager: the frozen pre-LoRA model (ValueError without LoRA)
  set_lora_rank(r)     merge any LoRA, add fresh LoRA of rank r (0 = full fine-tuning)
  cfg.action_chunk, cfg.image_size, cfg.lora_rank, action_chunk, device
Token families (discrete actions; SRPO, GAE-PPO, LUFFY, SFT), also hidden_size (the value head's input width):
  act(obs, instructions, temperature, greedy, return_hidden, generators) -> actions (B, chunk, 7) env units,
      tokens (B, chunk*7) in [0, action_tokenizer.n_bins), log-probs (B, chunk*7) at that temperature
      [, hidden (B, hidden_size)]; `generators` (None, or one torch.Generator per row): where row i draws its sample
  log_prob(obs, instructions, tokens, temperature, return_hidden) -> log-probs, entropies (B, chunk*7) with grads
  hidden(obs, instructions) -> (B, hidden_size) value-head input
  sft_loss: cross-entropy on action tokens ({"sft/loss", "sft/token_accuracy"})
  action_tokenizer: encode(actions) -> tokens, decode(tokens) -> actions, n_bins
Regression families (continuous deterministic actions, no log-probs; evaluation and SFT, refused by RL): act as the
token families with (B, 0) tokens and log-probs, sft_loss, hidden (models/openvla_oft_l1.py).
Flow families (continuous actions; FlowSAR, GAE-PPO, SFT): sample(obs, instructions, num_steps, noise_level,
generators) / velocity / flow_matching_loss (= sft_loss) / normalize_actions (see models/flow_policy.py), and for
GAE-PPO:
  sample(...) with flow-SDE noise (noise_method flow_sde, noise_level > 0) also returns the chain data of its one SDE
      step: sde_step (B,) the denoising step index, x_t / x_next (B, horizon, D) the model-space x before and after
      it, log_prob (B,) its Gaussian log-density, and hidden (B, hidden_size); evaluation samples at noise_level 0
      (the deterministic ODE)
  transition_log_prob(obs, instructions, sde_step, x_t, x_next, noise_level, num_steps, return_hidden) -> (B,)
      with grads: log N(x_next; mean, std^2) under flow_sde_step at that step, summed over the executed part (the
      first action_chunk steps x 7 env dims: what the env ran; RLinf's chunk-level log-prob) [, hidden]
  ppo_log_prob(...) -> that step's transition_log_prob as (B, 1), no entropy (its std is fixed), hidden
  hidden(obs, instructions) -> (B, hidden_size) value-head input: PaliGemma's output mean-pooled over the valid
      image and prompt tokens; hidden_size
  model_space_samples  True when the rollout keeps the model-space sample x0 (a pi0 checkpoint's protocol)
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
from typing import Any, Callable, ContextManager, Dict, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch

from models.configs import FAMILIES, family_entry, action_kind, config_class  # noqa: F401 - re-exported
from models.saved import PolicyLoadError

LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_vision", "bf16")  # an RL run's own keys, not the folder's


def read_config_json(folder: str) -> Dict[str, Any]:
    """The folder's config.json as a dict ({} when there is none or it is not a JSON object)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class _FamilyKind:
    """A family class's `kind` (on the class and its instances): the action kind its FAMILIES row states."""

    def __get__(self, obj: Any, cls: type) -> str:
        return action_kind(cls.family())


class PolicyFamily:
    """What a policy family tells about itself, with the defaults of a family that saves its own folders (token,
    flow); a family's class inherits it and overrides what differs (models/policy.py docstring)."""

    kind: str = _FamilyKind()  # its FAMILIES row's (models/configs.py), the one place a family's kind is stated
    published: bool = False
    model_space_samples: bool = False
    resizes_images: bool = False  # True: takes camera images of any size (resizes them to its vision tower itself)

    def paper_protocol(self) -> str:
        """The evaluation protocol of the paper a published checkpoint of this family comes from (envs/protocols.py;
        evaluate.py's default for a folder with no training config of ours); `heldout`: none."""
        return "heldout"

    def reads_wrist_camera(self) -> bool:
        """Whether the policy reads the wrist camera (the env must render it)."""
        return bool(getattr(self.cfg, "use_wrist", False))

    @classmethod
    def family(cls) -> str:
        """The family's name: its config class's `type` default (the FAMILIES key)."""
        return cls.config_class.__dataclass_fields__["type"].default

    @classmethod
    def detect(cls, folder: str) -> bool:
        """A folder this family saved: config.json names it (`type`, or `policy_type` in older saves)."""
        cfg = read_config_json(folder)
        return cfg.get("type", cfg.get("policy_type")) == cls.family()

    @classmethod
    def reads_folder_of(cls, found: str, policy_cfg: Any) -> bool:
        """Whether this family, configured as `policy_cfg`, starts RL from a folder of family `found` (another
        family's: `family_of_folder`); none by default (OpenVLA-OFT's token family reads an L1-regression folder with
        policy.from_l1_checkpoint)."""
        return False

    @classmethod
    def resolve_for_suite(cls, policy_cfg: Any, suite: str) -> Any:
        """The policy config with its suite-dependent defaults filled in (none by default)."""
        return policy_cfg

    def rollout_step(self, obs: Dict, instructions: Sequence[str], *, temperature: float = 1.0, greedy: bool = False,
                     generators: Optional[Sequence[torch.Generator]] = None, flow_steps: Optional[int] = None,
                     flow_noise_level: float = 0.0, keep_hidden: bool = False, keep_chain: bool = False
                     ) -> Tuple[Any, Dict[str, Any]]:
        """One policy call of a rollout (common/rollout.py): the actions (B, chunk, 7) to execute and this family's
        record of the call, per row: what its RL update needs again (`RolloutBatch` stores `tokens`, `old_log_probs`
        and `noise` under those names, every other key in `extras`). The default is a token family's (a regression
        family's tokens and log-probs are (B, 0)): `act`'s tokens, their log-probs and, with `keep_hidden`, the
        pooled hidden state; a flow family overrides it (models/flow_policy.py)."""
        out = self.act(obs, instructions, temperature=temperature, greedy=greedy, return_hidden=keep_hidden,
                       generators=generators)
        record = {"tokens": out[1].cpu().numpy(), "old_log_probs": out[2].float().cpu().numpy()}
        if keep_hidden:
            record["hidden"] = out[3].float().cpu().numpy()
        return out[0], record

    def ppo_log_prob(self, obs: Dict, instructions: Sequence[str], record: Callable[..., torch.Tensor], *,
                     temperature: float = 1.0, noise_level: float = 0.0, executed: Optional[torch.Tensor] = None
                     ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """PPO's log-probs of the actions a rollout took, under the current weights and with gradients
        (train_gae_ppo.py): (log-probs (B, A), their entropies (B, A) or None when they have no gradient, hidden
        (B, hidden_size)). `record(key)` reads these rows' rollout record (`rollout_step`'s keys) as a tensor,
        `executed` (B,) how many of each chunk's actions the env ran. The default is a token family's: `log_prob` of
        the recorded tokens at `temperature` (A = chunk x 7, one per action token); a flow family overrides it."""
        return self.log_prob(obs, instructions, record("tokens"), temperature, return_hidden=True)

    @classmethod
    def fresh(cls, policy_cfg: Any, demo_actions: Any) -> Any:
        """SFT's start from nothing (train_sft.py, `policy.<family>` section `policy_cfg`): an untrained policy whose
        action statistics come from the demos' actions (N, 7) (the default: an ActionTokenizer of policy_cfg.n_bins
        fitted on them, given to the constructor). Never asked of a published family (train_sft.py refuses it)."""
        from models.action_tokenizer import ActionTokenizer

        return cls(policy_cfg, ActionTokenizer.fit(demo_actions, n_bins=policy_cfg.n_bins))

    @classmethod
    def memory_model(cls, policy_cfg: Any, folder: Optional[str]) -> Any:
        """The memory plan's view of the policy `policy_cfg` (and `folder`, a checkpoint it starts from, when given)
        builds: a models.memory.Model (its network on the meta device and its activation stacks). None: the family
        gives no plan (--dry-run says so in one line; a run starts unchecked)."""
        return None

    @classmethod
    def start_from(cls, folder: str, policy_cfg: Any, env_cfg: Any, device: str, say: Callable[[str], None]) -> Any:
        """RL's start from `folder` (a policy this project saved): its architecture from the folder (one line via
        `say` names the YAML keys it overrides), the run's own LoRA keys (LORA_KEYS) from `policy_cfg`; any saved
        LoRA is merged into the base and fresh LoRA of policy_cfg.lora_rank goes on top, so the KL reference
        (adapters off) is exactly the policy RL started from."""
        policy = cls.load(folder, device=device)
        differ = [f"policy.{k}" for k in policy_keys_from_checkpoint(policy_cfg, policy.cfg, LORA_KEYS)]
        differ += [f"env.{k}" for k in ("image_size", "action_chunk") if getattr(env_cfg, k) != getattr(policy.cfg, k)]
        if differ:
            say(f"taken from the checkpoint {folder} (its architecture), not the config: {', '.join(differ)}")
        policy.cfg = dataclasses.replace(policy.cfg, **{k: getattr(policy_cfg, k) for k in LORA_KEYS
                                                        if hasattr(policy.cfg, k) and hasattr(policy_cfg, k)})
        policy.set_lora_rank(policy_cfg.lora_rank)  # merge the SFT's LoRA, fresh adapters on top (or none: full FT)
        return policy


def policy_keys_from_checkpoint(yaml_policy: Any, loaded_policy: Any, kept: Sequence[str]) -> List[str]:
    """Names of `policy.*` keys whose YAML value differs from the loaded checkpoint's (the checkpoint wins); keys in
    `kept` (LoRA, precision) are the run's own and are not compared."""
    return [f.name for f in dataclasses.fields(yaml_policy) if f.name not in kept
            and getattr(yaml_policy, f.name) != getattr(loaded_policy, f.name, None)]


def family_of_folder(folder: str) -> str:
    """The family of a saved or published policy folder: the one whose `detect` recognises it (PolicyLoadError when
    none does)."""
    if not os.path.isdir(folder):
        raise PolicyLoadError(f"{folder}: no such folder")
    for family in FAMILIES:
        if policy_class(family).detect(folder):
            return family
    raise PolicyLoadError(f"{folder} holds no policy of a known family ({', '.join(FAMILIES)}): expected a folder "
                          f"written by train_sft.py or an RL run (config.json + model.safetensors), or a published "
                          f"OpenVLA-OFT / pi0 checkpoint")


@runtime_checkable
class SavedPolicy(Protocol):
    kind: str
    action_chunk: int
    cfg: Any

    def save(self, path: str) -> None: ...

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu") -> "SavedPolicy": ...

    def reference(self) -> ContextManager: ...

    def set_lora_rank(self, lora_rank: int) -> None: ...

    def sft_loss(self, obs: Dict, instructions: Optional[Sequence[str]], actions) -> Tuple[torch.Tensor, Dict]: ...


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
    module, cls, _, _ = family_entry(family)
    return getattr(importlib.import_module(module), cls)


__all__ = ["SavedPolicy", "TokenActionPolicy", "FlowActionPolicy", "FAMILIES", "PolicyFamily", "policy_class",
           "config_class", "action_kind", "family_of_folder", "policy_keys_from_checkpoint", "LORA_KEYS"]
