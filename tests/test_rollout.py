"""Rollout collection: shapes, masks, finish steps and success agree with the env, GRPO group ids."""
import numpy as np
import pytest
import torch

from envs import EnvConfig
from common.rollout import collect_rollouts, flatten_steps, make_prompts
from envs import make_vector_env
from models import TokenPolicy, TokenPolicyConfig
from models.policy import PolicyFamily


class ExpertPolicy(PolicyFamily):  # a token family: PolicyFamily.rollout_step calls act
    """The scripted expert behind the policy API (chunk of 1, so it reacts every step); for testing rollouts."""

    action_chunk = 1
    kind, model_space_samples = "token", False  # the policy interface (models/policy.py)

    def __init__(self, env, fail_tasks=()):
        self.env, self.fail_tasks = env, set(fail_tasks)
        self.calls = []

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        core = self.env.core
        # the rollout calls the policy for a subset of the envs: find them by their observation (envs with the same
        # observation get the same expert action)
        active = [int(np.flatnonzero(~core.done & (core.agentview == view).all((1, 2, 3)))[0])
                  for view in obs["agentview"]]
        a = self.env.expert_action()[active]
        for r, t in enumerate(core.task_id[active]):
            if int(t) in self.fail_tasks:
                a[r] = 0.0  # stand still: never succeeds, runs to max_steps
        self.calls.append(len(instructions))
        b = len(instructions)
        assert a.shape[0] == b and obs["agentview"].shape[0] == b and (generators is None or len(generators) == b)
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
    # one call over all active envs per chunk (env.pipeline off); envs finish at different steps: the batch shrinks
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
    assert {t: batch.complete[batch.task_ids == t].mean() for t in (0, 1, 4)} == {0: 1.0, 1: 0.0, 4: 1.0}
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


def _assert_same_episodes(a, b):
    """Two rollouts of the same prompts gave exactly the same episodes."""
    for key in ("finish_step", "valid_steps", "complete", "truncated", "invalid", "actions", "rewards", "dones",
                "tokens", "old_log_probs", "noise"):
        x, y = getattr(a, key), getattr(b, key)
        assert (x is None) == (y is None), key
        if x is not None:
            np.testing.assert_array_equal(x, y, err_msg=key)
    for key in a.obs:
        np.testing.assert_array_equal(a.obs[key], b.obs[key], err_msg=key)
    for key in a.last_obs:
        np.testing.assert_array_equal(a.last_obs[key], b.last_obs[key], err_msg=key)
    if a.frames is not None:
        for x, y in zip(a.frames, b.frames):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("family", ["token", "flow"])
def test_pipelined_rollout_is_the_sequential_rollout(family):
    """env.pipeline only changes the order of policy calls and env chunks: with the same torch seed, the pipelined
    rollout (two halves of the envs taking turns) gives the sequential one's actions, log-probs (token) or noise
    (flow), rewards, finish steps and observations exactly, also with a partial last block; and the samples do not
    depend on how many envs run at once (per-episode generators)."""
    if family == "token":
        policy = TokenPolicy(TokenPolicyConfig()).eval()
        kwargs = {"temperature": 1.3}
    else:
        from models import FlowPolicy, FlowPolicyConfig

        policy = FlowPolicy(FlowPolicyConfig()).eval()
        kwargs = {"flow_steps": 3, "flow_noise_level": 0.5}
    runs = {}
    for name, n_env, overlap in [("sequential", 4, False), ("pipelined", 4, True), ("pipelined5", 5, True)]:
        env = make_vector_env(EnvConfig(num_envs=n_env, max_steps=30), seed=0)
        torch.manual_seed(7)
        runs[name] = collect_rollouts(env, policy, [0, 4, 1], [0, 1, 2], n_samples=2, keep_frames=True,
                                      progress=False, pipeline=True, overlap=overlap, **kwargs)
    seq = runs["sequential"]
    assert len(seq) == 6 and seq.stats["rollout/env_steps"] == seq.finish_step.sum() > 0
    assert len(set(map(bytes, seq.actions[:, 0]))) == 6  # the rows of a group sampled different actions
    _assert_same_episodes(seq, runs["pipelined"])
    # 5 envs batch the policy's rows differently (halves of 3 and 2): the same samples, equal up to float rounding
    five = runs["pipelined5"]
    np.testing.assert_array_equal(five.finish_step, seq.finish_step)
    np.testing.assert_allclose(five.actions, seq.actions, rtol=0, atol=1e-5)
    if family == "token":
        np.testing.assert_array_equal(five.tokens, seq.tokens)
        np.testing.assert_allclose(five.old_log_probs, seq.old_log_probs, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(five.noise, seq.noise)
    torch.manual_seed(8)  # another seed: other samples
    other = collect_rollouts(make_vector_env(EnvConfig(num_envs=4, max_steps=30), seed=0), policy, [0, 4, 1],
                             [0, 1, 2], n_samples=2, progress=False, pipeline=True, **kwargs)
    assert not np.array_equal(other.actions[:, 0], seq.actions[:, 0])


class NoisyExpert(ExpertPolicy):
    """The expert plus noise from each episode's own generator (pipelined rollouts): episodes succeed after
    different numbers of steps or run to the limit, so envs free at uneven times and are reset mid-rollout."""

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        core = self.env.core  # each env found by its whole observation (two episodes may share an image)
        state = core.state()
        active = [int(np.flatnonzero(~core.done & (core.agentview == view).all((1, 2, 3))
                                     & (state == s).all(1))[0]) for view, s in zip(obs["agentview"], obs["state"])]
        a = self.env.expert_action()[active]
        a[np.isin(core.task_id[active], list(self.fail_tasks))] = 0.0  # stand still: runs to max_steps
        noise = torch.stack([torch.randn(1, 7, generator=g) for g in generators]).numpy()
        b = len(instructions)
        logp = torch.as_tensor(noise[:, 0]).float()  # the draw, kept in the batch for comparison
        return np.clip(a[:, None, :] + 0.3 * noise, -1, 1), torch.zeros(b, 7, dtype=torch.long), logp


def test_streamed_rollout_is_the_same_however_its_envs_run_it():
    """env.pipeline streams episodes (an env takes the next one as soon as it frees, reset while the others step):
    with and without the overlap, and on 2 or 3 envs (one shared queue, or rows dealt to halves of 2 and 1), one
    iteration's batch is the same bit for bit: actions, draws, rewards, finish steps, observations and videos."""
    runs = {}
    for n_env in (2, 3):
        for overlap in (False, True):
            env = make_vector_env(EnvConfig(num_envs=n_env, max_steps=40), seed=0)
            torch.manual_seed(5)
            runs[n_env, overlap] = collect_rollouts(env, NoisyExpert(env, fail_tasks=[4]), [0, 4, 1], [0, 1, 2],
                                                    n_samples=3, keep_frames=True, progress=False, pipeline=True,
                                                    overlap=overlap)
    first = runs[2, False]
    assert len(first) == 9 and first.complete[[0, 1, 2, 6, 7, 8]].sum() >= 4 and not first.complete[3:6].any()
    assert len(set(first.finish_step.tolist())) >= 5  # uneven ends: envs free at different times
    assert first.stats["rollout/env_steps"] == first.finish_step.sum()
    assert first.stats["time/rollout_physics_s"] > 0 and first.stats["rollout/envs"] == 2
    for key, batch in runs.items():
        _assert_same_episodes(first, batch)
        assert batch.task_names == first.task_names and batch.instructions == first.instructions, key


def test_a_streamed_rollout_leaves_the_simulator_workers_their_cores(monkeypatch):
    """With the envs in worker processes and the policy on the CPU, the policy computes with the cores the workers
    leave (at least one thread) during a streamed rollout; in-process envs and policies elsewhere keep every thread."""
    import os

    from common.rollout import policy_threads

    class Workers:
        num_envs, processes = 2, [None, None]

    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert policy_threads(Workers(), policy, 16) == 14  # 16 cores, 2 simulator workers
    assert policy_threads(Workers(), policy, 8) == 8  # never more than the caller's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert policy_threads(Workers(), policy, 2) == 1  # this machine: 2 cores, 2 workers
    assert policy_threads(make_vector_env(EnvConfig(num_envs=2)), policy, 2) == 2  # tabletop: no workers


@pytest.mark.real_libero
def test_pipelined_rollout_is_the_sequential_rollout_on_real_libero():
    """The same on the real simulator (2 spawned workers, tiny token policy, 64 px): the streamed rollout (each worker
    runs two episodes, its second reset in the worker while the other steps) gives the same actions, log-probs,
    rewards, finish steps, observations and videos with and without the overlap; and a worker's chunk
    (cameras rendered only where an image is returned) gives the images of rendering every step."""
    from envs.libero import LiberoEnv

    cfg = EnvConfig(suite="libero_spatial", task_ids=[0], image_size=64, fast_render=True, max_steps=13, num_envs=2)
    single = LiberoEnv(cfg)
    actions = np.random.default_rng(0).uniform(-0.5, 0.5, (13, 7)).astype(np.float32)
    single.reset(options={"task_id": 0, "trial_id": 1})
    every = [single.step(a)[0] for a in actions]
    single.reset(options={"task_id": 0, "trial_id": 1})
    first, second = single.step_chunk(actions[:8], keep_frames=True), single.step_chunk(actions[8:])
    assert (first["steps"], second["steps"], second["truncated"]) == (8, 5, True)
    for got, want in ((first["obs"], every[7]), (second["obs"], every[12])):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    np.testing.assert_array_equal(first["frames"], np.stack([o["agentview"] for o in every[:8]]))
    single.close()

    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(image_size=64)).eval()
    env = make_vector_env(cfg)
    try:
        runs = []
        for overlap in (False, True):
            torch.manual_seed(3)
            runs.append(collect_rollouts(env, policy, [0, 0], [0, 1], n_samples=2, temperature=1.5, keep_frames=True,
                                         progress=False, pipeline=True, overlap=overlap))
    finally:
        env.close()
    seq, pipe = runs
    assert seq.finish_step.tolist() == [13] * 4 and seq.valid_steps.tolist() == [2] * 4 and not seq.invalid.any()
    assert len(seq.frames[0]) == 14 and seq.truncated.all()
    _assert_same_episodes(seq, pipe)


def test_libero_workers_spawn_with_one_blas_thread_and_a_core_share_of_render_threads(monkeypatch):
    import os

    from envs.libero import worker_environ

    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.delenv("LP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    with worker_environ(4):
        assert os.environ["OMP_NUM_THREADS"] == os.environ["OPENBLAS_NUM_THREADS"] == "1"
        assert os.environ["LP_NUM_THREADS"] == "4"  # 16 cores / 4 workers
    assert os.environ["OMP_NUM_THREADS"] == "8" and "LP_NUM_THREADS" not in os.environ  # the parent's restored
    monkeypatch.setenv("LP_NUM_THREADS", "3")  # the user's choice wins
    with worker_environ(32):
        assert os.environ["LP_NUM_THREADS"] == "3"


def test_sampling_rows_draw_from_their_own_generators():
    """Row i of a batch draws its uniforms (token) or noise (flow) from generators[i] alone: the same row sampled
    alone or beside others gives the same draw, which is the inverse-CDF draw of that generator's uniforms."""
    from models.flow_policy import _randn
    from models.token_policy import sample_categorical

    logits = torch.randn(3, 5, 10, generator=torch.Generator().manual_seed(0))

    def gens():
        return [torch.Generator().manual_seed(s) for s in (1, 2, 3)]

    full = sample_categorical(logits, gens())
    assert torch.equal(full[1:], sample_categorical(logits[1:], gens()[1:]))
    cdf = logits[1].softmax(-1).cumsum(-1)
    u = torch.rand(5, 1, generator=torch.Generator().manual_seed(2))
    assert torch.equal(full[1], torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(-1))
    noise = _randn((3, 8, 7), torch.device("cpu"), gens())
    assert torch.equal(noise[2], torch.randn(8, 7, generator=torch.Generator().manual_seed(3)))
    with pytest.raises(ValueError, match="one generator per row"):
        sample_categorical(logits, gens()[:2])


def _assert_frames_are_the_observations(batch, chunk):
    """Frame 0 of every recorded video is its reset observation, frame k the observation after env step k: the frame
    at each policy call t is the observation that call saw (t * chunk steps in), the last frame is `last_obs`."""
    for b, video in enumerate(batch.frames):
        assert len(video) == batch.finish_step[b] + 1
        for t in range(batch.valid_steps[b]):
            np.testing.assert_array_equal(video[t * chunk], batch.obs["agentview"][b, t])
        np.testing.assert_array_equal(video[-1], batch.last_obs["agentview"][b])


@pytest.mark.parametrize("family", ["token", "flow"])
@pytest.mark.parametrize("pipeline,overlap", [(False, False), (True, False), (True, True)])
def test_recorded_first_frame_is_the_reset_observation(family, pipeline, overlap):
    """Regression (e447356 .. 948d52e): frame 0 was a view into the observation buffer that every chunk overwrites,
    so each video started with its last frame (SRPO's world-model reward and evaluate.py's GIFs read them)."""
    torch.manual_seed(0)
    if family == "token":
        policy, kwargs = TokenPolicy(TokenPolicyConfig(action_chunk=4)).eval(), {"temperature": 1.0}
    else:
        from models import FlowPolicy, FlowPolicyConfig

        policy, kwargs = FlowPolicy(FlowPolicyConfig(action_chunk=4)).eval(), {"flow_steps": 2}
    env = make_vector_env(EnvConfig(num_envs=3, max_steps=13, action_chunk=4), seed=0)
    batch = collect_rollouts(env, policy, [0, 4], [3, 5], n_samples=2, keep_frames=True, progress=False,
                             pipeline=pipeline, overlap=overlap, **kwargs)
    reset_env = make_vector_env(EnvConfig(num_envs=4, max_steps=13, action_chunk=4), seed=0)
    first, _ = reset_env.reset(options={"task_ids": [0, 0, 4, 4], "trial_ids": [3, 3, 5, 5]})
    for b in range(4):
        np.testing.assert_array_equal(batch.frames[b][0], first["agentview"][b])
    assert not np.array_equal(batch.frames[0][0], batch.frames[0][-1])  # the gripper moved
    _assert_frames_are_the_observations(batch, 4)
