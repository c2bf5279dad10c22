"""Hand-computed checks of the losses: verl PPO pieces (common/losses.py, siiRL's SRPO), LUFFY's (train_luffy.py),
FlowSAR's (train_flowsar.py, RLinf's FlowSAR)."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from common.losses import agg_loss, compute_policy_loss_vanilla, compute_value_loss, kl_penalty
from train_flowsar import compute_flow_sar_loss
from train_luffy import compute_sft_pure_loss, compute_token_on_off_policy_loss

torch.set_num_threads(1)
LOG = math.log


# ---------------------------------------------------------------------------------------------------------------------
# agg_loss
# ---------------------------------------------------------------------------------------------------------------------
def test_agg_loss_four_modes_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 3)  # total / L, L = 3


def test_agg_loss_traj_token_mean_is_the_mean_of_trajectories_token_means():
    """traj-token-mean sums loss x mask, the mask carrying 1 / (tokens of the row's trajectory x trajectories): rows 0
    and 1 are one trajectory (3 valid tokens: 1 + 2 + 4 = 7, mean 7/3), row 2 another (1 token: 7) -> (7/3 + 7) / 2
    = 4.6667; the plain token mean of the same tokens is 14 / 4 = 3.5 (the long trajectory weighs more)."""
    loss = torch.tensor([[1.0, 2.0], [4.0, 9.0], [7.0, 8.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    weight = torch.tensor([1 / (3 * 2), 1 / (3 * 2), 1 / (1 * 2)])
    assert agg_loss(loss, mask * weight[:, None], "traj-token-mean").item() == pytest.approx((7 / 3 + 7) / 2)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(3.5)


def test_agg_loss_all_masked_rows_and_empty():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(1.5)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(1.5)  # (3 + 0) / 2 rows
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)  # the empty row is left out
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(1.0)
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert agg_loss(loss, torch.zeros_like(mask), mode).item() == 0.0
        assert agg_loss(torch.zeros(0, 3), torch.zeros(0, 3), mode).item() == 0.0
    with pytest.raises(ValueError, match="unknown loss_agg_mode 'mean'"):
        agg_loss(loss, mask, "mean")
    with pytest.raises(ValueError, match=r"loss_mat \(2, 3\), loss_mask \(2, 2\)"):
        agg_loss(loss, mask[:, :2], "token-mean")


# ---------------------------------------------------------------------------------------------------------------------
# PPO (verl compute_policy_loss_vanilla)
# ---------------------------------------------------------------------------------------------------------------------
def ppo_inputs():
    ratios = torch.tensor([[1.5, 0.5, 0.5, 5.0, 1.0, 5.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, -2.0, 1.0]])
    old = torch.full((1, 6), -1.0)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    return old, old + ratios.log(), advantages, mask


def test_ppo_clip_fractions_dual_clip_and_kl():
    old, new, adv, mask = ppo_inputs()
    pg_loss, clipfrac, ppo_kl, clipfrac_lower = compute_policy_loss_vanilla(old, new, adv, mask)
    # per token: max(-A r, -A clip(r, .8, 1.2)) -> [-1.2 (clipped), -0.5, 0.8 (clipped), 5, 2]; dual clip 5 -> 3
    assert pg_loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 3.0 + 2.0) / 5, rel=1e-5)
    assert clipfrac.item() == pytest.approx(2 / 5)
    assert clipfrac_lower.item() == pytest.approx(1 / 5)  # only the A < 0, r = 5 token hits -A c
    assert ppo_kl.item() == pytest.approx(-(LOG(1.5) + 2 * LOG(0.5) + LOG(5.0)) / 5, rel=1e-5)
    sums, *_ = compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert sums.item() == pytest.approx(4.1, rel=1e-5)


def test_ppo_asymmetric_clip_and_dual_clip_constant():
    old, new, adv, mask = ppo_inputs()
    pg_loss, *_ = compute_policy_loss_vanilla(old, new, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
    assert pg_loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0 + 2.0) / 5, rel=1e-5)
    pg_loss, *_ = compute_policy_loss_vanilla(old, new, adv, mask, clip_ratio_c=4.0)
    assert pg_loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 4.0 + 2.0) / 5, rel=1e-5)
    with pytest.raises(ValueError, match="clip_ratio_c .* > 1.0, got 1.0"):
        compute_policy_loss_vanilla(old, new, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match=r"advantages \(1, 5\)"):
        compute_policy_loss_vanilla(old, new, adv[:, :5], mask)


def test_ppo_gradients_vanish_on_clipped_tokens_and_log_ratio_is_clamped():
    old, new, adv, mask = ppo_inputs()
    new = new.clone().requires_grad_(True)
    pg_loss, *_ = compute_policy_loss_vanilla(old, new, adv, mask)
    pg_loss.backward()
    # d(-A r)/d log p = -A r: only token 2 (A = 1, r = 0.5) is unclipped among tokens 1-4
    assert new.grad[0, :4].tolist() == pytest.approx([0.0, -0.5 / 5, 0.0, 0.0], abs=1e-7)
    assert new.grad[0, 5].item() == 0.0  # masked
    _, _, kl, _ = compute_policy_loss_vanilla(torch.zeros(1, 1), torch.full((1, 1), 50.0), torch.ones(1, 1),
                                             torch.ones(1, 1))
    assert kl.item() == -20.0
    empty = compute_policy_loss_vanilla(old, new.detach(), adv, torch.zeros_like(mask))
    assert [t.item() for t in empty] == [0.0, 0.0, 0.0, 0.0]


def test_ppo_gae_ppo_reference_variant_hand_values():
    """The GAE-PPO reference's loss (OpenVLA-OFT-RL OpenVLA_PPO.py:1804-1822@f82c92f): clip low 0.2 / high 0.28,
    for A <= 0 the band swapped to [1 - 0.28, 1 + 0.2], no dual clip. Per token of ppo_inputs: r 1.5, A 1 -> -1.28;
    r 0.5, A 1 -> -0.5; r 0.5, A -1 -> max(0.5, 0.72) = 0.72 (verl's band: 0.8); r 5, A -1 -> max(5, 1.2) = 5;
    r 1, A -2 -> 2."""
    old, new, adv, mask = ppo_inputs()
    ref = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, negative_clip_band="swapped")
    pg_loss, clipfrac, _, lower = compute_policy_loss_vanilla(old, new, adv, mask, **ref)
    assert pg_loss.item() == pytest.approx((-1.28 - 0.5 + 0.72 + 5.0 + 2.0) / 5, rel=1e-5)
    assert clipfrac.item() == pytest.approx(2 / 5) and lower.item() == 0.0
    same, *_ = compute_policy_loss_vanilla(old, new, adv, mask, **{**ref, "negative_clip_band": "same"})
    assert same.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 5.0 + 2.0) / 5, rel=1e-5)
    with pytest.raises(ValueError, match="negative_clip_band must be one of"):
        compute_policy_loss_vanilla(old, new, adv, mask, negative_clip_band="flipped")


def test_ppo_log_ratio_and_advantage_clamps_and_the_skip_rule():
    """Token 0: log r = 6, A = -20; token 1: r = 1, A = 3 (loss -3). Clamps 5 and 10: r = e^5, A = -10, loss
    10 e^5 = 1484.13 (no dual clip, band [0.72, 1.2]); verl's defaults: r = e^6, A = -20, loss 20 e^6 = 8068.6. With
    loss_skip_above 100 token 0 adds nothing and still counts: (0 - 3) / 2, its gradient zero. The defaults
    (log_ratio_clamp 20, no advantage clamp, same band, no skip) are the loss as before."""
    old, new = torch.zeros(1, 2), torch.tensor([[6.0, 0.0]], requires_grad=True)
    adv, mask = torch.tensor([[-20.0, 3.0]]), torch.ones(1, 2)
    ref = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None, negative_clip_band="swapped")
    clamped, _, kl, _ = compute_policy_loss_vanilla(old, new, adv, mask, log_ratio_clamp=5.0, advantage_clamp=10.0,
                                                    **ref)
    assert clamped.item() == pytest.approx((10 * math.exp(5) - 3) / 2, rel=1e-6)
    assert kl.item() == pytest.approx(-5.0 / 2)
    plain, *_ = compute_policy_loss_vanilla(old, new, adv, mask, **ref)
    assert plain.item() == pytest.approx((20 * math.exp(6) - 3) / 2, rel=1e-6)
    skipped, *_ = compute_policy_loss_vanilla(old, new, adv, mask, log_ratio_clamp=5.0, advantage_clamp=10.0,
                                              loss_skip_above=100.0, **ref)
    assert skipped.item() == pytest.approx(-1.5)
    skipped.backward()
    assert new.grad[0].tolist() == pytest.approx([0.0, -3 / 2])  # d(-A r)/d log p = -A r at r = 1
    o, n, a, m = ppo_inputs()
    default = compute_policy_loss_vanilla(o, n, a, m)
    spelled = compute_policy_loss_vanilla(o, n, a, m, log_ratio_clamp=20.0, advantage_clamp=None,
                                          negative_clip_band="same", loss_skip_above=None)
    assert all(torch.equal(x, y) for x, y in zip(default, spelled))


# ---------------------------------------------------------------------------------------------------------------------
# KL, entropy, value loss, SFT
# ---------------------------------------------------------------------------------------------------------------------
def test_kl_penalty_estimators():
    logp, ref = torch.tensor([LOG(0.5), LOG(0.25)]), torch.tensor([LOG(0.25), LOG(0.5)])
    assert kl_penalty(logp, ref, "kl").tolist() == pytest.approx([LOG(2), -LOG(2)])
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([LOG(2), -LOG(2)])
    assert kl_penalty(logp, ref, "abs").tolist() == pytest.approx([LOG(2), LOG(2)])
    assert kl_penalty(logp, ref, "mse").tolist() == pytest.approx([0.5 * LOG(2) ** 2] * 2)
    # k3 = r - log r - 1 with r = ref_p / p: 0.5 + log 2 - 1 and 2 - log 2 - 1
    assert kl_penalty(logp, ref, "low_var_kl").tolist() == pytest.approx([LOG(2) - 0.5, 1 - LOG(2)], rel=1e-6)
    assert kl_penalty(logp, ref).tolist() == kl_penalty(logp, ref, "k3").tolist()
    far = kl_penalty(torch.tensor([0.0, 0.0]), torch.tensor([30.0, -30.0]), "low_var_kl")
    assert far.tolist() == [10.0, 10.0]  # clamped to [-10, 10] (e^20 - 21 and 19 before the clamp)
    with pytest.raises(ValueError, match="unknown kl_penalty 'full'"):
        kl_penalty(logp, ref, "full")


def test_value_loss_clipped_hand_values():
    vpreds, returns = torch.tensor([[1.0, 2.0, 0.95]]), torch.tensor([[0.0, 0.0, 1.0]])
    old, mask = torch.tensor([[0.9, 1.0, 0.5]]), torch.ones(1, 3)
    # max(unclipped, clipped): [max(1, 1), max(4, 1.44), max(0.0025, 0.09)]
    loss, clipfrac = compute_value_loss(vpreds, returns, old, mask, cliprange_value=0.2)
    assert loss.item() == pytest.approx(0.5 * (1 + 4 + 0.09) / 3, rel=1e-5)
    assert clipfrac.item() == pytest.approx(1 / 3)
    plain, plain_frac = compute_value_loss(vpreds, returns, old, mask, cliprange_value=None)
    assert plain.item() == pytest.approx(0.5 * (1 + 4 + 0.0025) / 3, rel=1e-5) and plain_frac.item() == 0.0
    masked, _ = compute_value_loss(vpreds, returns, old, torch.tensor([[1.0, 0.0, 0.0]]), cliprange_value=0.2)
    assert masked.item() == pytest.approx(0.5)
    assert compute_value_loss(vpreds, returns, old, torch.zeros(1, 3))[0].item() == 0.0
    with pytest.raises(ValueError, match=r"values_old \(1, 2\)"):
        compute_value_loss(vpreds, returns, old[:, :2], mask)


def test_sft_pure_loss():
    log_prob = torch.tensor([[LOG(0.5), LOG(0.25)], [0.0, -7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert compute_sft_pure_loss(log_prob, mask).item() == pytest.approx((LOG(2) + LOG(4)) / 2)
    assert compute_sft_pure_loss(log_prob, torch.zeros_like(mask)).item() == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# LUFFY compute_token_on_off_policy_loss
# ---------------------------------------------------------------------------------------------------------------------
KEYS = {"pg_loss", "off_pg_loss", "on_pg_loss", "off_pg_clipfrac", "on_pg_clipfrac", "ppo_kl", "off_policy_prob",
        "on_policy_prob", "off_ratio_mean", "off_ratio_max_clip_frac", "off_ratio_min_clip_frac"}


def luffy_batch():
    """Row 0: an expert (off-policy) demo, old log-prob = current one; row 1: an on-policy rollout."""
    p = torch.tensor([[0.5, 0.25, 0.8], [0.6, 0.3, 0.9]])
    p_old = torch.tensor([[0.5, 0.25, 0.8], [0.5, 0.5, 0.9]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, -1.0, 0.5]])
    eos = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.float32)
    prefix = torch.tensor([[True, True, True], [False, False, False]])
    return dict(old_log_prob=p_old.log(), log_prob=p.log(), advantages=adv, eos_mask=eos, prefix_mask=prefix)


def luffy(**overrides):
    args = dict(luffy_batch(), cliprange=0.2, clip_upper_bound=100.0)
    args.update(overrides)
    return {k: float(v) for k, v in compute_token_on_off_policy_loss(**args).items()}


def test_luffy_default_hand_values():
    out = luffy()
    assert set(out) == KEYS
    # on tokens: r = [1.2, 0.6, 1.0], upper = max(100, 1.2): losses [-2.4, 0.8 (clipped up from 0.6), -0.5]
    assert out["on_pg_loss"] == pytest.approx(-0.7, rel=1e-5)
    assert out["on_pg_clipfrac"] == pytest.approx(1 / 5)  # over all 5 valid tokens (eos_mask)
    # off tokens: ratio p = [0.5, 0.25], A = 1
    assert out["off_pg_loss"] == pytest.approx(-0.375, rel=1e-5)
    assert out["off_ratio_mean"] == pytest.approx(0.375, rel=1e-5)
    assert out["pg_loss"] == pytest.approx((-0.5 - 0.25 - 2.4 + 0.8 - 0.5) / 5, rel=1e-5)
    assert out["ppo_kl"] == pytest.approx(-(LOG(1.2) + LOG(0.6)) / 5, rel=1e-5)
    assert out["off_policy_prob"] == pytest.approx(0.375, rel=1e-5)
    assert out["on_policy_prob"] == pytest.approx((0.5 + 0.5 + 0.9) / 3, rel=1e-5)
    assert out["off_pg_clipfrac"] == out["off_ratio_max_clip_frac"] == out["off_ratio_min_clip_frac"] == 0.0


def test_luffy_clip_options():
    tight = luffy(cliprange=0.1, clip_upper_bound=1.0)  # upper = max(1.0, 1.1): r 1.2 -> 1.1, r 0.6 -> 0.9
    assert tight["on_pg_loss"] == pytest.approx((-2.2 + 0.9 - 0.5) / 3, rel=1e-5)
    assert tight["on_pg_clipfrac"] == pytest.approx(2 / 5)
    no_clip = luffy(loss_remove_clip=True)
    assert no_clip["on_pg_loss"] == pytest.approx((-2.4 + 0.6 - 0.5) / 3, rel=1e-5)
    assert no_clip["on_pg_clipfrac"] == 0.0
    assert no_clip["pg_loss"] == pytest.approx((-0.75 - 2.3) / 5, rel=1e-5)
    no_mean = luffy(loss_remove_token_mean=True)
    assert no_mean["pg_loss"] == pytest.approx(-2.85 / 3, rel=1e-5)  # sum / L, L = 3


def test_luffy_off_ratio_min_max_clip_fractions():
    hi = luffy(off_max_clip=0.3)  # [0.5, 0.25] -> [0.3, 0.25]; the masked 0.8 hits the bound but is not counted
    assert hi["off_ratio_max_clip_frac"] == pytest.approx(0.5)
    assert hi["off_ratio_mean"] == pytest.approx(0.275, rel=1e-5)
    assert hi["off_pg_loss"] == pytest.approx(-0.275, rel=1e-5)
    lo = luffy(off_min_clip=0.4)  # [0.5, 0.25] -> [0.5, 0.4]
    assert lo["off_ratio_min_clip_frac"] == pytest.approx(0.5) and lo["off_ratio_mean"] == pytest.approx(0.45)
    both = luffy(off_max_clip=0.45, off_min_clip=0.3)
    assert both["off_ratio_max_clip_frac"] == pytest.approx(0.5)
    assert both["off_ratio_min_clip_frac"] == pytest.approx(0.5)


def test_luffy_all_max_clip_drops_confident_tokens_from_loss_and_mask():
    out = luffy(all_max_clip=0.85)  # the on-policy token with p = 0.9 leaves the loss and the denominator
    assert out["pg_loss"] == pytest.approx((-0.5 - 0.25 - 2.4 + 0.8) / 4, rel=1e-5)
    assert out["on_pg_loss"] == pytest.approx(-0.7, rel=1e-5)  # the component metrics are taken before it
    both = luffy(all_max_clip=0.85, loss_remove_token_mean=True)
    assert both["pg_loss"] == pytest.approx((-0.5 - 0.25 - 2.4 + 0.8) / 3, rel=1e-5)


def test_luffy_target_probs():
    target = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.1, 0.1]])
    out = luffy(target_probs=target)  # off ratio p / (target + 1e-6) on prefix tokens: [1, 0.5]
    assert out["off_ratio_mean"] == pytest.approx(0.75, rel=1e-5)
    assert out["off_pg_loss"] == pytest.approx(-0.75, rel=1e-5)


ON_RESHAPES = {
    "no_reshape": lambda p, q: p / q,
    "logp": lambda p, q: np.log(p) - np.log(q),
    "p_logp": lambda p, q: p / q + 0.7 * (np.log(p) - np.log(q)),
    "square_root": lambda p, q: np.sqrt(p / q),
    "pow": lambda p, q: (p / q) ** 0.3,
    "p_div_p_0.1": lambda p, q: (p / (p + 0.1)) / (q / (q + 0.1)),
    "p_div_p_0.5": lambda p, q: (p / (p + 0.5)) / (q / (q + 0.5)),
}
OFF_RESHAPES = {
    "no_reshape": lambda p: p,
    "logp": lambda p: 0.7 * np.log(p),
    "p_logp": lambda p: 0.7 * np.log(p) + p,
    "square_root": lambda p: np.sqrt(p),
    "p_div_p_0.1": lambda p: p / (p + 0.1),
    "p_div_p_0.3": lambda p: p / (p + 0.3),
    "p_div_p_0.5": lambda p: p / (p + 0.5),
    "pow": lambda p: p ** 0.3,
}


@pytest.mark.parametrize("name", sorted(ON_RESHAPES))
def test_luffy_on_policy_reshapes_match_direct_formula(name):
    p, q, adv = np.array([0.6, 0.3, 0.9]), np.array([0.5, 0.5, 0.9]), np.array([2.0, -1.0, 0.5])
    ratio = ON_RESHAPES[name](p, q)
    out = luffy(on_policy_reshape=name, on_policy_reshape_weight=0.7, on_policy_reshape_pow_exp=0.3)
    clipped = np.maximum(-adv * ratio, -adv * np.clip(ratio, 0.8, 100.0))
    assert out["on_pg_loss"] == pytest.approx(clipped.mean(), rel=1e-5)
    raw = luffy(on_policy_reshape=name, on_policy_reshape_weight=0.7, on_policy_reshape_pow_exp=0.3,
                loss_remove_clip=True)
    assert raw["on_pg_loss"] == pytest.approx((-adv * ratio).mean(), rel=1e-5)


@pytest.mark.parametrize("name", sorted(OFF_RESHAPES))
def test_luffy_off_policy_reshapes_match_direct_formula(name):
    p = np.array([0.5, 0.25])
    out = luffy(off_policy_reshape=name, off_policy_reshape_weight=0.7, off_policy_reshape_pow_exp=0.3)
    assert out["off_ratio_mean"] == pytest.approx(OFF_RESHAPES[name](p).mean(), rel=1e-5)
    assert out["off_pg_loss"] == pytest.approx(-OFF_RESHAPES[name](p).mean(), rel=1e-5)


def test_luffy_gradients_edge_cases_and_errors():
    batch = luffy_batch()
    log_prob = batch.pop("log_prob").clone().requires_grad_(True)
    out = compute_token_on_off_policy_loss(log_prob=log_prob, cliprange=0.2, clip_upper_bound=100.0, **batch)
    out["pg_loss"].backward()
    # off token: d(-A p)/d log p = -A p / 5 tokens; on token 0: -A r / 5; on token 1 clipped: 0
    assert log_prob.grad[0].tolist() == pytest.approx([-0.5 / 5, -0.25 / 5, 0.0], rel=1e-5)
    assert log_prob.grad[1].tolist() == pytest.approx([-2.4 / 5, 0.0, -0.5 / 5], rel=1e-5)

    only_on = luffy(prefix_mask=torch.zeros(2, 3, dtype=torch.bool))
    assert only_on["off_pg_loss"] == only_on["off_ratio_mean"] == only_on["off_policy_prob"] == 0.0
    only_off = luffy(prefix_mask=torch.ones(2, 3, dtype=torch.bool))
    assert only_off["on_pg_loss"] == only_off["on_policy_prob"] == 0.0
    no_old = luffy_batch()["old_log_prob"].clone()
    no_old[0, 2] = float("-inf")  # a missing old log-prob (even on a padded token) would make NaN gradients: refused
    with pytest.raises(ValueError, match="old_log_prob must be finite"):
        luffy(old_log_prob=no_old)
    empty = luffy(eos_mask=torch.zeros(2, 3))
    assert all(v == 0.0 for v in empty.values())

    with pytest.raises(ValueError, match="prefix_mask must be a bool tensor"):
        luffy(prefix_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="invalid on_policy_reshape 'p_div_p_0.3'"):
        luffy(on_policy_reshape="p_div_p_0.3")
    with pytest.raises(ValueError, match="invalid off_policy_reshape 'cube'"):
        luffy(off_policy_reshape="cube")
    with pytest.raises(ValueError, match=r"eos_mask \(2, 2\)"):
        luffy(eos_mask=torch.ones(2, 2))


# ---------------------------------------------------------------------------------------------------------------------
# FlowSAR loss (RLinf's FlowSAR write-up §2.2)
# ---------------------------------------------------------------------------------------------------------------------
def flow_batch():
    v_old = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]])  # (N=2, chunk=1, dim=2)
    v_theta = torch.tensor([[[2.0, 0.0]], [[1.0, 3.0]]])
    u = torch.tensor([[[1.0, 1.0]], [[0.0, 0.0]]])
    return dict(v_theta=v_theta, v_old=v_old, u_target=u, weights=torch.tensor([0.6, 0.4]),
                labels=torch.tensor([1.0, -1.0]), beta=0.5)


def test_flow_sar_mse_branch_hand_values():
    # sample 0: v+ = [1, 0], v- = [-1, 0] -> E+ 0.5, E- 2.5; sample 1: v+ = [1, 2], v- = [1, 0] -> E+ 2.5, E- 0.5
    loss, m = compute_flow_sar_loss(**flow_batch())
    assert loss.item() == pytest.approx((0.6 * 0.5 + 0.4 * 0.5) / 2)
    assert m["flow_sar_loss"] == pytest.approx(0.25)
    assert m["flow_sar_E_pos"] == pytest.approx(1.5) and m["flow_sar_E_neg"] == pytest.approx(1.5)
    assert m["flow_sar_weight_mean"] == pytest.approx(0.5)
    assert m["flow_sar_success_ratio"] == pytest.approx(0.5)
    assert "flow_sar_contrastive" not in m
    masked, _ = compute_flow_sar_loss(**flow_batch(), loss_mask=torch.tensor([True, False]))
    assert masked.item() == pytest.approx(0.3)
    none, m0 = compute_flow_sar_loss(**flow_batch(), loss_mask=torch.tensor([False, False]))
    assert none.item() == 0.0 and all(math.isfinite(v) for v in m0.values())


def test_flow_sar_softplus_kl_hand_values():
    loss, m = compute_flow_sar_loss(**flow_batch(), loss_variant="softplus_kl", kl_coeff=0.5)
    contrastive = (0.6 * F.softplus(torch.tensor(-1.0)) + 0.4 * F.softplus(torch.tensor(-1.0))).item() / 2
    assert contrastive == pytest.approx(0.5 * 0.3132617, rel=1e-6)
    assert m["flow_sar_contrastive"] == pytest.approx(contrastive, rel=1e-6)
    assert m["flow_sar_kl_penalty"] == pytest.approx(1.0)  # 0.5 * mean((v_theta - v_old)^2) = 0.5 * 2
    assert loss.item() == pytest.approx(contrastive + 1.0, rel=1e-6)
    assert "flow_sar_success_ratio" not in m


def test_flow_sar_sde_scales_energies_by_one_over_2t():
    _, mse = compute_flow_sar_loss(**flow_batch())
    loss, sde = compute_flow_sar_loss(**flow_batch(), energy_type="sde", flow_t=torch.tensor([[0.25], [0.5]]))
    assert sde["flow_sar_E_pos"] == pytest.approx((0.5 / 0.5 + 2.5 / 1.0) / 2)
    assert sde["flow_sar_E_neg"] == pytest.approx((2.5 / 0.5 + 0.5 / 1.0) / 2)
    assert loss.item() == pytest.approx((0.6 * 1.0 + 0.4 * 0.5) / 2)
    _, half = compute_flow_sar_loss(**flow_batch(), energy_type="sde", flow_t=torch.full((2,), 0.5))
    assert half["flow_sar_E_pos"] == pytest.approx(mse["flow_sar_E_pos"])  # 2t = 1: unchanged
    with pytest.raises(ValueError, match="flow_t"):
        compute_flow_sar_loss(**flow_batch(), energy_type="sde")
    with pytest.raises(ValueError, match="flow_t must be > 0"):
        compute_flow_sar_loss(**flow_batch(), energy_type="sde", flow_t=torch.zeros(2))


@pytest.mark.parametrize("variant", ["mse_branch", "softplus_kl"])
@pytest.mark.parametrize("energy", ["mse", "sde"])
def test_flow_sar_gradient_moves_success_toward_target_and_failure_away(variant, energy):
    gen = torch.Generator().manual_seed(0)
    v_old = torch.randn(4, 8, 7, generator=gen)
    u = torch.randn(4, 8, 7, generator=gen)
    labels = torch.tensor([1.0, -1.0, 1.0, -1.0])
    v_theta = v_old.clone().requires_grad_(True)  # the usual start: current policy = reference
    loss, _ = compute_flow_sar_loss(v_theta, v_old, u, torch.full((4,), 0.25), labels, beta=1.0, energy_type=energy,
                                    loss_variant=variant, kl_coeff=1.0, flow_t=torch.tensor([0.2, 0.4, 0.6, 0.8]))
    loss.backward()
    stepped = v_old - 0.01 * v_theta.grad
    before = (v_old - u).square().flatten(1).sum(-1)
    after = (stepped - u).square().flatten(1).sum(-1)
    assert (after[labels > 0] < before[labels > 0]).all()  # success: toward u
    assert (after[labels < 0] > before[labels < 0]).all()  # failure: away from u


def test_flow_sar_errors():
    with pytest.raises(ValueError, match="loss_variant"):
        compute_flow_sar_loss(**flow_batch(), loss_variant="nft")
    with pytest.raises(ValueError, match="energy_type"):
        compute_flow_sar_loss(**flow_batch(), energy_type="l1")
    batch = flow_batch()
    batch["labels"] = torch.tensor([1.0, 0.0])
    with pytest.raises(ValueError, match=r"\{-1, \+1\}"):
        compute_flow_sar_loss(**batch)
    batch = flow_batch()
    batch["u_target"] = torch.zeros(2, 1, 3)
    with pytest.raises(ValueError, match=r"u_target \(2, 1, 3\)"):
        compute_flow_sar_loss(**batch)
    batch = flow_batch()
    batch["weights"], batch["labels"] = torch.ones(3), torch.ones(3)
    with pytest.raises(ValueError, match=r"weights.shape \(3,\)"):
        compute_flow_sar_loss(**batch)
