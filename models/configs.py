"""The policies' and encoders' config dataclasses and the table of policy families, in one module that imports
neither torch nor transformers: a script reads its command line (and answers --help or a bad value) in about a
second, before the model code loads. Each model module imports its config from here."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from base.config_fields import ranged

OFT_ACTION_CHUNK = 8  # OpenVLA-OFT's chunk: 8 actions x 7 dims = 56 parallel-decoded slots
OFT_IMAGE_SIZE = 224  # OpenVLA-OFT's vision input side


@dataclass
class TokenPolicyConfig:
    type: str = "token"  # the policy family (models/configs.py FAMILIES); openvla_oft loads a published checkpoint
    preset: str = "tiny"  # tiny (CNN + small Llama, CPU) | minivla (SigLIP-base/16 + Qwen2.5-0.5B architecture)
    image_size: int = ranged(64, "[32, 1024]")  # square camera images (px); multiple of 16
    action_chunk: int = ranged(8, "[1, 64]")  # actions per policy call; the model predicts action_chunk * 7 tokens
    n_bins: int = ranged(256, "[2, 65536]")  # action bins per dimension
    use_wrist: bool = True  # also encode the wrist camera
    vision_path: Optional[str] = None  # SigLIP checkpoint (hub id or dir) for from_pretrained; None = random init
    backbone_path: Optional[str] = None  # LM checkpoint + tokenizer (Llama/Qwen2); None = random init, byte tokenizer
    hidden_size: int = ranged(128, "[1, 65536]")  # tiny preset LM width (ignored when the LM comes from minivla or backbone_path)
    num_layers: int = ranged(2, "[1, 1024]")  # tiny preset LM depth
    num_heads: int = ranged(4, "[1, 1024]")  # tiny preset LM attention heads
    max_text_len: int = ranged(48, "[1, 8192]")  # instruction tokens kept (truncated beyond)
    lora_rank: int = ranged(0, "[0, 4096]")  # 0 = full fine-tuning; > 0 = LoRA on the LM attention projections
    lora_alpha: int = ranged(16, "(0, inf)")  # LoRA scale: the adapter's update is multiplied by alpha / rank
    lora_dropout: float = ranged(0.0, "[0, 1)")  # dropout on the LoRA adapters' input
    lora_vision: bool = False  # also put LoRA on the vision tower
    bf16: bool = True  # bf16 autocast on CUDA (log-probs are always computed in float32)


@dataclass
class FlowPolicyConfig:
    type: str = "flow"  # the policy family (models/configs.py FAMILIES)
    preset: str = "tiny"  # tiny (random init from the width/depth fields) | pi0 (PI0Config() defaults, random init)
    pretrained_path: Optional[str] = None  # pi0 checkpoint: openpi/RLinf or LeRobot folder, transformers' dir or hub id
    tokenizer_path: Optional[str] = None  # instruction tokenizer; None = pretrained_path's, else the byte tokenizer
    image_size: int = ranged(64, "[32, 1024]")  # square camera images (px) in the observations; multiple of 16
    action_chunk: int = ranged(8, "[1, 64]")  # actions executed per policy call (openpi's replan_steps)
    horizon: Optional[int] = ranged(None, "[1, 1024]")  # actions the model predicts per call (PI0's chunk_size); None = action_chunk, or
                                   # the checkpoint's chunk_size (pi0: 50) when it carries statistics
    n_bins: int = ranged(256, "[2, 65536]")  # only for the shared ActionTokenizer
                                             # (its statistics normalise the actions)
    use_wrist: bool = True  # wrist camera as PI0's second camera
    hidden_size: int = ranged(64, "[1, 65536]")  # tiny: PaliGemma LM (Gemma) width = SigLIP width
    num_layers: int = ranged(2, "[1, 1024]")  # tiny: depth of the LM, the action expert and the SigLIP tower
    num_heads: int = ranged(2, "[1, 1024]")  # tiny: query heads (LM and expert; one shared key/value head, as pi0)
    expert_dim: int = ranged(64, "[1, 65536]")  # tiny: action expert (Gemma) width
    expert_layers: Optional[int] = ranged(None, "[1, 1024]")  # PI0's expert attends to the LM layer by layer: must equal num_layers
    expert_heads: Optional[int] = ranged(None, "[1, 1024]")  # must equal num_heads (the expert shares the LM's head_dim and KV heads)
    max_text_len: int = ranged(48, "[1, 8192]")  # instruction tokens (BOS + text + newline), truncated beyond
    num_steps: int = ranged(10, "[1, 1000]")  # default Euler steps for sample()
    time_sampling: str = "beta"  # training t: beta (pi0: t = 0.999 * Beta(1.5, 1) + 0.001, favours noisy t) | uniform
    lora_rank: int = ranged(0, "[0, 4096]")  # 0 = full fine-tuning; > 0 = LoRA (see the module docstring)
    lora_alpha: int = ranged(16, "(0, inf)")  # LoRA scale: the adapter's update is multiplied by alpha / rank
    lora_dropout: float = ranged(0.0, "[0, 1)")  # dropout on the LoRA adapters' input
    lora_vision: bool = False  # also put LoRA on the vision tower
    bf16: bool = True  # bf16 autocast on CUDA
    bf16_weights: bool = False  # frozen weights bf16 except openpi's fp32 set (patch/position embeddings, norms);
                                # trainable ones fp32 (AdamW master weights); bf16 autocast
    train_expert_only: bool = False  # freeze PaliGemma (vision, projector, LM); train the expert + projections fully
    noise_method: str = "additive"  # exploration at noise_level > 0: additive (s sqrt(dt) z after every step but the
                                    # last) | flow_sde (RLinf: one random step is an SDE step, sigma = s sqrt(t/(1-t)))
    delta_action_dims: Optional[int] = ranged(None, "[0, 64]")  # first N action dims relative to the state; None = as the checkpoint
                                             # says (openpi pi0_libero: 6; 0 without statistics)
    value_input: str = "prefix"  # the value head's input: prefix = PaliGemma's output mean-pooled over the valid
                                 # image and prompt tokens (width hidden_size; a function of the observation) |
                                 # expert = the action expert's output mean-pooled over the horizon (width
                                 # expert_dim; RLinf's pi0 critic: the mean of the values at every denoising step of
                                 # the rollout's chain, the flow-SDE step's in the update)


@dataclass
class OpenVLAOFTConfig:
    type: str = "openvla_oft"  # the policy family (models/configs.py FAMILIES)
    init_path: str = ""  # the published (or saved) checkpoint folder
    unnorm_key: Optional[str] = None  # dataset_statistics.json key or suite (libero_10 -> libero_10_no_noops)
    image_size: int = ranged(OFT_IMAGE_SIZE, "[32, 1024]")  # camera image side the env renders;
                                                            # resized to 224 when different
    action_chunk: int = ranged(OFT_ACTION_CHUNK, "[1, 64]")  # fixed by the checkpoint (8 x 7 slots)
    lora_rank: int = ranged(0, "[0, 4096]")  # 0 = full fine-tuning; > 0 = LoRA on every linear layer except lm_head
    lora_alpha: int = ranged(16, "(0, inf)")  # LoRA scale: the adapter's update is multiplied by alpha / rank
    lora_dropout: float = ranged(0.0, "[0, 1)")  # dropout on the LoRA adapters' input
    bf16_weights: bool = False  # keep the weights in bf16 (the published dtype; OFT's evaluation); False = float32
    bf16: bool = True  # bf16 autocast on CUDA (SimpleVLA-RL's fp32 weights + bf16 compute); log-probs stay float32
    gradient_checkpointing: bool = False
    image_pipeline: str = "auto"  # libero: the reference's JPEG q95 round trip + Lanczos to 224 + centre crop
                                  # (libero_image; render at env.image_size 256) | resize: PIL bicubic to 224 only |
                                  # crop_lanczos: 0.9-area centre crop, then PIL Lanczos to 224, no JPEG (the
                                  # GAE-PPO reference's, crop_lanczos_image) |
                                  # auto: libero on LIBERO suites, resize on the embedded one (set when RL starts)
    num_images: int = ranged(1, "[1, 2]")  # camera images in the input: 1 = agent view (the SimpleVLA-RL / siiRL
                                           # checkpoints) | 2 = agent view + wrist (the official OpenVLA-OFT LIBERO
                                           # checkpoints, num_images_in_input 2)
    use_proprio: Optional[bool] = False  # the 8-D state (eef xyz, axis-angle, 2 fingers) as one more Llama token
                                         # after the patches, through the folder's proprio_projector--*.pt
    proprio_norm: str = "q99"  # the state before the projector: q99 = 2 (x - q01) / (q99 - q01) - 1 clipped to
                               # [-1, 1] with the checkpoint's proprio statistics (OpenVLA-OFT's training and
                               # evaluation) | none = the raw state (the GAE-PPO reference's token path)
    from_l1_checkpoint: bool = False  # true: an L1-regression checkpoint folder (action_head--*.pt: the official
                                      # OpenVLA-OFT LIBERO ones) starts this token family as the GAE-PPO reference
                                      # loads it (load_l1_action_head False): the LM's action-token logits are the
                                      # policy, the action head is not loaded; false: such a folder is refused


@dataclass
class OpenVLAOFTL1Config(OpenVLAOFTConfig):
    type: str = "openvla_oft_l1"  # the policy family (models/configs.py FAMILIES)
    num_images: int = ranged(2, "[1, 2]")  # agentview + wrist (the published L1 checkpoints); 1 = agentview only
    use_proprio: Optional[bool] = None  # None: when the folder holds a proprio_projector file


@dataclass
class EncoderConfig:
    kind: str = "vjepa2"  # vjepa2 | pixels
    model_path: Optional[str] = None  # V-JEPA 2 checkpoint (e.g. facebook/vjepa2-vitl-fpc64-256); None = tiny random
    num_frames: int = ranged(16, "[1, 4096]")  # frames sampled uniformly per episode
                                               # (vjepa2: a multiple of its tubelet size 2)
    crop_size: int = ranged(64, "[1, 4096]")  # tiny random V-JEPA 2 input size (a checkpoint uses its own crop_size)
    hidden_size: int = ranged(64, "[1, 65536]")  # tiny random V-JEPA 2 width
    num_layers: int = ranged(2, "[1, 1024]")  # tiny random V-JEPA 2 depth
    pixel_size: int = ranged(8, "[1, 1024]")  # pixels: per-frame resolution after downsampling
    batch_size: int = ranged(8, "[1, 65536]")  # episodes per forward pass
    seed: int = ranged(0, "[0, inf)")  # initialisation seed of the tiny random model (same seed -> same embeddings)
    pooling: str = "mean"  # mean (all frames / all tokens averaged, as siiRL) | final_spatial (last frames, per patch)
    fp16: bool = True  # fp16 autocast on CUDA


@dataclass
class ValueHeadConfig:
    hidden_dims: List[int] = field(default_factory=lambda: [1024, 512])  # the GAE-PPO reference: 4096->1024->512->1
    dropout: float = ranged(0.0, "[0, 1)")  # dropout between the value head's layers
    activation: str = "gelu"  # between the layers: gelu | relu (both references: the GAE-PPO reference's
                              # vla_oft/min_vla/value_head.py, RLinf's pi0 critic)
    init: str = "small_last"  # small_last: torch's default Linear init, the last layer N(0, 0.01^2) with zero bias
                              # (values start near 0) | torch: torch's default everywhere (the GAE-PPO reference) |
                              # rlinf: kaiming-normal (fan_out, for the activation), the last layer N(0, 0.02^2),
                              # zero biases (RLinf's ValueHead._init_weights)


# family -> (module, policy class, config class, kind); the policy's module is imported on use (models/policy.py
# policy_class), so a family's dependencies load only when it is built
FAMILIES: Dict[str, Tuple[str, str, type, str]] = {
    "token": ("models.token_policy", "TokenPolicy", TokenPolicyConfig, "token"),
    "flow": ("models.flow_policy", "FlowPolicy", FlowPolicyConfig, "flow"),
    "openvla_oft": ("models.openvla_oft", "OpenVLAOFTPolicy", OpenVLAOFTConfig, "token"),
    "openvla_oft_l1": ("models.openvla_oft_l1", "OpenVLAOFTL1Policy", OpenVLAOFTL1Config, "regression"),
}


def family_entry(family: str) -> Tuple[str, str, type, str]:
    """FAMILIES' row of `family`: (module, policy class name, config class, action kind); ValueError naming the
    families for an unknown one."""
    if family not in FAMILIES:
        raise ValueError(f"unknown policy family {family!r}; use one of {sorted(FAMILIES)}")
    return FAMILIES[family]


def config_class(family: str) -> type:
    return family_entry(family)[2]


def action_kind(family: str) -> str:
    """'token' (discrete actions with log-probs), 'flow' (continuous, sampled) or 'regression' (continuous,
    deterministic, no log-probs: evaluation and SFT only)."""
    return family_entry(family)[3]
