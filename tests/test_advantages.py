"""Hand-computed checks of common/advantages.py: GRPO family (siiRL's SRPO, verl's Advanced
GRPO, LUFFY), GAE (the GAE-PPO reference); and FlowSAR's weights (train_flowsar.py)."""
import math

import numpy as np
import pytest
import torch

from common.advantages import (compute_advanced_grpo_outcome_advantage, compute_advantage, compute_gae,
                               compute_grpo_outcome_advantage, compute_grpo_outcome_advantage_split,
                               compute_step_grpo_advantage, episode_to_token_rewards, make_response_mask)
from common.masking import masked_mean, masked_sum
from train_flowsar import compute_flow_sar_weights

torch.set_num_threads(1)
SQRT3 = math.sqrt(3.0)


def token_rewards(scores, length=4):
    """(B, L) rewards with each score on the row's last token."""
    out = torch.zeros(len(scores), length)
    out[:, -1] = torch.tensor(scores, dtype=torch.float32)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------------
def test_masked_mean_and_sum_hand_values():
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    assert masked_sum(x, m).item() == 7.0  # NaN / inf under mask 0 are ignored
    assert masked_mean(x, m).item() == pytest.approx(7.0 / 3.0)
    assert masked_mean(x, m, dim=-1).tolist() == [1.5, 4.0]
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # empty mask -> 0, not NaN
    assert masked_mean(x, m & torch.tensor([[True] * 3, [False] * 3]), dim=-1).tolist() == [1.5, 0.0]
    w = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(x, w).item() == pytest.approx(1.5)  # float weights: sum(x w) / sum(w)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        masked_mean(x, torch.ones(3, 2))


def test_make_response_mask_is_finish_step_mask():
    m = make_response_mask(torch.tensor([0, 2, 3]), num_steps=3, tokens_per_step=2)
    assert m.dtype == torch.bool and m.shape == (3, 6)
    assert m.int().tolist() == [[0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]
    assert make_response_mask([], 3, 2).shape == (0, 6)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        make_response_mask([4], 3, 2)
    with pytest.raises(ValueError, match="1-D"):
        make_response_mask([[1]], 3, 2)


# ---------------------------------------------------------------------------------------------------------------------
# GRPO (naive, siiRL's SRPO)
# ---------------------------------------------------------------------------------------------------------------------
def test_grpo_hand_values_unbiased_std_and_singleton():
    rewards = token_rewards([1.0, 0.0, 0.0, 1.0])
    mask = torch.ones(4, 4)
    adv, ret = compute_grpo_outcome_advantage(rewards, mask, ["a", "a", "a", "b"])
    # group a: mean 1/3, unbiased std sqrt(1/3); group b (one row): mean 0, std 1
    std = math.sqrt(1.0 / 3.0)
    expected = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 1.0 / (1.0 + 1e-6)]
    assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
    assert torch.equal(adv, ret) and torch.equal(adv, adv[:, :1].expand(4, 4))
    assert adv[0, 0].item() == pytest.approx(1.1547, abs=1e-4)


def test_grpo_dr_grpo_mask_zero_std_and_index_types():
    rewards = token_rewards([1.0, 0.0, 0.0, 2.0, 2.0])
    mask = torch.tensor([[1, 1, 0, 0]] * 4 + [[0, 0, 0, 0]])
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([0, 0, 0, 1, 1]), norm_adv_by_std_in_grpo=False)
    assert adv[:, 0].tolist() == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0])  # zero-std group -> 0
    assert adv[:, 2:].abs().sum() == 0 and adv[4].abs().sum() == 0  # masked tokens and an all-masked row
    adv_t, _ = compute_grpo_outcome_advantage(rewards, mask, torch.tensor([0, 0, 0, 1, 1]))
    adv_n, _ = compute_grpo_outcome_advantage(rewards, mask, np.array([0, 0, 0, 1, 1]))
    assert torch.equal(adv_t, adv_n) and not torch.isnan(adv_t).any()


def test_grpo_empty_batch_and_shape_errors():
    adv, _ = compute_grpo_outcome_advantage(torch.zeros(0, 5), torch.zeros(0, 5), [])
    assert adv.shape == (0, 5)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(2, 4\)"):
        compute_grpo_outcome_advantage(torch.zeros(2, 3), torch.zeros(2, 4), [0, 0])
    with pytest.raises(ValueError, match="index has 3 entries but the batch has 2"):
        compute_grpo_outcome_advantage(torch.zeros(2, 3), torch.zeros(2, 3), [0, 0, 1])


# ---------------------------------------------------------------------------------------------------------------------
# step GRPO and Advanced GRPO (verl's Advanced GRPO)
# ---------------------------------------------------------------------------------------------------------------------
def test_advanced_grpo_worked_example_step_naive_and_advanced():
    # episode 1 reward 1.0, episode 2 reward 2.0, each 3 steps x 10 tokens
    mask = make_response_mask(torch.tensor([3, 3]), num_steps=3, tokens_per_step=10)
    rewards = torch.tensor([1.0, 2.0])
    adv, _ = compute_advanced_grpo_outcome_advantage(rewards, mask, [0, 0])
    assert adv[0].tolist() == pytest.approx([-1.0] * 30, abs=1e-5)
    assert adv[1].tolist() == pytest.approx([1.0] * 30, abs=1e-5)
    step, _ = compute_step_grpo_advantage(episode_to_token_rewards(rewards, mask), mask, [0, 0], torch.ones(2, 3))
    assert torch.allclose(step, adv, atol=1e-6)  # step mean 1.5, std 0.5 -> +-1.0
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-4)


def test_advanced_grpo_zero_sum_with_unequal_lengths():
    # rewards 1 (2 tokens) and 0 (6 tokens): mu = 0.25, sigma = sqrt(0.1875) -> +sqrt(3), -1/sqrt(3)
    mask = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    adv, _ = compute_advanced_grpo_outcome_advantage(torch.tensor([1.0, 0.0]), mask, [7, 7])
    assert adv[0].tolist() == pytest.approx([SQRT3, SQRT3, 0, 0, 0, 0], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([-1 / SQRT3] * 6, rel=1e-5)
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-5)
    naive, _ = compute_grpo_outcome_advantage(episode_to_token_rewards(torch.tensor([1.0, 0.0]), mask), mask, [7, 7])
    assert abs(naive.sum().item()) > 1.0  # naive GRPO loses the zero sum when lengths differ
    dr, _ = compute_advanced_grpo_outcome_advantage(torch.tensor([1.0, 0.0]), mask, [7, 7],
                                                    norm_adv_by_std_in_grpo=False)
    assert dr[:, 0].tolist() == pytest.approx([0.75, -0.25])


def test_advanced_grpo_zero_sum_random_groups_singletons_and_empty():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 9, (12,), generator=gen)
    lengths[5] = 0  # an all-masked row
    mask = make_response_mask(lengths, num_steps=8, tokens_per_step=3)
    rewards = torch.rand(12, generator=gen)
    index = [0, 0, 0, 0, 1, 1, 1, 1, 2, 3, 3, 3]  # group 2 is a singleton
    adv, _ = compute_advanced_grpo_outcome_advantage(rewards, mask, index)
    assert not torch.isnan(adv).any() and adv[5].abs().sum() == 0
    for g in set(index):
        rows = torch.tensor([i == g for i in index])
        assert adv[rows].sum().item() == pytest.approx(0.0, abs=1e-4)
    assert adv[8].abs().max() == 0  # a singleton group: reward equals its own mean -> 0
    empty, _ = compute_advanced_grpo_outcome_advantage(torch.zeros(0), torch.zeros(0, 6), [])
    assert empty.shape == (0, 6)
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 6\)"):
        compute_advanced_grpo_outcome_advantage(torch.zeros(3), torch.zeros(2, 6), [0, 0, 0])


def test_step_grpo_unequal_lengths_weights_longer_episodes():
    # E1 reward 1 with 1 valid step, E2 reward 2 with 3 steps: step mean 1.75, population std sqrt(0.1875)
    step_mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    mask = step_mask.repeat_interleave(2, dim=1)
    rewards = episode_to_token_rewards(torch.tensor([1.0, 2.0]), mask)
    adv, _ = compute_step_grpo_advantage(rewards, mask, ["g", "g"], step_mask)
    assert adv[0].tolist() == pytest.approx([-SQRT3, -SQRT3, 0, 0, 0, 0], rel=1e-5)
    assert adv[1].tolist() == pytest.approx([1 / SQRT3] * 6, rel=1e-5)
    assert (adv[:, ::2] * step_mask).sum().item() == pytest.approx(0.0, abs=1e-5)  # steps sum to 0
    dr, _ = compute_step_grpo_advantage(rewards, mask, ["g", "g"], step_mask, norm_adv_by_std_in_grpo=False)
    assert dr[:, 0].tolist() == pytest.approx([-0.75, 0.25])
    single, _ = compute_step_grpo_advantage(rewards[:1], mask[:1], ["s"], step_mask[:1])
    assert single.abs().max() == 0 and not torch.isnan(single).any()
    none, _ = compute_step_grpo_advantage(rewards, torch.zeros_like(mask), ["g", "g"], torch.zeros_like(step_mask))
    assert none.abs().max() == 0 and not torch.isnan(none).any()
    with pytest.raises(ValueError, match=r"step_mask \(2, 4\)"):
        compute_step_grpo_advantage(rewards, mask, ["g", "g"], torch.ones(2, 4))


# ---------------------------------------------------------------------------------------------------------------------
# LUFFY split GRPO
# ---------------------------------------------------------------------------------------------------------------------
def test_split_baseline_uses_on_policy_rows_only():
    scores = [1.0, 0.0, 1.0, 1.0]  # rows 0-2 on-policy, row 3 off-policy (expert)
    on_policy = torch.tensor([True, True, True, False])
    adv, ret = compute_grpo_outcome_advantage_split(token_rewards(scores), torch.ones(4, 4), [0, 0, 0, 0], on_policy)
    std = math.sqrt(1 / 3)  # on-policy mean 2/3, unbiased std sqrt(1/3)
    expected = [(1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6)]
    assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-5) and torch.equal(adv, ret)
    other, _ = compute_grpo_outcome_advantage_split(token_rewards([1.0, 0.0, 1.0, -5.0]), torch.ones(4, 4),
                                                     [0, 0, 0, 0], on_policy)
    assert torch.equal(other[:3], adv[:3])  # the off-policy row's score does not move the baseline
    assert other[3, 0].item() == pytest.approx((-5 - 2 / 3) / (std + 1e-6), rel=1e-5)


def test_split_singleton_zero_std_no_on_policy_and_no_std():
    scores = [0.5, 1.0, 1.0, 1.0, 0.0, 2.0, 3.0]
    on_policy = torch.tensor([True, False, True, True, False, False, False])
    index = ["s", "s", "z", "z", "z", "n", "n"]  # s: one on-policy row; z: on-policy std 0; n: none on-policy
    mask = torch.ones(7, 4)
    adv, _ = compute_grpo_outcome_advantage_split(token_rewards(scores), mask, index, on_policy)
    expected = [0.5 / (1 + 1e-6), 1.0 / (1 + 1e-6), 0.0, 0.0, -1.0 / (1 + 1e-6), 2 / (1 + 1e-6), 3 / (1 + 1e-6)]
    assert adv[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
    no_std, _ = compute_grpo_outcome_advantage_split(token_rewards(scores), mask, index, on_policy, use_std=False)
    assert no_std[:, 0].tolist() == pytest.approx([0.5, 1.0, 0.0, 0.0, -1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"on_policy_mask must be \(7,\), got \(6,\)"):
        compute_grpo_outcome_advantage_split(token_rewards(scores), mask, index, on_policy[:6])


# ---------------------------------------------------------------------------------------------------------------------
# the adapter the scripts call
# ---------------------------------------------------------------------------------------------------------------------
def test_compute_advantage_adapter_routes_every_grpo_name():
    mask = make_response_mask(torch.tensor([1, 3, 2, 0]), num_steps=3, tokens_per_step=2)
    step_mask = make_response_mask(torch.tensor([1, 3, 2, 0]), num_steps=3, tokens_per_step=1)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0])
    tlr = episode_to_token_rewards(rewards, mask)
    assert tlr.tolist()[0] == [0, 1.0, 0, 0, 0, 0] and tlr.tolist()[2] == [0, 0, 0, 0.5, 0, 0]
    assert tlr.sum(-1).tolist() == rewards.tolist()  # an all-masked row still carries its score (token 0)
    index = [0, 0, 0, 0]
    torch.testing.assert_close(compute_advantage("grpo", rewards, mask, index)[0],
                               compute_grpo_outcome_advantage(tlr, mask, index)[0])
    torch.testing.assert_close(compute_advantage("step_grpo", rewards, mask, index, step_mask=step_mask)[0],
                               compute_step_grpo_advantage(tlr, mask, index, step_mask)[0])
    torch.testing.assert_close(compute_advantage("advanced_grpo", rewards, mask, index, epsilon=1e-3)[0],
                               compute_advanced_grpo_outcome_advantage(rewards, mask, index, epsilon=1e-3)[0])
    on = torch.tensor([True, True, True, False])
    torch.testing.assert_close(
        compute_advantage("grpo_split", rewards, mask, index, on_policy_mask=on, norm_adv_by_std_in_grpo=False)[0],
        compute_grpo_outcome_advantage_split(tlr, mask, index, on, use_std=False)[0])
    with pytest.raises(ValueError, match="step_mask"):
        compute_advantage("step_grpo", rewards, mask, index)
    with pytest.raises(ValueError, match="on_policy_mask"):
        compute_advantage("grpo_split", rewards, mask, index)
    with pytest.raises(ValueError, match="compute_gae"):
        compute_advantage("gae", rewards, mask, index)
    with pytest.raises(ValueError, match="unknown adv_estimator 'ppo'"):
        compute_advantage("ppo", rewards, mask, index)


# ---------------------------------------------------------------------------------------------------------------------
# GAE: the ten properties of the GAE-PPO reference
# ---------------------------------------------------------------------------------------------------------------------
def test_gae_1_output_shapes():
    for n in (1, 7):
        for x in (np.zeros(n), torch.zeros(n), np.zeros((3, n)), torch.zeros(3, n)):
            adv, ret = compute_gae(x, x, x)
            assert type(adv) is type(x) and type(ret) is type(x)
            assert tuple(adv.shape) == tuple(x.shape) == tuple(ret.shape)
    adv, ret = compute_gae(np.zeros(0), np.zeros(0), np.zeros(0))
    assert adv.shape == (0,) and ret.shape == (0,)


def test_gae_2_simple_trajectory_hand_values():
    r, v, d = np.array([0.0, 0.0, 1.0]), np.array([0.5, 0.4, 0.3]), np.array([False, False, True])
    adv, ret = compute_gae(r, v, d, gamma=0.9, gae_lambda=0.8, normalize_advantages=False)
    # t2: 1 - 0.3 = 0.7; t1: -0.13 + 0.72*0.7 = 0.374; t0: -0.14 + 0.72*0.374 = 0.12928
    assert adv.tolist() == pytest.approx([0.12928, 0.374, 0.7])
    assert ret.tolist() == pytest.approx([0.62928, 0.774, 1.0])
    boot, _ = compute_gae(np.array([1.0]), np.array([0.5]), np.array([0.0]), gamma=0.9, normalize_advantages=False,
                          last_value=2.0)
    assert boot.tolist() == pytest.approx([1.0 + 0.9 * 2.0 - 0.5])  # V_T = last_value bootstraps an unfinished run
    seed_adv, _ = compute_gae(np.array([0.0, 0, 0, 1]), np.array([0.5, 0.6, 0.7, 0.8]), np.array([0, 0, 0, 1]),
                              normalize_advantages=False)
    assert (seed_adv > 0).all()  # the reference's manual example: reward above the values -> positive advantages


def test_gae_3_normalisation():
    gen = np.random.default_rng(0)
    adv, _ = compute_gae(gen.normal(size=50), gen.normal(size=50), gen.random(50) < 0.1)
    assert adv.mean() == pytest.approx(0.0, abs=1e-9) and adv.std() == pytest.approx(1.0, abs=1e-6)
    one, _ = compute_gae(np.array([3.0]), np.array([1.0]), np.array([True]))
    assert one.tolist() == [0.0]  # a single value normalises to 0, not NaN


def test_gae_4_episode_boundaries_reset():
    r, v, d = np.array([1.0, 0.0, 1.0, 0.0]), np.full(4, 0.5), np.array([0, 1, 0, 1])
    adv, _ = compute_gae(r, v, d, gamma=0.9, gae_lambda=0.8, normalize_advantages=False)
    assert adv.tolist() == pytest.approx([0.59, -0.5, 0.59, -0.5])
    first, _ = compute_gae(r[:2], v[:2], d[:2], gamma=0.9, gae_lambda=0.8, normalize_advantages=False)
    assert adv[:2].tolist() == pytest.approx(first.tolist())  # nothing leaks across done=True


def test_gae_5_all_zero_rewards_give_negative_advantages():
    adv, ret = compute_gae(np.zeros(6), np.full(6, 0.5), np.array([0, 0, 0, 0, 0, 1]), normalize_advantages=False)
    assert (adv < 0).all()
    # t5: 0 - 0.5; t4: (0.99 * 0.5 - 0.5) + 0.99 * 0.95 * (-0.5) = -0.005 - 0.47025
    assert adv[-2:].tolist() == pytest.approx([-0.47525, -0.5])
    assert (ret < 0.5).all()  # every return is below the value estimate


def test_gae_6_nan_and_inf_are_replaced_by_zero():
    r = np.array([np.nan, 0.0, 1.0, np.inf])
    v = np.array([0.5, -np.inf, 0.2, 0.1])
    d = np.array([0, 0, 0, 1])
    adv, ret = compute_gae(r, v, d, normalize_advantages=True)
    clean_adv, clean_ret = compute_gae(np.array([0, 0, 1.0, 0]), np.array([0.5, 0, 0.2, 0.1]), d)
    assert np.isfinite(adv).all() and np.isfinite(ret).all()
    np.testing.assert_allclose(adv, clean_adv)
    np.testing.assert_allclose(ret, clean_ret)


def test_gae_7_batch_matches_rows_and_normalises_globally():
    gen = np.random.default_rng(1)
    r, v, d = gen.normal(size=(3, 5)), gen.normal(size=(3, 5)), gen.random((3, 5)) < 0.3
    last = np.array([0.1, -0.2, 0.3])
    adv, ret = compute_gae(r, v, d, normalize_advantages=False, last_value=last)
    for i in range(3):
        row_adv, row_ret = compute_gae(r[i], v[i], d[i], normalize_advantages=False, last_value=last[i])
        np.testing.assert_allclose(adv[i], row_adv)
        np.testing.assert_allclose(ret[i], row_ret)
    norm, _ = compute_gae(r, v, d, last_value=last)
    np.testing.assert_allclose(norm, (adv - adv.mean()) / (adv.std() + 1e-8))
    with pytest.raises(ValueError, match="last_value"):
        compute_gae(r, v, d, last_value=np.zeros(2))


def test_gae_8_torch_cpu():
    r = torch.tensor([0.0, 0.0, 1.0])
    v = torch.tensor([0.5, 0.4, 0.3], requires_grad=True)
    adv, ret = compute_gae(r, v, torch.tensor([False, False, True]), gamma=0.9, gae_lambda=0.8,
                           normalize_advantages=False)
    assert isinstance(adv, torch.Tensor) and adv.dtype == torch.float32 and adv.device.type == "cpu"
    assert not adv.requires_grad and not ret.requires_grad  # targets, never part of the graph
    assert adv.tolist() == pytest.approx([0.12928, 0.374, 0.7], rel=1e-5)


def test_gae_9_numpy_and_torch_agree():
    gen = np.random.default_rng(2)
    r, v, d = gen.normal(size=(4, 9)), gen.normal(size=(4, 9)), gen.random((4, 9)) < 0.2
    for normalize in (False, True):
        adv_n, ret_n = compute_gae(r, v, d, normalize_advantages=normalize, last_value=0.3)
        adv_t, ret_t = compute_gae(torch.from_numpy(r), torch.from_numpy(v), torch.from_numpy(d),
                                   normalize_advantages=normalize, last_value=0.3)
        np.testing.assert_allclose(adv_t.numpy(), adv_n, rtol=1e-12)
        np.testing.assert_allclose(ret_t.numpy(), ret_n, rtol=1e-12)
    adv32, _ = compute_gae(r.astype(np.float32), v.astype(np.float32), d)
    assert adv32.dtype == np.float32


def test_gae_10_returns_equal_advantages_plus_values():
    gen = np.random.default_rng(3)
    r, v, d = gen.normal(size=20), gen.normal(size=20), gen.random(20) < 0.2
    adv, ret = compute_gae(r, v, d, normalize_advantages=False)
    np.testing.assert_allclose(ret, adv + v)
    _, ret_norm = compute_gae(r, v, d, normalize_advantages=True)
    np.testing.assert_allclose(ret_norm, adv + v)  # returns are taken before normalisation
    with pytest.raises(ValueError, match=r"rewards \(20,\), values \(19,\)"):
        compute_gae(r, v[:19], d)


# ---------------------------------------------------------------------------------------------------------------------
# FlowSAR weights (RLinf's FlowSAR §2.1)
# ---------------------------------------------------------------------------------------------------------------------
def softmax(x):
    e = np.exp(np.asarray(x) - np.max(x))
    return e / e.sum()


def test_flow_sar_weights_success_and_failure_softmax():
    errors = torch.tensor([[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]])
    w, labels = compute_flow_sar_weights(errors, torch.tensor([1.0, 0.0]), temperature=0.5, w_min=0.0, w_max=1.0)
    assert w[:, 0].tolist() == pytest.approx([0.0900306, 0.2447285, 0.6652410], rel=1e-5)  # softmax(e / T)
    assert w[:, 1].tolist() == pytest.approx([0.6652410, 0.2447285, 0.0900306], rel=1e-5)  # softmax(-e / T)
    assert labels.tolist() == [1.0, -1.0]
    assert w.sum(0).tolist() == pytest.approx([1.0, 1.0])


def test_flow_sar_weights_clip_renormalise_and_masked_steps():
    errors = torch.tensor([[0.0, 0.0, 3.0], [0.5, 0.5, 1.0], [1.0, 1.0, 2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    w, _ = compute_flow_sar_weights(errors, torch.tensor([1, 1, 0]), temperature=0.5, w_min=0.05, w_max=0.5,
                                    step_mask=mask)
    clipped = np.clip(softmax([0.0, 1.0, 2.0]), 0.05, 0.5)
    assert w[:, 0].tolist() == pytest.approx((clipped / clipped.sum()).tolist(), rel=1e-5)  # [0.1079, 0.2932, 0.5990]
    assert w[:, 0].tolist() == pytest.approx([0.107851, 0.293171, 0.598978], rel=1e-4)
    two = np.clip(softmax([0.0, 1.0]), 0.05, 0.5)
    assert w[:, 1].tolist() == pytest.approx([*(two / two.sum()), 0.0], rel=1e-5)  # masked step -> 0
    assert w[:, 2].tolist() == [0.0, 0.0, 0.0] and not torch.isnan(w).any()  # no valid step at all
    assert w.sum(0).tolist() == pytest.approx([1.0, 1.0, 0.0])
    one, _ = compute_flow_sar_weights(torch.tensor([[2.0]]), torch.tensor([1]))
    assert one.tolist() == [[1.0]]  # clip to 0.5 then renormalise -> 1
    no_clip_masked, _ = compute_flow_sar_weights(errors, torch.tensor([1, 1, 0]), 0.5, 0.0, 1.0, step_mask=mask)
    assert no_clip_masked.sum(0).tolist() == pytest.approx([1.0, 1.0, 0.0])


def test_flow_sar_weights_errors():
    with pytest.raises(ValueError, match=r"\(3, 2\).*\(3,\)"):
        compute_flow_sar_weights(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"\{0, 1\}"):
        compute_flow_sar_weights(torch.zeros(3, 2), torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match="temperature"):
        compute_flow_sar_weights(torch.zeros(3, 2), torch.zeros(2), temperature=0.0)
    with pytest.raises(ValueError, match="w_min"):
        compute_flow_sar_weights(torch.zeros(3, 2), torch.zeros(2), w_min=0.6, w_max=0.5)
    with pytest.raises(ValueError, match=r"recon_errors \(3, 2\), step_mask \(2, 3\)"):
        compute_flow_sar_weights(torch.zeros(3, 2), torch.zeros(2), step_mask=torch.ones(2, 3))
