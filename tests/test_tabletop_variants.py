"""The tabletop suite's robustness variants: what each one changes, what none may change (tasks, trials, success
predicate, determinism), the base suite bitwise as before, and that no training script practises on them."""
import hashlib

import numpy as np
import pytest

import envs
from common.config import EnvConfig
from envs.tabletop import (BLOCK, BLOCK_HALF, CAMERA_SHIFT, CAMERA_ZOOM, COLORS, FLAT_HALF, FLOOR_RGB, GRIPPER_RADIUS,
                           GRIPPER_Z, HOME_XY, LAN_INSTRUCTIONS, LAYOUTS, LIGHT_CAST, LIGHT_GAIN, LIGHT_RAMP,
                           NEW_COLORS, NEW_FLAT_COLORS, NOISE_SIGMA, NUM_TASKS, NUM_TRIALS, OBJECT_REPLACEMENTS, PLATE,
                           REPLACED_TASKS, SWAPS, TASKS, VARIANTS, TabletopEnv, TabletopVectorEnv, scene)


def trajectory_hash(tasks, trials, expert_noise, steps, seed, suite="tabletop"):
    """sha256 of every observation, reward and end flag of a run mixing the noisy expert and random actions."""
    env = TabletopVectorEnv(len(tasks), expert_noise=expert_noise, seed=seed, suite=suite)
    h = hashlib.sha256()
    obs, info = env.reset(options={"task_ids": tasks, "trial_ids": trials})
    rng = np.random.default_rng(seed)
    for k in range(steps):
        for key in ("agentview", "wrist", "state"):
            h.update(obs[key].tobytes())
        a = env.expert_action() if k % 3 else rng.uniform(-1, 1, (len(tasks), 7)).astype(np.float32)
        obs, r, term, trunc, info = env.step(a)
        h.update(r.tobytes())
        h.update(term.tobytes())
        h.update(trunc.tobytes())
    return h.hexdigest()[:16]


def test_base_suite_is_bitwise_as_before_the_variants():
    # values recorded from the code before the variants existed (commit c79ec10)
    assert trajectory_hash([0, 4, 7, 9, 5], [0, 13, 31, 49, 2], 0.1, 120, 3) == "1e95bd40e38b208e"
    assert trajectory_hash([1, 2, 3, 6, 8], [7, 8, 44, 20, 1], 0.0, 60, 0) == "bb3e10ddeb885339"
    env = TabletopVectorEnv(3, image_size=96, expert_noise=0.05, seed=1)  # demo starts, another resolution
    h = hashlib.sha256()
    obs, _ = env.reset(options={"task_ids": [0, 6, 9], "trial_ids": [100, 5, 0], "demo": True})
    for _ in range(80):
        h.update(obs["agentview"].tobytes())
        h.update(obs["wrist"].tobytes())
        obs, *_ = env.step(env.expert_action())
    assert h.hexdigest()[:16] == "67cdac66a7383e8f"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_keeps_tasks_and_trials_and_is_deterministic(variant):
    suite = f"tabletop_{variant}"
    cfg = EnvConfig(suite=suite)
    assert len(envs.suite_tasks(cfg)) == NUM_TASKS and envs.num_trials(cfg) == NUM_TRIALS == 50
    tasks, trials = [0, 5, 9, 7], [0, 17, 49, 3]
    assert trajectory_hash(tasks, trials, 0.1, 40, 2, suite) == trajectory_hash(tasks, trials, 0.1, 40, 2, suite)
    if variant != "lan":  # lan changes only the words (tested below)
        assert trajectory_hash(tasks, trials, 0.1, 40, 2, suite) != trajectory_hash(tasks, trials, 0.1, 40, 2)
    env = TabletopEnv(suite=suite)  # a reset in the middle of an episode gives the same start again
    first, info = env.reset(options={"task_id": 4, "trial_id": 8})
    env.step(np.ones(7, dtype=np.float32))
    again, _ = env.reset(options={"task_id": 4, "trial_id": 8})
    for k in first:
        np.testing.assert_array_equal(first[k], again[k])
    assert info["task_description"] == envs.suite_tasks(cfg)[4]["description"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_expert_solves_every_variant(variant):
    env = TabletopVectorEnv(20, expert_noise=0.1, seed=0, suite=f"tabletop_{variant}")
    for task in range(NUM_TASKS):
        env.reset(options={"task_ids": [task] * 20, "trial_ids": list(range(30, 50))})
        while not env.core.done.all():
            env.step(env.expert_action())
        assert env.core.success.mean() >= 0.95, (variant, task)


def same_except(variant, keys):
    """Every (task, trial) of `variant` matches the base scene in all scene keys but `keys`."""
    for task in range(NUM_TASKS):
        for trial in (0, 21, 49):
            base, var = scene(task, trial), scene(task, trial, variant=variant)
            for k in ("kind", "color", "shape", "pos", "gripper", "goals", "max_steps", "description"):
                if k not in keys:
                    assert np.array_equal(np.asarray(base[k]), np.asarray(var[k])), (variant, task, trial, k)


def test_lan_rewords_every_instruction_and_changes_nothing_else():
    same_except("lan", {"description"})
    for task in range(NUM_TASKS):
        new = scene(task, 0, variant="lan")["description"]
        assert new == LAN_INSTRUCTIONS[task] and new != TASKS[task][1] and len(new) <= 46
    base, lan = TabletopEnv(), TabletopEnv(suite="tabletop_lan")
    o1, i1 = base.reset(options={"task_id": 7, "trial_id": 2})
    o2, i2 = lan.reset(options={"task_id": 7, "trial_id": 2})
    np.testing.assert_array_equal(o1["agentview"], o2["agentview"])
    assert i2["task_description"] == "drop the red cube into the basket"
    assert i2["task_name"] == "drop_the_red_cube_into_the_basket"


def test_object_replaces_one_task_object_and_the_instruction_names_it():
    same_except("object", {"color", "shape", "description"})
    for task in range(NUM_TASKS):
        slot, old, new, rgb, form = OBJECT_REPLACEMENTS[task]
        base, var = scene(task, 3), scene(task, 3, variant="object")
        assert slot in np.asarray(TASKS[task][2]).ravel()  # an object the task is about
        assert tuple(var["color"][slot]) == rgb and var["shape"][slot] == form
        assert (tuple(base["color"][slot]), base["shape"][slot]) != (rgb, form)  # it looks different
        assert old in TASKS[task][1] and new in var["description"] and old not in var["description"]
        others = np.arange(len(LAYOUTS[TASKS[task][0]])) != slot
        np.testing.assert_array_equal(base["color"][:4][others], var["color"][:4][others])
    # task 0: the red block became purple; the agent view shows purple and no red
    env = TabletopEnv(suite="tabletop_object")
    obs, info = env.reset(options={"task_id": 0, "trial_id": 0})
    pix = obs["agentview"].reshape(-1, 3)
    assert (pix == NEW_COLORS["purple"]).all(1).sum() > 10 and not (pix == COLORS["red"]).all(1).any()
    assert info["task_description"] == "put the purple block on the blue plate"
    # task 2: a red cylinder is drawn as a disc: fewer red pixels than the square block, none in the box's corners
    base, var = TabletopEnv(image_size=128), TabletopEnv(image_size=128, suite="tabletop_object")
    ob, _ = base.reset(options={"task_id": 2, "trial_id": 0})
    ov, _ = var.reset(options={"task_id": 2, "trial_id": 0})
    red = lambda im: (im.reshape(-1, 3) == COLORS["red"]).all(1).sum()  # noqa: E731
    assert 0.6 < red(ov["agentview"]) / red(ob["agentview"]) < 0.9  # a disc covers pi/4 of its box


def test_object_success_predicate_follows_the_replaced_object():
    """The expert (which reads the goals) solves it; putting another object there does not count."""
    env = TabletopEnv(suite="tabletop_object")
    env.reset(options={"task_id": 0, "trial_id": 4})  # put the purple block (slot 0) on the blue plate (slot 2)
    core = env.core
    core.pos[0, 0, :2] = core.pos[0, 2, :2]  # the purple block teleported onto the plate: success on the next step
    _, r, term, _, info = env.step(np.zeros(7, dtype=np.float32))
    assert r == 1.0 and term and info["success"]
    env.reset(options={"task_id": 0, "trial_id": 4})
    core.pos[0, 1, :2] = core.pos[0, 2, :2]  # the yellow block on the plate instead: no success
    _, r, term, _, _ = env.step(np.zeros(7, dtype=np.float32))
    assert r == 0.0 and not term


def test_swap_exchanges_two_objects_positions():
    same_except("swap", {"pos"})
    for task in range(NUM_TASKS):
        a, b = SWAPS[task]
        assert {a, b} & set(np.asarray(TASKS[task][2]).ravel().tolist())  # one of them is in the task
        kinds = [k for k, *_ in LAYOUTS[TASKS[task][0]]]
        assert (kinds[a] == BLOCK) == (kinds[b] == BLOCK)  # same footprint class
        for trial in range(NUM_TRIALS):
            base, var = scene(task, trial)["pos"], scene(task, trial, variant="swap")["pos"]
            np.testing.assert_array_equal(var[a], base[b])
            np.testing.assert_array_equal(var[b], base[a])
            rest = [j for j in range(len(kinds)) if j not in (a, b)]
            np.testing.assert_array_equal(var[rest], base[rest])
            half = np.array([FLAT_HALF.get(k, BLOCK_HALF) for k in kinds])  # still 0.04 clear of each other
            gap = np.abs(var[:4, None, :2] - var[None, :4, :2]).max(-1) - half[:, None] - half[None]
            assert (gap[~np.eye(4, dtype=bool)] > 0.04).all()


def test_task_asks_for_a_goal_no_base_task_of_the_scene_asks_for():
    same_except("task", {"goals", "description", "max_steps"})
    for task in range(NUM_TASKS):
        layout, text, goals, _ = REPLACED_TASKS[task]
        assert layout == TASKS[task][0]
        base_goals = [g for lay, _, gs, _ in TASKS if lay == layout for g in gs]
        assert not set(goals) & set(base_goals)  # (layout 0's "stack the red block on the yellow block" is task 6's
        # instruction in layout 1: the words are known, the scene is not)
        assert scene(task, 0, variant="task")["description"] == text


def test_camera_moves_the_agent_view_only():
    same_except("camera", set())
    base, cam = TabletopEnv(), TabletopEnv(suite="tabletop_camera")
    S = 64
    for trial in range(5):
        ob, _ = base.reset(options={"task_id": 1, "trial_id": trial})
        oc, _ = cam.reset(options={"task_id": 1, "trial_id": trial})
        np.testing.assert_array_equal(ob["wrist"], oc["wrist"])  # the wrist camera rides on the gripper
        view = scene(1, trial, variant="camera")["view"]
        (dx, dy), zoom = view["shift"], view["zoom"]
        assert (CAMERA_SHIFT[0] <= np.abs(view["shift"])).all() and (np.abs(view["shift"]) <= CAMERA_SHIFT[1]).all()
        assert CAMERA_ZOOM[0] <= zoom <= CAMERA_ZOOM[1]
        # the centre pixel shows the table point 0.5 + shift; a corner in the shift's direction sees the floor
        c = int(np.floor((0.5 + dx + 0.5 / S / zoom) * S)), int(np.floor((0.5 + dy + 0.5 / S / zoom) * S))
        np.testing.assert_array_equal(oc["agentview"][S // 2, S // 2], ob["agentview"][c[1], c[0]])
        corner = oc["agentview"][-1 if dy > 0 else 0, -1 if dx > 0 else 0]
        assert tuple(corner) == FLOOR_RGB


def test_light_scales_both_views_by_the_trials_gain_and_cast():
    same_except("light", set())
    base, lit = TabletopEnv(), TabletopEnv(suite="tabletop_light")
    for trial in range(6):
        ob, _ = base.reset(options={"task_id": 3, "trial_id": trial})
        ol, _ = lit.reset(options={"task_id": 3, "trial_id": trial})
        view = scene(3, trial, variant="light")["view"]
        gain = view["gain"] * view["cast"]
        assert any(lo <= view["gain"] <= hi for lo, hi in LIGHT_GAIN)
        assert (np.abs(view["cast"] - 1) <= LIGHT_CAST).all()
        np.testing.assert_array_equal(ol["wrist"], np.clip(np.rint(ob["wrist"] * gain.astype(np.float32)), 0, 255))
        # the agent view also gets a linear gradient of +-LIGHT_RAMP/2 across the image along the trial's angle
        u = (np.arange(64) + 0.5) / 64 - 0.5
        a = view["ramp_angle"]
        ramp = 1 + LIGHT_RAMP * (u[None, :] * np.cos(a) + u[:, None] * np.sin(a))
        want = np.clip(np.rint(ob["agentview"] * ramp[:, :, None] * gain), 0, 255)
        assert np.abs(ol["agentview"] - want).max() <= 1  # float32 rounding
        assert abs(ramp.mean() - 1) < 1e-9 and ramp.max() - ramp.min() > LIGHT_RAMP * 0.9
        np.testing.assert_array_equal(ol["state"], ob["state"])


def test_noise_adds_fresh_gaussian_noise_of_the_trials_sigma():
    same_except("noise", set())
    base, noisy = TabletopEnv(), TabletopEnv(suite="tabletop_noise")
    ob, _ = base.reset(options={"task_id": 0, "trial_id": 9})
    on, _ = noisy.reset(options={"task_id": 0, "trial_id": 9})
    sigma = scene(0, 9, variant="noise")["view"]["sigma"]
    assert NOISE_SIGMA[0] <= sigma <= NOISE_SIGMA[1]
    diff = on["agentview"].astype(float) - ob["agentview"]
    unclipped = (ob["agentview"] > 3 * sigma) & (ob["agentview"] < 255 - 3 * sigma)
    assert abs(diff[unclipped].mean()) < 0.5 and diff[unclipped].std() == pytest.approx(sigma, rel=0.05)
    still = np.zeros(7, dtype=np.float32)
    ob2, *_ = base.step(still)
    on2, *_ = noisy.step(still)
    np.testing.assert_array_equal(ob2["agentview"], ob["agentview"])  # the scene did not change ...
    assert (on2["agentview"] != on["agentview"]).mean() > 0.5  # ... but the noise is drawn again every step
    assert (on2["wrist"] != ob2["wrist"]).mean() > 0.5


def test_distractor_adds_one_new_object_clear_of_the_others():
    same_except("distractor", {"kind", "color", "pos"})
    kinds = set()
    for task in range(NUM_TASKS):
        n = len(LAYOUTS[TASKS[task][0]])
        for trial in range(NUM_TRIALS):
            base, var = scene(task, trial), scene(task, trial, variant="distractor")
            np.testing.assert_array_equal(var["pos"][:n], base["pos"][:n])
            np.testing.assert_array_equal(var["color"][:n], base["color"][:n])
            k, rgb = int(var["kind"][n]), tuple(var["color"][n])
            assert base["kind"][n] == 0 and k in (BLOCK, PLATE)
            assert rgb in (NEW_COLORS if k == BLOCK else NEW_FLAT_COLORS).values()
            kinds.add(k)
            half = np.array([FLAT_HALF.get(int(x), BLOCK_HALF) for x in var["kind"][: n + 1]])
            gap = np.abs(var["pos"][:n, :2] - var["pos"][n, :2]).max(-1) - half[:n] - half[n]
            assert (gap > 0.04).all() and (var["pos"][n, :2] - half[n] >= 0).all()
            assert (var["pos"][n, :2] + half[n] <= 1).all()
            assert n not in np.asarray(var["goals"]).ravel()  # never part of the task
    assert kinds == {BLOCK, PLATE}
    env = TabletopEnv(suite="tabletop_distractor")
    obs, _ = env.reset(options={"task_id": 4, "trial_id": 0})
    rgb = tuple(env.core.color[0, 4])
    assert (obs["agentview"].reshape(-1, 3) == rgb).all(1).sum() > 10  # drawn


def test_gripper_starts_away_from_home():
    same_except("gripper", {"gripper"})
    for task in (0, 4, 9):
        for trial in range(NUM_TRIALS):
            g = scene(task, trial, variant="gripper")["gripper"]
            r = np.abs(g[:2] - np.array(HOME_XY)).max()
            assert GRIPPER_Z[0] <= g[2] <= GRIPPER_Z[1] and (0.05 <= g[:2]).all() and (g[:2] <= 0.95).all()
            assert r >= GRIPPER_RADIUS[0] / np.sqrt(2) - 1e-9  # base starts are within 0.05 of home
    env = TabletopEnv(suite="tabletop_gripper")
    obs, _ = env.reset(options={"task_id": 0, "trial_id": 0})
    np.testing.assert_allclose(obs["state"][:3], scene(0, 0, variant="gripper")["gripper"], rtol=1e-6)


def test_an_untrained_policy_almost_never_solves_the_replaced_tasks():
    env = TabletopVectorEnv(25, seed=0, suite="tabletop_task")
    rng = np.random.default_rng(0)
    for task in range(NUM_TASKS):
        env.reset(options={"task_ids": [task] * 25, "trial_ids": list(range(25, 50))})
        while not env.core.done.all():
            env.step(rng.uniform(-1, 1, (25, 7)))
        assert env.core.success.sum() <= 1, task


def test_variants_are_never_practised_or_demoed(tmp_path):
    from common.demos import generate_expert_demos
    from common.run import start_run

    for variant in VARIANTS:
        with pytest.raises(ValueError, match=f"env.suite=tabletop_{variant} is a robustness variant, for evaluation "
                                             f"only .* train on env.suite=tabletop"):
            envs.check_training_suite(f"tabletop_{variant}")
    envs.check_training_suite("tabletop")
    envs.check_training_suite("libero_spatial")
    with pytest.raises(ValueError, match="scripted-expert demos exist only for env.suite=tabletop"):
        generate_expert_demos(EnvConfig(suite="tabletop_lan"), [0], 1)
    with pytest.raises(ValueError, match="tabletop_swap is a robustness variant for evaluation only: it has no demo"):
        TabletopVectorEnv(1, suite="tabletop_swap").reset(options={"task_ids": [0], "trial_ids": [0], "demo": True})
    with pytest.raises(ValueError, match="unknown tabletop suite 'tabletop_fog'"):
        TabletopVectorEnv(1, suite="tabletop_fog")

    class Cfg:  # start_run looks at the suite before anything else
        env = EnvConfig(suite="tabletop_noise")

    with pytest.raises(SystemExit, match="^error: env.suite=tabletop_noise is a robustness variant"):
        start_run(Cfg(), "train_srpo")
    import train_sft

    with pytest.raises(SystemExit, match="^error: env.suite=tabletop_object is a robustness variant"):
        train_sft.main(["env.suite=tabletop_object", f"log.output_dir={tmp_path}"])
