"""A scripted expert for real LIBERO's pick-and-place tasks, reading privileged state from the MuJoCo simulator.

`LiberoExpert(env)` drives one `envs.libero.LiberoEnv`: after every `env.reset(...)` call `expert.reset()`, then
`expert.act()` gives the next 7-D OSC_POSE delta action (Δxyz, Δaxis-angle, gripper -1 open / +1 closed) from the
poses of the end effector, the objects and the fixtures in `env.raw_env.sim`. It handles every task whose BDDL goal
is one `On` or `In` predicate of a movable object, unless it goes into a drawer (`unhandled_reason`): all of
libero_object and libero_spatial, libero_goal's placements (tasks 1, 2, 4, 5, 6, 8, 9). A small state machine turns
the gripper to the grasp's yaw while it flies above the object, descends, closes, lifts high enough to clear what
lies on the way, carries, lowers until the object nearly touches its target, opens and backs off upwards.

Grasps come from the collision geometry of the object and of everything around it: the fingers close across a
direction in which the object fits between them, the one with the most room around the palm and fingers; an object
wider than the open gripper everywhere (a bowl, the plate) is taken by its rim, one finger inside and one outside,
on the side with the most room that keeps the arm within easy reach (`plan_grasp`).

The controller's scale, measured on MuJoCo 3.3.7 (LIBERO's OSC_POSE, 20 Hz, output limits 0.05 m and 0.5 rad per
unit action): a constant action a moves the end effector ~12.5 mm x a per step once it has sped up (about 2 steps)
and turns it ~0.1 rad x a per step; the fingers need ~10 steps to close or open fully.
"""
from __future__ import annotations

import concurrent.futures as futures
import math
import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

METRES_PER_STEP = 0.0125  # end-effector travel per step for a unit action (steady state, measured)
RADIANS_PER_STEP = 0.1  # rotation per step for a unit rotation action (steady state, measured)
FINGER_REACH = 0.013  # the fingertips lie this far below the end-effector site (pads: 0.005 below to 0.012 above)
PALM_HEIGHT = 0.045  # the palm lies this far above the end-effector site
MAX_GRASP_WIDTH = 0.07  # the open pads are 0.076 apart: narrower objects are taken whole, wider ones by the rim
HAND_BOTTOM = 0.026  # the palm's underside lies this far above the end-effector site
HAND_HALF = (0.105, 0.032)  # the palm's half extents along and across the closing direction
FINGER_SPAN = (0.032, 0.068)  # the open fingers' inner and outer distance from the site along the closing direction
FINGER_HALF_WIDTH = 0.011  # the fingers' half extent across the closing direction
CLEARANCE_CAP = 0.03  # more room than this counts the same
EASY_REACH = 0.72  # horizontal distance from the robot's base beyond which the Panda, hand down, nears full stretch
MAX_SPEED = 1.0  # fastest translation action (~0.25 m/s)
DESCENT_SPEED = 0.7  # straight down to a grasp (faster drifts sideways)
SLOW_SPEED = 0.5  # the last centimetres down to a grasp or a placement
MAX_ACTION_CHANGE = 0.25  # per step and dimension: smooth starts and stops (gripper excepted)
GRIPPER_STEPS = 9  # steps to close or open the fingers
MAX_REGRASPS = 2  # a grasp that did not lift the object is tried again this many times
ROBOT_PREFIXES = ("robot0_", "gripper0_", "mount0_")


@dataclass
class PickPlaceGoal:
    """A BDDL goal `(On obj target)` or `(In obj target)`; the target is an object or a site (region)."""
    relation: str  # "on" | "in"
    obj: str
    target: str


def unhandled_reason(parsed_problem: Dict[str, Any]) -> Optional[str]:
    """None when the scripted expert handles a task (its BDDL parsed by LIBERO's `robosuite_parse_problem`), else
    why not: it places one movable object on or in something (`On` / `In`), but opens no drawer (`In` a fixture's
    region, e.g. a cabinet's top drawer, which starts closed) and turns no knob."""
    goal = parsed_problem["goal_state"]
    movable = {name for names in parsed_problem["objects"].values() for name in names}
    fixtures = {name for names in parsed_problem["fixtures"].values() for name in names}
    if len(goal) != 1 or len(goal[0]) != 3 or goal[0][0] not in ("on", "in") or goal[0][1] not in movable:
        return f"its goal {goal} is not one (On obj target) or (In obj target) predicate on a movable object"
    region = parsed_problem["regions"].get(goal[0][2], {})
    if goal[0][0] == "in" and region.get("target") in fixtures:
        return f"its goal {goal} puts the object into a region of the fixture '{region['target']}' (a drawer: the " \
               f"expert does not open it first)"
    return None


def pick_place_goal(domain_env: Any) -> PickPlaceGoal:
    """The task's goal as a PickPlaceGoal, or ValueError naming what the expert cannot do."""
    reason = unhandled_reason(domain_env.parsed_problem)
    if reason:
        raise ValueError(f"the scripted expert cannot do this task: {reason}")
    relation, obj, target = domain_env.parsed_problem["goal_state"][0]
    return PickPlaceGoal(relation, obj, target)


# ------------------------------------------------------------------------------------------------ rotations

def _rot_z(angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


# The gripper pointing straight down with its fingers closing along world x (columns: the end effector's axes in
# world coordinates; the fingers slide along its x axis). Turned by yaw ψ about world z, the fingers close along
# (cos ψ, sin ψ, 0). LIBERO's Panda starts near yaw 90°.
DOWN = np.diag([1.0, -1.0, -1.0])


def _axis_angle(rot: np.ndarray) -> np.ndarray:
    """Rotation matrix -> axis * angle (angle in [0, pi])."""
    cos = np.clip((np.trace(rot) - 1.0) / 2.0, -1.0, 1.0)
    angle = math.acos(cos)
    if angle < 1e-6:
        return np.zeros(3)
    axis = np.array([rot[2, 1] - rot[1, 2], rot[0, 2] - rot[2, 0], rot[1, 0] - rot[0, 1]])
    norm = np.linalg.norm(axis)
    if norm < 1e-6:  # angle ~ pi: the axis from the symmetric part
        axis = np.sqrt(np.maximum((np.diag(rot) + 1.0) / 2.0, 0.0))
        k = int(np.argmax(axis))
        axis = (rot[:, k] + np.eye(3)[:, k]) / (2.0 * axis[k])
        norm = np.linalg.norm(axis)
    return axis / norm * angle


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2.0 * math.pi) - math.pi


# --------------------------------------------------------------------------------------------------- geometry

class Scene:
    """Collision geometry of the current LIBERO scene, as world-frame point sets (the corners of each collision
    geom's bounding box), grouped by body: what the expert plans grasps and clearances with."""

    def __init__(self, domain_env: Any):
        self.env = domain_env
        self.sim = domain_env.sim
        m = self.sim.model._model
        self.model = m
        parents = m.body_parentid
        names = [m.body(b).name for b in range(m.nbody)]
        self.robot_bodies = {b for b in range(m.nbody) if names[b].startswith(ROBOT_PREFIXES)}
        # each movable object and fixture: its root body and every body below it
        self.bodies: Dict[str, List[int]] = {}
        for name in list(domain_env.objects_dict) + list(domain_env.fixtures_dict):
            root = domain_env.obj_body_id[name]
            subtree = []
            for b in range(m.nbody):
                p = b
                while p not in (0, root):
                    p = parents[p]
                if p == root:
                    subtree.append(b)
            self.bodies[name] = subtree
        collides = (m.geom_contype != 0) | (m.geom_conaffinity != 0)
        self.geoms = {name: [g for g in np.flatnonzero(collides) if m.geom_bodyid[g] in set(bodies)]
                      for name, bodies in self.bodies.items()}
        corners = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=np.float64)
        self._corners = corners
        # other obstacles: collision geoms of no object, fixture or robot and smaller than a wall or the table
        owned = {g for gs in self.geoms.values() for g in gs}
        self.other_geoms = [g for g in np.flatnonzero(collides) if g not in owned
                            and m.geom_bodyid[g] not in self.robot_bodies and m.geom_bodyid[g] != 0
                            and np.max(m.geom_aabb[g][3:]) < 0.3]

    def _points(self, geoms: List[int]) -> np.ndarray:
        if not geoms:
            return np.zeros((0, 3))
        m, d = self.model, self.sim.data._data
        g = np.asarray(geoms)
        centre, half = m.geom_aabb[g, :3], m.geom_aabb[g, 3:]
        local = centre[:, None, :] + half[:, None, :] * self._corners[None]  # (G, 8, 3)
        rot = d.geom_xmat[g].reshape(-1, 3, 3)
        world = np.einsum("gij,gkj->gki", rot, local) + d.geom_xpos[g][:, None, :]
        return world.reshape(-1, 3)

    def points(self, name: str) -> np.ndarray:
        """World-frame points bounding object or fixture `name` (its collision geoms' box corners)."""
        return self._points(self.geoms[name])

    def obstacle_points(self, exclude: Tuple[str, ...] = ()) -> np.ndarray:
        """Points of everything the gripper or a carried object could hit, except the named objects."""
        parts = [self.points(n) for n in self.geoms if n not in exclude] + [self._points(self.other_geoms)]
        return np.concatenate(parts) if parts else np.zeros((0, 3))

    def body_pos(self, name: str) -> np.ndarray:
        return self.sim.data.body_xpos[self.env.obj_body_id[name]].copy()

    def site_pos(self, name: str) -> np.ndarray:
        return np.asarray(self.sim.data.get_site_xpos(name)).copy()


def narrowest_direction(points: np.ndarray, step_deg: float = 3.0) -> Tuple[float, float, np.ndarray]:
    """The horizontal direction (angle in [0, pi), in steps of `step_deg`) along which `points` are narrowest, that
    width, and the centre of their tightest bounding rectangle in that orientation (xy)."""
    angles = np.radians(np.arange(0.0, 180.0, step_deg))
    extents = [_extent(points[:, :2], a) for a in angles]
    k = int(np.argmin([width for width, _ in extents]))
    return float(angles[k]), extents[k][0], extents[k][1]


def _extent(xy: np.ndarray, angle: float) -> Tuple[float, np.ndarray]:
    """Width of points `xy` along direction `angle` and the centre of their bounding rectangle in that orientation."""
    u = np.array([math.cos(angle), math.sin(angle)])
    v = np.array([-u[1], u[0]])
    pu, pv = xy @ u, xy @ v
    return float(pu.max() - pu.min()), u * (pu.max() + pu.min()) / 2 + v * (pv.max() + pv.min()) / 2


def _distance_to_segment(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """xy distance of each point to the segment a-b."""
    ab = b - a
    t = np.clip(((points - a) @ ab) / max(float(ab @ ab), 1e-12), 0.0, 1.0)
    return np.linalg.norm(points - (a + t[:, None] * ab), axis=1)


@dataclass
class Grasp:
    xy: np.ndarray  # where the end-effector site goes
    z: float  # end-effector site height at the grasp
    yaw: float  # the fingers close along (cos yaw, sin yaw)
    rim: bool  # taken by the rim (one finger inside)
    clearance: float  # free room around the hand and fingers (m, capped at CLEARANCE_CAP)


def _outside(pu: np.ndarray, pv: np.ndarray, half_u: float, half_v: float, lo_u: float = 0.0) -> np.ndarray:
    """Distance of points (pu, pv) from the rectangle |u| in [lo_u, half_u], |v| <= half_v (0 inside)."""
    au, av = np.abs(pu), np.abs(pv)
    du = np.maximum(np.maximum(au - half_u, lo_u - au), 0.0)
    dv = np.maximum(av - half_v, 0.0)
    return np.hypot(du, dv)


def gripper_clearance(obstacles: np.ndarray, xy: np.ndarray, z: float, yaw: float) -> float:
    """Free room (m) around the open gripper lowered to (xy, z) with yaw `yaw`: the horizontal distance from every
    obstacle point at a height the gripper sweeps through on its way down to the footprint of the palm (above the
    site) or of the fingers (down to the fingertips). Footprints measured on LIBERO's Panda (collision geoms)."""
    if not len(obstacles):
        return CLEARANCE_CAP
    u = np.array([math.cos(yaw), math.sin(yaw)])
    rel = obstacles[:, :2] - xy
    pu, pv, h = rel @ u, rel @ np.array([-u[1], u[0]]), obstacles[:, 2]
    dist = np.full(len(obstacles), CLEARANCE_CAP)
    palm = h > z + HAND_BOTTOM
    dist[palm] = _outside(pu[palm], pv[palm], *HAND_HALF)
    fingers = (h > z - FINGER_REACH) & ~palm
    dist[fingers] = _outside(pu[fingers], pv[fingers], FINGER_SPAN[1], FINGER_HALF_WIDTH, FINGER_SPAN[0])
    return float(min(dist.min(), CLEARANCE_CAP))


def plan_grasp(scene: Scene, obj: str, current_yaw: float, place_xy: Optional[np.ndarray] = None) -> Grasp:
    """Where and how to take `obj`: whole, across a direction in which it fits the open fingers, or else (a bowl) by
    the rim, one finger inside; among those, the grasp with the most room around the hand and fingers, then the
    narrowest, then the least turn from `current_yaw`. A rim grasp also keeps the hand, here and over `place_xy`
    (where the object's centre goes), within EASY_REACH of the robot's base where it can."""
    pts = scene.points(obj)
    bottom, top = float(pts[:, 2].min()), float(pts[:, 2].max())
    obstacles = scene.obstacle_points(exclude=(obj,))
    candidates: List[Tuple[float, Grasp]] = []
    _, min_width, _ = narrowest_direction(pts)
    if min_width <= MAX_GRASP_WIDTH:
        # high enough that the fingertips clear the support, low enough that the palm clears the object's top
        z = min(max(top - PALM_HEIGHT + 0.01, bottom + 0.45 * (top - bottom)), top - 0.01)
        z = max(z, bottom + FINGER_REACH + 0.002)
        xy = pts[:, :2]
        fitting = [a for a in np.radians(np.arange(0.0, 180.0, 5.0)) if _extent(xy, a)[0] <= MAX_GRASP_WIDTH]
        for angle in fitting or [narrowest_direction(pts)[0]]:  # (its best direction may lie between the steps)
            width, centre = _extent(xy, angle)
            yaw = _closest_yaw(float(angle), current_yaw)
            clearance = gripper_clearance(obstacles, centre, z, yaw)
            score = clearance - 0.2 * width - 0.002 * abs(_wrap(yaw - current_yaw))
            candidates.append((score, Grasp(centre, z, yaw, False, clearance)))
    else:
        angle, width, centre = narrowest_direction(pts)
        radius = width / 2.0
        z = max(top - 0.015, bottom + FINGER_REACH + 0.002)  # the fingertips clear the support
        base = scene.sim.data.body_xpos[scene.model.body("robot0_base").id][:2]
        for phi in np.radians(np.arange(0.0, 360.0, 10.0)):
            u = np.array([math.cos(phi), math.sin(phi)])
            offset = (radius - 0.006) * u
            point = centre + offset
            yaw = _closest_yaw(float(phi), current_yaw)
            clearance = gripper_clearance(obstacles, point, z, yaw)
            # the hand stays on this side of the rim until the release: keep both ends within the arm's easy reach
            reach = max(np.linalg.norm(point - base), np.linalg.norm(place_xy + offset - base) if place_xy is not None
                        else 0.0)
            score = clearance - 0.002 * abs(_wrap(yaw - current_yaw)) - 0.5 * max(0.0, reach - EASY_REACH)
            candidates.append((score, Grasp(point, z, yaw, True, clearance)))
    return max(candidates, key=lambda c: c[0])[1]


def _closest_yaw(angle: float, current_yaw: float) -> float:
    """`angle` or `angle + pi` (the gripper is symmetric), whichever is nearer to `current_yaw`."""
    yaw = _wrap(angle)
    return yaw if abs(_wrap(yaw - current_yaw)) <= math.pi / 2 else _wrap(yaw + math.pi)


# ------------------------------------------------------------------------------------------------------ expert

class LiberoExpert:
    """Closed-loop scripted pick-and-place on a `LiberoEnv` (privileged simulator state); see the module docstring.
    Phases: approach, descend, grasp, lift, carry, lower, release, retreat, and reopen (a missed grasp: open, rise,
    plan again) (`self.phase`)."""

    def __init__(self, env: Any):
        self.env = env
        self.phase = "approach"

    # -- state
    @property
    def _domain(self) -> Any:
        return self.env.raw_env.env

    def _eef(self) -> Tuple[np.ndarray, np.ndarray]:
        robot = self._domain.robots[0]
        data = self._domain.sim.data
        return data.site_xpos[robot.eef_site_id].copy(), data.site_xmat[robot.eef_site_id].reshape(3, 3).copy()

    def _yaw(self, rot: np.ndarray) -> float:
        closing = rot[:, 0]  # the fingers slide along the end effector's x axis
        return math.atan2(closing[1], closing[0])

    def reset(self) -> None:
        """Plan a new episode from the simulator's current scene (call after every env.reset)."""
        self.scene = Scene(self._domain)
        self.goal = pick_place_goal(self._domain)
        self.phase, self.phase_steps, self.regrasps = "approach", 0, 0
        self.prev_action = np.zeros(7)
        self.prev_action[6] = -1.0
        self.stall = 0
        self.last_z = None
        self._plan_grasp()

    def _plan_grasp(self) -> None:
        pos, rot = self._eef()
        self.grasp = plan_grasp(self.scene, self.goal.obj, self._yaw(rot), self._target()[0])
        self.obj_start = self.scene.body_pos(self.goal.obj)
        obstacles = self.scene.obstacle_points(exclude=(self.goal.obj,))
        near = _distance_to_segment(obstacles[:, :2], pos[:2], self.grasp.xy) < 0.08 if len(obstacles) else []
        clear = float(obstacles[near, 2].max()) if np.any(near) else -math.inf
        obj_top = float(self.scene.points(self.goal.obj)[:, 2].max())
        # fly above everything near the way (fingertips 3 cm clear), then come down over the object
        self.hover_z = max(self.grasp.z + 0.06, obj_top + FINGER_REACH + 0.03)
        self.travel_z = max(self.hover_z, clear + FINGER_REACH + 0.03)

    def _target(self) -> Tuple[np.ndarray, float]:
        """Where the carried object should end: (xy of the object's body, height of its bottom)."""
        goal, scene = self.goal, self.scene
        if goal.target in scene.geoms:  # an object or fixture
            pts = scene.points(goal.target)
            xy = scene.body_pos(goal.target)[:2]
            inside = np.linalg.norm(pts[:, :2] - xy, axis=1) < 0.03
            top = float(pts[inside, 2].max()) if inside.any() else float(pts[:, 2].max())
            return xy, top + 0.012
        site = self._domain.object_sites_dict[goal.target]
        centre = scene.site_pos(goal.target)
        half = np.abs(np.asarray(self._domain.sim.data.get_site_xmat(goal.target)).reshape(3, 3)
                      @ np.asarray(site.size, dtype=np.float64))
        if goal.relation == "in":
            return centre[:2], centre[2] - half[2] + 0.03
        return centre[:2], centre[2] + half[2] + 0.012

    # -- control
    def _move(self, pos: np.ndarray, rot: np.ndarray, goal_pos: np.ndarray, yaw: float, speed: float,
              gripper: float) -> np.ndarray:
        action = np.zeros(7)
        delta = (goal_pos - pos) / (METRES_PER_STEP * 3.0)  # close the gap in ~3 steps, capped at `speed`
        norm = np.linalg.norm(delta)
        action[:3] = delta if norm <= speed else delta * speed / norm
        err = _axis_angle(_rot_z(yaw) @ DOWN @ rot.T)
        action[3:6] = np.clip(err / (RADIANS_PER_STEP * 3.0), -1.0, 1.0)
        action[6] = gripper
        return action

    def _smooth(self, action: np.ndarray) -> np.ndarray:
        out = action.copy()
        prev = self.prev_action[:6]
        out[:6] = np.clip(np.clip(action[:6], prev - MAX_ACTION_CHANGE, prev + MAX_ACTION_CHANGE), -1.0, 1.0)
        self.prev_action = out
        return out.astype(np.float32)

    def _next(self, phase: str) -> None:
        self.phase, self.phase_steps, self.stall = phase, 0, 0

    def _stalled(self, z: float) -> bool:
        """True after 3 steps in which the end effector went down less than 1 mm per step (it touched something)."""
        if self.last_z is not None and self.last_z - z < 0.001:
            self.stall += 1
        else:
            self.stall = 0
        self.last_z = z
        return self.stall >= 3

    def act(self) -> np.ndarray:
        pos, rot = self._eef()
        g = self.grasp
        self.phase_steps += 1
        phase = self.phase
        if phase == "approach":
            goal = np.array([*g.xy, self.travel_z])
            if pos[2] < self.travel_z - 0.03 and np.linalg.norm(pos[:2] - g.xy) > 0.03:
                goal = np.array([*pos[:2], self.travel_z])  # rise first
            action = self._move(pos, rot, goal, g.yaw, MAX_SPEED, -1.0)
            yaw_err = abs(_wrap(self._yaw(rot) - g.yaw))
            if np.linalg.norm(pos[:2] - g.xy) < 0.01 and yaw_err < math.radians(5) and \
                    abs(pos[2] - self.travel_z) < 0.03:
                self._next("descend")
        elif phase == "descend":
            goal = np.array([*g.xy, g.z])
            speed = SLOW_SPEED if pos[2] - g.z < 0.04 else DESCENT_SPEED
            action = self._move(pos, rot, goal, g.yaw, speed, -1.0)
            if abs(pos[2] - g.z) < 0.005 or self._stalled(pos[2]):
                self._next("grasp")
        elif phase == "grasp":
            action = self._move(pos, rot, np.array([*g.xy, g.z]), g.yaw, SLOW_SPEED, 1.0)
            if self.phase_steps >= GRIPPER_STEPS:
                self.grasp_offset_z = pos[2] - float(self.scene.points(self.goal.obj)[:, 2].min())
                self._plan_carry(pos)
                self._next("lift")
        elif phase == "lift":
            action = self._move(pos, rot, np.array([*pos[:2], self.carry_z]), g.yaw, MAX_SPEED, 1.0)
            lifted = self.scene.body_pos(self.goal.obj)[2] - self.obj_start[2]
            if self.phase_steps >= 6 and lifted < 0.01 and pos[2] - g.z > 0.03:  # the object stayed behind
                if self.regrasps < MAX_REGRASPS:
                    self.regrasps += 1
                    self._plan_grasp()
                    self._next("reopen")
                else:
                    self._next("retreat")
            elif pos[2] > self.carry_z - 0.03:
                self._next("carry")
        elif phase == "reopen":
            action = self._move(pos, rot, np.array([*pos[:2], self.travel_z]), self._yaw(rot), SLOW_SPEED, -1.0)
            if self.phase_steps >= GRIPPER_STEPS:
                self._next("approach")
        elif phase == "carry":
            target_xy, _ = self._target()
            obj_xy = self.scene.body_pos(self.goal.obj)[:2]
            goal_xy = pos[:2] + (target_xy - obj_xy)
            action = self._move(pos, rot, np.array([*goal_xy, self.carry_z]), g.yaw, MAX_SPEED, 1.0)
            if np.linalg.norm(target_xy - obj_xy) < 0.01:
                self._next("lower")
        elif phase == "lower":
            target_xy, bottom = self._target()
            obj_xy = self.scene.body_pos(self.goal.obj)[:2]
            obj_bottom = float(self.scene.points(self.goal.obj)[:, 2].min())
            goal = np.array([*(pos[:2] + target_xy - obj_xy), pos[2] + bottom - obj_bottom])
            speed = SLOW_SPEED if obj_bottom - bottom < 0.04 else MAX_SPEED
            action = self._move(pos, rot, goal, g.yaw, speed, 1.0)
            if obj_bottom - bottom < 0.005 or self._stalled(pos[2]):
                self._next("release")
        elif phase == "release":
            action = self._move(pos, rot, pos, g.yaw, SLOW_SPEED, -1.0)
            if self.phase_steps >= GRIPPER_STEPS - 3:
                self._next("retreat")
        else:  # retreat: straight up, open
            action = self._move(pos, rot, np.array([*pos[:2], pos[2] + 0.05]), self._yaw(rot), SLOW_SPEED, -1.0)
        return self._smooth(action)

    def _plan_carry(self, pos: np.ndarray) -> None:
        """Carry height: the carried object's bottom 3 cm above everything between here and the target."""
        target_xy, bottom = self._target()
        obstacles = self.scene.obstacle_points(exclude=(self.goal.obj,))
        near = _distance_to_segment(obstacles[:, :2], pos[:2], target_xy) < 0.08 if len(obstacles) else []
        clear = float(obstacles[near, 2].max()) if np.any(near) else bottom
        self.carry_z = max(clear, bottom) + 0.03 + self.grasp_offset_z


# -------------------------------------------------------------------------------------------- episodes and demos

def run_episode(env: Any, expert: LiberoExpert, options: Dict[str, Any], record: bool = False) -> Dict[str, Any]:
    """One expert episode on `env` (a LiberoEnv) from `env.reset(options=options)` until success or max_steps.
    -> success, steps, phase (where it ended), regrasps and, with `record`, the demo's arrays in LIBERO's layout
    (`DEMO_ARRAYS`): the observation and simulator state *before* each action, as OpenVLA's regenerated LIBERO
    data pairs them (LIBERO's own create_dataset.py stores the observation after it)."""
    from robosuite.utils.transform_utils import quat2axisangle

    env.reset(options=options)
    expert.reset()
    steps: Dict[str, List[np.ndarray]] = {k: [] for k in DEMO_ARRAYS} if record else {}
    info: Dict[str, Any] = {"success": False}
    for _ in range(env.max_steps):
        action = expert.act()
        if record:
            raw = env.raw_obs
            quat = np.asarray(raw["robot0_eef_quat"], np.float64)
            ee = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(quat)])
            for key, value in (("agentview_rgb", raw["agentview_image"]),
                               ("eye_in_hand_rgb", raw["robot0_eye_in_hand_image"]),
                               ("ee_states", ee), ("ee_pos", ee[:3]), ("ee_ori", ee[3:]),
                               ("gripper_states", raw["robot0_gripper_qpos"]),
                               ("joint_states", raw["robot0_joint_pos"]),
                               ("robot_states", np.concatenate([raw["robot0_gripper_qpos"], raw["robot0_eef_pos"],
                                                                quat])),
                               ("states", env.raw_env.get_sim_state()), ("actions", action)):
                steps[key].append(np.array(value))
        _, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            break
    out = {"success": bool(info["success"]), "steps": int(env._steps), "phase": expert.phase,
           "regrasps": expert.regrasps}
    if record:
        arrays = {k: np.stack(v).astype(DEMO_ARRAYS[k]) for k, v in steps.items()}
        flags = np.zeros(len(arrays["actions"]), np.uint8)
        flags[-1] = 1  # the last step reaches the goal (only successes are kept)
        out["arrays"] = {**arrays, "rewards": flags, "dones": flags.copy()}
    return out


# LIBERO's released *_demo.hdf5 (scripts/create_dataset.py): data/demo_i/{obs/<key>, actions, states, robot_states,
# rewards, dones}; name -> dtype (images (T, H, W, 3) as rendered, i.e. upside down: macros_image_convention opengl)
DEMO_ARRAYS = {"agentview_rgb": np.uint8, "eye_in_hand_rgb": np.uint8, "ee_states": np.float64,
               "ee_pos": np.float64, "ee_ori": np.float64, "gripper_states": np.float64, "joint_states": np.float64,
               "robot_states": np.float64, "states": np.float64, "actions": np.float64}
OBS_KEYS = ("agentview_rgb", "eye_in_hand_rgb", "ee_states", "ee_pos", "ee_ori", "gripper_states", "joint_states")


def demo_file_attrs(env: Any, extra: Dict[str, Any]) -> Dict[str, Any]:
    """The `data` group's attributes of a LIBERO demo file for the task `env` (a LiberoEnv) has built, as
    create_dataset.py writes them (env_name, problem_info, macros_image_convention, bddl_file_name,
    bddl_file_content, env_args), plus ours (`extra`, e.g. the recorder and its seeds)."""
    import json

    import robosuite
    import robosuite.macros as macros
    from libero.libero.envs.bddl_utils import get_problem_info

    domain = env.raw_env.env
    bddl = domain.bddl_file_name
    problem_info = get_problem_info(bddl)
    size = env.cfg.image_size
    env_kwargs = {"bddl_file_name": bddl, "robots": ["Panda"],
                  "controller_configs": robosuite.load_controller_config(default_controller="OSC_POSE"),
                  "camera_names": ["agentview", "robot0_eye_in_hand"], "camera_heights": size, "camera_widths": size,
                  "control_freq": int(domain.control_freq), "has_renderer": False, "has_offscreen_renderer": True,
                  "use_camera_obs": True, "ignore_done": True, "hard_reset": False}
    env_args = {"type": 1, "env_name": type(domain).__name__, "problem_name": problem_info["problem_name"],
                "bddl_file": bddl, "env_kwargs": env_kwargs}
    with open(bddl) as f:
        content = f.read()
    return {"env_name": type(domain).__name__, "problem_info": json.dumps(problem_info),
            "macros_image_convention": macros.IMAGE_CONVENTION, "bddl_file_name": bddl,
            "bddl_file_content": content, "env_args": json.dumps(env_args), **extra}


class DemoFileWriter:
    """Writes successful demos one by one into a LIBERO-layout HDF5 file (`data/demo_0`, `demo_1`, ...), then
    `close()` adds `num_demos` and `total`. Written to `<path>.tmp` and renamed when closed, so an interrupted
    recording leaves no half file under the final name."""

    def __init__(self, path: str, attrs: Dict[str, Any]):
        import os

        import h5py

        self.path, self.tmp = path, f"{path}.tmp"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = h5py.File(self.tmp, "w")
        self.data = self.file.create_group("data")
        for key, value in attrs.items():
            self.data.attrs[key] = value
        self.num_demos, self.total = 0, 0

    def add(self, arrays: Dict[str, np.ndarray], attrs: Dict[str, Any]) -> None:
        group = self.data.create_group(f"demo_{self.num_demos}")
        obs = group.create_group("obs")
        for key, value in arrays.items():
            image = value.ndim == 4
            (obs if key in OBS_KEYS else group).create_dataset(
                key, data=value, **({"compression": "gzip", "compression_opts": 4, "chunks": (1,) + value.shape[1:]}
                                    if image else {}))
        group.attrs["num_samples"] = len(arrays["actions"])
        group.attrs["init_state"] = arrays["states"][0]
        for key, value in attrs.items():
            group.attrs[key] = value
        self.num_demos += 1
        self.total += len(arrays["actions"])

    def close(self) -> None:
        import os

        self.data.attrs["num_demos"] = self.num_demos
        self.data.attrs["total"] = self.total
        self.file.close()
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        import os

        self.file.close()
        os.remove(self.tmp)


# ---- the expert in worker processes: its success from LIBERO's init states, and demos recorded into HDF5 files
# (record_demos.py is the command line; benchmarks/libero_learning.py records its demos through it)
_WORKER: Dict[str, Any] = {}  # per process: the env and expert, kept across episodes (the scene is built per task)


def _worker_env(suite: str, task: int, image_size: int, cameras: bool, fast_render: bool):
    from envs import EnvConfig
    from envs.libero import LiberoEnv

    key = (suite, image_size, cameras, fast_render)
    if _WORKER.get("key") != key:
        if "env" in _WORKER:
            _WORKER["env"].close()
        env = LiberoEnv(EnvConfig(suite=suite, task_ids=[task], image_size=image_size, fast_render=fast_render),
                        cameras=cameras)
        _WORKER.update(key=key, env=env, expert=LiberoExpert(env))
    return _WORKER["env"], _WORKER["expert"]


def close_worker_env() -> None:
    """Close this process's simulator now, not while the interpreter tears EGL down (robosuite's render context then
    printed "Exception ignored ... EGLError" tracebacks)."""
    if "env" in _WORKER:
        _WORKER.pop("env").close()


def evaluate_episode(suite: str, task: int, trial: int) -> Dict[str, Any]:
    """The expert from LIBERO's init state `trial` of `task`, no cameras."""
    env, expert = _worker_env(suite, task, 8, False, True)
    return {"task": task, "trial": trial, **run_episode(env, expert, {"task_id": task, "trial_id": trial})}


def record_episode(suite: str, task: int, seed: int, image_size: int, fast_render: bool, trial: bool = False
                   ) -> Dict[str, Any]:
    """The expert from the random placement drawn with `seed` (with `trial`: from the suite's init state number
    `seed`), recorded (both cameras); a success also carries the file's attributes and the scene's MJCF."""
    env, expert = _worker_env(suite, task, image_size, True, fast_render)
    start = {"task_id": task, "trial_id": seed} if trial else {"task_id": task, "placement_seed": seed}
    out = run_episode(env, expert, start, record=True)
    out.update(task=task, seed=seed, task_name=env.task_names[task])
    if out["success"]:
        out["file_attrs"] = demo_file_attrs(env, {})
        out["model_file"] = env.raw_env.sim.model.get_xml()  # the scene's MJCF, as LIBERO's demos carry it
    else:
        out.pop("arrays")
    return out


def expert_pool(workers: int) -> Optional[futures.Executor]:
    """`workers` spawned episode processes (one thread each); None for 1: episodes run in this process."""
    if workers <= 1:
        return None
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))


def record_demos(suite: str, task_ids: List[int], out: str, image_size: int, fast_render: bool, workers: int,
                 count: int = 0, seed: int = 1000, max_attempts: int = 0, trials: Optional[range] = None) -> None:
    """Per task one file <out>/<suite>/<task name>_demo.hdf5 in LIBERO's layout: `count` successful demos from the
    random placements drawn with seeds `seed`, `seed` + 1, ... (at most `max_attempts` episodes), or with `trials`
    one attempt from each of those official init states. A file is written under a temporary name and renamed once
    complete (an interrupted task leaves none)."""
    from tqdm import tqdm

    pool = expert_pool(workers)
    per_task = len(trials) if trials is not None else count
    bar = tqdm(total=per_task * len(task_ids), unit="demo" if trials is None else "trial",
               desc=f"recording {suite}", dynamic_ncols=True)
    t0 = time.time()
    try:
        for task in task_ids:
            writers: List[Any] = []
            try:
                if trials is not None:
                    attempts = _record_trials(suite, task, out, image_size, fast_render, pool, trials, bar, writers)
                else:
                    attempts = _record_task(suite, task, out, image_size, fast_render, pool, workers, count, seed,
                                            max_attempts, bar, writers)
            except BaseException:
                for writer in writers:
                    writer.abort()
                raise
            path = writers[0].path
            tqdm.write(f"task {task}: {writers[0].num_demos} demos in {attempts} attempts "
                       f"({writers[0].num_demos / attempts:.0%}) -> "
                       f"{path} ({os.path.getsize(path) / 2**20:.1f} MiB); {(time.time() - t0) / 60:.1f} min so far")
    finally:
        bar.close()
        if pool:
            pool.shutdown(cancel_futures=True)
    minutes = (time.time() - t0) / 60
    print(f"recorded {per_task * len(task_ids)} {'init states' if trials is not None else 'demos'} in "
          f"{minutes:.1f} min ({per_task * len(task_ids) / max(minutes, 1e-9):.2f}/min, {workers} workers)")


def _file_extra(suite: str, task: int, image_size: int, fast_render: bool) -> Dict[str, Any]:
    from envs import EnvConfig

    return {"recorder": "vla-rl scripted expert (envs/libero_expert.py)", "suite": suite, "task_id": task,
            "image_size": image_size, "fast_render": fast_render, "num_steps_wait": EnvConfig().num_steps_wait}


def _record_task(suite: str, task: int, out: str, image_size: int, fast_render: bool,
                 pool: Optional[futures.Executor], workers: int, count: int, seed: int, max_attempts: int, bar: Any,
                 writers: List[Any]) -> int:
    """One task's file: demo i is the i-th success in seed order, whatever order the workers finish in (the same
    file every time); its writer goes into `writers` once it exists. -> episodes run."""
    pending: Dict[int, Any] = {}  # seed -> future
    finished: Dict[int, Dict[str, Any]] = {}  # seed -> result, not yet written
    next_seed, next_write, kept, attempts = seed, seed, 0, 0
    while kept < count:
        if attempts >= max_attempts:
            raise SystemExit(f"error: task {task}: only {kept} of {count} demos succeeded in {attempts} "
                             f"attempts (--max-attempts)")
        if pool:
            needed = count - kept - sum(r["success"] for r in finished.values())  # no episode to spare
            while len(pending) < min(workers, needed) and next_seed - seed < max_attempts:
                pending[next_seed] = pool.submit(record_episode, suite, task, next_seed, image_size, fast_render)
                next_seed += 1
            done, _ = futures.wait(list(pending.values()), return_when=futures.FIRST_COMPLETED)
            for s in [s for s, future in pending.items() if future in done]:
                finished[s] = pending.pop(s).result()
        else:
            finished[next_seed] = record_episode(suite, task, next_seed, image_size, fast_render)
            next_seed += 1
        while next_write in finished and kept < count:
            r = finished.pop(next_write)
            attempts, next_write = attempts + 1, next_write + 1
            if r["success"]:
                if not writers:
                    extra = {**_file_extra(suite, task, image_size, fast_render), "first_placement_seed": seed}
                    path = os.path.join(out, suite, f"{r['task_name']}_demo.hdf5")
                    writers.append(DemoFileWriter(path, {**r["file_attrs"], **extra}))
                writers[0].add(r["arrays"], {"placement_seed": r["seed"], "model_file": r["model_file"]})
                kept += 1
                bar.update(1)
            bar.set_postfix(task=task, attempts=attempts, kept=kept)
    for future in pending.values():
        future.cancel()
    writers[0].close()
    return attempts


def _record_trials(suite: str, task: int, out: str, image_size: int, fast_render: bool,
                   pool: Optional[futures.Executor], trials: range, bar: Any, writers: List[Any]) -> int:
    """One attempt from each official init state in `trials` (e.g. RL's practice states 0..39, LUFFY's
    demonstrations of them), the successes written in trial order with their trial_id; a failure is named and
    skipped. -> episodes run."""
    from tqdm import tqdm

    trials = list(trials)
    jobs = [(suite, task, j, image_size, fast_render, True) for j in trials]
    results = list(pool.map(record_episode, *zip(*jobs))) if pool else [record_episode(*job) for job in jobs]
    failed = [j for j, r in zip(trials, results) if not r["success"]]
    for j, r in zip(trials, results):
        if r["success"]:
            if not writers:
                extra = {**_file_extra(suite, task, image_size, fast_render), "trials": [trials[0], trials[-1]]}
                path = os.path.join(out, suite, f"{r['task_name']}_demo.hdf5")
                writers.append(DemoFileWriter(path, {**r["file_attrs"], **extra}))
            writers[0].add(r["arrays"], {"trial_id": j, "model_file": r["model_file"]})
        bar.update(1)
    if not writers:
        raise SystemExit(f"error: task {task}: the expert failed from every init state {trials[0]}-{trials[-1]}")
    if failed:
        tqdm.write(f"task {task}: no demo from init states {failed} (the expert failed there)")
    writers[0].close()
    return len(trials)
