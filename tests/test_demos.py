"""Demonstrations as rows of an RL batch (common/demos.py `tokenize_demo_actions`, `rollout_demos`): tokens as the
policy acts (chunks, 256 bins, padding after the end), decoded back within one bin, replayed in the simulator with
their success checked, and `prefix_mask` on exactly the demo rows' valid tokens."""
import numpy as np
import pytest
import torch

import envs
from envs import EnvConfig
from common.demos import generate_expert_demos, rollout_demos, tokenize_demo_actions
from common.rollout import RolloutBatch, collect_rollouts, flatten_steps
from models import TokenPolicy, TokenPolicyConfig
from models.action_tokenizer import ActionTokenizer


def test_tokens_by_hand_chunks_and_padding():
    tok = ActionTokenizer()  # identity statistics [-1, 1]: bin = floor((a + 1) / 2 * 256), clipped to 255
    a = np.array([[0.0, 1.0, -1.0, 0.5, -0.5, 0.25, 1.0],
                  [0.1, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0],
                  [-0.3, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]], np.float32)
    tokens, executed, valid = tokenize_demo_actions([a, a[:1]], tok, chunk=2)
    assert tokens.shape == (2, 2, 14) and executed.shape == (2, 2, 2, 7) and valid.tolist() == [2, 1]
    assert tokens[0, 0, :7].tolist() == [128, 255, 0, 192, 64, 160, 255]
    assert tokens[0, 0, 7:].tolist() == [140, 128, 128, 128, 128, 128, 0]  # 0.1 -> floor(1.1 * 128) = 140
    assert tokens[0, 1, :7].tolist() == [89, 128, 128, 128, 128, 128, 255]  # -0.3 -> floor(0.7 * 128) = 89
    np.testing.assert_array_equal(tokens[0, 1, 7:], tokens[0, 1, :7])  # L = 3: the last action repeats to fill
    np.testing.assert_array_equal(tokens[1, 0, 7:], tokens[1, 0, :7])
    assert (tokens[1, 1] == 0).all() and (executed[1, 1] == 0).all()  # past the episode: zeros (masked out)
    np.testing.assert_allclose(executed[0, 0, 0, :3], [1 / 256, 255.5 / 128 - 1, -1 + 1 / 256], atol=1e-6)  # centres


@pytest.mark.parametrize("seed", [0, 1])
def test_demo_tokens_decode_back_to_the_expert_actions_within_one_bin(seed):
    rng = np.random.default_rng(seed)
    actions = rng.uniform(-1.2, 1.2, size=(37, 7)).astype(np.float32)
    actions[:, 6] = np.sign(actions[:, 6])
    tok = ActionTokenizer.fit(actions[:, :] * 0.9)  # statistics from other data: some actions fall outside [low, high]
    tokens, executed, valid = tokenize_demo_actions([actions], tok, chunk=8)
    assert valid.tolist() == [5]
    decoded = executed[0].reshape(-1, 7)[:37]
    np.testing.assert_array_equal(tok.decode(tokens[0].reshape(5, 8, 7)).reshape(-1, 7)[:37], decoded)
    half_bin = (tok.high - tok.low)[:6] / 256 / 2
    inside = (actions[:, :6] >= tok.low[:6]) & (actions[:, :6] <= tok.high[:6]) & (np.abs(actions[:, :6]) <= 1)
    err = np.abs(decoded - actions)
    assert inside.mean() > 0.6 and (err[:, :6] <= half_bin + 1e-6)[inside].all()
    assert (err[:, :6] <= np.maximum(np.abs(actions[:, :6]) - 1, 0) + np.maximum(  # outside: clipped to the range
        np.maximum(actions[:, :6] - tok.high[:6], tok.low[:6] - actions[:, :6]), 0) + half_bin + 1e-6).all()
    assert (err[:, :6][inside] > 0).any()  # really quantised
    np.testing.assert_array_equal(decoded[:, 6], actions[:, 6])  # gripper exactly +-1


def test_expert_demos_replayed_as_policy_rows_succeed_and_decode_within_one_bin():
    cfg = EnvConfig(task_ids=[0], num_envs=4)
    demos = generate_expert_demos(cfg, [0], 3, demo_starts=False, cache_dir=None, verbose=False)  # trials 0, 1, 2
    tok = ActionTokenizer()
    venv = envs.make_vector_env(cfg, num_envs=2, seed=0)  # 3 demos on 2 envs: two reset blocks
    batch = rollout_demos(venv, tok, 8, [0, 0, 0], [0, 1, 2], demo_actions=[d["actions"] for d in demos])
    assert batch.complete.all() and not batch.invalid.any()  # success checked in the simulator
    lengths = np.array([len(d["actions"]) for d in demos])
    assert batch.finish_step.tolist() == lengths.tolist()
    assert batch.valid_steps.tolist() == (-(-lengths // 8)).tolist()
    for i, d in enumerate(demos):  # executed actions = decoded tokens, within half a bin of the expert's
        executed = batch.actions[i, :batch.valid_steps[i]].reshape(-1, 7)[:lengths[i]]
        np.testing.assert_array_equal(executed, tok.decode(batch.tokens[i, :batch.valid_steps[i]].reshape(-1, 8, 7))
                                      .reshape(-1, 7)[:lengths[i]])
        assert np.abs(executed - d["actions"]).max() <= 1 / 256 + 1e-6
        np.testing.assert_array_equal(batch.obs["agentview"][i, 0], d["agentview"][0])  # same start as the demo
    assert batch.stats["rollout/env_steps"] == lengths.sum()
    # a demo that stops short of success is replayed, fails, and says so
    short = rollout_demos(venv, tok, 8, [0], [0], demo_actions=[demos[0]["actions"][:10]])
    assert not short.complete[0] and short.finish_step[0] == 10 and short.valid_steps[0] == 2


def test_closed_loop_expert_rows_and_prefix_mask_covers_exactly_the_demo_tokens():
    cfg = EnvConfig(task_ids=[0], num_envs=3, max_steps=60)
    venv = envs.make_vector_env(cfg, seed=0)
    tok = ActionTokenizer()
    demo = rollout_demos(venv, tok, 8, [0, 0, 0], [3, 4, 5])
    assert demo.complete.all() and (demo.old_log_probs == 0).all()
    # the closed-loop rows replay exactly: same tokens, same observations, same success
    again = rollout_demos(venv, tok, 8, [0, 0, 0], [3, 4, 5], demo_actions=[
        demo.actions[i, :demo.valid_steps[i]].reshape(-1, 7)[:demo.finish_step[i]] for i in range(3)])
    assert again.complete.all() and (again.tokens == demo.tokens).all()
    np.testing.assert_array_equal(again.obs["wrist"], demo.obs["wrist"])
    # on-policy rows of a tiny random policy (prefix False, as train_luffy.py marks them) + the demos
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2))
    on = collect_rollouts(envs.make_vector_env(EnvConfig(num_envs=2, max_steps=20), seed=0), policy, [0], [3],
                          n_samples=2, progress=False)
    on.extras["prefix_mask"] = np.zeros(on.tokens.shape, dtype=bool)
    both = RolloutBatch.concat([on, demo])
    prefix = both.extras["prefix_mask"]
    assert prefix.shape == both.tokens.shape
    valid_tokens = np.repeat(both.step_mask[:, :, None], 56, axis=2)
    np.testing.assert_array_equal(prefix[2:], valid_tokens[2:])  # demo rows: every valid token, nothing past the end
    assert not prefix[:2].any()  # on-policy rows: none
    steps = flatten_steps(both)
    assert steps.data["prefix_mask"].shape == (len(steps), 56)
    assert steps.data["prefix_mask"].all(axis=1).sum() == demo.valid_steps.sum() and on.valid_steps.tolist() == [3, 3]
    assert (steps.data["prefix_mask"].all(axis=1) == (steps.episode >= 2)).all()


def test_bad_demo_input_is_named():
    tok = ActionTokenizer()
    with pytest.raises(ValueError, match=r"demo 1: actions must be a non-empty \(L, 7\) array, got shape \(3, 6\)"):
        tokenize_demo_actions([np.zeros((2, 7)), np.zeros((3, 6))], tok, 8)
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        tokenize_demo_actions([np.zeros((2, 7))], tok, 0)
