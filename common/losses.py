"""Losses: verl's PPO, value, KL and entropy pieces (siiRL's SRPO), LUFFY's mixed-policy loss, RLinf's FlowSAR.

Token tensors are (B, L); masks are bool or 0/1 floats of the same shape. Everything here is a pure function.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from common.advantages import check_same_shape, masked_mean, masked_sum

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "traj-token-mean")


def on_host(t: torch.Tensor) -> bool:
    """Whether a value check on `t` is free: on the CPU it is; on an accelerator `bool(tensor)` waits for the device,
    once per micro-batch, so the losses check their inputs' values only where that costs nothing (the CPU runs and
    the tests); shapes and dtypes are checked everywhere."""
    return t.device.type == "cpu"


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """verl's agg_loss: token-mean, seq-mean-token-sum, seq-mean-token-mean (rows without valid tokens left out), or
    seq-mean-token-sum-norm = total masked sum / L (Dr.GRPO); and traj-token-mean = the masked sum, `loss_mask`
    weighting each token by 1 / (tokens of its trajectory x trajectories in the mini-batch) (the mask times
    common/train.py micro_batches' traj_weight), so the sum over a mini-batch's micro-batches is the mean over its
    trajectories of each one's token mean. That is siiRL's embodied actor with its one trajectory per micro-batch
    (ppo_micro_batch_size_per_gpu 1, siirl/params/model_args.py:278@af00a77): a trajectory's loss is the sum of its
    token losses / its valid tokens (siirl/engine/actor/embodied_actor.py:417, 476-480), divided by the mini-batch's
    trajectories (gradient_accumulation, :384, :482); SimpleVLA-RL's the same (verl/workers/actor/dp_rob.py:405,
    412, 440, 507-513@7c51662)."""
    check_same_shape(loss_mat=loss_mat, loss_mask=loss_mask)
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "traj-token-mean":
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
                                clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean",
                                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's PPO clipped loss with asymmetric clip and dual clip for A < 0 (Ye et al. 2019), as siiRL's SRPO uses it.
    Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower)."""
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask)
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip constant) must be > 1.0, got {clip_ratio_c}")
    eps_low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high

    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)

    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean((pg_losses2 > pg_losses1).float(), response_mask)

    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = masked_mean(((clip_pg_losses1 > pg_losses3) & (advantages < 0)).float(), response_mask)

    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
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


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values_old: torch.Tensor,
                       response_mask: torch.Tensor, cliprange_value: Optional[float] = 0.2,
                       loss_agg_mode: str = "token-mean") -> Tuple[torch.Tensor, torch.Tensor]:
    """verl's clipped value loss 0.5 * agg(max((v - R)^2, (clip(v, v_old +- c) - R)^2)); cliprange_value=None gives the
    plain 0.5 * agg((v - R)^2). Returns (vf_loss, vf_clipfrac)."""
    check_same_shape(vpreds=vpreds, returns=returns, values_old=values_old, response_mask=response_mask)
    vf_losses1 = (vpreds - returns) ** 2
    if cliprange_value is None:
        return 0.5 * agg_loss(vf_losses1, response_mask, loss_agg_mode), torch.zeros((), device=vpreds.device)
    vpredclipped = torch.clamp(vpreds, values_old - cliprange_value, values_old + cliprange_value)
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(vf_losses1, vf_losses2), response_mask, loss_agg_mode)
    vf_clipfrac = masked_mean((vf_losses2 > vf_losses1).float(), response_mask)
    return vf_loss, vf_clipfrac


# ---------------------------------------------------------------------------------------------------------------------
# LUFFY (its mix_core_alg.py)
# ---------------------------------------------------------------------------------------------------------------------
def _nan_to_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isnan(x), torch.zeros_like(x), x)


def _on_policy_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor, reshape: str, weight: float,
                     pow_exp: float) -> torch.Tensor:
    delta = log_prob - old_log_prob
    if reshape == "no_reshape":
        return torch.exp(delta)
    if reshape == "logp":
        return delta
    if reshape == "p_logp":
        return torch.exp(delta) + weight * delta
    if reshape == "square_root":
        return torch.sqrt(torch.exp(delta))
    if reshape == "pow":
        return torch.pow(torch.exp(delta), pow_exp)
    if reshape in ("p_div_p_0.1", "p_div_p_0.5"):
        gamma = float(reshape.rsplit("_", 1)[1])
        prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
        return (prob / (prob + gamma)) / (old_prob / (old_prob + gamma))
    raise ValueError(f"invalid on_policy_reshape {reshape!r}; valid: no_reshape, logp, p_logp, square_root, pow, "
                     f"p_div_p_0.1, p_div_p_0.5")


def _off_policy_ratio(log_prob: torch.Tensor, reshape: str, weight: float, pow_exp: float) -> torch.Tensor:
    prob = torch.exp(log_prob)
    if reshape == "no_reshape":
        return prob
    if reshape == "logp":
        return log_prob * weight
    if reshape == "p_logp":
        return log_prob * weight + prob
    if reshape == "square_root":
        return torch.sqrt(prob)
    if reshape in ("p_div_p_0.1", "p_div_p_0.3", "p_div_p_0.5"):
        gamma = float(reshape.rsplit("_", 1)[1])
        return prob / (prob + gamma)
    if reshape == "pow":
        return torch.pow(prob, pow_exp)
    raise ValueError(f"invalid off_policy_reshape {reshape!r}; valid: no_reshape, logp, p_logp, square_root, "
                     f"p_div_p_0.1, p_div_p_0.3, p_div_p_0.5, pow")


def compute_token_on_off_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    eos_mask: torch.Tensor,
    cliprange: float,
    clip_upper_bound: float,
    prefix_mask: torch.Tensor,
    off_max_clip: Optional[float] = None,
    off_min_clip: Optional[float] = None,
    all_max_clip: Optional[float] = None,
    off_policy_reshape: str = "no_reshape",
    off_policy_reshape_weight: float = 1.0,
    off_policy_reshape_pow_exp: float = 0.5,
    on_policy_reshape: str = "no_reshape",
    on_policy_reshape_weight: float = 1.0,
    on_policy_reshape_pow_exp: float = 0.5,
    target_probs: Optional[torch.Tensor] = None,
    loss_remove_token_mean: bool = False,
    loss_remove_clip: bool = False,
) -> Dict[str, torch.Tensor]:
    """LUFFY's mixed-policy loss: PPO clip on on-policy tokens, reshaped p (or p / target_probs) on prefix
    tokens; dict of 11 scalars. (LUFFY's off_cliprange, off_normalize and off_abs_cliprange, which it ignores, are not
    taken.)"""
    check_same_shape(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, eos_mask=eos_mask,
                     prefix_mask=prefix_mask)
    if prefix_mask.dtype != torch.bool:
        raise ValueError(f"prefix_mask must be a bool tensor (it is negated with ~), got dtype {prefix_mask.dtype}")
    # exp(inf) in the unused on-policy branch would give NaN gradients
    if on_host(old_log_prob) and not bool(torch.isfinite(old_log_prob).all()):
        raise ValueError("old_log_prob must be finite on every token; for off-policy (prefix) tokens pass the policy's "
                         "log-prob under the old weights, as LUFFY does")
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    on_mask = (~prefix_mask) * eos_mask
    off_mask = prefix_mask * eos_mask

    # on-policy: (reshaped) importance ratio with PPO clip
    negative_approx_kl = log_prob - old_log_prob
    ppo_kl = masked_mean(-negative_approx_kl, eos_mask)
    ratio = _on_policy_ratio(log_prob, old_log_prob, on_policy_reshape, on_policy_reshape_weight,
                             on_policy_reshape_pow_exp)
    on_pg_losses = -advantages * ratio
    if loss_remove_clip:
        on_pg_clipfrac = zero
    else:
        upper_bound = max(clip_upper_bound, 1.0 + cliprange)
        on_pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, upper_bound)
        on_pg_clipfrac = masked_mean((on_pg_losses2 > on_pg_losses).float(), eos_mask)
        on_pg_losses = torch.maximum(on_pg_losses, on_pg_losses2)
    on_pg_loss = masked_mean(on_pg_losses, on_mask)

    # off-policy: the current policy's (reshaped) token probability, no old policy
    if target_probs is None:
        off_ratio = _off_policy_ratio(log_prob, off_policy_reshape, off_policy_reshape_weight,
                                      off_policy_reshape_pow_exp)
    else:
        check_same_shape(target_probs=target_probs, log_prob=log_prob)
        off_ratio = torch.exp(log_prob) / (target_probs + 1e-6) * prefix_mask
    off_ratio_max_clip_frac, off_ratio_min_clip_frac = zero, zero
    if off_max_clip is not None:
        off_ratio = torch.clamp(off_ratio, max=off_max_clip)
        off_ratio_max_clip_frac = masked_mean((off_ratio == off_max_clip).float(), off_mask)
    if off_min_clip is not None:
        off_ratio = torch.clamp(off_ratio, min=off_min_clip)
        off_ratio_min_clip_frac = masked_mean((off_ratio == off_min_clip).float(), off_mask)
    off_ratio_mean = _nan_to_zero(masked_mean(off_ratio, off_mask))
    off_pg_losses = -advantages * off_ratio
    off_pg_loss = _nan_to_zero(masked_mean(off_pg_losses, off_mask))
    off_pg_clipfrac = zero

    # combine per token: P * L_off + (1 - P) * L_on (torch.where, so an unused side can never inject NaN)
    pg_losses = torch.where(prefix_mask, off_pg_losses, on_pg_losses)
    off_policy_prob = _nan_to_zero(masked_mean(torch.exp(log_prob), off_mask))
    on_policy_prob = _nan_to_zero(masked_mean(torch.exp(old_log_prob), on_mask))

    loss_mask = eos_mask
    if all_max_clip is not None:  # tokens the policy already gives p > all_max_clip leave the loss and its mask
        keep = torch.exp(log_prob) <= all_max_clip
        loss_mask = eos_mask * keep
        pg_losses = torch.where(keep, pg_losses, torch.zeros_like(pg_losses))
    if loss_remove_token_mean:
        pg_loss = masked_sum(pg_losses, loss_mask) / max(loss_mask.shape[-1], 1)
    else:
        pg_loss = masked_mean(pg_losses, loss_mask)

    return {
        "pg_loss": pg_loss,
        "off_pg_loss": off_pg_loss,
        "on_pg_loss": on_pg_loss,
        "off_pg_clipfrac": off_pg_clipfrac,
        "on_pg_clipfrac": on_pg_clipfrac,
        "ppo_kl": ppo_kl,
        "off_policy_prob": off_policy_prob,
        "on_policy_prob": on_policy_prob,
        "off_ratio_mean": off_ratio_mean,
        "off_ratio_max_clip_frac": off_ratio_max_clip_frac,
        "off_ratio_min_clip_frac": off_ratio_min_clip_frac,
    }


def compute_sft_pure_loss(log_prob: torch.Tensor, eos_mask: torch.Tensor) -> torch.Tensor:
    """LUFFY's SFT loss: masked_mean(-log_prob, eos_mask)."""
    check_same_shape(log_prob=log_prob, eos_mask=eos_mask)
    return masked_mean(-log_prob, eos_mask)


# ---------------------------------------------------------------------------------------------------------------------
# RLinf's FlowSAR (write-up §2.2)
# ---------------------------------------------------------------------------------------------------------------------
def compute_flow_sar_loss(v_theta: torch.Tensor, v_old: torch.Tensor, u_target: torch.Tensor, weights: torch.Tensor,
                          labels: torch.Tensor, beta: float, energy_type: str = "mse",
                          loss_variant: str = "mse_branch", kl_coeff: float = 0.5,
                          flow_t: Optional[torch.Tensor] = None,
                          loss_mask: Optional[torch.Tensor] = None,
                          element_mask: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Dict[str, Any]]:
    """FlowSAR mirror loss (write-up §2.2): v+- = (1 -+ b) v_old +- b v_theta, E+- = mean (v+- - u)^2 (sde: / 2t);
    mse_branch w[R E+ + (1-R) E-] or softplus_kl w softplus(y (E+ - E-) / 2) + kl_coeff mean (v_theta - v_old)^2.
    `loss_mask` (*S) drops whole samples; `element_mask` (broadcastable to v_theta) keeps only some of a sample's
    elements in its means (the actions the env executed: a chunk cut short by the episode's end), the others get no
    gradient. The metrics are detached 0-d tensors (read them after the update: no host sync per micro-batch)."""
    check_same_shape(v_theta=v_theta, v_old=v_old, u_target=u_target)
    check_same_shape(weights=weights, labels=labels)
    sample_shape = tuple(weights.shape)
    k = len(sample_shape)
    if k == 0 or v_theta.ndim <= k or tuple(v_theta.shape[:k]) != sample_shape:
        raise ValueError(f"v_theta must be (*S, chunk...) with S = weights.shape {sample_shape} (>= 1-D), "
                         f"got v_theta {tuple(v_theta.shape)}")
    if loss_mask is None:
        loss_mask = torch.ones(sample_shape, dtype=torch.bool, device=weights.device)
    check_same_shape(weights=weights, loss_mask=loss_mask)
    if energy_type not in ("mse", "sde"):
        raise ValueError(f"energy_type must be 'mse' or 'sde', got {energy_type!r}")
    if loss_variant not in ("mse_branch", "softplus_kl"):
        raise ValueError(f"loss_variant must be 'mse_branch' or 'softplus_kl', got {loss_variant!r}")
    if on_host(labels) and not bool(((labels == 1) | (labels == -1)).all()):
        raise ValueError(f"labels must be y = 2R - 1 in {{-1, +1}}, got {labels.tolist()}")

    def sample_mean(x: torch.Tensor) -> torch.Tensor:  # over each sample's (kept) elements
        if element_mask is None:
            return x.flatten(k).mean(dim=-1)
        keep = element_mask.to(device=x.device, dtype=torch.bool).expand_as(x)
        kept = torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device)).flatten(k).sum(dim=-1)
        return kept / keep.flatten(k).sum(dim=-1).clamp(min=1).to(x.dtype)

    v_pos = (1.0 - beta) * v_old + beta * v_theta
    v_neg = (1.0 + beta) * v_old - beta * v_theta
    e_pos = sample_mean((v_pos - u_target).square())
    e_neg = sample_mean((v_neg - u_target).square())
    if energy_type == "sde":
        if flow_t is None or flow_t.numel() != e_pos.numel():
            raise ValueError(f"energy_type 'sde' needs flow_t with one t per sample {sample_shape}, got "
                             f"{None if flow_t is None else tuple(flow_t.shape)}")
        t = flow_t.reshape(sample_shape).to(e_pos.dtype)
        if on_host(t) and bool((t <= 0).any()):
            raise ValueError(f"flow_t must be > 0 for the 1/(2t) sde scaling, got min {float(t.min())}")
        e_pos, e_neg = e_pos / (2.0 * t), e_neg / (2.0 * t)

    labels = labels.to(e_pos.dtype)
    success = (labels + 1.0) / 2.0
    metrics: Dict[str, Any] = {}
    if loss_variant == "mse_branch":
        per_sample = weights * (success * e_pos + (1.0 - success) * e_neg)
        metrics["flow_sar_success_ratio"] = masked_mean(success, loss_mask).detach()
    else:
        contrastive = weights * F.softplus(0.5 * labels * (e_pos - e_neg))
        penalty = kl_coeff * sample_mean((v_theta - v_old).square())
        per_sample = contrastive + penalty
        metrics["flow_sar_contrastive"] = masked_mean(contrastive.detach(), loss_mask)
        metrics["flow_sar_kl_penalty"] = masked_mean(penalty.detach(), loss_mask)
    loss = masked_mean(per_sample, loss_mask)
    metrics.update({
        "flow_sar_loss": loss.detach(),
        "flow_sar_E_pos": masked_mean(e_pos.detach(), loss_mask),
        "flow_sar_E_neg": masked_mean(e_neg.detach(), loss_mask),
        "flow_sar_weight_mean": masked_mean(weights.detach().to(e_pos.dtype), loss_mask),
    })
    return loss, metrics
