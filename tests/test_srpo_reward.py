"""Hand-computed checks of SRPO's embodied reward (train_srpo.py) and the dynamic-sampling filter (common/dynamic_sampling.py;
siiRL)."""
import numpy as np
import pytest
import torch
from scipy.special import expit

from common.dynamic_sampling import filter_groups, filter_metrics, sample_rounds
from common.rollout import RolloutBatch
from train_srpo import compute_embodied_reward

torch.set_num_threads(1)


def failure_reward(d_norm):
    return 0.6 * expit(10.0 * (0.5 - np.asarray(d_norm, dtype=float)))


# ---------------------------------------------------------------------------------------------------------------------
# compute_embodied_reward
# ---------------------------------------------------------------------------------------------------------------------
def test_success_is_one_and_failures_shrink_with_distance_to_the_success_mean():
    # three successes too far apart (after scaling) to form a DBSCAN cluster -> centre = their mean (1.0333, 1.0333)
    succ = [[1.0, 1.0], [1.1, 1.0], [1.0, 1.1]]
    fails = [[2.0, 2.0], [3.0, 3.0], [5.0, 5.0], [4.0, 4.0]]
    rewards = compute_embodied_reward([True] * 3 + [False] * 4, np.array(succ + fails), ["t"] * 7)
    assert rewards[:3].tolist() == [1.0, 1.0, 1.0]
    centre = np.mean(succ, axis=0)
    d = np.linalg.norm(np.array(fails) - centre, axis=1)
    expected = failure_reward((d - d.min()) / (d.max() - d.min()))
    np.testing.assert_allclose(rewards[3:], expected, rtol=1e-12)
    assert rewards[3] == pytest.approx(0.6 * expit(5.0)) and rewards[5] == pytest.approx(0.6 * expit(-5.0))
    assert ((rewards[3:] > 0) & (rewards[3:] < 0.6)).all()
    assert rewards[3] > rewards[4] > rewards[6] > rewards[5]  # monotone: nearer to success -> more reward


def test_dbscan_clusters_are_used_and_beat_the_plain_mean():
    # two tight success clusters A ~ (0, 10), B ~ (10, 0); failure F3 sits at the mean of all successes
    succ = [[0.0, 10.0], [0.01, 10.0], [10.0, 0.0], [10.0, 0.01]]
    fails = [[1.0, 10.0], [10.0, 3.0], [5.0, 5.0]]
    rewards = compute_embodied_reward([1, 1, 1, 1, 0, 0, 0], np.array(succ + fails), ["t"] * 7)
    centres = np.array([[0.005, 10.0], [10.0, 0.005]])  # inverse-transformed mean of each scaled cluster
    d = np.min(np.linalg.norm(np.array(fails)[:, None] - centres[None], axis=2), axis=1)
    np.testing.assert_allclose(rewards[4:], failure_reward((d - d.min()) / (d.max() - d.min())), rtol=1e-9)
    assert rewards[4] > rewards[5] > rewards[6]  # with the plain mean F3 would have ranked first
    assert rewards[4] == pytest.approx(0.6 * expit(5.0), rel=1e-6)


def test_invalid_rows_tasks_without_success_and_single_failure():
    emb = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, 3.0],  # task a: zero-embedding success, success, failure
                    [2.0, 2.0], [4.0, 4.0],  # task b: failures only
                    [1.0, 2.0], [1.0, 2.5]])  # task c: successes only
    completes = [True, True, False, False, False, True, True]
    names = ["a", "a", "a", "b", "b", "c", "c"]
    rewards = compute_embodied_reward(completes, emb, names)
    assert rewards[0] == 0.0  # an all-zero embedding is invalid, even for a success
    assert rewards[1] == 1.0
    assert rewards[2] == pytest.approx(0.6 * expit(0.0))  # one failure: distance range 0 -> d_norm 0.5 -> 0.3
    assert rewards[3:5].tolist() == [0.0, 0.0]  # no success in the task -> failures get 0
    assert rewards[5:].tolist() == [1.0, 1.0]


def test_tasks_are_pooled_by_name_and_independent():
    emb = np.array([[1.0, 1.0], [2.0, 2.0], [9.0, 9.0],  # task a
                    [50.0, 50.0], [52.0, 50.0], [60.0, 50.0]])  # task b, far away
    names = ["a", "a", "a", "b", "b", "b"]
    completes = np.array([True, False, False, True, False, False])
    rewards = compute_embodied_reward(completes, emb, names)
    alone_a = compute_embodied_reward(completes[:3], emb[:3], names[:3])
    np.testing.assert_allclose(rewards[:3], alone_a)  # task b's successes do not move task a's rewards
    np.testing.assert_allclose(rewards[[1, 2, 4, 5]], failure_reward([0.0, 1.0, 0.0, 1.0]), rtol=1e-12)
    shuffled = compute_embodied_reward(completes[::-1], emb[::-1], names[::-1])
    np.testing.assert_allclose(shuffled[::-1], rewards)  # trials of a task are pooled wherever they sit


def test_single_success_fallback_and_parameters():
    emb = np.array([[1.0, 0.0], [1.0, 3.0], [1.0, 5.0]])  # one success cannot form a cluster (min_samples 2)
    rewards = compute_embodied_reward(torch.tensor([True, False, False]), torch.tensor(emb), ["t"] * 3)
    assert rewards.tolist() == pytest.approx([1.0, 0.6 * expit(5.0), 0.6 * expit(-5.0)])
    custom = compute_embodied_reward([1, 0, 0], emb, ["t"] * 3, sigmoid_steepness=2.0, sigmoid_offset=0.25,
                                     max_failure_reward=0.8)
    assert custom[1:].tolist() == pytest.approx([0.8 * expit(0.5), 0.8 * expit(-1.5)])


def test_embodied_reward_empty_and_shape_errors():
    assert compute_embodied_reward(np.zeros(0, bool), np.zeros((0, 4)), []).shape == (0,)
    with pytest.raises(ValueError, match=r"completes \(3,\), embeddings \(2, 4\), 3 task_names"):
        compute_embodied_reward([1, 0, 1], np.ones((2, 4)), ["a"] * 3)
    with pytest.raises(ValueError, match="2 task_names"):
        compute_embodied_reward([1, 0, 1], np.ones((3, 4)), ["a"] * 2)


# ---------------------------------------------------------------------------------------------------------------------
# filter_groups (siiRL _filter_batch)
# ---------------------------------------------------------------------------------------------------------------------
def groups_with_successes(counts, n):
    return torch.tensor([i < c for c in counts for i in range(n)])


def test_filter_accuracy_bounds_are_inclusive():
    success = groups_with_successes([0, 1, 5, 9, 10], n=10)  # accuracy 0, 0.1, 0.5, 0.9, 1.0
    keep = filter_groups(success, torch.zeros(50, dtype=torch.bool), n_samples=10)
    assert keep.dtype == torch.bool and keep.shape == (50,)
    assert keep.reshape(5, 10).all(dim=1).tolist() == [False, True, True, True, False]
    assert keep.reshape(5, 10).any(dim=1).tolist() == [False, True, True, True, False]  # whole groups only
    assert filter_groups(success, torch.zeros(50), 10, filter_accuracy=False).all()
    narrow = filter_groups(success, torch.zeros(50), 10, accuracy_lower_bound=0.5, accuracy_upper_bound=0.5)
    assert narrow.reshape(5, 10)[:, 0].tolist() == [False, False, True, False, False]


def test_filter_truncation_drops_a_group_if_any_sample_was_truncated():
    success = np.array([1, 0, 1, 0, 1, 0], dtype=bool)
    truncated = np.array([0, 1, 0, 0, 0, 0], dtype=bool)  # group 0 has a truncated sample (RolloutBatch.truncated)
    keep = filter_groups(success, truncated, n_samples=2, filter_truncated=True)
    assert keep.tolist() == [False, False, True, True, True, True]
    assert filter_groups(success, truncated, 2, filter_truncated=False).all()
    only_trunc = filter_groups(np.zeros(6, bool), truncated, 2, filter_accuracy=False, filter_truncated=True)
    assert only_trunc.tolist() == [False, False, True, True, True, True]


def test_filter_empty_results_and_errors():
    all_fail = filter_groups(torch.zeros(8, dtype=torch.bool), torch.zeros(8), n_samples=4)
    assert all_fail.tolist() == [False] * 8  # an empty result is a normal outcome
    assert filter_groups(torch.zeros(0, dtype=torch.bool), torch.zeros(0), 4).shape == (0,)
    with pytest.raises(ValueError, match=r"multiple of n_samples=4.*success \(6,\)"):
        filter_groups(torch.zeros(6, dtype=torch.bool), torch.zeros(6), 4)
    with pytest.raises(ValueError, match=r"truncated \(7,\)"):
        filter_groups(torch.zeros(8, dtype=torch.bool), torch.zeros(7), 4)
    with pytest.raises(ValueError, match="n_samples must be >= 1"):
        filter_groups(torch.zeros(8, dtype=torch.bool), torch.zeros(8), 0)
    with pytest.raises(ValueError, match="accuracy_lower_bound"):
        filter_groups(torch.zeros(8, dtype=torch.bool), torch.zeros(8), 4, accuracy_lower_bound=0.9,
                      accuracy_upper_bound=0.1)


def test_filter_metrics_counts():
    success = groups_with_successes([0, 2, 4], n=4)
    keep = filter_groups(success, torch.zeros(12), 4)
    m = filter_metrics(success, keep, 4)
    assert m == {"sampling/groups": 3.0, "sampling/kept_groups": 1.0, "sampling/kept_fraction": pytest.approx(1 / 3),
                 "sampling/all_success_groups": 1.0, "sampling/all_failure_groups": 1.0,
                 "sampling/success_rate": 0.5}
    empty = filter_metrics(torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.bool), 4)
    assert empty["sampling/kept_fraction"] == 0.0 and empty["sampling/success_rate"] == 0.0


def _round_batch(complete, truncated, invalid, steps=10):
    B = len(complete)
    return RolloutBatch(task_ids=np.zeros(B, np.int64), trial_ids=np.arange(B), group_ids=np.arange(B) // 2,
                        task_names=["t"] * B, instructions=["i"] * B, complete=np.array(complete, bool),
                        finish_step=np.full(B, steps), valid_steps=np.ones(B, np.int64), invalid=np.array(invalid, bool),
                        actions=np.zeros((B, 1, 1, 7), np.float32), rewards=np.zeros((B, 1), np.float32),
                        dones=np.ones((B, 1), bool), truncated=np.array(truncated, bool),
                        stats={"rollout/env_steps": float(B * steps)})


class _OneProcess:  # the run's collective surface, one process
    world, rank, stopped = 1, 0, False

    def __init__(self, stop_at=None):
        self.counted, self.stop_at = [], stop_at

    def gather(self, items):
        return list(items)

    def count_env_steps(self, batch, metrics, seconds):
        self.counted.append(len(batch))
        metrics["rollout/env_steps"] = batch.stats["rollout/env_steps"]

    def should_stop(self):
        self.stopped = len(self.counted) == self.stop_at
        return self.stopped


def test_sample_rounds_refills_until_the_quota_with_offset_groups():
    """Rounds of 2 groups x 2 samples, quota 2 groups: round 0 keeps group 1 (group 0 all solved), round 1 keeps
    nothing (group 0 truncated, group 1's episodes crashed), round 2 keeps both: 3 rounds, group ids offset by the
    round (x quota), crashed episodes dropped from the kept rows and from the keep mask."""
    rounds = [_round_batch([1, 1, 0, 1], [0, 0, 0, 0], [0, 0, 0, 0]),
              _round_batch([0, 1, 0, 1], [1, 0, 0, 0], [0, 0, 1, 1]),
              _round_batch([0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0])]
    run = _OneProcess()
    out = sample_rounds(run, lambda r: (rounds[r], rounds[r]), 2, 2, 5, True, filter_truncated=True,
                        accuracy_lower_bound=0.5, accuracy_upper_bound=0.5)
    assert out.rounds == 3 and run.counted == [4, 4, 4] and out.env_steps == 120.0
    assert [k.tolist() for _, k in out.seen] == [[False, False, True, True], [False] * 4, [True] * 4]
    assert [b.group_ids.tolist() for b in out.kept] == [[1, 1], [], [4, 4, 5, 5]]
    assert out.group_rounds == [0, 2, 2] and out.metrics == {"rollout/env_steps": 40.0}
    one = sample_rounds(_OneProcess(), lambda r: (rounds[r], rounds[r]), 2, 2, 5, False)  # no refill: one round
    assert one.rounds == 1 and [b.group_ids.tolist() for b in one.kept] == [[1, 1]]
    stopped = sample_rounds(_OneProcess(stop_at=2), lambda r: (_round_batch([0, 1] * 2, [0] * 4, [0] * 4),) * 2, 2,
                            2, 5, True, filter_accuracy=False)
    assert stopped.rounds == 1 and len(stopped.kept) == 1  # the round stopped in is counted, not filtered

