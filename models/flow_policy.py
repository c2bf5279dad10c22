"""pi0 flow policy: a thin wrapper around transformers' `PI0ForConditionalGeneration` (PaliGemma prefix + Gemma
action expert) that speaks this repo's observation dicts, instruction lists and normalised 7-D action chunks.

Convention (spec section 4, and PI0's own): t = 0 clean, t = 1 noise, x_t = (1 - t) a + t eps, target u = eps - a.
Actions live in the ActionTokenizer's normalised space ([-1, 1] per dim). Sampling integrates Euler from t = 1 to 0:
x <- x - v / N, plus, with noise_level s > 0, s * sqrt(1/N) * z after every step but the last (exploration).
Numerics as openpi's PyTorch pi0 (docs/pi0.md): the time sinusoid in float64 (`OpenpiTimestepEmbeddings`, put in
place of PI0's float32 one), the sampler's times t = 1, t += float32(-1/N) in float32 (`openpi_time_grid`).

Mapping onto PI0:
  cameras      agentview (+ wrist with use_wrist) -> pixel_values (B, V, 3, S, S) in [-1, 1] (PI0Processor's
               normalisation), resized to the vision tower's size S when it differs from cfg.image_size (an openpi
               checkpoint: openpi's uint8 PIL bilinear resize_with_pad, then /255*2-1; else torch antialiased
               bilinear on the floats).
  instruction  "<image> x n_img_tokens x V" then openpi's BOS + encode(text) + encode(newline), right-padded with id
               0; the byte tokenizer (tiny) or the checkpoint's own tokenizer.
  state        (B, 8) raw, zero-padded to max_state_dim (PI0's state token lives in the expert's suffix).
  actions      (B, chunk, 7) normalised, zero-padded to max_action_dim: the padded dims of x_t are always 0 (training
               and sampling alike) and only the first 7 output dims are used; PI0's chunk_size is set to action_chunk.
The prefix (images + prompt through the PaliGemma LM) is run once and its KV cache reused: a velocity call runs only
the action expert over [state, x_t] (what an ODE step and a FlowSAR update step need). The training loss goes through
PI0's own forward (prefix + expert in one call), the same computation.

Tiers: `pretrained_path` = a pi0 checkpoint: a transformers' save, or an openpi / RLinf or LeRobot >= 0.4 pi0
folder (models/pi0_checkpoint.py: pi0.5, legacy layouts and missing weights are refused) (LIBERO tier); without it a
tiny PI0Config (SigLIP + Gemma of width hidden_size, depth num_layers; expert width expert_dim) is built
from the fields below (CPU tier). With LoRA: rank-r adapters on the attention and MLP projections of the PaliGemma LM
and the action expert (+ vision tower attention with lora_vision); the action/time/state embeddings and the action
output projection train fully (peft modules_to_save).

The checkpoint's protocol (a pi0 folder that carries statistics; ../shared/specs/pi0.md sections 2-4): the state is
z-scored with the checkpoint's statistics before the zero padding; the model space is PI0's own (horizon chunk_size,
e.g. 50, x max_action_dim 32, noise in every dim); env actions = un-normalised model output, made absolute (first
delta_dims + state) where the checkpoint was trained on relative actions, first 7 dims, first action_chunk steps
(openpi's replan_steps); the prompt is openpi's cleaned text (underscores and newlines -> spaces) + newline, padded
to max_text_len; an openpi checkpoint's statistics apply in float64 as openpi's numpy transforms (Pi0Stats).
Without statistics everything stays as above (actions in the ActionTokenizer's space, 7 dims, horizon =
action_chunk).
Recipe switches (RLinf's pi0 RL): train_expert_only (PaliGemma frozen; the expert and the action/state/time
projections train in full), bf16_weights (the frozen weights in bf16 with openpi's fp32 exceptions, the trainable
ones fp32 as AdamW's master weights; run under bf16 autocast),
noise_method flow_sde (at noise_level > 0 one random denoising step per call is RLinf's flow-SDE step, the others
ODE; noise_level 0 = deterministic ODE, as evaluation uses).
PPO on this family (RLinf's): the sample keeps the SDE step's chain data (step index, x before and after it);
`transition_log_prob` recomputes that step's Gaussian density with gradients, over the executed part only (first
action_chunk steps x 7 env dims: the rest of the horizon and the padding dims never reach the env, so they carry no
credit and would only add noise to the ratio), summed to one log-prob per chunk (RLinf's chunk-level log-prob).
`hidden` (the value head's input) is, with value_input prefix, PaliGemma's output mean-pooled over the valid prefix
tokens (RLinf's value_after_vlm mean_token mode, a function of the observation); with value_input expert (RLinf's pi0
critic, openpi_action_model.py:176-179,1154-1163,1274-1284@a3816b5) the action expert's output before the action
projection, mean-pooled over the horizon, at each denoising step: a sample records all S steps' (B, S, expert_dim)
(the value head averages their S values, RLinf's rollout value), the update's `transition_log_prob` the flow-SDE
step's (B, expert_dim), and `hidden` (a truncated episode's bootstrap) an ODE chain's from fresh noise.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from transformers import (GemmaConfig, PaliGemmaConfig, PI0Config, PI0ForConditionalGeneration,
                          SiglipVisionConfig)
from transformers.models.pi0.modeling_pi0 import PI0TimestepEmbeddings

from models.action_tokenizer import ACTION_DIM, ActionTokenizer
from models.configs import FlowPolicyConfig
from models.memory import Model, Stack, trainable, tuned
from models.pi0_checkpoint import STATS_FILE, Pi0Stats, cast_bf16_weights, is_pi0_folder, load_pi0_folder
from models.policy import PolicyFamily, read_config_json
from models.text_tokenizer import ByteTokenizer, load_text_tokenizer
from models.vla_backbone import STATE_DIM, Obs, to_pixels, autocast, check_obs, merge_lora, reference_context, unwrap

PRESETS = ("tiny", "pi0")
NOISE_METHODS = ("additive", "flow_sde")
VALUE_INPUTS = ("prefix", "expert")  # what the value head reads (FlowPolicyConfig.value_input)
LORA_TARGETS = r".*\.(language_model|dit)\.layers\.\d+\.(self_attn\.(q_proj|k_proj|v_proj|o_proj)|" \
               r"mlp\.(gate_proj|up_proj|down_proj))"
LORA_VISION_TARGETS = r".*\.vision_tower\..*self_attn\.(q_proj|k_proj|v_proj|out_proj)"
TRAINABLE_WITH_LORA = ["embed_action_time", "action_out_proj"]  # PI0's action/time/state embeddings and output
PI0_CONFIG_DIR = "pi0"  # inside a saved policy folder: the PI0Config (architecture), to rebuild without download


def _randn(shape: Tuple[int, ...], device: torch.device,
           generators: Optional[Sequence[torch.Generator]] = None) -> torch.Tensor:
    """Standard normal noise of `shape`; with `generators`, row i (dim 0) drawn on the CPU from generators[i]."""
    if generators is None:
        return torch.randn(shape, device=device)
    if len(generators) != shape[0]:
        raise ValueError(f"need one generator per row: {shape[0]} rows, {len(generators)} generators")
    return torch.stack([torch.randn(shape[1:], generator=g) for g in generators]).to(device)




class Prefix(NamedTuple):
    """Cached prefix: PI0's PaliGemma KV cache of [images, prompt] (never mutated: each velocity call works on a
    shallow copy), the prompt's key validity (B, P) long (0 = padding), the model's state (B, max_state_dim), the
    raw env state (B, 8) (for relative actions) and the PaliGemma output mean-pooled over the valid prefix tokens
    (B, hidden_size) float32 (the value head's input, `FlowPolicy.hidden`)."""
    past_key_values: Any
    attention_mask: torch.Tensor
    state: torch.Tensor
    raw_state: Optional[torch.Tensor] = None
    hidden: Optional[torch.Tensor] = None


class FlowSample(NamedTuple):
    actions: np.ndarray  # (B, action_chunk, 7) float32 env actions to execute (unnormalised)
    x0: torch.Tensor  # (B, horizon, D) the integrated sample in the model space (D = 7, or 32 with statistics)
    noise: torch.Tensor  # (B, horizon, D) the initial noise x_1
    # the flow-SDE step's chain data (noise_method flow_sde at noise_level > 0; else None), what PPO needs to
    # recompute the step's log-density (`FlowPolicy.transition_log_prob`): the step index i (B,) int64, x before it
    # (B, horizon, D), the sampled x after it, and its log-density (B,) float32 over the executed part
    sde_step: Optional[torch.Tensor] = None
    x_t: Optional[torch.Tensor] = None
    x_next: Optional[torch.Tensor] = None
    log_prob: Optional[torch.Tensor] = None
    hidden: Optional[torch.Tensor] = None  # the value head's input: (B, hidden_size) the prefix's pooled output
                                           # (Prefix.hidden), or with value_input expert (B, steps, expert_dim)


def tiny_pi0_config(cfg: FlowPolicyConfig, vocab_size: int) -> PI0Config:
    """PI0Config for the CPU tier: SigLIP (patch 16 at cfg.image_size) + Gemma LM of width hidden_size, Gemma expert
    of width expert_dim, num_layers each, num_heads query heads over one KV head; image token = last vocab id."""
    h, heads = cfg.hidden_size, cfg.num_heads
    if h % heads or (h // heads) % 2:
        raise ValueError(f"hidden_size ({h}) must be divisible by num_heads ({heads}) with an even head_dim")
    if cfg.expert_dim % 2:
        raise ValueError(f"expert_dim must be even, got {cfg.expert_dim}")
    text = GemmaConfig(vocab_size=vocab_size + 1, hidden_size=h, intermediate_size=2 * h,
                       num_hidden_layers=cfg.num_layers, num_attention_heads=heads, num_key_value_heads=1,
                       head_dim=h // heads, max_position_embeddings=1024)
    vision = SiglipVisionConfig(hidden_size=h, intermediate_size=2 * h, num_hidden_layers=cfg.num_layers,
                                num_attention_heads=heads, image_size=cfg.image_size, patch_size=16,
                                vision_use_head=False)
    vlm = PaliGemmaConfig(text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=h,
                          image_token_id=vocab_size)
    dit = GemmaConfig(hidden_size=cfg.expert_dim, intermediate_size=2 * cfg.expert_dim,
                      num_hidden_layers=cfg.num_layers, num_attention_heads=heads, num_key_value_heads=1,
                      head_dim=h // heads, max_position_embeddings=1024)
    return PI0Config(vlm_config=vlm.to_dict(), dit_config=dit.to_dict(), chunk_size=cfg.action_chunk,
                     max_state_dim=STATE_DIM, max_action_dim=ACTION_DIM, num_inference_steps=cfg.num_steps)


class OpenpiTimestepEmbeddings(PI0TimestepEmbeddings):
    """PI0's time sinusoid as openpi computes it (`create_sinusoidal_pos_embedding` in openpi's pi0_pytorch.py):
    periods, frequencies and the products freq * t in float64 (float32 on MPS, which has no float64), sin / cos, then
    cast to the time's dtype. transformers' own module does all of it in float32, where freq * t (freq up to
    2 pi / 4e-3 = 1571) is rounded to ~1e-4 before the sine: the velocity then differs from openpi's by ~1e-4.
    FlowPolicy puts this module in place of `embed_action_time.sinusoid_embeds` (`use_openpi_time_embedding`); it has
    no weights (the float32 frequency buffer it inherits is non-persistent and unused)."""

    def forward(self, time: torch.Tensor) -> torch.Tensor:
        dtype = torch.float32 if time.device.type == "mps" else torch.float64
        with torch.autocast(time.device.type, enabled=False):
            fraction = torch.linspace(0.0, 1.0, self.config.dit_config.hidden_size // 2, dtype=dtype,
                                      device=time.device)
            period = self.config.min_period * (self.config.max_period / self.config.min_period) ** fraction
            angle = (1.0 / period * 2 * math.pi)[None, :] * time[:, None]
            return torch.cat([angle.sin(), angle.cos()], dim=1).to(time.dtype)


def use_openpi_time_embedding(model: PI0ForConditionalGeneration) -> None:
    """Swap PI0's float32 time sinusoid for openpi's float64 one (OpenpiTimestepEmbeddings), in place; the one place
    where this repo changes a transformers PI0 module. Every PI0 forward (velocity, sampling, the training loss) then
    embeds t as openpi does."""
    old = model.embed_action_time.sinusoid_embeds
    if not isinstance(old, OpenpiTimestepEmbeddings):
        model.embed_action_time.sinusoid_embeds = OpenpiTimestepEmbeddings(model.config).to(old.sinusoid_freq.device)


def openpi_time_grid(num_steps: int) -> List[float]:
    """The times of openpi's Euler sampler (pi0_pytorch.py `sample_actions`): t = 1, then `t += dt` in float32 with
    dt = float32(-1 / num_steps), while t >= -dt / 2 -> num_steps Python floats (each exactly a float32 value; e.g.
    N = 10: 1, 0.9, 0.79999995, 0.6999999, 0.5999999, ..., 0.09999993, where float32(1 - i / N) ends at 0.1)."""
    dt = np.float32(-1.0 / num_steps)
    t, times = np.float32(1.0), []
    while t >= -dt / np.float32(2):
        times.append(float(t))
        t = np.float32(t + dt)
    if len(times) != num_steps:  # float32 drift of half a step: never for num_steps 1..1000 (checked)
        raise ValueError(f"openpi's float32 time grid has {len(times)} steps for num_steps={num_steps}")
    return times


def openpi_resize_with_pad(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 (B, H, W, 3) -> (B, size, size, 3) as openpi's client resizes LIBERO frames before sending them
    (openpi_client.image_tools.resize_with_pad, PIL bilinear on the uint8 image): returned as-is at size x size; else
    ratio = max(W, H) / size, the image resized with PIL BILINEAR to int(W / ratio) x int(H / ratio) and pasted on a
    black size x size canvas at offset int((size - side) / 2) (no padding for square frames)."""
    b, h, w, _ = images.shape
    if (h, w) == (size, size):
        return images
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    top, left = max(0, int((size - rh) / 2)), max(0, int((size - rw) / 2))
    out = np.zeros((b, size, size, images.shape[-1]), np.uint8)
    for i, img in enumerate(images):
        resized = Image.fromarray(img).resize((rw, rh), Image.Resampling.BILINEAR)
        out[i, top:top + rh, left:left + rw] = np.asarray(resized)
    return out


def openpi_pixels(images: Union[np.ndarray, torch.Tensor], size: int, device: torch.device) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> (B, 3, size, size) float32 as openpi feeds pi0: `openpi_resize_with_pad` to size, then
    x / 255 * 2 - 1 in float32 (openpi's Observation.from_dict)."""
    arr = images.cpu().numpy() if torch.is_tensor(images) else np.asarray(images)
    if arr.dtype != np.uint8:
        raise ValueError(f"a pi0 checkpoint's protocol takes uint8 camera images, got {arr.dtype}")
    x = torch.from_numpy(np.ascontiguousarray(openpi_resize_with_pad(arr, size))).to(device)
    return x.to(torch.float32).permute(0, 3, 1, 2) / 255.0 * 2.0 - 1.0


def flow_sde_coefficients(t: float, dt: float, noise_level: float, num_steps: int) -> Tuple[float, float, float]:
    """The flow-SDE step's scalars at time t (`flow_sde_step`) -> (x0 weight, x1 weight, std)."""
    t_den = (1.0 - 1.0 / num_steps) if t >= 1.0 else t
    sigma = noise_level * math.sqrt(t / (1.0 - t_den))
    return 1.0 - t + dt, t - dt - sigma ** 2 * dt / (2.0 * t), math.sqrt(dt) * sigma


def flow_sde_step(x: torch.Tensor, v: torch.Tensor, t: float, dt: float, noise_level: float, num_steps: int
                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """RLinf's flow-SDE transition from time t to t - dt (spec section 2.3) -> (mean, std): with the predictions
    x0 = x - v t and x1 = x + v (1 - t) and sigma = s sqrt(t / (1 - t')) (t' = t, or the next time 1 - 1/N at t = 1),
    mean = x0 (1 - t + dt) + x1 (t - dt - sigma^2 dt / (2 t)), std = sqrt(dt) sigma. sigma = 0 is the Euler step."""
    w0, w1, std = flow_sde_coefficients(t, dt, noise_level, num_steps)
    x0_pred, x1_pred = x - v * t, x + v * (1.0 - t)
    mean = x0_pred * w0 + x1_pred * w1
    return mean, torch.full_like(x, std)


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Elementwise log N(x; mean, std^2) = -(x - mean)^2 / (2 std^2) - log std - log(2 pi) / 2 (std > 0)."""
    return -(x - mean) ** 2 / (2 * std ** 2) - torch.log(std) - 0.5 * math.log(2 * math.pi)


def _fresh_cache(cache):
    """Shallow copy of a DynamicCache: the expert appends its suffix keys/values to the copy, not to the prefix."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    return out


def _pi0_config(folder: Optional[str]) -> Tuple[PI0Config, str]:
    """(PI0Config, where it came from) for the memory plan: a pi0 checkpoint folder's config.json, a saved flow
    policy's pi0/, else PI0's defaults (the pi0_base size)."""
    if folder:
        for path in (os.path.join(folder, "pi0"), folder):
            if os.path.isfile(os.path.join(path, "config.json")):
                try:
                    return PI0Config.from_pretrained(path), f"{path}/config.json"
                except (OSError, ValueError, TypeError):
                    continue
    return PI0Config(), "PI0Config() (pi0_base size)"


class FlowPolicy(nn.Module, PolicyFamily):
    """prefix / velocity / sample / flow_matching_loss / save / load / reference around PI0ForConditionalGeneration."""

    config_class = FlowPolicyConfig
    resizes_images = True  # to its vision tower's input

    @classmethod
    def detect(cls, folder: str) -> bool:
        """A flow policy this project saved, or a pi0 checkpoint folder (openpi / RLinf, LeRobot)."""
        cfg = read_config_json(folder)
        return is_pi0_folder(folder) or cfg.get("policy_type") == "flow" or cfg.get("type") == "flow" \
            or "expert_dim" in cfg

    @classmethod
    def memory_model(cls, policy_cfg: FlowPolicyConfig, folder: Optional[str]) -> Model:
        """The memory plan's view of this family (models/memory.py): the policy of `policy_cfg` on the meta device,
        with the architecture of the pi0 checkpoint or saved flow policy in `folder` (or policy_cfg.pretrained_path),
        else of policy_cfg.preset (the run's LoRA, precision and expert-only keys kept); its stacks: SigLIP over the
        cameras, PaliGemma's Gemma over the image and prompt tokens, the action expert over the noisy actions (it
        attends to the prefix's keys and values)."""
        cfg = policy_cfg
        folder = (folder if folder and os.path.isdir(folder) else None) or cfg.pretrained_path
        saved = folder and os.path.isfile(os.path.join(folder, "pi0", "config.json"))
        if saved:
            with open(os.path.join(folder, "config.json")) as f:
                stored = {k: v for k, v in json.load(f).items() if k != "policy_type"}
            keep = {k: getattr(cfg, k) for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_vision", "bf16",
                                                  "bf16_weights", "train_expert_only")}
            cfg = dataclasses.replace(type(cfg)(**stored), **keep)
        if folder or cfg.preset == "pi0":
            pi0_cfg, source = _pi0_config(folder)
        else:
            pi0_cfg, source = tiny_pi0_config(cfg, ByteTokenizer.vocab_size), "tiny preset"
        # a pi0 checkpoint carries statistics: its horizon is the model's chunk_size (50); tiny: action_chunk
        horizon = cfg.horizon or (pi0_cfg.chunk_size if folder or cfg.preset == "pi0" else cfg.action_chunk)
        with torch.device("meta"):
            policy = cls(dataclasses.replace(cfg, pretrained_path=None, tokenizer_path=None),
                         _saved=(pi0_cfg, None, None))
        net, pc = policy.net, pi0_cfg
        vc, tc, dc = pc.vlm_config.vision_config, pc.vlm_config.text_config, pc.dit_config
        cameras = 2 if cfg.use_wrist else 1
        image_tokens = (vc.image_size // vc.patch_size) ** 2 * cameras
        vision_grad = trainable(net, r"\.vision_tower\.")
        lm_grad = vision_grad or trainable(net, r"\.multi_modal_projector\.") or trainable(net, r"\.language_model\.")
        bf16 = bool(cfg.bf16_weights)
        stacks = [tuned(net, Stack("SigLIP", "vit", vc.num_hidden_layers, vc.hidden_size, vc.intermediate_size,
                                   vc.hidden_size, vc.hidden_size, image_tokens, grad=vision_grad),
                        r"\.vision_tower\..*layers\.", bf16)]
        prefix = image_tokens + cfg.max_text_len
        stacks.append(tuned(net, Stack("Gemma (PaliGemma)", "decoder", tc.num_hidden_layers, tc.hidden_size,
                                       tc.intermediate_size, tc.num_attention_heads * tc.head_dim,
                                       tc.num_key_value_heads * tc.head_dim, prefix, grad=lm_grad),
                            r"\.language_model\.layers\.", bf16))
        expert = tuned(net, Stack("Gemma (action expert)", "decoder", dc.num_hidden_layers, dc.hidden_size,
                                  dc.intermediate_size, dc.num_attention_heads * dc.head_dim,
                                  dc.num_key_value_heads * dc.head_dim, 1 + horizon, extra_keys=prefix),
                       r"\.dit\.layers\.", bf16)
        expert.residual, expert.cast_inputs = 2, False  # the suffix enters as the bf16 output of embed_action_time
        stacks.append(expert)
        variant = ""
        if policy_cfg.train_expert_only:
            variant = "action expert only" + (f" + LoRA r={policy_cfg.lora_rank}" if policy_cfg.lora_rank else "")
        return Model(f"flow ({cfg.preset})", net, stacks, policy.hidden_size,
                     [f"PI0 from {source}; {prefix} prefix tokens ({cameras} camera(s)), expert {1 + horizon} tokens "
                      f"(horizon {horizon})"], unused=("model.dit.embed_tokens.weight",),  # PI0's expert: no token ids
                     policy_cfg=policy_cfg, variant=variant)

    @classmethod
    def start_from(cls, folder, policy_cfg, env_cfg, device, say):
        """A pi0 checkpoint folder: its weights and statistics, run with the YAML's policy section (a checkpoint
        carries no policy config of ours) at the env's image size and chunk; else a flow policy this project saved."""
        if not is_pi0_folder(folder):
            return super().start_from(folder, policy_cfg, env_cfg, device, say)
        policy_cfg = dataclasses.replace(policy_cfg, pretrained_path=folder, image_size=env_cfg.image_size,
                                         action_chunk=env_cfg.action_chunk)
        return cls(policy_cfg).to(device)  # ValueError for pi0.5, a legacy layout, missing weights or tokenizer

    def paper_protocol(self) -> str:
        """openpi's, for a pi0 checkpoint (it carries openpi's statistics); heldout for the tiny policy."""
        return "openpi" if self.stats is not None else "heldout"

    @property
    def model_space_samples(self) -> bool:
        """A pi0 checkpoint's protocol (it has statistics): the rollout keeps the model-space sample x0."""
        return self.stats is not None

    def sft_loss(self, obs, instructions, actions):
        """train_sft.py's objective for this family: the flow-matching loss."""
        return self.flow_matching_loss(obs, instructions, actions)

    def __init__(self, cfg: Optional[FlowPolicyConfig] = None, action_tokenizer: Optional[ActionTokenizer] = None,
                 _saved: Optional[Tuple[PI0Config, str]] = None):
        super().__init__()
        self.cfg = cfg = cfg if cfg is not None else FlowPolicyConfig()
        if cfg.action_chunk < 1:
            raise ValueError(f"action_chunk must be >= 1, got {cfg.action_chunk}")
        if cfg.time_sampling not in ("beta", "uniform"):
            raise ValueError(f"time_sampling must be 'beta' or 'uniform', got {cfg.time_sampling!r}")
        if cfg.noise_method not in NOISE_METHODS:
            raise ValueError(f"noise_method must be one of {NOISE_METHODS}, got {cfg.noise_method!r}")
        if cfg.value_input not in VALUE_INPUTS:
            raise ValueError(f"value_input must be one of {VALUE_INPUTS}, got {cfg.value_input!r}")
        if cfg.preset not in PRESETS:
            raise ValueError(f"preset must be one of {PRESETS}, got {cfg.preset!r}")
        if cfg.image_size % 16 != 0 or cfg.image_size <= 0:
            raise ValueError(f"image_size must be a positive multiple of 16, got {cfg.image_size}")
        for name, want in (("expert_layers", cfg.num_layers), ("expert_heads", cfg.num_heads)):
            if getattr(cfg, name) not in (None, want):
                raise ValueError(f"{name}={getattr(cfg, name)} but PI0's action expert must match the LM "
                                 f"({'num_layers' if name == 'expert_layers' else 'num_heads'}={want}); leave it None")
        self.action_tokenizer = action_tokenizer or ActionTokenizer(n_bins=cfg.n_bins)
        self.stats: Optional[Pi0Stats] = None  # the checkpoint's statistics: its protocol (module docstring)
        # architecture + weights: saved policy (load) > pretrained checkpoint > tiny / pi0 config (random init)
        if _saved is not None:
            pi0_cfg, tok_dir, self.stats = _saved
            self.text_tokenizer = load_text_tokenizer(tok_dir, cfg.max_text_len)
            from transformers.initialization import no_init_weights

            with no_init_weights():  # every weight is overwritten by load()
                model = PI0ForConditionalGeneration(pi0_cfg)
        elif cfg.pretrained_path is not None:
            local = os.path.isdir(cfg.pretrained_path)
            if local:  # checked (pi0.5, legacy layout, missing weights) before anything else
                model, self.stats = load_pi0_folder(cfg.pretrained_path)
            tok_path = cfg.tokenizer_path or cfg.pretrained_path
            try:
                self.text_tokenizer = load_text_tokenizer(tok_path, cfg.max_text_len)
            except (OSError, ValueError) as e:
                raise ValueError(f"no instruction tokenizer at {tok_path} ({type(e).__name__}); set tokenizer_path "
                                 f"(e.g. google/paligemma-3b-pt-224 or a local copy)") from e
            if not local:
                model = PI0ForConditionalGeneration.from_pretrained(cfg.pretrained_path, dtype=torch.float32)
        else:
            self.text_tokenizer = load_text_tokenizer(cfg.tokenizer_path, cfg.max_text_len)
            pi0_cfg = tiny_pi0_config(cfg, self.text_tokenizer.vocab_size) if cfg.preset == "tiny" else PI0Config()
            model = PI0ForConditionalGeneration(pi0_cfg)
        if self.stats is not None and cfg.delta_action_dims is not None:
            self.stats = dataclasses.replace(self.stats, delta_dims=cfg.delta_action_dims)
        horizon = model.config.chunk_size if self.stats is not None else cfg.action_chunk
        self.horizon = horizon = cfg.horizon if cfg.horizon is not None else horizon
        if horizon < cfg.action_chunk:
            raise ValueError(f"horizon={horizon} < action_chunk={cfg.action_chunk}: a call cannot execute more actions "
                             f"than the model predicts")
        model.config.chunk_size = horizon  # the expert's suffix is [state, horizon actions]
        use_openpi_time_embedding(model)  # openpi's float64 time sinusoid (before LoRA copies the module)
        # model space: PI0's max_action_dim with the checkpoint's protocol, else the 7 env dims (padding stays 0)
        self.model_dim = model.config.max_action_dim if self.stats is not None else ACTION_DIM
        self._check_model(model.config)
        self.net = self._wrap_lora(model) if cfg.lora_rank > 0 else model
        self._freeze_vlm()
        self.action_chunk = cfg.action_chunk

    def _check_model(self, pc: PI0Config) -> None:
        vlm = pc.vlm_config
        if pc.max_action_dim < ACTION_DIM or pc.max_state_dim < STATE_DIM:
            raise ValueError(f"PI0 max_action_dim/max_state_dim ({pc.max_action_dim}, {pc.max_state_dim}) must be at "
                             f"least ({ACTION_DIM}, {STATE_DIM})")
        vocab = vlm.text_config.vocab_size
        if self.text_tokenizer.vocab_size > max(vocab, vlm.image_token_id + 1):
            raise ValueError(f"instruction tokenizer vocab {self.text_tokenizer.vocab_size} exceeds PI0's "
                             f"{vocab}: wrong tokenizer for this checkpoint (set tokenizer_path)")
        vis = vlm.vision_config
        self.vision_size = vis.image_size
        self.image_tokens = (vis.image_size // vis.patch_size) ** 2  # per camera

    def _freeze_vlm(self) -> None:
        """train_expert_only: PaliGemma (vision tower, projector, LM, their LoRA) and the expert's unused token
        embedding take no gradient; the expert and the action/state/time projections train. Then bf16_weights casts
        the frozen weights (pi0_checkpoint.cast_bf16_weights)."""
        if self.cfg.train_expert_only:
            for name, p in self.net.named_parameters():
                if ".vlm." in f".{name}" or "dit.embed_tokens" in name:
                    p.requires_grad_(False)
        if self.cfg.bf16_weights:
            cast_bf16_weights(self.net)

    def _autocast(self):
        """bf16 autocast: on CUDA with cfg.bf16, on any device with bf16 weights (their fp32 exceptions mix in)."""
        if self.cfg.bf16_weights:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return autocast(self.device, self.cfg.bf16)

    def _wrap_lora(self, model: nn.Module) -> nn.Module:
        from peft import LoraConfig, get_peft_model

        target = f"({LORA_TARGETS})|({LORA_VISION_TARGETS})" if self.cfg.lora_vision else LORA_TARGETS
        lcfg = LoraConfig(r=self.cfg.lora_rank, lora_alpha=self.cfg.lora_alpha, lora_dropout=self.cfg.lora_dropout,
                          target_modules=target, modules_to_save=list(TRAINABLE_WITH_LORA))
        return get_peft_model(model, lcfg)

    @property
    def core(self) -> PI0ForConditionalGeneration:
        """The PI0 model (LoRA layers injected in place when there are any)."""
        return unwrap(self.net)

    @property
    def device(self) -> torch.device:
        return self.core.action_out_proj.weight.device

    @property
    def pi0_config(self) -> PI0Config:
        return self.core.config

    # ------------------------------------------------------------------ inputs
    def model_inputs(self, obs: Obs, instructions: Optional[Sequence[str]] = None) -> Dict[str, torch.Tensor]:
        """obs + instructions -> PI0's keyword inputs: input_ids / attention_mask (B, L), pixel_values
        (B, V, 3, S, S), pixel_attention_mask (B, V) bool, state (B, max_state_dim)."""
        agent, wrist, state, instructions = check_obs(obs, instructions, self.cfg.image_size, self.cfg.use_wrist)
        dev, b = self.device, agent.shape[0]
        views = [agent, wrist] if self.cfg.use_wrist else [agent]
        if self.stats is not None and self.stats.source == "openpi":  # openpi's uint8 PIL resize, then /255*2-1
            pixels = torch.stack([openpi_pixels(v, self.vision_size, dev) for v in views], dim=1)
        else:
            pixels = torch.stack([to_pixels(v, dev) for v in views], dim=1)  # (B, V, 3, H, W) in [-1, 1]
            if self.vision_size != self.cfg.image_size:
                pixels = F.interpolate(pixels.flatten(0, 1), size=(self.vision_size, self.vision_size),
                                       mode="bilinear", align_corners=False, antialias=True
                                       ).clamp_(-1, 1).unflatten(0, (b, len(views)))
        if self.stats is not None:  # openpi's tokenizer cleans the prompt and pads it to max_token_len
            instructions = [s.strip().replace("_", " ").replace("\n", " ") for s in instructions]
        ids, mask = self._prompt_tokens(instructions, pad_to=self.cfg.max_text_len if self.stats is not None else 0)
        image_id = self.pi0_config.vlm_config.image_token_id
        if bool((ids == image_id).any()):
            raise ValueError(f"an instruction tokenised to the image token id {image_id}")
        n_img = self.image_tokens * len(views)
        input_ids = torch.cat([torch.full((b, n_img), image_id, dtype=torch.long), ids], dim=1).to(dev)
        attention_mask = torch.cat([torch.ones(b, n_img, dtype=torch.long), mask.long()], dim=1).to(dev)
        raw = torch.as_tensor(state, dtype=torch.float32, device=dev)
        st = self.stats.normalize_state(raw) if self.stats is not None else raw
        st = F.pad(st, (0, self.pi0_config.max_state_dim - STATE_DIM))
        return {"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixels,
                "pixel_attention_mask": torch.ones(b, len(views), dtype=torch.bool, device=dev), "state": st,
                "raw_state": raw}

    def _prompt_tokens(self, texts: Sequence[str], pad_to: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """openpi's prompt tokens: BOS + encode(text) + encode("\\n") (the newline encoded on its own, openpi's
        "start of answer" token; one encode of text + "\\n" could merge across it), cut to max_text_len, right-padded
        with id 0 and mask 0 to the longest row or `pad_to` -> (ids, mask) (B, L) long."""
        ids, mask = self.text_tokenizer(list(texts))  # BOS + text, cut to max_text_len
        empty, newline = (row[m.bool()] for row, m in zip(*self.text_tokenizer(["", "\n"])))
        if not torch.equal(newline[:len(empty)], empty):
            raise ValueError("the instruction tokenizer's encoding of '\\n' does not start with its encoding of ''")
        rows = [torch.cat([r[m.bool()], newline[len(empty):]])[:self.cfg.max_text_len] for r, m in zip(ids, mask)]
        width = max(pad_to, max(len(r) for r in rows))
        out_ids = torch.zeros(len(rows), width, dtype=torch.long)
        out_mask = torch.zeros_like(out_ids)
        for i, r in enumerate(rows):
            out_ids[i, :len(r)], out_mask[i, :len(r)] = r, 1
        return out_ids, out_mask

    def _pad_actions(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, self.pi0_config.max_action_dim - x.shape[-1]))

    def _check_xt(self, x_t, t, b: int) -> Tuple[torch.Tensor, torch.Tensor]:
        x_t = torch.as_tensor(x_t, dtype=torch.float32, device=self.device)
        if tuple(x_t.shape) != (b, self.horizon, self.model_dim):
            raise ValueError(f"x_t has shape {tuple(x_t.shape)}; expected ({b}, {self.horizon}, {self.model_dim})")
        t = torch.as_tensor(t, dtype=torch.float32, device=self.device)
        t = t.expand(b) if t.ndim == 0 else t
        if tuple(t.shape) != (b,):
            raise ValueError(f"t has shape {tuple(t.shape)}; expected a float or ({b},)")
        return x_t, t

    # ------------------------------------------------------------------ flow
    def prefix(self, obs: Obs, instructions: Optional[Sequence[str]] = None) -> Prefix:
        """Run [images, prompt] through PaliGemma once (as PI0's sample_actions does); pass the result to
        velocity()/sample() to reuse it. Gradients flow through it when enabled."""
        inputs = self.model_inputs(obs, instructions)
        mask = inputs["attention_mask"]
        model = self.core.model
        with self._autocast():
            embeds = model.embed_prefix(inputs["input_ids"], inputs["pixel_values"], inputs["pixel_attention_mask"])
            out = model.vlm(inputs_embeds=embeds, attention_mask=mask, position_ids=mask.cumsum(-1) - 1,
                            token_type_ids=torch.zeros_like(mask), use_cache=True)
        valid = mask[..., None].float()
        hidden = (out.last_hidden_state.float() * valid).sum(1) / valid.sum(1)
        return Prefix(out.past_key_values, mask, inputs["state"], inputs["raw_state"], hidden)

    def hidden(self, obs: Obs, instructions: Optional[Sequence[str]] = None) -> torch.Tensor:
        """The value head's input, float32. value_input prefix: (B, hidden_size), PaliGemma's last hidden state
        mean-pooled over the valid image and prompt tokens (RLinf's `value_after_vlm` "mean_token" features), a
        function of the observation alone; frozen under train_expert_only. value_input expert: (B, steps,
        expert_dim), the expert's features at every step of an ODE chain from fresh noise (`sample`)."""
        if self.cfg.value_input == "expert":
            with torch.no_grad():
                return self.sample(obs, instructions).hidden
        return self.prefix(obs, instructions).hidden

    @property
    def hidden_size(self) -> int:
        """The value head's input width: PaliGemma's (value_input prefix) or the action expert's (expert)."""
        if self.cfg.value_input == "expert":
            return self.pi0_config.dit_config.hidden_size
        return self.pi0_config.vlm_config.text_config.hidden_size

    def velocity(self, obs: Optional[Obs], instructions: Optional[Sequence[str]], x_t: torch.Tensor,
                 t: Union[float, torch.Tensor], prefix: Optional[Prefix] = None, return_features: bool = False):
        """v(x_t, t | obs, instruction), (B, horizon, D) float32, with gradients; `t` a float or (B,) tensor. With a
        `prefix` only the action expert runs (PI0's forward on the cached prefix). `return_features`: also the
        expert's output over the horizon (what the action projection reads) mean-pooled, (B, expert_dim) float32
        (RLinf's `_compute_value_from_suffix` input, chunk_critic_input False)."""
        if prefix is None:
            prefix = self.prefix(obs, instructions)
        x_t, t = self._check_xt(x_t, t, prefix.state.shape[0])
        seen: List[torch.Tensor] = []
        hook = self.core.action_out_proj.register_forward_hook(lambda m, args, out: seen.append(args[0])) \
            if return_features else None
        try:
            with self._autocast():
                out = self.core(state=prefix.state, noise=self._pad_actions(x_t), timestep=t,
                                attention_mask=prefix.attention_mask,
                                past_key_values=_fresh_cache(prefix.past_key_values))
        finally:
            if hook is not None:
                hook.remove()
        v = out.logits[..., :self.model_dim].float()
        return (v, seen[0].float().mean(1)) if return_features else v

    def rollout_step(self, obs, instructions, *, temperature: float = 1.0, greedy: bool = False, generators=None,
                     flow_steps: Optional[int] = None, flow_noise_level: float = 0.0, keep_hidden: bool = False,
                     keep_chain: bool = False):
        """A flow family's rollout call (models/policy.py PolicyFamily.rollout_step): `sample` at `flow_noise_level`
        (temperature and greedy do not apply: evaluation passes noise level 0, the deterministic ODE); the record
        holds the initial noise, with `model_space_samples` the model-space sample x0, with `keep_hidden` the
        prefix's pooled features and with `keep_chain` the flow-SDE step's chain (sde_step, x_t, x_next) and its
        log-density as old_log_probs (B, 1)."""
        sample = self.sample(obs, instructions, num_steps=flow_steps, noise_level=flow_noise_level,
                             generators=generators)
        record = {"noise": sample.noise.float().cpu().numpy()}
        if self.model_space_samples:
            record["x0"] = sample.x0.float().cpu().numpy()
        if keep_hidden:
            record["hidden"] = sample.hidden.float().cpu().numpy()
        if keep_chain:
            if sample.sde_step is None:
                raise ValueError("keep_chain needs flow-SDE samples (noise_method flow_sde, noise level > 0)")
            record.update(sde_step=sample.sde_step.cpu().numpy(), x_t=sample.x_t.float().cpu().numpy(),
                          x_next=sample.x_next.float().cpu().numpy(),
                          old_log_probs=sample.log_prob.float().cpu().numpy()[:, None])
        return sample.actions, record

    @torch.no_grad()
    def sample(self, obs: Obs, instructions: Optional[Sequence[str]] = None, num_steps: Optional[int] = None,
               noise_level: float = 0.0, noise: Optional[torch.Tensor] = None, prefix: Optional[Prefix] = None,
               reuse_prefix: bool = True, generators: Optional[Sequence[torch.Generator]] = None) -> FlowSample:
        """Euler from t = 1 (noise) to t = 0 in `num_steps` (default cfg.num_steps) steps -> FlowSample(actions,
        x0, noise): x <- x - v / N at openpi's float32 times (`openpi_time_grid`), as openpi's sample_actions.
        noise_level > 0 explores (cfg.noise_method); 0 is the deterministic ODE. `reuse_prefix=False`
        recomputes the prefix at every step (only to measure the cache).
        `generators` (B CPU generators): row i's noise comes from generators[i] instead of the global RNG."""
        num_steps = self.cfg.num_steps if num_steps is None else num_steps
        if num_steps < 1 or noise_level < 0:
            raise ValueError(f"need num_steps >= 1 and noise_level >= 0, got {num_steps}, {noise_level}")
        if prefix is None:
            prefix = self.prefix(obs, instructions)
        shape = (prefix.state.shape[0], self.horizon, self.model_dim)
        x = _randn(shape, self.device, generators) if noise is None else noise.to(self.device, torch.float32)
        if tuple(x.shape) != shape:
            raise ValueError(f"noise has shape {tuple(x.shape)}; expected {shape}")
        x1, dt = x.clone(), 1.0 / num_steps
        expert = self.cfg.value_input == "expert"
        features = []  # value_input expert: the expert's pooled output at every step (RLinf's rollout value)
        sde = noise_level > 0 and self.cfg.noise_method == "flow_sde"
        # RLinf: one random denoising step per call (shared by the batch) is the SDE step; torch's RNG (seeded, resumed)
        sde_step = int(torch.randint(num_steps, ())) if sde else -1
        chain = {}
        for i, t in enumerate(openpi_time_grid(num_steps)):  # openpi's float32 times; the step stays dt = 1 / N
            step_prefix = prefix if reuse_prefix else self.prefix(obs, instructions)
            if expert:
                v, f = self.velocity(None, None, x, t, step_prefix, return_features=True)
                features.append(f)
            else:
                v = self.velocity(None, None, x, t, step_prefix)
            if i == sde_step:
                mean, std = flow_sde_step(x, v, t, dt, noise_level, num_steps)
                x_t, x = x, mean + std * _randn(shape, self.device, generators)
                chain = dict(sde_step=torch.full((shape[0],), i, dtype=torch.long, device=self.device), x_t=x_t,
                             x_next=x, log_prob=self._executed(gaussian_log_prob(x, mean, std)).sum((1, 2)))
            else:
                x = x - dt * v
                if noise_level > 0 and not sde and i < num_steps - 1:
                    x = x + noise_level * math.sqrt(dt) * _randn(shape, self.device, generators)
        hidden = torch.stack(features, dim=1) if expert else prefix.hidden
        return FlowSample(self.env_actions(x, prefix.raw_state), x, x1, hidden=hidden, **chain)

    def _executed(self, x: torch.Tensor) -> torch.Tensor:
        """The executed part of a model-space tensor (B, horizon, D): the first action_chunk steps (the rest of the
        horizon is never sent to the env) and the first 7 dims (the env's; the padding dims are dropped by
        env_actions) -- RLinf's `[:, :action_chunk, :action_env_dim]`."""
        return x[:, :self.action_chunk, :ACTION_DIM]

    def transition_log_prob(self, obs: Obs, instructions: Optional[Sequence[str]], sde_step: torch.Tensor,
                            x_t: torch.Tensor, x_next: torch.Tensor, noise_level: float,
                            num_steps: Optional[int] = None, return_hidden: bool = False,
                            executed: Optional[torch.Tensor] = None):
        """log p(x_next | x_t) of the flow-SDE step `sde_step` (B,) that a rollout sample took (FlowSample's chain
        data), with gradients: the Gaussian density of x_next under `flow_sde_step`'s mean and std at that step's
        time, summed over the executed part (`_executed`; RLinf's chunk-level log-prob) -> (B,) float32
        [, hidden (B, hidden_size) from the same prefix]. The step index may differ between rows. `executed` (B,):
        how many of the chunk's actions the env ran (an episode that ended inside the chunk ran fewer); the actions
        after them add nothing (default: all action_chunk)."""
        num_steps = self.cfg.num_steps if num_steps is None else num_steps
        if noise_level <= 0 or self.cfg.noise_method != "flow_sde":
            raise ValueError(f"transition_log_prob needs the flow-SDE step (noise_method flow_sde, noise_level > 0); "
                             f"got {self.cfg.noise_method!r}, {noise_level}")
        prefix = self.prefix(obs, instructions)
        b, dt = prefix.state.shape[0], 1.0 / num_steps
        steps = torch.as_tensor(sde_step, dtype=torch.long).reshape(-1).tolist()
        if len(steps) != b or not all(0 <= i < num_steps for i in steps):
            raise ValueError(f"sde_step must hold {b} step indices in [0, {num_steps}), got {steps}")
        grid = openpi_time_grid(num_steps)  # the times sample() used
        t = [grid[i] for i in steps]
        w0, w1, std = (torch.tensor(c, dtype=torch.float32, device=self.device)[:, None, None]
                       for c in zip(*(flow_sde_coefficients(ti, dt, noise_level, num_steps) for ti in t)))
        x_t = torch.as_tensor(x_t, dtype=torch.float32, device=self.device)
        x_next = torch.as_tensor(x_next, dtype=torch.float32, device=self.device)
        times, hidden = torch.tensor(t, dtype=torch.float32), prefix.hidden
        if self.cfg.value_input == "expert":  # the expert's output at the flow-SDE step's x_t (RLinf's update value)
            v, hidden = self.velocity(None, None, x_t, times, prefix, return_features=True)
        else:
            v = self.velocity(None, None, x_t, times, prefix)
        tt, omt = (torch.tensor(c, dtype=torch.float32, device=self.device)[:, None, None]
                   for c in (t, [1.0 - ti for ti in t]))  # 1 - t in double, as the rollout's Python floats
        mean = (x_t - v * tt) * w0 + (x_t + v * omt) * w1
        terms = self._executed(gaussian_log_prob(x_next, mean, std.expand_as(mean)))  # (B, action_chunk, 7)
        if executed is not None:  # actions the env never ran get no log-prob
            ran = torch.arange(terms.shape[1], device=terms.device)[None, :] < \
                torch.as_tensor(executed, device=terms.device).reshape(-1, 1)
            terms = torch.where(ran[:, :, None], terms, torch.zeros((), dtype=terms.dtype, device=terms.device))
        log_prob = terms.sum((1, 2))
        return (log_prob, hidden) if return_hidden else log_prob

    def ppo_log_prob(self, obs, instructions, record, *, temperature: float = 1.0, noise_level: float = 0.0,
                     executed: Optional[torch.Tensor] = None):
        """A flow family's PPO log-prob (models/policy.py PolicyFamily.ppo_log_prob): the rollout's flow-SDE step's
        log-density over the executed actions (`transition_log_prob`) as (B, 1); its std is fixed by the schedule, so
        no entropy (None); temperature does not apply."""
        log_prob, hidden = self.transition_log_prob(obs, instructions, record("sde_step"), record("x_t"),
                                                    record("x_next"), noise_level, return_hidden=True,
                                                    executed=executed)
        return log_prob[:, None], None, hidden

    def env_actions(self, x0: torch.Tensor, raw_state: Optional[torch.Tensor] = None) -> np.ndarray:
        """Model-space sample (B, horizon, D) -> the env actions to execute (B, action_chunk, 7) float32: with the
        checkpoint's statistics un-normalised, made absolute (relative dims + raw state), first 7 dims, first
        action_chunk steps; without them the ActionTokenizer's un-normalisation (clip, gripper binarisation)."""
        if self.stats is None:
            return self.action_tokenizer.unnormalize(x0[:, :self.action_chunk])
        a = self.stats.unnormalize_actions(x0.to(self.stats.math_dtype(x0)))  # openpi: float64 until the env
        if self.stats.delta_dims:
            if raw_state is None:
                raise ValueError("relative actions need the raw state (pass the Prefix's raw_state)")
            a = self.stats.to_absolute(a, raw_state)
        return a[:, :self.action_chunk, :ACTION_DIM].cpu().numpy().astype(np.float32)

    def normalize_actions(self, actions, state=None) -> torch.Tensor:
        """Env actions (B, horizon, 7) -> model-space float32 tensor (B, horizon, D) on the policy's device; with the
        checkpoint's statistics made relative to the raw `state` (B, 8) where it says so, z-scored, zero-padded."""
        if self.stats is None:
            return self.action_tokenizer.normalize(actions).to(self.device)
        a = torch.as_tensor(np.asarray(actions, np.float32) if not torch.is_tensor(actions) else actions,
                            dtype=torch.float32, device=self.device)
        if a.shape[1] != self.horizon:
            raise ValueError(f"actions cover {a.shape[1]} steps; the model space needs the whole horizon "
                             f"({self.horizon}): use the rollout's x0 instead of executed actions")
        if self.stats.delta_dims:
            if state is None:
                raise ValueError("this checkpoint's actions are relative to the state: pass the raw state")
            a = self.stats.to_delta(a, torch.as_tensor(state, dtype=torch.float32, device=self.device))
        return self.stats.normalize_actions(F.pad(a, (0, self.model_dim - a.shape[-1])))

    def sample_time(self, b: int) -> torch.Tensor:
        """Training times (B,): pi0's scale * Beta(alpha, beta) + offset (PI0Config's values) or U(0, 1)."""
        if self.cfg.time_sampling == "uniform":
            return torch.rand(b, device=self.device)
        pc = self.pi0_config
        beta = torch.distributions.Beta(float(pc.time_sampling_beta_alpha), float(pc.time_sampling_beta_beta))
        return (pc.time_sampling_scale * beta.sample((b,)) + pc.time_sampling_offset).to(self.device)

    def flow_matching_loss(self, obs: Obs, instructions: Optional[Sequence[str]], actions,
                           t: Optional[torch.Tensor] = None, noise: Optional[torch.Tensor] = None
                           ) -> Tuple[torch.Tensor, Dict[str, float]]:
        """SFT loss mean((v(x_t, t) - (eps - a))^2) over the model-space dims of demo actions (B, horizon, 7), one
        PI0 forward (prefix + expert) -> (loss, {"sft/flow_mse"})."""
        inputs = self.model_inputs(obs, instructions)
        raw_state = inputs.pop("raw_state")
        b = inputs["state"].shape[0]
        if tuple(actions.shape) != (b, self.horizon, ACTION_DIM):
            raise ValueError(f"actions have shape {tuple(actions.shape)}; expected ({b}, {self.horizon}, 7)")
        a = self.normalize_actions(actions, raw_state)
        eps = torch.randn_like(a) if noise is None else noise.to(a)
        t = self.sample_time(b) if t is None else t.to(a)
        x_t = (1 - t)[:, None, None] * a + t[:, None, None] * eps
        with self._autocast():
            out = self.core(noise=self._pad_actions(x_t), timestep=t, **inputs)
        loss = F.mse_loss(out.logits[..., :self.model_dim].float(), eps - a)
        return loss, {"sft/flow_mse": loss.item()}

    # ------------------------------------------------------------------ LoRA, checkpoints
    def reference(self):
        """Context manager running the frozen pre-LoRA model (peft `disable_adapter()`); ValueError without LoRA."""
        return reference_context(self.net)

    def set_lora_rank(self, lora_rank: int) -> None:
        """Merge any LoRA into the base weights, then add fresh LoRA of `lora_rank` (0 = none)."""
        model = merge_lora(self.net)
        model.requires_grad_(True)
        self.cfg = dataclasses.replace(self.cfg, lora_rank=lora_rank)
        self.net = self._wrap_lora(model) if lora_rank > 0 else model
        self._freeze_vlm()
        self.train(self.training)  # peft leaves new modules in train mode

    def save(self, path: str) -> None:
        """config.json (this FlowPolicyConfig + "policy_type": "flow"), model.safetensors (all weights, LoRA
        structure kept), pi0/config.json (the PI0Config), action_stats.json, tokenizer/, and the checkpoint's
        statistics (pi0_stats.json) when it has them."""
        from safetensors.torch import save_model

        from models.saved import readable_files

        os.makedirs(path, exist_ok=True)
        save_model(self.net, os.path.join(path, "model.safetensors"))
        readable_files(path)  # safetensors writes 0600: shared-cluster colleagues must read the weights
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"policy_type": "flow", **dataclasses.asdict(self.cfg)}, f, indent=2)
        self.pi0_config.save_pretrained(os.path.join(path, PI0_CONFIG_DIR))
        self.action_tokenizer.save(os.path.join(path, "action_stats.json"))
        self.text_tokenizer.save_pretrained(os.path.join(path, "tokenizer"))
        if self.stats is not None:
            self.stats.save(os.path.join(path, STATS_FILE))

    @classmethod
    def load(cls, path: str, lora_rank: Optional[int] = None, device: str = "cpu") -> "FlowPolicy":
        """Rebuild from `save` (no download); `lora_rank` not None and different from the saved rank merges the saved
        LoRA and adds fresh LoRA of that rank (0 = plain model)."""
        from safetensors.torch import load_model

        from models.saved import check_weights_fit

        with open(os.path.join(path, "config.json")) as f:
            cfg_dict = json.load(f)
        if cfg_dict.pop("policy_type", None) != "flow":
            raise ValueError(f"{path}/config.json is not a flow policy (no \"policy_type\": \"flow\")")
        pi0_cfg = PI0Config.from_pretrained(os.path.join(path, PI0_CONFIG_DIR))
        stats_file = os.path.join(path, STATS_FILE)
        stats = Pi0Stats.load(stats_file) if os.path.isfile(stats_file) else None
        tokenizer = ActionTokenizer.load(path)
        check_weights_fit(lambda: cls(FlowPolicyConfig(**cfg_dict), tokenizer,
                                      _saved=(pi0_cfg, os.path.join(path, "tokenizer"), stats)).net,
                          os.path.join(path, "model.safetensors"))  # shapes first: nothing allocated for a bad config
        policy = cls(FlowPolicyConfig(**cfg_dict), tokenizer, _saved=(pi0_cfg, os.path.join(path, "tokenizer"), stats))
        load_model(policy.net, os.path.join(path, "model.safetensors"), strict=True)
        policy.to(device)
        if lora_rank is not None and lora_rank != policy.cfg.lora_rank:
            policy.set_lora_rank(lora_rank)
        return policy


__all__ = ["FlowPolicy", "FlowPolicyConfig", "FlowSample", "Prefix", "tiny_pi0_config", "flow_sde_step",
           "flow_sde_coefficients", "gaussian_log_prob", "PRESETS"]
