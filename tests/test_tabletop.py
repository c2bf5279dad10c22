"""The embedded tabletop suite: determinism, expert and random success, language/vision, validation, vector API."""
import numpy as np
import pytest

from envs import EnvConfig
from envs import check_task_ids, make_vector_env, suite_tasks
from envs.tabletop import (HOME_JITTER, HOME_XY, JITTER, LAYOUTS, NUM_TASKS, NUM_TRIALS, TASKS, TabletopEnv,
                           TabletopVectorEnv, initial_state)


def run_episodes(env: TabletopVectorEnv, task: int, policy) -> np.ndarray:
    env.reset(options={"task_ids": [task] * env.num_envs, "trial_ids": list(range(env.num_envs))})
    while not env.core.done.all():
        env.step(policy())
    return env.core.success.copy()


def test_same_task_and_trial_gives_identical_first_observation():
    a, b = TabletopEnv(), TabletopEnv()
    oa, ia = a.reset(options={"task_id": 3, "trial_id": 7})
    a.step(np.ones(7, dtype=np.float32))
    oa2, _ = a.reset(options={"task_id": 3, "trial_id": 7})
    ob, ib = b.reset(options={"task_id": 3, "trial_id": 7})
    for k in ("agentview", "wrist", "state"):
        np.testing.assert_array_equal(oa[k], ob[k])
        np.testing.assert_array_equal(oa[k], oa2[k])
    assert oa["agentview"].shape == (64, 64, 3) and oa["agentview"].dtype == np.uint8
    assert oa["state"].shape == (8,) and oa["state"].dtype == np.float32


@pytest.mark.parametrize("noise", [0.0, 0.1])
def test_expert_solves_every_task_at_least_95_percent(noise):
    env = TabletopVectorEnv(NUM_TRIALS, expert_noise=noise, seed=0)
    for task in range(NUM_TASKS):
        rate = run_episodes(env, task, env.expert_action).mean()
        assert rate >= 0.95, f"task {task}: expert success {rate:.2f}"


def test_uniform_random_policy_almost_never_succeeds():
    env = TabletopVectorEnv(NUM_TRIALS, seed=0)
    rng = np.random.default_rng(0)
    rates = [run_episodes(env, t, lambda: rng.uniform(-1, 1, (NUM_TRIALS, 7))).mean() for t in range(NUM_TASKS)]
    assert max(rates) <= 0.05, rates


def test_instruction_matches_task_and_layouts_are_shared():
    env = TabletopEnv()
    for task in range(NUM_TASKS):
        _, info = env.reset(options={"task_id": task, "trial_id": 0})
        assert info["task_description"] == TASKS[task][1]
        assert info["task_name"] == TASKS[task][1].replace(" ", "_")
    # tasks 0 and 2 share a layout: same trial, same picture, different instruction and different expert action
    o0, i0 = env.reset(options={"task_id": 0, "trial_id": 5})
    a0 = env.expert_action()
    env2 = TabletopEnv()
    o2, i2 = env2.reset(options={"task_id": 2, "trial_id": 5})
    np.testing.assert_array_equal(o0["agentview"], o2["agentview"])
    assert i0["task_description"] != i2["task_description"]
    for _ in range(20):  # the expert picks the same block, then heads to a different plate
        env.step(env.expert_action())
        env2.step(env2.expert_action())
    assert not np.allclose(env.core.gripper, env2.core.gripper)
    assert a0.shape == (7,)


def test_starts_jitter_around_nominal_spots_and_demo_starts_are_separate():
    for task in (0, 4, 9):
        layout = LAYOUTS[TASKS[task][0]]
        nominal = np.array([(x, y) for _, _, x, y in layout])
        trials = [initial_state(task, j) for j in range(NUM_TRIALS)]
        demos = [initial_state(task, j, demo=True) for j in range(NUM_TRIALS)]
        for pos, grip in trials + demos:
            # every object within JITTER of its nominal spot, the gripper near home
            assert np.abs(pos[: len(layout), :2] - nominal).max() <= JITTER + 1e-9
            assert np.abs(grip[:2] - np.array(HOME_XY)).max() <= HOME_JITTER + 1e-9
        trial_pos = np.stack([p for p, _ in trials])
        demo_pos = np.stack([p for p, _ in demos])
        assert len({p.tobytes() for p in trial_pos}) == NUM_TRIALS  # every trial is a different scene
        assert not any((d == trial_pos).all(axis=(1, 2)).any() for d in demo_pos)  # no demo start is a trial
    np.testing.assert_array_equal(initial_state(0, 3, demo=True)[0], initial_state(0, 3, demo=True)[0])
    initial_state(0, 10_000, demo=True)  # demo starts are unbounded
    with pytest.raises(ValueError, match="demo start -1 is out of range"):
        initial_state(0, -1, demo=True)
    venv = TabletopVectorEnv(2)
    obs_demo, _ = venv.reset(options={"task_ids": [0, 0], "trial_ids": [60, 60], "demo": True})
    obs_trial, _ = venv.reset(options={"task_ids": [0, 0], "trial_ids": [1, 1]})
    assert (obs_demo["agentview"][0] != obs_trial["agentview"][0]).any()


def test_images_differ_across_trials_and_show_height():
    env = TabletopEnv()
    first = [env.reset(options={"task_id": 0, "trial_id": j})[0]["agentview"] for j in range(5)]
    for j in range(1, 5):
        assert (first[0] != first[j]).any()
    obs, _ = env.reset(options={"task_id": 0, "trial_id": 0})
    up, *_ = env.step(np.array([0, 0, 1, 0, 0, 0, -1], dtype=np.float32))
    assert up["state"][2] == pytest.approx(obs["state"][2] + 0.05)
    assert (up["agentview"] != obs["agentview"]).any()  # the gripper grows when it rises


def test_reward_termination_and_absorbing_after_success():
    env = TabletopEnv()
    env.reset(options={"task_id": 0, "trial_id": 0})
    total, steps = 0.0, 0
    while True:
        obs, r, term, trunc, info = env.step(env.expert_action())
        total, steps = total + r, steps + 1
        if term or trunc:
            break
    assert term and not trunc and info["success"] and r == 1.0 and total == 1.0
    again, r2, term2, _, _ = env.step(np.ones(7, dtype=np.float32))
    assert r2 == 0.0 and term2
    np.testing.assert_array_equal(again["agentview"], obs["agentview"])


def test_truncation_at_max_steps():
    env = TabletopEnv(max_steps=7)
    env.reset(options={"task_id": 1, "trial_id": 0})
    for k in range(7):
        _, _, term, trunc, _ = env.step(np.zeros(7, dtype=np.float32))
    assert trunc and not term


def test_bad_ids_and_action_shape_raise_with_the_valid_range():
    env = TabletopEnv()
    with pytest.raises(ValueError, match=r"task_id 10 is out of range: the tabletop suite has tasks 0\.\.9"):
        env.reset(options={"task_id": 10, "trial_id": 0})
    with pytest.raises(ValueError, match=r"trial_id 50 is out of range: each tabletop task has trials 0\.\.49"):
        env.reset(options={"task_id": 0, "trial_id": 50})
    env.reset(options={"task_id": 0, "trial_id": 0})
    with pytest.raises(ValueError, match=r"action must have shape \(7,\).*got \(6,\)"):
        env.step(np.zeros(6))
    venv = TabletopVectorEnv(2)
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 7\).*got \(3, 7\)"):
        venv.step(np.zeros((3, 7)))
    with pytest.raises(ValueError, match="one task id and one trial id per env"):
        venv.reset(options={"task_ids": [0], "trial_ids": [0]})
    with pytest.raises(ValueError, match=r"task id 12 is out of range: suite 'tabletop' has task ids 0\.\.9"):
        check_task_ids(EnvConfig(task_ids=[0, 12]))
    with pytest.raises(ValueError, match="unknown env.suite 'libero_99'; choose one of: tabletop, libero_spatial"):
        make_vector_env(EnvConfig(suite="libero_99"), 2)


def test_vector_env_matches_single_envs_and_resets_by_mask():
    cfg = EnvConfig(num_envs=3, expert_noise=0.0)
    venv = make_vector_env(cfg, seed=0)
    obs, info = venv.reset(options={"task_ids": [0, 4, 9], "trial_ids": [1, 2, 3]})
    assert list(info["task_description"]) == [TASKS[t][1] for t in (0, 4, 9)]
    singles = [TabletopEnv() for _ in range(3)]
    for s, (t, j) in zip(singles, [(0, 1), (4, 2), (9, 3)]):
        s.reset(options={"task_id": t, "trial_id": j})
    rng = np.random.default_rng(1)
    for _ in range(10):
        a = rng.uniform(-1, 1, (3, 7)).astype(np.float32)
        obs, rew, term, trunc, info = venv.step(a)
        for i, s in enumerate(singles):
            o, *_ = s.step(a[i])
            np.testing.assert_array_equal(o["agentview"], obs["agentview"][i])
            np.testing.assert_array_equal(o["wrist"], obs["wrist"][i])
    before = obs["agentview"].copy()
    obs, info = venv.reset(options={"task_ids": [5], "trial_ids": [0], "reset_mask": np.array([False, True, False])})
    np.testing.assert_array_equal(obs["agentview"][0], before[0])
    assert info["task_id"].tolist() == [0, 5, 9] and info["elapsed_steps"].tolist() == [10, 0, 10]


def test_suite_tasks_lists_ten_tasks_with_limits():
    tasks = suite_tasks(EnvConfig())
    assert len(tasks) == 10 and tasks[0]["description"] == "put the red block on the blue plate"
    assert tasks[0]["max_steps"] == 100 and tasks[9]["max_steps"] == 200
    assert suite_tasks(EnvConfig(max_steps=30))[9]["max_steps"] == 30


def test_stale_suite_version_is_named_with_the_fix(tmp_path):
    from envs import SUITE_VERSION_FILE, stale_suite_message, write_suite_version
    from envs.tabletop import SUITE_VERSION

    unversioned = stale_suite_message(str(tmp_path), "tabletop")  # an SFT export from before versioning
    assert "unversioned" in unversioned and "Delete the folder" in unversioned
    write_suite_version(str(tmp_path), "tabletop")
    assert stale_suite_message(str(tmp_path), "tabletop") is None
    (tmp_path / SUITE_VERSION_FILE).write_text('{"suite": "tabletop", "version": %d}' % (SUITE_VERSION - 1))
    assert f"version {SUITE_VERSION - 1}" in stale_suite_message(str(tmp_path), "tabletop")
    assert stale_suite_message(str(tmp_path), "libero_spatial") is None  # real LIBERO's starts never change
