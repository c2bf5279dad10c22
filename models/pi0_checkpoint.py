"""pi0 checkpoints from openpi / RLinf and LeRobot: find the folder's layout, refuse what transformers' PI0 cannot
load (pi0.5, LeRobot's legacy key layout) with one line, load the weights with no missing key, and read the state /
action statistics the checkpoint was trained with (the reference protocol, ../shared/specs/pi0.md sections 2-4).

Layouts (a folder; hub ids must be downloaded first, e.g. `huggingface-cli download RLinf/RLinf-Pi0-LIBERO-Long-SFT`):
  openpi    model.safetensors (openpi PyTorch key names, as RLinf ships them) [+ config.json] and
            physical-intelligence/libero/norm_stats.json ({"norm_stats": {"state"|"actions": {"mean", "std"}}}),
            also found under assets/ (openpi's JAX -> PyTorch converter). z-score with eps 1e-6 both ways; pi0_libero
            was trained on actions made relative to the state (first 6 dims, gripper excluded).
  lerobot   config.json with "type": "pi0" (lerobot >= 0.4), model.safetensors ("model." + openpi names),
            policy_preprocessor_step_<i>_normalizer_processor.safetensors (flat keys "observation.state.mean", ...)
            and the postprocessor's unnormaliser file ("action.mean", "action.std"). (x - mean) / (std + eps) with
            the step's eps (1e-8 by default), un-normalised as x * std + mean; relative actions only with
            "use_relative_actions": true.
transformers' PI0 maps both key layouts at load time; this module only checks the result.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

NORM_STATS = os.path.join("physical-intelligence", "libero", "norm_stats.json")  # RLinf's place (asset id)
OPENPI_EPS = 1e-6  # openpi transforms.Normalize / Unnormalize
LEROBOT_EPS = 1e-8  # lerobot NormalizerProcessorStep default
OPENPI_DELTA_DIMS = 6  # pi0_libero's extra_delta_transform: DeltaActions(mask=[True] * 6 + [False])
STATS_FILE = "pi0_stats.json"  # inside a saved policy folder
UNUSED_KEYS = ("model.dit.embed_tokens.weight",)  # the action expert's token embedding is never used by pi0
FP32_PARAMS = ("patch_embedding.", "position_embedding.", "input_layernorm.", "post_attention_layernorm.",
               "layer_norm", "post_layernorm.")  # the last two: SigLIP's LayerNorms (see keep_fp32)


class Pi0CheckpointError(ValueError):
    """A folder that is not a loadable pi0 checkpoint; the message is one line naming the problem and the fix."""


@dataclass
class Pi0Stats:
    """The checkpoint's z-score statistics and action convention. Normalise: (x - mean) / (std + eps); un-normalise:
    x * (std + unnorm_eps) + mean, the statistics cut or padded (mean 0, std 1) to the tensor's last dimension (as
    openpi's Unnormalize pads them to the model's 32 action dims). The first `delta_dims` action dims are relative to
    the same dims of the raw state (0 = absolute actions)."""
    state_mean: List[float]
    state_std: List[float]
    action_mean: List[float]
    action_std: List[float]
    eps: float = OPENPI_EPS
    unnorm_eps: float = OPENPI_EPS
    delta_dims: int = 0
    source: str = "openpi"  # openpi | lerobot

    def math_dtype(self, x: torch.Tensor) -> torch.dtype:
        """openpi's transforms run in numpy on the float64 statistics of norm_stats.json (a float32 state comes out
        float64, then PI0 casts it to float32): the same here for openpi checkpoints (float32 on MPS, which has no
        float64); LeRobot's normaliser runs in float32."""
        return torch.float64 if self.source == "openpi" and x.device.type != "mps" else torch.float32

    def _stats(self, mean: List[float], std: List[float], x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The statistics cut or padded to x's last dimension, in float64 as openpi's JSON values are (float32 for
        lerobot), on x's device and in `math_dtype`."""
        d, dtype = x.shape[-1], self.math_dtype(x)
        m = torch.as_tensor(mean, dtype=torch.float64)[:d]
        s = torch.as_tensor(std, dtype=torch.float64)[:d]
        m = torch.cat([m, torch.zeros(d - len(m), dtype=torch.float64)])
        s = torch.cat([s, torch.ones(d - len(s), dtype=torch.float64)])
        if self.source != "openpi":
            m, s = m.float(), s.float()
        return m.to(x.device, dtype), s.to(x.device, dtype)

    def normalize_state(self, state: torch.Tensor) -> torch.Tensor:
        """(B, d) raw state -> z-scored with the first d statistics (in `math_dtype`, returned in state's dtype)."""
        mean, std = self._stats(self.state_mean, self.state_std, state)
        return ((state.to(mean.dtype) - mean) / (std + self.eps)).to(state.dtype)

    def normalize_actions(self, actions: torch.Tensor) -> torch.Tensor:
        """(..., D) model-space actions (relative where delta_dims says) -> z-scored."""
        mean, std = self._stats(self.action_mean, self.action_std, actions)
        return ((actions.to(mean.dtype) - mean) / (std + self.eps)).to(actions.dtype)

    def unnormalize_actions(self, x: torch.Tensor) -> torch.Tensor:
        """(..., D) z-scored -> model-space actions."""
        mean, std = self._stats(self.action_mean, self.action_std, x)
        return (x.to(mean.dtype) * (std + self.unnorm_eps) + mean).to(x.dtype)

    def to_absolute(self, actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """(B, H, D) actions + (B, d) raw state -> the first delta_dims dims plus state[:, :delta_dims]."""
        if self.delta_dims == 0:
            return actions
        n = self.delta_dims
        return torch.cat([actions[..., :n] + state[:, None, :n].to(actions), actions[..., n:]], dim=-1)

    def to_delta(self, actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """Inverse of to_absolute (openpi's DeltaActions, used for supervised training)."""
        if self.delta_dims == 0:
            return actions
        n = self.delta_dims
        return torch.cat([actions[..., :n] - state[:, None, :n].to(actions), actions[..., n:]], dim=-1)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)

    @classmethod
    def load(cls, path: str) -> "Pi0Stats":
        with open(path) as f:
            return cls(**json.load(f))


# ---------------------------------------------------------------- layouts
def _read_json(path: str) -> Optional[dict]:
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            out = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise Pi0CheckpointError(f"{path} is unreadable ({type(e).__name__}: {e})") from None
    return out if isinstance(out, dict) else None


def find_norm_stats(path: str) -> Optional[str]:
    """openpi's norm_stats.json: <path>/physical-intelligence/libero/ (RLinf), <path>/assets/<asset id>/ (openpi),
    else the only norm_stats.json two or three levels down."""
    for candidate in (os.path.join(path, NORM_STATS), os.path.join(path, "assets", NORM_STATS)):
        if os.path.isfile(candidate):
            return candidate
    found = sorted(glob.glob(os.path.join(path, "*", "*", "norm_stats.json")) +
                   glob.glob(os.path.join(path, "assets", "*", "*", "norm_stats.json")))
    if len(found) > 1:
        raise Pi0CheckpointError(f"{path} holds several norm_stats.json ({', '.join(found)}); keep the one of the "
                                 f"dataset the checkpoint was trained on")
    return found[0] if found else None


def pi0_layout(path: str) -> Optional[str]:
    """'openpi' (model.safetensors + norm_stats.json), 'lerobot' (config.json "type": "pi0"/"pi05") or None."""
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "model.safetensors")):
        return None
    cfg = _read_json(os.path.join(path, "config.json")) or {}
    if cfg.get("policy_type") == "flow":  # this repo's own saved policy
        return None
    if str(cfg.get("type", "")).startswith("pi0") and os.path.isfile(os.path.join(path, "policy_preprocessor.json")):
        return "lerobot"
    if find_norm_stats(path) is not None:
        return "openpi"
    if str(cfg.get("type", "")).startswith("pi0"):
        return "lerobot"  # its normaliser files are missing: load_pi0_stats says so
    return None


def is_pi0_folder(path: str) -> bool:
    return pi0_layout(path) is not None


def _config_says_pi05(cfg: Dict) -> bool:
    names = [str(cfg.get(k, "")).lower() for k in ("type", "model_type", "config_name", "name")]
    return any("pi05" in n or "pi0.5" in n or "pi0_5" in n for n in names) or bool(cfg.get("pi05"))


def check_keys(path: str) -> None:
    """Refuse a pi0.5 checkpoint (config or adaRMS / time-MLP keys) and LeRobot's legacy layout, one line each."""
    from safetensors import safe_open

    cfg = _read_json(os.path.join(path, "config.json")) or {}
    files = [f for f in sorted(glob.glob(os.path.join(path, "*.safetensors")))
             if not os.path.basename(f).startswith("policy_")]  # the weights (one file or shards), not normalisers
    if not files:
        raise Pi0CheckpointError(f"{path} has no *.safetensors weights: download the whole checkpoint folder")
    keys: List[str] = []
    for file in files:
        try:
            with safe_open(file, "pt") as f:
                keys += list(f.keys())
        except Exception as e:  # noqa: BLE001 - any safetensors failure means a bad file
            raise Pi0CheckpointError(f"{file} is unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                                     f"download it again") from None
    adarms = any(".layernorm.dense." in k or "_layernorm.dense." in k or ".norm.dense." in k for k in keys)
    time_mlp = any(k.split(".")[-2] in ("time_mlp_in", "time_mlp_out") for k in keys if "." in k)
    if _config_says_pi05(cfg) or adarms or (time_mlp and not any("state_proj" in k for k in keys)):
        raise Pi0CheckpointError(f"{path} is a pi0.5 checkpoint (adaRMS expert / time MLP / config); transformers "
                                 f"has no pi0.5 model yet: use a pi0 checkpoint (e.g. "
                                 f"RLinf/RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT)")
    if any("paligemma_with_expert.paligemma.language_model." in k or
           "paligemma_with_expert.paligemma.vision_tower." in k for k in keys):
        raise Pi0CheckpointError(f"{path} uses LeRobot's legacy pi0 layout (before lerobot 0.4: "
                                 f"paligemma.language_model.*), which transformers loads with a random PaliGemma: "
                                 f"download the checkpoint's current revision or re-save it with lerobot >= 0.4")


def load_pi0_stats(path: str, layout: Optional[str] = None) -> Pi0Stats:
    """The statistics and action convention of a pi0 folder (openpi or lerobot layout)."""
    layout = layout or pi0_layout(path)
    if layout == "openpi":
        file = find_norm_stats(path)
        data = (_read_json(file) or {}).get("norm_stats", {})
        try:
            st, ac = data["state"], data["actions"]
            return Pi0Stats([float(v) for v in st["mean"]], [float(v) for v in st["std"]],
                            [float(v) for v in ac["mean"]], [float(v) for v in ac["std"]],
                            OPENPI_EPS, OPENPI_EPS, OPENPI_DELTA_DIMS, "openpi")
        except (KeyError, TypeError, ValueError):
            raise Pi0CheckpointError(f"{file} has no norm_stats.state/actions mean and std (openpi's layout)") from None
    if layout != "lerobot":
        raise Pi0CheckpointError(f"{path} is not a pi0 folder (no norm_stats.json, no LeRobot config.json)")
    from safetensors.torch import load_file

    cfg = _read_json(os.path.join(path, "config.json")) or {}
    modes = {k.upper(): str(v).upper() for k, v in (cfg.get("normalization_mapping") or {}).items()}
    for feature in ("STATE", "ACTION"):
        if modes.get(feature, "MEAN_STD") != "MEAN_STD":
            raise Pi0CheckpointError(f"{path}/config.json normalises {feature} with {modes[feature]}; pi0 here "
                                     f"supports MEAN_STD only")
    pre = sorted(glob.glob(os.path.join(path, "policy_preprocessor_step_*_normalizer_processor.safetensors")))
    post = sorted(glob.glob(os.path.join(path, "policy_postprocessor_step_*_unnormalizer_processor.safetensors")))
    flat: Dict[str, torch.Tensor] = {}
    for file in pre + post:  # the postprocessor's action statistics win
        flat.update(load_file(file))
    need = ["observation.state.mean", "observation.state.std", "action.mean", "action.std"]
    missing = [k for k in need if k not in flat]
    if missing:
        raise Pi0CheckpointError(f"{path} lacks LeRobot's normaliser statistics {missing} (expected in "
                                 f"policy_preprocessor_step_<i>_normalizer_processor.safetensors): download the "
                                 f"checkpoint's processor files too")
    eps = LEROBOT_EPS
    for step in (_read_json(os.path.join(path, "policy_preprocessor.json")) or {}).get("steps", []):
        if "normalizer" in str(step.get("registry_name", step.get("class", ""))).lower():
            eps = float((step.get("config") or {}).get("eps", eps))
    delta = OPENPI_DELTA_DIMS if cfg.get("use_relative_actions") else 0
    as_list = lambda k: [float(v) for v in flat[k].float().flatten()]  # noqa: E731
    return Pi0Stats(as_list("observation.state.mean"), as_list("observation.state.std"), as_list("action.mean"),
                    as_list("action.std"), eps, 0.0, delta, "lerobot")


def load_pi0_model(path: str):
    """PI0ForConditionalGeneration from a pi0 folder in float32, refusing pi0.5 / legacy layouts and any missing key
    (one line each); extra keys (e.g. RLinf's value_head) are ignored."""
    from transformers import PI0Config, PI0ForConditionalGeneration

    check_keys(path)
    try:
        config = PI0Config.from_pretrained(path) if os.path.isfile(os.path.join(path, "config.json")) else PI0Config()
        model, info = PI0ForConditionalGeneration.from_pretrained(path, config=config, dtype=torch.float32,
                                                                  output_loading_info=True)
    except Exception as e:  # noqa: BLE001 - config, shape and file errors all mean "not this checkpoint"
        raise Pi0CheckpointError(f"could not load the pi0 checkpoint {path}: {type(e).__name__}: "
                                 f"{' '.join(str(e).split())[:300]}") from None
    missing = sorted(k for k in info.get("missing_keys", ()) if k not in UNUSED_KEYS)
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    if missing or mismatched:
        what = f"{len(missing)} missing weights (e.g. {', '.join(missing[:3])})" if missing else \
            f"{len(mismatched)} weights of the wrong shape (e.g. {', '.join(mismatched[:2])})"
        raise Pi0CheckpointError(f"{path}: {what}; this is not a pi0 checkpoint transformers' PI0 can load "
                                 f"(openpi-PyTorch / RLinf or lerobot >= 0.4 layout)")
    return model


def load_pi0_folder(path: str) -> Tuple[object, Optional[Pi0Stats]]:
    """(PI0 model, its statistics or None for a plain transformers save without statistics)."""
    layout = pi0_layout(path)
    model = load_pi0_model(path)
    return model, (load_pi0_stats(path, layout) if layout is not None else None)


def keep_fp32(name: str) -> bool:
    """openpi's to_bfloat16_for_selected_params: the vision patch / position embeddings, the Gemma layers' input and
    post-attention RMSNorms and the final norms (LM and expert) stay fp32; everything else goes bf16, except SigLIP's
    LayerNorms, which openpi stores in bf16 but which stay fp32 here (CUDA autocast runs layer_norm in fp32 anyway;
    on CPU a bf16 LayerNorm weight cannot take the fp32 activations)."""
    return any(s in name for s in FP32_PARAMS) or name.endswith(".norm.weight")


def cast_bf16_weights(model: torch.nn.Module) -> None:
    """bf16 weights except openpi's fp32 set (keep_fp32) and the trainable parameters, which stay fp32 as AdamW's
    master weights (a step of lr 1e-6 on a bf16 weight of size ~0.02 is below bf16's resolution and would be lost)."""
    for name, p in model.named_parameters():
        p.data = p.data.to(torch.float32 if keep_fp32(name) or p.requires_grad else torch.bfloat16)


__all__ = ["Pi0Stats", "Pi0CheckpointError", "pi0_layout", "is_pi0_folder", "find_norm_stats", "check_keys",
           "load_pi0_stats", "load_pi0_model", "load_pi0_folder", "cast_bf16_weights", "keep_fp32", "STATS_FILE",
           "OPENPI_EPS", "LEROBOT_EPS"]
