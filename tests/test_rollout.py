"""Rollout collection: shapes, masks, finish steps and success agree with the env, GRPO group ids."""
import numpy as np
import pytest
import torch

from envs import EnvConfig
from common.rollout import collect_rollouts, flatten_steps, make_prompts, success_by_task
from envs import make_vector_env
from models import TokenPolicy, TokenPolicyConfig


class ExpertPolicy:
    """The scripted expert behind the policy API (chunk of 1, so it reacts every step); for testing rollouts."""

    action_chunk = 1

    def __init__(self, env, fail_tasks=()):
        self.env, self.fail_tasks = env, set(fail_tasks)
        self.calls = []

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False):
        active = ~self.env.core.done
        a = self.env.expert_action()[active]
        for r, t in enumerate(self.env.core.task_id[active]):
            if int(t) in self.fail_tasks:
                a[r] = 0.0  # stand still: never succeeds, runs to max_steps
        self.calls.append(len(instructions))
        b = len(instructions)
        assert a.shape[0] == b and obs["agentview"].shape[0] == b
        return a[:, None, :], torch.zeros(b, 7, dtype=torch.long), torch.zeros(b, 7)


def test_make_prompts_repeats_groups():
    rows = make_prompts([3, 5], [7, 9], 3)
    assert rows.tolist() == [[3, 7, 0]] * 3 + [[5, 9, 1]] * 3
    with pytest.raises(ValueError, match="same length"):
        make_prompts([1], [1, 2], 2)


def test_expert_rollout_finish_steps_and_success_agree_with_env():
    env = make_vector_env(EnvConfig(num_envs=6, max_steps=40), seed=0)
    policy = ExpertPolicy(env, fail_tasks={1})
    batch = collect_rollouts(env, policy, [0, 1, 4], [0, 1, 2], n_samples=2, keep_frames=True, progress=False)
    assert batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert batch.task_ids.tolist() == [0, 0, 1, 1, 4, 4]
    assert batch.complete.tolist() == [True, True, False, False, True, True]
    np.testing.assert_array_equal(batch.finish_step, env.core.steps)  # env steps the env itself counted
    assert (batch.finish_step[[2, 3]] == 40).all() and (batch.finish_step[[0, 1, 4, 5]] < 40).all()
    np.testing.assert_array_equal(batch.valid_steps, batch.finish_step)  # chunk of 1
    # envs finish at different steps: the active batch shrinks and masks follow
    assert policy.calls[0] == 6 and policy.calls[-1] == 2
    T = batch.num_steps
    assert T == 40 and batch.actions.shape == (6, T, 1, 7) and batch.obs["agentview"].shape == (6, T, 64, 64, 3)
    assert batch.obs["agentview"].dtype == np.uint8
    mask = batch.step_mask
    assert mask.sum(1).tolist() == batch.valid_steps.tolist()
    assert (batch.actions[~mask] == 0).all()
    # reward 1 on the last policy step of each success, dones exactly there
    for b in range(6):
        last = batch.valid_steps[b] - 1
        assert batch.dones[b, last] and batch.dones[b].sum() == 1
        assert batch.rewards[b].sum() == float(batch.complete[b]) and batch.rewards[b, last] == float(batch.complete[b])
        assert len(batch.frames[b]) == batch.finish_step[b] + 1  # the first frame plus one per env step
    assert success_by_task(batch) == {0: 1.0, 1: 0.0, 4: 1.0}
    sub = batch.select(batch.complete)
    assert len(sub) == 4 and sub.task_ids.tolist() == [0, 0, 4, 4] and len(sub.frames) == 4


def test_token_policy_rollout_chunks_and_partial_last_block():
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig()).eval()
    env = make_vector_env(EnvConfig(num_envs=4, max_steps=20), seed=0)
    batch = collect_rollouts(env, policy, [0, 2, 3], [0, 0, 0], n_samples=2, progress=False)  # 6 episodes, 4 envs
    assert len(batch) == 6 and batch.group_ids.tolist() == [0, 0, 1, 1, 2, 2]
    assert (batch.finish_step == 20).all() and (batch.valid_steps == 3).all()  # ceil(20 / 8)
    assert batch.tokens.shape == (6, 3, 56) and batch.old_log_probs.shape == (6, 3, 56)
    assert (batch.old_log_probs <= 0).all() and batch.old_log_probs.min() < 0
    # the logged tokens decode to the executed actions
    decoded = policy.action_tokenizer.decode(torch.as_tensor(batch.tokens[0, 0]).view(8, 7))
    np.testing.assert_allclose(np.asarray(decoded), batch.actions[0, 0], atol=1e-6)
    assert batch.stats["rollout/env_steps"] == 120


def test_rollout_log_probs_are_the_old_log_probs():
    """train_srpo.py uses the rollout's log-probs as PPO's old log-probs (train.recompute_old_log_prob=false): they come
    from the same module and weights, so a separate forward over the stored steps (batched differently) gives the same
    values up to float rounding, as does the update's own forward over shuffled micro-batches."""
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig()).eval()
    env = make_vector_env(EnvConfig(num_envs=4, max_steps=24), seed=0)
    batch = collect_rollouts(env, policy, [0, 4], [0, 1], n_samples=3, temperature=1.3, progress=False)
    steps = flatten_steps(batch)
    assert len(steps) == 18  # 6 episodes x ceil(24 / 8) policy steps
    for order in (np.arange(len(steps)), np.random.default_rng(0).permutation(len(steps))):
        recomputed = torch.empty(len(steps), 56)
        with torch.no_grad():
            for s in range(0, len(steps), 5):  # micro-batches of 5, unlike the rollout's batches of 4 envs
                part = steps.take(order[s:s + 5])
                recomputed[order[s:s + 5]] = policy.log_prob(part.obs, part.instructions, part.tensor("tokens"), 1.3)[0]
        torch.testing.assert_close(recomputed, steps.tensor("old_log_probs"), rtol=0, atol=1e-5)
