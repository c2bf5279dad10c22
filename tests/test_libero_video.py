"""SRPO's episode videos sampled at the encoder's frames (`video_frames`): on real LIBERO the workers render only those
frames, from snapshots of what MuJoCo's renderer reads, and each is bit-identical to the frame an every-step render
gives; elsewhere the rollout samples the full video. Either way the encoder sees the same frames."""
import numpy as np
import pytest
import torch

from common.rollout import collect_rollouts
from envs import EnvConfig, make_vector_env
from base.video import sample_frame_indices
from models import TokenPolicy, TokenPolicyConfig
from models.trajectory_encoders import PixelEncoder
from models.configs import EncoderConfig


def test_sampling_a_sampled_video_keeps_it():
    """The encoders resample whatever video they get: a video already sampled at their n frames must pass unchanged,
    including an episode shorter than n (repeated frames)."""
    for length in (1, 3, 16, 17, 201):
        for n in (1, 4, 16):
            idx = sample_frame_indices(length, n)
            assert len(idx) == n and idx[0] == 0 and (n == 1 or idx[-1] == length - 1)  # n 1: the first frame
            assert sample_frame_indices(n, n).tolist() == list(range(n))
    assert sample_frame_indices(3, 5).tolist() == [0, 0, 1, 2, 2]


def test_tabletop_rollout_samples_the_full_video_and_the_encoder_embeds_it_alike():
    """The embedded suite keeps every frame; with video_frames the rollout returns each episode's frames at the
    sampled indices, and the pixel encoder (mean over its 16 frames, and the last frame) embeds both alike."""
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2)).eval()
    runs = {}
    for n in (0, 16):
        torch.manual_seed(1)
        runs[n] = collect_rollouts(make_vector_env(EnvConfig(num_envs=4, max_steps=30), seed=0), policy, [0, 1],
                                   [0, 1], n_samples=2, keep_frames=True, video_frames=n, progress=False)
    full, sampled = runs[0], runs[16]
    np.testing.assert_array_equal(full.actions, sampled.actions)
    assert [len(f) for f in full.frames] == [s + 1 for s in full.finish_step.tolist()]
    for f, s in zip(full.frames, sampled.frames):
        np.testing.assert_array_equal(s, f[sample_frame_indices(len(f), 16)])
    for pooling in ("mean", "final_spatial"):
        enc = PixelEncoder(EncoderConfig(kind="pixels", pooling=pooling))
        np.testing.assert_array_equal(enc.embed(full.frames), enc.embed(sampled.frames))


def _count_renders(env):
    """Wrap the agent view's sensor with a counter (step_chunk reads the sensor it finds)."""
    from envs.libero import CAMERAS

    camera = env.raw_env.env._observables[CAMERAS["agentview"]]
    real, count = camera._sensor, [0]

    def sensor(obs_cache):
        count[0] += 1
        return real(obs_cache)

    sensor.__modality__ = real.__modality__
    camera._sensor = sensor
    return count


def _episode(env, actions, chunk, **kwargs):
    """Reset trial 1 and run `actions` in chunks; -> (reset observation, the chunks' results)."""
    obs = env.reset(options={"task_id": 0, "trial_id": 1})[0]
    return obs, [env.step_chunk(actions[s: s + chunk], **kwargs) for s in range(0, len(actions), chunk)]


@pytest.mark.real_libero
def test_a_worker_renders_only_the_sampled_frames_and_each_is_the_every_step_render():
    """libero_spatial task 0, trial 1, 64 px, random actions in chunks of 8. Truncated at 45 steps: the chunks before
    the end return no frames and the last returns the 46-frame video (the reset view, 45 steps) at its 16 sampled
    frames, bit-identical to every-step rendering, with 6 chunk-end renders plus at most 16 instead of 45 (and
    the reset's). Then an episode forced to succeed at step 11 (mid-chunk, so its last frame is rendered from a snapshot): its 12-frame
    video at 5 frames. The observations and MuJoCo states match throughout."""
    from envs.libero import LiberoEnv

    cfg = EnvConfig(suite="libero_spatial", task_ids=[0], image_size=64, fast_render=True, max_steps=45)
    actions = np.random.default_rng(4).uniform(-0.8, 0.8, (45, 7)).astype(np.float32)
    env = LiberoEnv(cfg)
    try:
        env.reset(options={"task_id": 0, "trial_id": 1})
        count = _count_renders(env)
        reset, full = _episode(env, actions, 8, keep_frames=True)
        every = np.concatenate([reset["agentview"][None]] + [r["frames"] for r in full])
        full_renders, count[0] = count[0], 0
        state_full = env.raw_env.sim.get_state().flatten()
        reset2, sampled = _episode(env, actions, 8, keep_frames=True, video_frames=16)
        sampled_renders = count[0]
        np.testing.assert_array_equal(env.raw_env.sim.get_state().flatten(), state_full)
        np.testing.assert_array_equal(reset2["agentview"], reset["agentview"])
        assert len(every) == 46 and full[-1]["truncated"] and sampled[-1]["truncated"]
        assert all(r["frames"].shape == (0, 64, 64, 3) for r in sampled[:-1])
        np.testing.assert_array_equal(sampled[-1]["frames"], every[sample_frame_indices(46, 16)])
        assert len({f.tobytes() for f in sampled[-1]["frames"]}) > 8  # the arm moved: the frames differ
        for a, b in zip(full, sampled):
            for key in a["obs"]:
                np.testing.assert_array_equal(a["obs"][key], b["obs"][key])
        # the reset's render, then every step's; sampled: the reset's, each chunk's end (the policy's view) and the
        # sampled frames that are neither (20 here: the sampled frames at chunk ends are renders already made)
        assert full_renders == 1 + 45 and sampled_renders <= 1 + 6 + 16, (full_renders, sampled_renders)

        # success forced at the 11th step: mid-chunk, after the step's camera sample
        raw_step, steps = env.raw_env.step, [0]

        def step(action):
            raw, reward, done, info = raw_step(action)
            steps[0] += 1
            return raw, reward, steps[0] == 11, info

        env.raw_env.step = step  # (the reset's settling steps go through it too: counted from the first action)
        reset = env.reset(options={"task_id": 0, "trial_id": 1})[0]
        steps[0] = 0
        full = [env.step_chunk(actions[s: s + 8], keep_frames=True) for s in (0, 8)]
        every = np.concatenate([reset["agentview"][None]] + [r["frames"] for r in full])
        env.reset(options={"task_id": 0, "trial_id": 1})
        steps[0] = 0
        sampled = [env.step_chunk(actions[s: s + 8], keep_frames=True, video_frames=5) for s in (0, 8)]
        assert len(every) == 12 and full[1]["terminated"] and sampled[1]["terminated"] and sampled[1]["steps"] == 3
        assert sampled[0]["frames"].shape[0] == 0
        np.testing.assert_array_equal(sampled[1]["frames"], every[sample_frame_indices(12, 5)])
    finally:
        env.close()


@pytest.mark.real_libero
def test_libero_rollout_with_sampled_videos_is_the_rollout_with_every_frame():
    """Two spawned workers, a tiny token policy, 13-step episodes, streamed (pipeline) and in blocks: the rollout with
    video_frames 5 gives the same episodes (actions, log-probs, rewards, observations) as the one keeping every
    frame, and each video is the full one at its 5 sampled frames."""
    cfg = EnvConfig(suite="libero_spatial", task_ids=[0], image_size=64, fast_render=True, max_steps=13, num_envs=2)
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(image_size=64)).eval()
    env = make_vector_env(cfg)
    try:
        for pipeline in (True, False):
            runs = {}
            for n in (0, 5):
                torch.manual_seed(3)
                runs[n] = collect_rollouts(env, policy, [0, 0], [0, 1], n_samples=2, temperature=1.5,
                                           keep_frames=True, video_frames=n, progress=False, pipeline=pipeline)
            full, sampled = runs[0], runs[5]
            for key in ("finish_step", "actions", "rewards", "dones", "tokens", "old_log_probs"):
                np.testing.assert_array_equal(getattr(full, key), getattr(sampled, key), err_msg=key)
            for key in full.obs:
                np.testing.assert_array_equal(full.obs[key], sampled.obs[key], err_msg=key)
            assert [len(f) for f in full.frames] == [14] * 4
            for f, s in zip(full.frames, sampled.frames):
                np.testing.assert_array_equal(s, f[sample_frame_indices(14, 5)])
    finally:
        env.close()
