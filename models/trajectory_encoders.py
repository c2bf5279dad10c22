"""Episode (video) embeddings for the SRPO reward: `embed(videos) -> (B, D) float32 numpy`.

`videos` is a list of uint8 arrays (T_i, H, W, 3) with varying T_i. Frames are sampled uniformly over each episode.
A zero-length or all-black episode embeds to all zeros (the reward marks those rows invalid).
  vjepa2 - `transformers.VJEPA2Model` (skip_predictor=True) on the sampled frames; preprocessing as
           VJEPA2VideoProcessor (resize shortest edge to crop*256/224, centre crop, /255, ImageNet mean/std), in torch.
  pixels - frames area-downsampled to pixel_size x pixel_size, in [0, 1], flattened (the baseline).
`pooling` picks what of the video the embedding keeps:
  mean          - (default, as siiRL) vjepa2: last_hidden_state averaged over all tokens (dim = hidden_size);
                  pixels: all num_frames sampled frames (dim = num_frames * pixel_size^2 * 3).
  final_spatial - the final state, kept spatially resolved. vjepa2: the model sees only the last tubelet (the last
                  tubelet_size of the num_frames sampled frames) and its tokens are flattened in patch order, not
                  averaged (dim = (crop/patch)^2 * hidden_size); pixels: the last frame only (dim = pixel_size^2 * 3).
                  Either way the embedding depends on the episode's final frames only. V-JEPA 2 has no absolute
                  position embedding, so averaging over space forgets where things ended, and a whole-video average
                  makes failures that never grasp look like successes. On the tabletop suite this pooling ranks
                  failures by simulator progress better than `mean` (benchmarks/progress_reward_quality.py;
                  docs/results.md).
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import VJEPA2Config, VJEPA2Model

from base.video import sample_frame_indices
from models.configs import EncoderConfig

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _check_videos(videos: Sequence[np.ndarray]) -> List[np.ndarray]:
    if isinstance(videos, np.ndarray) and videos.ndim == 5:
        videos = list(videos)
    videos = list(videos)
    if len(videos) == 0:
        raise ValueError("videos is empty: need a list of uint8 arrays (T, H, W, 3)")
    for i, v in enumerate(videos):
        v = np.asarray(v)
        if v.ndim != 4 or v.shape[-1] != 3:
            raise ValueError(f"videos[{i}] has shape {v.shape}; expected (T, H, W, 3)")
        videos[i] = v
    return videos


def _is_blank(v: np.ndarray) -> bool:
    return v.shape[0] == 0 or not v.any()


POOLINGS = ("mean", "final_spatial")


def _check_pooling(pooling: str) -> None:
    if pooling not in POOLINGS:
        raise ValueError(f"encoder pooling must be one of {', '.join(POOLINGS)}; got {pooling!r}")


class VJEPA2Encoder:
    """V-JEPA 2 video encoder: from_pretrained(model_path), or a tiny random config seeded by cfg.seed."""

    def __init__(self, cfg: EncoderConfig, device: Optional[str] = None):
        _check_pooling(cfg.pooling)
        self.cfg = cfg
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if cfg.model_path is not None:
            self.model = VJEPA2Model.from_pretrained(cfg.model_path, dtype=torch.float32)
        else:
            config = VJEPA2Config(crop_size=cfg.crop_size, frames_per_clip=cfg.num_frames, patch_size=16,
                                  hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                                  num_attention_heads=4, mlp_ratio=2.0, pred_hidden_size=32,
                                  pred_num_hidden_layers=1, pred_num_attention_heads=2, num_pooler_layers=1)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                self.model = VJEPA2Model(config)
        tubelet = self.model.config.tubelet_size
        if cfg.num_frames < tubelet or cfg.num_frames % tubelet:
            raise ValueError(f"num_frames must be a positive multiple of the tubelet size {tubelet}, "
                             f"got {cfg.num_frames}")
        self.model.eval().to(self.device)
        self.crop_size = int(self.model.config.crop_size)
        width = int(self.model.config.hidden_size)
        patches = (self.crop_size // int(self.model.config.patch_size)) ** 2  # tokens per tubelet
        self.dim = width if cfg.pooling == "mean" else patches * width

    def preprocess(self, video: np.ndarray) -> torch.Tensor:
        """uint8 (T, H, W, 3) -> float (num_frames, 3, crop, crop), as VJEPA2VideoProcessor does
        (final_spatial: the last tubelet_size of those frames)."""
        idx = sample_frame_indices(video.shape[0], self.cfg.num_frames)
        if self.cfg.pooling == "final_spatial":
            idx = idx[-int(self.model.config.tubelet_size):]  # the last tubelet only
        x = torch.from_numpy(video[idx]).to(self.device).permute(0, 3, 1, 2).float()
        h, w = x.shape[-2:]
        short = int(self.crop_size * 256 / 224)
        size = (short, max(short, round(w * short / h))) if h <= w else (max(short, round(h * short / w)), short)
        x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        top, left = (size[0] - self.crop_size) // 2, (size[1] - self.crop_size) // 2
        x = x[..., top: top + self.crop_size, left: left + self.crop_size] / 255.0
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def embed(self, videos: Sequence[np.ndarray]) -> np.ndarray:
        videos = _check_videos(videos)
        out = np.zeros((len(videos), self.dim), np.float32)
        keep = [i for i, v in enumerate(videos) if not _is_blank(v)]
        for s in range(0, len(keep), self.cfg.batch_size):
            rows = keep[s: s + self.cfg.batch_size]
            x = torch.stack([self.preprocess(videos[i]) for i in rows])
            with torch.autocast("cuda", dtype=torch.float16, enabled=self.cfg.fp16 and self.device.type == "cuda"):
                h = self.model(pixel_values_videos=x, skip_predictor=True).last_hidden_state
            # mean: average over all tokens; final_spatial: the one tubelet's tokens, in (row, column) patch order
            h = h.float().mean(1) if self.cfg.pooling == "mean" else h.float().flatten(1)
            out[rows] = h.cpu().numpy()
        return out


class PixelEncoder:
    """Baseline: num_frames uniformly sampled frames (final_spatial: the last frame only), area-downsampled to
    pixel_size^2, in [0, 1], flattened."""

    def __init__(self, cfg: EncoderConfig):
        _check_pooling(cfg.pooling)
        if cfg.num_frames < 1 or cfg.pixel_size < 1:
            raise ValueError(f"num_frames and pixel_size must be >= 1, got {cfg.num_frames}, {cfg.pixel_size}")
        self.cfg = cfg
        self.dim = (cfg.num_frames if cfg.pooling == "mean" else 1) * cfg.pixel_size * cfg.pixel_size * 3

    def embed(self, videos: Sequence[np.ndarray]) -> np.ndarray:
        videos = _check_videos(videos)
        out = np.zeros((len(videos), self.dim), np.float32)
        for i, v in enumerate(videos):
            if _is_blank(v):
                continue
            mean = self.cfg.pooling == "mean"
            idx = sample_frame_indices(v.shape[0], self.cfg.num_frames) if mean else [v.shape[0] - 1]
            x = torch.from_numpy(v[idx]).permute(0, 3, 1, 2)
            x = F.interpolate(x.float() / 255.0, size=(self.cfg.pixel_size, self.cfg.pixel_size), mode="area")
            out[i] = x.flatten().numpy()
        return out


def make_trajectory_encoder(cfg: EncoderConfig, device: Optional[str] = None):
    """`cfg.kind` 'vjepa2' -> VJEPA2Encoder, 'pixels' -> PixelEncoder; both expose `embed(videos)` and `dim`."""
    if cfg.kind == "vjepa2":
        return VJEPA2Encoder(cfg, device)
    if cfg.kind == "pixels":
        return PixelEncoder(cfg)
    raise ValueError(f"encoder kind must be 'vjepa2' or 'pixels', got {cfg.kind!r}")
