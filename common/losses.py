"""Losses shared by the RL scripts: verl's PPO clip, value, KL and loss aggregation (siiRL's SRPO, GAE-PPO). An
algorithm's defining loss lives in its script (LUFFY's in train_luffy.py, FlowSAR's in train_flowsar.py).

Token tensors are (B, L); masks are bool or 0/1 floats of the same shape. Everything here is a pure function.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from common.masking import check_same_shape, masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "traj-token-mean", "episode-ratio")
VALUE_LOSSES = ("half-mse", "mse", "huber")
NEGATIVE_CLIP_BANDS = ("same", "swapped")  # the PPO clip band for A <= 0 (compute_policy_loss_vanilla)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """verl's agg_loss: token-mean, seq-mean-token-sum, seq-mean-token-mean (rows without valid tokens left out), or
    seq-mean-token-sum-norm = total masked sum / L (Dr.GRPO); and traj-token-mean = the masked sum, `loss_mask`
    weighting each token by 1 / (tokens of its trajectory x trajectories in the mini-batch) (the mask times
    common/train.py micro_batches' traj_weight), so the sum over a mini-batch's micro-batches is the mean over its
    trajectories of each one's token mean. That is siiRL's embodied actor with its one trajectory per micro-batch
    (ppo_micro_batch_size_per_gpu 1, siirl/params/model_args.py:278@af00a77): a trajectory's loss is the sum of its
    token losses / its valid tokens (siirl/engine/actor/embodied_actor.py:417, 476-480), divided by the mini-batch's
    trajectories (gradient_accumulation, :384, :482); SimpleVLA-RL's the same (verl/workers/actor/dp_rob.py:405,
    412, 440, 507-513@7c51662). episode-ratio is RLinf's masked_mean_ratio (rlinf/utils/utils.py:352-356@a3816b5:
    mean over every entry, padding included, of loss x mask x max length / the row's episode length): the masked sum
    too, `loss_mask` carrying those weights divided by the entries (common/train.py micro_batches)."""
    check_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode in ("traj-token-mean", "episode-ratio"):
        return masked_sum(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}; valid: {', '.join(LOSS_AGG_MODES)}")
    if loss_mat.ndim != 2:
        raise ValueError(f"{loss_agg_mode} needs a (B, L) loss_mat, got shape {tuple(loss_mat.shape)}")
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        return seq_sums.mean() if seq_sums.numel() else seq_sums.sum()
    if loss_agg_mode == "seq-mean-token-mean":
        seq_means = masked_mean(loss_mat, loss_mask, dim=-1)
        return masked_mean(seq_means, loss_mask.to(seq_means.dtype).sum(dim=-1) > 0)
    return seq_sums.sum() / max(loss_mat.shape[-1], 1)


def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, clip_ratio: float = 0.2,
                                clip_ratio_low: Optional[float] = None, clip_ratio_high: Optional[float] = None,
                                clip_ratio_c: Optional[float] = 3.0, loss_agg_mode: str = "token-mean",
                                log_ratio_clamp: float = 20.0, advantage_clamp: Optional[float] = None,
                                negative_clip_band: str = "same", loss_skip_above: Optional[float] = None,
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's PPO clipped loss with asymmetric clip and dual clip for A < 0 (Ye et al. 2019), as siiRL's SRPO uses it;
    clip_ratio_c None: no dual clip (RLinf's pi0 PPO: clip_ratio_c is passed only for GR00T,
    rlinf/workers/actor/embodied_fsdp_actor_worker.py:664-668@a3816b5). The GAE-PPO reference's variant
    (OpenVLA-OFT-RL OpenVLA_PPO.py:1804-1822@f82c92f) with log_ratio_clamp 5 (log r clamped to [-5, 5]; verl's 20 by
    default), advantage_clamp 10 (A clamped to [-10, 10]; None: none), negative_clip_band "swapped" (for A <= 0 the
    band is [1 - eps_high, 1 + eps_low]; "same": [1 - eps_low, 1 + eps_high] for both signs) and loss_skip_above 100
    (an element whose loss exceeds it in size adds nothing, the mean's denominator unchanged; None: none). Returns
    (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip constant) must be > 1.0, got {clip_ratio_c}")
    if negative_clip_band not in NEGATIVE_CLIP_BANDS:
        raise ValueError(f"negative_clip_band must be one of {NEGATIVE_CLIP_BANDS}, got {negative_clip_band!r}")
    eps_low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    if advantage_clamp is not None:
        advantages = torch.clamp(advantages, min=-advantage_clamp, max=advantage_clamp)

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-log_ratio_clamp, max=log_ratio_clamp)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    if negative_clip_band == "swapped":  # the GAE-PPO reference: A > 0 [1 - low, 1 + high], else [1 - high, 1 + low]
        clipped = torch.where(advantages > 0, clipped, torch.clamp(ratio, 1.0 - eps_high, 1.0 + eps_low))
    pg_losses2 = -advantages * clipped
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).float(), response_mask)

    if clip_ratio_c is None:
        pg_losses, pg_clipfrac_lower = clip_pg_losses1, torch.zeros((), device=advantages.device)
    else:
        pg_losses3 = -advantages * clip_ratio_c
        clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
        pg_clipfrac_lower = masked_mean(((clip_pg_losses1 > pg_losses3) & (advantages < 0)).float(), response_mask)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if loss_skip_above is not None:  # the reference's `continue` past a sample whose |loss| > 100
        pg_losses = torch.where(pg_losses.abs() > loss_skip_above, torch.zeros_like(pg_losses), pg_losses)
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode)
    return pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate as in verl (Schulman's k1/k2/k3): kl|k1 = d, abs = |d|, mse|k2 = d^2/2 with d = logp - ref;
    low_var_kl|k3 = e^-d + d - 1, with -d clamped to [-20, 20] and the result to [-10, 10]."""
    check_same_shape(logprob=logprob, ref_logprob=ref_logprob)
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(kl) - kl - 1.0, min=-10.0, max=10.0)
    raise ValueError(f"unknown kl_penalty {kl_penalty!r}; valid: kl (k1), abs, mse (k2), low_var_kl (k3)")


def huber(error: torch.Tensor, delta: float) -> torch.Tensor:
    """0.5 e^2 where |e| < delta, delta (|e| - delta / 2) beyond (RLinf rlinf/algorithms/utils.py:20-23@a3816b5)."""
    return torch.where(error.abs() < delta, 0.5 * error ** 2, delta * (error.abs() - 0.5 * delta))


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values_old: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: Optional[float] = 0.2,
                       loss_agg_mode: str = "token-mean", kind: str = "half-mse",
                       huber_delta: float = 1.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The value loss agg(max(l(v - R), l(clip(v, v_old +- c) - R))), cliprange_value=None: agg(l(v - R)), with
    `kind` l: half-mse 0.5 e^2 (verl's), mse e^2 (F.mse_loss: the GAE-PPO reference, ppo/gae_ppo_trainer.py:167@
    f82c92f), huber `huber(e, huber_delta)` (RLinf's critic, rlinf/algorithms/losses.py:354-361@a3816b5).
    Returns (vf_loss, vf_clipfrac)."""
    check_same_shape(vpreds=vpreds, returns=returns, values_old=values_old, response_mask=response_mask)
    if kind not in VALUE_LOSSES:
        raise ValueError(f"unknown value loss {kind!r}; valid: {', '.join(VALUE_LOSSES)}")
    loss = {"half-mse": lambda e: 0.5 * e ** 2, "mse": lambda e: e ** 2,
            "huber": lambda e: huber(e, huber_delta)}[kind]
    vf_losses1 = loss(vpreds - returns)
    if cliprange_value is None:
        return agg_loss(vf_losses1, response_mask, loss_agg_mode), torch.zeros((), device=vpreds.device)
    vpredclipped = torch.clamp(vpreds, values_old - cliprange_value, values_old + cliprange_value)
    vf_losses2 = loss(vpredclipped - returns)
    vf_loss = agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac
