"""The embedded `tabletop` suite: 10 LIBERO-shaped pick-and-place tasks, simulated and rendered in numpy.

A gripper (x, y, z, open/closed) moves over a table in [0, 1]^2 with coloured blocks, plates and a basket. Tasks share
scene layouts (so the instruction matters); every trial starts from its own fixed placement, each object jittered
around its region as in LIBERO's init files (so vision matters, and trials not trained on are like those that were).
Observations, actions and episode rules follow real LIBERO (see ../shared/specs/environments.md): `agentview` and
`wrist` uint8 images, an 8-D `state`, 7-D actions in [-1, 1] (rotation dims ignored, gripper > 0 closes),
reward 1 on the step that succeeds, `terminated` on success and `truncated` at `max_steps`.

All physics, the scripted expert and rendering are batched over environments; `TabletopVectorEnv` is a native
`gymnasium.vector.VectorEnv` (autoreset disabled) and `TabletopEnv` the single-environment `gymnasium.Env`.

Robustness variants (`tabletop_lan`, `tabletop_object`, ... see VARIANTS): the same 10 tasks and 50 trials with one
perturbation each, LIBERO-PRO's four families (instruction, object, position swap, task) and the LIBERO-Plus ones a
numpy renderer can do honestly (camera, lighting, sensor noise, distractor, gripper start). Trial j of a variant is
base trial j's placement plus the perturbation (drawn from VARIANT_SEED where random), so the drop against `tabletop`
is paired. They are for evaluation only: no demo starts, and the training scripts refuse them.
"""
from __future__ import annotations

import functools
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

NUM_TRIALS = 50  # fixed initial states per task, like LIBERO's init files
SUITE_VERSION = 2  # bump when starts, physics or rendering change: SFT exports record it (2: LIBERO-style starts)
STEP_SIZE = 0.05  # table units moved per step at |action| = 1
BLOCK_HALF = 0.05  # half the side of a block
BLOCK_HEIGHT = 0.05
HOVER_Z = 0.2  # expert's travel height
MAX_Z = 0.4
START_Z = 0.25
WRIST_ZOOM = 3  # the wrist camera sees a third of the table around the gripper
TRIAL_SEED = 20261120  # the suite's initial states are a pure function of (task_id, trial_id, TRIAL_SEED)

BLOCK, PLATE, BASKET = 1, 2, 3
COLORS = {
    "red": (215, 40, 40), "yellow": (235, 205, 35), "blue": (40, 70, 215), "green": (40, 160, 60),
}
FLAT_COLORS = {"blue plate": (140, 175, 255), "green plate": (150, 225, 150), "basket": (120, 75, 35)}
FLAT_HALF = {PLATE: 0.09, BASKET: 0.11}
TABLE_RGB = (205, 185, 150)
GRIPPER_RGB = (60, 60, 60)
SHADOW_RGB = (120, 105, 85)

# Scene layouts: (kind, name, nominal x, nominal y) per object. Several tasks share a layout with different
# instructions. As in LIBERO's init files, every object starts in its own region: the nominal spot plus a per-trial
# offset of up to JITTER in x and y (and the gripper near its home HOME_XY), so a policy that has seen some trials can
# generalise to the others, while vision is still needed to grasp.
LAYOUTS: List[List[Tuple[int, str, float, float]]] = [
    [(BLOCK, "red", 0.25, 0.30), (BLOCK, "yellow", 0.72, 0.28), (PLATE, "blue plate", 0.30, 0.72),
     (PLATE, "green plate", 0.72, 0.70)],
    [(BLOCK, "red", 0.25, 0.28), (BLOCK, "green", 0.74, 0.26), (BLOCK, "blue", 0.27, 0.74),
     (BLOCK, "yellow", 0.72, 0.72)],
    [(BLOCK, "red", 0.24, 0.30), (BLOCK, "blue", 0.55, 0.22), (BASKET, "basket", 0.70, 0.70),
     (PLATE, "green plate", 0.28, 0.72)],
]
JITTER = 0.04  # max per-trial offset of an object from its nominal spot (table units; a block is 0.1 wide)
HOME_XY = (0.5, 0.5)
HOME_JITTER = 0.05  # max per-trial offset of the gripper's start from HOME_XY
# (layout, instruction, goals as (object, support) pairs that must all hold, max_steps)
TASKS: List[Tuple[int, str, List[Tuple[int, int]], int]] = [
    (0, "put the red block on the blue plate", [(0, 2)], 100),
    (0, "put the yellow block on the green plate", [(1, 3)], 100),
    (0, "put the red block on the green plate", [(0, 3)], 100),
    (0, "put the yellow block on the blue plate", [(1, 2)], 100),
    (1, "stack the green block on the red block", [(1, 0)], 100),
    (1, "stack the yellow block on the blue block", [(3, 2)], 100),
    (1, "stack the red block on the yellow block", [(0, 3)], 100),
    (2, "put the red block in the basket", [(0, 2)], 100),
    (2, "put the blue block on the green plate", [(1, 3)], 100),
    (2, "put both the red block and the blue block in the basket", [(0, 2), (1, 2)], 200),
]
NUM_TASKS = len(TASKS)
MAX_OBJECTS = max(len(layout) for layout in LAYOUTS) + 1  # one free slot: tabletop_distractor's extra object
MAX_GOALS = max(len(t[2]) for t in TASKS)

# ---------------------------------------------------------------- robustness variants (evaluation only)
VARIANTS = ("lan", "object", "swap", "task", "camera", "light", "noise", "distractor", "gripper")
VARIANT_SEED = 20261125  # a variant's random perturbations are a pure function of (variant, task, trial, VARIANT_SEED)
SQUARE, ROUND = 0, 1  # block shapes as drawn from above (a round one is a cylinder; its footprint stays square)
NEW_COLORS = {"purple": (140, 60, 190), "orange": (240, 130, 30), "cyan": (40, 190, 200), "pink": (240, 120, 180)}
NEW_FLAT_COLORS = {"pink plate": (255, 190, 215), "grey plate": (185, 185, 185)}
FLOOR_RGB = (95, 95, 105)  # what a shifted camera sees beyond the table's edge
# tabletop_lan: the same instruction in other words (<= 46 characters: the policies keep 48 text tokens)
LAN_INSTRUCTIONS = [
    "place the red cube on the blue dish",
    "set the yellow cube on the green dish",
    "move the red cube onto the green plate",
    "place the yellow cube on top of the blue dish",
    "put the green cube on top of the red cube",
    "place the yellow cube onto the blue cube",
    "set the red cube on top of the yellow cube",
    "drop the red cube into the basket",
    "move the blue cube onto the green dish",
    "put the red and blue cubes in the basket",
]
# tabletop_object: one object of the task replaced by one of another colour and/or shape in the same role (the goals
# still name its slot, so the predicate follows it); the instruction names the new object.
# (object slot, old words, new words, colour, shape)
OBJECT_REPLACEMENTS: List[Tuple[int, str, str, Tuple[int, int, int], int]] = [
    (0, "red block", "purple block", NEW_COLORS["purple"], SQUARE),
    (3, "green plate", "pink plate", NEW_FLAT_COLORS["pink plate"], SQUARE),
    (0, "red block", "red cylinder", COLORS["red"], ROUND),
    (2, "blue plate", "grey plate", NEW_FLAT_COLORS["grey plate"], SQUARE),
    (1, "green block", "orange block", NEW_COLORS["orange"], SQUARE),
    (2, "blue block", "blue cylinder", COLORS["blue"], ROUND),
    (0, "red block", "cyan block", NEW_COLORS["cyan"], SQUARE),
    (0, "red block", "orange cylinder", NEW_COLORS["orange"], ROUND),
    (1, "blue block", "purple block", NEW_COLORS["purple"], SQUARE),
    (0, "red block", "pink block", NEW_COLORS["pink"], SQUARE),
]
# tabletop_swap: two objects of the same footprint class trade places (one of them in the task), per task
SWAPS: List[Tuple[int, int]] = [(0, 1), (2, 3), (0, 1), (2, 3), (1, 2), (3, 0), (0, 1), (2, 3), (0, 1), (2, 3)]
# tabletop_task: a task in the same scene that no base task asks for (layout 0 has only two: tasks 0/2 and 1/3 share)
REPLACED_TASKS: List[Tuple[int, str, List[Tuple[int, int]], int]] = [
    (0, "stack the red block on the yellow block", [(0, 1)], 100),
    (0, "stack the yellow block on the red block", [(1, 0)], 100),
    (0, "stack the red block on the yellow block", [(0, 1)], 100),
    (0, "stack the yellow block on the red block", [(1, 0)], 100),
    (1, "stack the blue block on the green block", [(2, 1)], 100),
    (1, "stack the red block on the blue block", [(0, 2)], 100),
    (1, "stack the yellow block on the green block", [(3, 1)], 100),
    (2, "stack the blue block on the red block", [(1, 0)], 100),
    (2, "put the red block on the green plate", [(0, 3)], 100),
    (2, "stack the red block on the blue block", [(0, 1)], 100),
]
CAMERA_SHIFT = (0.04, 0.08)  # tabletop_camera: |shift| of the agent view per axis (table units), random sign
CAMERA_ZOOM = (0.9, 1.1)
LIGHT_GAIN = ((0.55, 0.75), (1.25, 1.45))  # tabletop_light: dimmer or brighter, a colour cast and a light gradient
LIGHT_CAST = 0.15
LIGHT_RAMP = 0.3
NOISE_SIGMA = (6.0, 14.0)  # tabletop_noise: Gaussian sensor noise (of 255) on both views, fresh every step
GRIPPER_RADIUS = (0.15, 0.3)  # tabletop_gripper: start this far from home in xy, at a height in GRIPPER_Z
GRIPPER_Z = (0.1, 0.38)


def suite_variant(suite: str) -> Optional[str]:
    """None for the base suite 'tabletop', 'lan' for 'tabletop_lan', ...; ValueError for any other name."""
    if suite == "tabletop":
        return None
    if suite.startswith("tabletop_") and suite[len("tabletop_"):] in VARIANTS:
        return suite[len("tabletop_"):]
    raise ValueError(f"unknown tabletop suite '{suite}'; choose tabletop or one of: "
                     + ", ".join(f"tabletop_{v}" for v in VARIANTS))


def task_spec(task_id: int, variant: Optional[str] = None) -> Tuple[int, str, List[Tuple[int, int]], int]:
    """(layout, instruction, goals, max_steps) of a task of the base suite or of a variant."""
    layout, text, goals, max_steps = TASKS[task_id]
    if variant == "lan":
        text = LAN_INSTRUCTIONS[task_id]
    elif variant == "object":
        _, old, new, *_ = OBJECT_REPLACEMENTS[task_id]
        text = text.replace(old, new)
    elif variant == "task":
        layout, text, goals, max_steps = REPLACED_TASKS[task_id]
    return layout, text, goals, max_steps


def task_description(task_id: int, variant: Optional[str] = None) -> str:
    return task_spec(task_id, variant)[1]


def task_name(task_id: int, variant: Optional[str] = None) -> str:
    """LIBERO-style task name (the instruction with underscores), used to group trials of a task."""
    return task_description(task_id, variant).replace(" ", "_")


def check_ids(task_id: int, trial_id: int, demo: bool = False) -> None:
    if not 0 <= int(task_id) < NUM_TASKS:
        raise ValueError(f"task_id {task_id} is out of range: the tabletop suite has tasks 0..{NUM_TASKS - 1}")
    if demo and int(trial_id) < 0:
        raise ValueError(f"demo start {trial_id} is out of range: demo starts are numbered 0, 1, 2, ...")
    if not demo and not 0 <= int(trial_id) < NUM_TRIALS:
        raise ValueError(f"trial_id {trial_id} is out of range: each tabletop task has trials 0..{NUM_TRIALS - 1}")


def initial_state(task_id: int, trial_id: int, demo: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Fixed start of (task, trial): object positions (MAX_OBJECTS, 3) and gripper position (3,). Tasks sharing a
    layout share their starts (trial j is the same scene), so only the instruction tells them apart. `demo=True`
    numbers a separate, unbounded set of starts drawn the same way, for demonstrations (LIBERO's demos, too, were
    recorded from other initial states than its 50 evaluation init states)."""
    check_ids(task_id, trial_id, demo)
    layout_id = TASKS[task_id][0]
    return _placement(layout_id, np.random.default_rng([TRIAL_SEED, layout_id, trial_id] + ([1] if demo else [])))


def drawn_state(task_id: int, placement_seed: int) -> np.ndarray:
    """A start drawn from the suite's placement distribution (as the trials and demo starts are) by `placement_seed`,
    from a third stream that neither the trials nor the demo starts use; flattened as reset's "init_states" reads it:
    object positions (MAX_OBJECTS * 3) then the gripper's (3)."""
    check_ids(task_id, 0)
    layout_id = TASKS[task_id][0]
    pos, gripper = _placement(layout_id, np.random.default_rng([TRIAL_SEED, layout_id, int(placement_seed), 2]))
    return np.concatenate([pos.ravel(), gripper])


def _placement(layout_id: int, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """Object positions (MAX_OBJECTS, 3) and gripper position (3,) of layout `layout_id` drawn from `rng`."""
    layout = LAYOUTS[layout_id]
    pos = np.zeros((MAX_OBJECTS, 3))
    nominal = np.array([(x, y) for _, _, x, y in layout])
    half = np.array([FLAT_HALF.get(kind, BLOCK_HALF) for kind, *_ in layout])
    for _ in range(1000):  # rejection sampling: objects stay clear of each other by a 0.04 gap
        xy = nominal + rng.uniform(-JITTER, JITTER, size=nominal.shape)
        gap = np.abs(xy[:, None] - xy[None]).max(-1) - half[:, None] - half[None]
        if (gap[~np.eye(len(layout), dtype=bool)] > 0.04).all():
            break
    else:  # unreachable with the layouts above (nominal spots are far apart); kept as a guard for edits
        raise RuntimeError(f"layout {layout_id}: no valid placement found; move the nominal spots apart")
    pos[: len(layout), :2] = xy
    gripper = np.array([*(np.array(HOME_XY) + rng.uniform(-HOME_JITTER, HOME_JITTER, size=2)), START_Z])
    return pos, gripper


def _clear_spot(pos: np.ndarray, half: np.ndarray, h: float, rng: np.random.Generator) -> np.ndarray:
    """An (x, y) for an object of half-size h on the table, 0.04 clear of the objects (pos, half) already there."""
    for _ in range(1000):
        xy = rng.uniform(h + 0.02, 1.0 - h - 0.02, size=2)
        if (np.abs(pos[:, :2] - xy).max(-1) - half - h > 0.04).all():
            return xy
    raise RuntimeError("no clear spot for the distractor")  # unreachable with the layouts above


def scene(task_id: int, trial_id: int, demo: bool = False, variant: Optional[str] = None) -> Dict[str, Any]:
    """Everything a reset sets for (task, trial) of the base suite or a variant: object `kind`, `color`, `shape`,
    `pos` (MAX_OBJECTS, ...), `gripper` start, `goals`, `max_steps`, `description`, and `view`, the variant's image
    perturbation parameters. A variant's trial j starts from base trial j; its random draws come from
    (VARIANT_SEED, variant, task, trial)."""
    if variant is not None and demo:
        raise ValueError(f"tabletop_{variant} is a robustness variant for evaluation only: it has no demo starts "
                         f"(demos come from the base suite 'tabletop')")
    pos, gripper = initial_state(task_id, trial_id, demo)
    layout_id, description, goals, max_steps = task_spec(task_id, variant)
    layout = LAYOUTS[layout_id]
    kind = np.zeros(MAX_OBJECTS, dtype=np.int64)
    kind[: len(layout)] = [k for k, *_ in layout]
    color = np.zeros((MAX_OBJECTS, 3), dtype=np.uint8)
    color[: len(layout)] = [COLORS.get(name, FLAT_COLORS.get(name)) for _, name, *_ in layout]
    shape = np.zeros(MAX_OBJECTS, dtype=np.int64)
    view: Dict[str, Any] = {}
    out = dict(kind=kind, color=color, shape=shape, pos=pos, gripper=gripper, goals=goals, max_steps=max_steps,
               description=description, view=view)
    if variant is None or variant in ("lan", "task"):
        return out
    rng = np.random.default_rng([VARIANT_SEED, VARIANTS.index(variant), task_id, trial_id])
    if variant == "object":
        slot, _, _, rgb, form = OBJECT_REPLACEMENTS[task_id]
        color[slot], shape[slot] = rgb, form
    elif variant == "swap":
        a, b = SWAPS[task_id]
        pos[[a, b]] = pos[[b, a]]
    elif variant == "distractor":
        n = len(layout)
        half = np.array([FLAT_HALF.get(k, BLOCK_HALF) for k in kind[:n]])
        if rng.random() < 0.5:
            kind[n], name = BLOCK, list(NEW_COLORS)[rng.integers(len(NEW_COLORS))]
            color[n] = NEW_COLORS[name]
        else:
            kind[n], name = PLATE, list(NEW_FLAT_COLORS)[rng.integers(len(NEW_FLAT_COLORS))]
            color[n] = NEW_FLAT_COLORS[name]
        pos[n, :2] = _clear_spot(pos[:n], half, FLAT_HALF.get(int(kind[n]), BLOCK_HALF), rng)
    elif variant == "gripper":
        r, phi = rng.uniform(*GRIPPER_RADIUS), rng.uniform(0, 2 * np.pi)
        xy = np.clip(np.array(HOME_XY) + r * np.array([np.cos(phi), np.sin(phi)]), 0.05, 0.95)
        gripper = np.array([*xy, rng.uniform(*GRIPPER_Z)])
        out["gripper"] = gripper
    elif variant == "camera":
        view["shift"] = rng.uniform(*CAMERA_SHIFT, size=2) * rng.choice([-1.0, 1.0], size=2)
        view["zoom"] = rng.uniform(*CAMERA_ZOOM)
    elif variant == "light":
        view["gain"] = rng.uniform(*LIGHT_GAIN[rng.integers(2)])
        view["cast"] = rng.uniform(1 - LIGHT_CAST, 1 + LIGHT_CAST, size=3)
        view["ramp_angle"] = rng.uniform(0, 2 * np.pi)
    elif variant == "noise":
        view["sigma"] = rng.uniform(*NOISE_SIGMA)
        view["noise_seed"] = int(rng.integers(2**63))
    return out


class TabletopCore:
    """Batched state, physics, success predicates, scripted expert and rendering of N tabletop environments."""

    def __init__(self, num_envs: int, image_size: int = 64, max_steps: Optional[int] = None, expert_noise: float = 0.0,
                 seed: Optional[int] = None, suite: str = "tabletop"):
        if image_size < 16:
            raise ValueError(f"image_size must be >= 16 px, got {image_size}")
        self.n, self.size, self.max_steps_override, self.expert_noise = num_envs, image_size, max_steps, expert_noise
        self.variant = suite_variant(suite)
        self.rng = np.random.default_rng(seed)
        n = num_envs
        self.task_id = np.zeros(n, dtype=np.int64)
        self.trial_id = np.zeros(n, dtype=np.int64)
        self.pos = np.zeros((n, MAX_OBJECTS, 3))
        self.kind = np.zeros((n, MAX_OBJECTS), dtype=np.int64)
        self.color = np.zeros((n, MAX_OBJECTS, 3), dtype=np.uint8)
        self.shape = np.zeros((n, MAX_OBJECTS), dtype=np.int64)
        self.goals = np.full((n, MAX_GOALS, 2), -1, dtype=np.int64)
        self.gripper = np.zeros((n, 3))
        self.closed = np.zeros(n, dtype=bool)
        self.held = np.full(n, -1, dtype=np.int64)
        self.held_offset = np.zeros((n, 3))
        self.steps = np.zeros(n, dtype=np.int64)
        self.max_steps = np.zeros(n, dtype=np.int64)
        self.success = np.zeros(n, dtype=bool)
        self.truncated = np.zeros(n, dtype=bool)
        self.agentview = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
        self.wrist = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
        self.bg_agent = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
        wide = WRIST_ZOOM * image_size + image_size
        self.bg_wrist = np.zeros((n, wide, wide, 3), dtype=np.uint8)
        # image perturbations of the camera / light / noise variants, per env (set at reset from the trial's draw)
        if self.variant == "camera":
            self.camera_index = np.zeros((n, image_size * image_size), dtype=np.int64)
        elif self.variant == "light":
            self.light_agent = np.ones((n, image_size, image_size, 3), dtype=np.float32)
            self.light_wrist = np.ones((n, 3), dtype=np.float32)
        elif self.variant == "noise":
            self.noise_sigma = np.zeros(n)
            self.noise_rng = [np.random.default_rng(0) for _ in range(n)]

    # ---------------------------------------------------------------- reset / step
    def reset(self, idx: np.ndarray, task_ids: Sequence[int], trial_ids: Sequence[int], demo: bool = False,
              init_states: Optional[Sequence[Optional[np.ndarray]]] = None) -> None:
        for k, (i, task, trial) in enumerate(zip(idx, task_ids, trial_ids)):
            sc = scene(int(task), int(trial), demo, self.variant)
            if init_states is not None and init_states[k] is not None:  # a given start (`drawn_state`'s layout)
                state = np.asarray(init_states[k], dtype=np.float64)
                sc["pos"], sc["gripper"] = state[:-3].reshape(MAX_OBJECTS, 3), state[-3:]
            self.task_id[i], self.trial_id[i] = task, trial
            self.pos[i], self.kind[i], self.color[i], self.shape[i] = sc["pos"], sc["kind"], sc["color"], sc["shape"]
            self.goals[i] = -1
            self.goals[i, : len(sc["goals"])] = sc["goals"]
            self.gripper[i] = sc["gripper"]
            self.max_steps[i] = self.max_steps_override or sc["max_steps"]
            self._draw_flats(int(i))
            if sc["view"]:
                self._set_view(int(i), sc["view"])
        self.closed[idx] = False
        self.held[idx] = -1
        self.steps[idx] = 0
        self.success[idx] = False
        self.truncated[idx] = False
        self.render(np.asarray(idx))

    @property
    def done(self) -> np.ndarray:
        return self.success | self.truncated

    def step(self, actions: np.ndarray, envs: Optional[np.ndarray] = None) -> np.ndarray:
        """Advance every unfinished env (of `envs`, default all) by one action; finished envs are absorbing. Returns
        the success reward (N,)."""
        actions = np.asarray(actions, dtype=np.float64)
        if actions.shape != (self.n, 7):
            raise ValueError(f"actions must have shape ({self.n}, 7) (num_envs, 7), got {actions.shape}")
        act = np.flatnonzero(~self.done)
        if envs is not None:
            act = np.intersect1d(act, envs)
        if act.size == 0:
            return np.zeros(self.n, dtype=np.float32)
        a = np.clip(np.nan_to_num(actions[act]), -1.0, 1.0)
        grip = self.gripper[act] + a[:, :3] * STEP_SIZE
        grip[:, :2] = np.clip(grip[:, :2], 0.0, 1.0)
        grip[:, 2] = np.clip(grip[:, 2], 0.0, MAX_Z)
        self.gripper[act] = grip
        close = a[:, 6] > 0
        was_closed = self.closed[act]
        held = self.held[act]
        # a held block follows the gripper
        carrying = act[held >= 0]
        if carrying.size:
            self.pos[carrying, self.held[carrying]] = self.gripper[carrying] + self.held_offset[carrying]
        self._grasp(act[close & ~was_closed & (held < 0)])
        for i in act[~close & was_closed & (held >= 0)]:
            self._release(i)
        self.closed[act] = close
        self.steps[act] += 1
        newly = act[self._goals_met(act)]
        reward = np.zeros(self.n, dtype=np.float32)
        reward[newly] = 1.0
        self.success[newly] = True
        self.truncated[act] = ~self.success[act] & (self.steps[act] >= self.max_steps[act])
        self.render(act)
        return reward

    def _grasp(self, idx: np.ndarray) -> None:
        """Closing fingers pick up the top-most block between them (xy inside the block, tip within its height)."""
        if idx.size == 0:
            return
        g = self.gripper[idx][:, None, :]
        p = self.pos[idx]
        near = (
            (self.kind[idx] == BLOCK)
            & (np.abs(p[:, :, 0] - g[:, :, 0]) < BLOCK_HALF)
            & (np.abs(p[:, :, 1] - g[:, :, 1]) < BLOCK_HALF)
            & (g[:, :, 2] >= p[:, :, 2])
            & (g[:, :, 2] <= p[:, :, 2] + BLOCK_HEIGHT + 0.02)
        )
        hit = near.any(axis=1)
        j = np.argmax(np.where(near, p[:, :, 2], -np.inf), axis=1)
        i = idx[hit]
        self.held[i] = j[hit]
        self.held_offset[i] = self.pos[i, j[hit]] - self.gripper[i]

    def _release(self, i: int) -> None:
        j = int(self.held[i])
        self.held[i] = -1
        p = self.pos[i]
        others = (self.kind[i] == BLOCK) & (np.arange(MAX_OBJECTS) != j)
        overlap = others & (np.abs(p[:, 0] - p[j, 0]) < 2 * BLOCK_HALF) & (np.abs(p[:, 1] - p[j, 1]) < 2 * BLOCK_HALF)
        overlap &= p[:, 2] < p[j, 2]  # only blocks below the released one can support it
        p[j, 2] = (p[overlap, 2] + BLOCK_HEIGHT).max() if overlap.any() else 0.0

    def _on(self, idx: np.ndarray, obj: np.ndarray, sup: np.ndarray) -> np.ndarray:
        """Predicate on(obj, support) for envs idx: resting (not held) on the plate/basket or on top of the block."""
        p_obj = self.pos[idx, obj]
        p_sup = self.pos[idx, sup]
        kind_sup = self.kind[idx, sup]
        d = np.abs(p_obj[:, :2] - p_sup[:, :2]).max(axis=1)
        half = np.where(kind_sup == BLOCK, BLOCK_HALF, np.where(kind_sup == PLATE, FLAT_HALF[PLATE], FLAT_HALF[BASKET]))
        # on a block: exactly on its top; on a plate: on the table; in the basket: anywhere inside (blocks may pile up)
        height_ok = np.where(kind_sup == BLOCK, np.abs(p_obj[:, 2] - p_sup[:, 2] - BLOCK_HEIGHT) < 1e-6,
                             (p_obj[:, 2] < 1e-6) | (kind_sup == BASKET))
        return (self.held[idx] != obj) & (d <= half) & height_ok

    def _goals_met(self, idx: np.ndarray) -> np.ndarray:
        met = np.ones(idx.size, dtype=bool)
        for g in range(MAX_GOALS):
            obj, sup = self.goals[idx, g, 0], self.goals[idx, g, 1]
            active = obj >= 0
            ok = self._on(idx, np.maximum(obj, 0), np.maximum(sup, 0))
            met &= ~active | ok
        return met

    # ---------------------------------------------------------------- scripted expert
    def expert_action(self) -> np.ndarray:
        """Reactive pick-and-place expert for the first unmet goal of every env, plus Gaussian noise on xyz."""
        n = self.n
        idx = np.arange(n)
        # current subgoal: first goal not yet satisfied (the last one when all are met)
        sub = np.zeros(n, dtype=np.int64)
        for g in range(MAX_GOALS - 1, -1, -1):
            obj, sup = self.goals[:, g, 0], self.goals[:, g, 1]
            active = obj >= 0
            unmet = active & ~self._on(idx, np.maximum(obj, 0), np.maximum(sup, 0))
            sub = np.where(unmet, g, sub)
        obj = self.goals[idx, sub, 0]
        sup = self.goals[idx, sub, 1]
        g = self.gripper
        p_obj = self.pos[idx, obj]
        p_sup = self.pos[idx, sup]
        holding_obj = self.held == obj
        # where to go: above the object to pick it, or above the support to place it
        dest = np.where(holding_obj[:, None], p_sup, p_obj).copy()
        # several blocks into the basket: each goal has its own spot so they land side by side
        n_goals = (self.goals[:, :, 0] >= 0).sum(axis=1)
        in_basket = holding_obj & (self.kind[idx, sup] == BASKET) & (n_goals > 1)
        dest[in_basket, 0] += (sub[in_basket] - 0.5 * (n_goals[in_basket] - 1)) * 2.2 * BLOCK_HALF
        place_z = np.where(self.kind[idx, sup] == BLOCK, p_sup[:, 2] + BLOCK_HEIGHT, 0.0) + BLOCK_HEIGHT / 2 + 0.01
        grasp_z = p_obj[:, 2] + BLOCK_HEIGHT / 2
        low_z = np.where(holding_obj, place_z, grasp_z)
        xy_err = dest[:, :2] - g[:, :2]
        err = np.abs(xy_err).max(axis=1)
        aligned, near = err < 0.02, err < 0.04
        target = g.copy()
        # travel at hover height; move in xy only once high enough (or already close), then descend
        high = g[:, 2] >= HOVER_Z - 0.03
        target[:, :2] = np.where((high | near)[:, None], dest[:, :2], g[:, :2])
        target[:, 2] = np.where(aligned, low_z, np.where(near, g[:, 2], HOVER_Z))
        at_low = aligned & (np.abs(g[:, 2] - low_z) < 0.02)
        grip = np.where(holding_obj, 1.0, -1.0)
        grip = np.where(~holding_obj & at_low, 1.0, grip)  # close on the object
        grip = np.where(holding_obj & at_low, -1.0, grip)  # open over the target
        wrong = (self.held >= 0) & ~holding_obj
        grip = np.where(wrong | (self.closed & (self.held < 0) & ~at_low), -1.0, grip)
        move = np.clip((target - g) / STEP_SIZE, -1.0, 1.0)
        move[(wrong | (self.closed & (self.held < 0)))] = 0.0  # first let go, then move
        if self.expert_noise > 0:
            move = np.clip(move + self.rng.normal(0.0, self.expert_noise, size=move.shape), -1.0, 1.0)
        actions = np.zeros((n, 7), dtype=np.float32)
        actions[:, :3] = move
        actions[:, 6] = grip
        return actions

    # ---------------------------------------------------------------- observations
    def state(self) -> np.ndarray:
        """8-D proprio like LIBERO: eef xyz, eef axis-angle (always 0 here), two gripper finger positions."""
        s = np.zeros((self.n, 8), dtype=np.float32)
        s[:, :3] = self.gripper
        finger = np.where(self.closed, 0.0, 0.04)
        s[:, 6], s[:, 7] = finger, -finger
        return s

    def _set_view(self, i: int, view: Dict[str, Any]) -> None:
        """Env i's image perturbation from its trial's draw (`scene(...)["view"]`), applied by `_perturb_views`."""
        S = self.size
        u = (np.arange(S) + 0.5) / S - 0.5  # pixel centres, relative to the image centre
        if self.variant == "camera":  # the agent camera moved by `shift` and zoomed: resample the rendered view
            (dx, dy), zoom = view["shift"], view["zoom"]
            ix = np.floor((0.5 + dx + u / zoom) * S).astype(np.int64)
            iy = np.floor((0.5 + dy + u / zoom) * S).astype(np.int64)
            inside = ((iy >= 0) & (iy < S))[:, None] & ((ix >= 0) & (ix < S))[None, :]
            self.camera_index[i] = np.where(inside, iy[:, None] * S + ix[None, :], S * S).ravel()  # S*S: the floor
        elif self.variant == "light":  # gain x colour cast, and a linear light gradient across the agent view
            a = view["ramp_angle"]
            ramp = 1.0 + LIGHT_RAMP * (u[None, :] * np.cos(a) + u[:, None] * np.sin(a))
            self.light_wrist[i] = view["gain"] * view["cast"]
            self.light_agent[i] = ramp[:, :, None] * self.light_wrist[i]
        elif self.variant == "noise":
            self.noise_sigma[i] = view["sigma"]
            self.noise_rng[i] = np.random.default_rng(view["noise_seed"])

    def _perturb_views(self, idx: np.ndarray) -> None:
        """Apply the camera / light / noise variant to the freshly rendered views of envs idx (the base suite and the
        other variants render untouched)."""
        S = self.size
        if self.variant == "camera":
            k = len(idx)
            flat = np.empty((k * S * S + 1, 3), dtype=np.uint8)  # every view's pixels, then one floor pixel
            flat[:-1] = self.agentview[idx].reshape(k * S * S, 3)
            flat[-1] = FLOOR_RGB
            index = self.camera_index[idx] + (np.arange(k) * S * S)[:, None]
            index[self.camera_index[idx] == S * S] = k * S * S
            self.agentview[idx] = flat[index].reshape(k, S, S, 3)
        elif self.variant == "light":
            self.agentview[idx] = np.clip(np.rint(self.agentview[idx] * self.light_agent[idx]), 0, 255)
            self.wrist[idx] = np.clip(np.rint(self.wrist[idx] * self.light_wrist[idx][:, None, None]), 0, 255)
        elif self.variant == "noise":
            for i in idx.tolist():
                noise = self.noise_rng[i].standard_normal((2, S, S, 3), dtype=np.float32)
                noise *= np.float32(self.noise_sigma[i])
                self.agentview[i] = np.clip(np.rint(self.agentview[i] + noise[0]), 0, 255)
                self.wrist[i] = np.clip(np.rint(self.wrist[i] + noise[1]), 0, 255)

    def _draw_flats(self, i: int) -> None:
        """Static background of env i (table, plates, basket): agent view, and the wrist view's 3x-zoomed table with
        S/2 of padding so that a wrist image is one crop around the gripper."""
        S, Z = self.size, WRIST_ZOOM
        for img, scale, pad in ((self.bg_agent[i], S, 0), (self.bg_wrist[i], Z * S, S // 2)):
            img[:] = TABLE_RGB
            ring = max(1, round(scale / 32))
            for j in range(MAX_OBJECTS):
                k = self.kind[i, j]
                if k not in FLAT_HALF:
                    continue
                x, y, h = self.pos[i, j, 0], self.pos[i, j, 1], FLAT_HALF[k]
                y0, y1, x0, x1 = (int(round(v * scale)) + pad for v in (y - h, y + h, x - h, x + h))
                c = self.color[i, j]
                if k == BASKET:  # a ring: four walls
                    img[y0:y1, x0:x0 + ring] = c
                    img[y0:y1, x1 - ring:x1] = c
                    img[y0:y0 + ring, x0:x1] = c
                    img[y1 - ring:y1, x0:x1] = c
                else:
                    img[y0:y1, x0:x1] = c

    def render(self, idx: np.ndarray) -> None:
        """Agent view (top-down; blocks and gripper grow with height; gripper shadow on the table) and wrist view (3x
        zoom centred on the gripper, fingers fixed in the image), for envs idx."""
        if len(idx) == 0:
            return
        S, Z = self.size, WRIST_ZOOM
        idx = np.asarray(idx)
        self.agentview[idx] = self.bg_agent[idx]
        grip = self.gripper[idx]
        start = np.rint(grip[:, :2] * Z * S).astype(np.int64).tolist()
        for r, i in enumerate(idx.tolist()):
            x0, y0 = start[r]
            self.wrist[i] = self.bg_wrist[i, y0:y0 + S, x0:x0 + S]
        pos = self.pos[idx]
        kind = self.kind[idx]
        is_block = kind == BLOCK
        n_blocks = int(is_block.sum(axis=1).max())
        # blocks of each env from low to high (non-blocks sorted last and skipped)
        order = np.argsort(np.where(is_block, pos[:, :, 2], np.inf), axis=1, kind="stable")[:, :n_blocks]
        rows = np.arange(len(idx))[:, None]
        bpos, valid = pos[rows, order], is_block[rows, order]
        bcol = self.color[idx][rows, order]
        h = BLOCK_HALF * (1.0 + 1.5 * bpos[:, :, 2])
        gs = 0.035 * (1.0 + 1.5 * grip[:, 2])
        gap = np.where(self.closed[idx], 0.3, 1.0) * gs
        fingers = lambda gx, gy, gs, gap: np.stack([  # noqa: E731  (left and right finger boxes)
            np.stack([gy - gs, gy + gs, gx - gap - 0.3 * gs, gx - gap + 0.3 * gs], -1),
            np.stack([gy - gs, gy + gs, gx + gap - 0.3 * gs, gx + gap + 0.3 * gs], -1)], 1)
        views = []
        for img, center, mag in ((self.agentview, np.full_like(grip[:, :2], 0.5), 1.0), (self.wrist, grip[:, :2], Z)):
            cx = (bpos[:, :, 0] - center[:, None, 0]) * mag + 0.5
            cy = (bpos[:, :, 1] - center[:, None, 1]) * mag + 0.5
            boxes = np.stack([cy - h * mag, cy + h * mag, cx - h * mag, cx + h * mag], -1)
            gx = (grip[:, 0] - center[:, 0]) * mag + 0.5
            gy = (grip[:, 1] - center[:, 1]) * mag + 0.5
            px = lambda b: np.clip(np.rint(b * S), 0, S).astype(np.int64).tolist()  # noqa: E731
            if mag == 1.0:  # gripper and its shadow on the table
                shadow = px(np.stack([gy - 0.02, gy + 0.02, gx - 0.02, gx + 0.02], -1))
                f = fingers(gx, gy, gs, gap)
            else:  # the wrist camera rides on the gripper: fingers at a fixed place and size, shadow hidden
                shadow = None
                f = fingers(np.full_like(gx, 0.5), np.full_like(gy, 0.62), np.full_like(gs, 0.18), gap / gs * 0.18)
            views.append((img, px(boxes), shadow, px(f)))
        valid_l = valid.tolist()
        round_l = (self.shape[idx][rows, order] == ROUND).tolist() if self.variant == "object" else None
        for r, i in enumerate(idx.tolist()):
            colors = bcol[r]
            for img, boxes, shadow, f in views:
                im = img[i]
                if shadow is not None:
                    y0, y1, x0, x1 = shadow[r]
                    im[y0:y1, x0:x1] = SHADOW_RGB
                for j, ok in enumerate(valid_l[r]):
                    if ok:
                        y0, y1, x0, x1 = boxes[r][j]
                        if round_l is not None and round_l[r][j]:  # a cylinder seen from above: a disc
                            im[y0:y1, x0:x1][_disc(y1 - y0, x1 - x0)] = colors[j]
                        else:
                            im[y0:y1, x0:x1] = colors[j]
                for y0, y1, x0, x1 in f[r]:
                    im[y0:y1, x0:x1] = GRIPPER_RGB
        if self.variant in ("camera", "light", "noise"):
            self._perturb_views(idx)


@functools.lru_cache(maxsize=None)
def _disc(h: int, w: int) -> np.ndarray:
    """Boolean mask of the ellipse inscribed in an h x w box (pixel centres inside)."""
    y = (np.arange(h) + 0.5) / max(h, 1) - 0.5
    x = (np.arange(w) + 0.5) / max(w, 1) - 0.5
    return y[:, None] ** 2 + x[None, :] ** 2 <= 0.25


def _observation_space(size: int) -> gym.spaces.Dict:
    img = gym.spaces.Box(0, 255, (size, size, 3), dtype=np.uint8)
    return gym.spaces.Dict({
        "agentview": img, "wrist": img,
        "state": gym.spaces.Box(-np.inf, np.inf, (8,), dtype=np.float32),
    })


ACTION_SPACE = gym.spaces.Box(-1.0, 1.0, (7,), dtype=np.float32)


class TabletopVectorEnv(VectorEnv):
    """N tabletop envs stepped together in numpy; `reset(options={"task_ids": [...], "trial_ids": [...]})`; `suite`
    names the base suite or a robustness variant (`tabletop_lan`, ...)."""

    metadata = {"autoreset_mode": AutoresetMode.DISABLED, "render_modes": []}

    def __init__(self, num_envs: int, image_size: int = 64, max_steps: Optional[int] = None, expert_noise: float = 0.0,
                 seed: Optional[int] = None, suite: str = "tabletop"):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self.core = TabletopCore(num_envs, image_size, max_steps, expert_noise, seed, suite)
        self.single_observation_space = _observation_space(image_size)
        self.single_action_space = ACTION_SPACE
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.num_tasks = NUM_TASKS
        self.num_trials = NUM_TRIALS
        self.task_descriptions = [task_description(t, self.core.variant) for t in range(NUM_TASKS)]
        self.task_names = [task_name(t, self.core.variant) for t in range(NUM_TASKS)]
        self.pipeline = False  # collect_rollouts' default (env.pipeline): in-process numpy has no time to overlap
        self._chunks: Dict[tuple, Dict[str, Any]] = {}

    def _obs(self) -> Dict[str, np.ndarray]:
        c = self.core
        return {"agentview": c.agentview.copy(), "wrist": c.wrist.copy(), "state": c.state()}

    def _info(self) -> Dict[str, Any]:
        c = self.core
        return {
            "success": c.success.copy(),
            "task_id": c.task_id.copy(),
            "trial_id": c.trial_id.copy(),
            "task_description": np.array([self.task_descriptions[t] for t in c.task_id], dtype=object),
            "task_name": np.array([self.task_names[t] for t in c.task_id], dtype=object),
            "max_steps": c.max_steps.copy(),
            "elapsed_steps": c.steps.copy(),
        }

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        """Reset envs to chosen (task, trial) starts: options {"task_ids", "trial_ids"} (length N, or the masked count
        with "reset_mask" (N,) bool to reset only some envs); "demo": True picks the demo starts instead of the
        trials; "init_states" (one per env reset, None = its trial's) starts an env from a given state instead (the
        base suite's layout of the task, objects and gripper where `drawn_state` puts them)."""
        if seed is not None:
            self.core.rng = np.random.default_rng(seed)
        options = dict(options or {})
        mask = options.get("reset_mask")
        idx = np.arange(self.num_envs) if mask is None else np.flatnonzero(np.asarray(mask, dtype=bool))
        task_ids = options.get("task_ids", [0] * len(idx))
        trial_ids = options.get("trial_ids", [0] * len(idx))
        if len(task_ids) != len(idx) or len(trial_ids) != len(idx):
            raise ValueError(
                f"reset needs one task id and one trial id per env being reset ({len(idx)}); "
                f"got {len(task_ids)} task_ids and {len(trial_ids)} trial_ids"
            )
        demo = bool(options.get("demo", False))
        for t, j in zip(task_ids, trial_ids):
            check_ids(t, j, demo)
        init_states = options.get("init_states")
        if init_states is not None:
            if self.core.variant is not None:
                raise ValueError(f"reset option init_states is for the base suite 'tabletop', not the robustness "
                                 f"variant 'tabletop_{self.core.variant}'")
            if len(init_states) != len(idx):
                raise ValueError(f"reset needs one init state (or None) per env being reset ({len(idx)}); got "
                                 f"{len(init_states)}")
        self.core.reset(idx, task_ids, trial_ids, demo, init_states)
        return self._obs(), self._info()

    def step(self, actions: np.ndarray):
        reward = self.core.step(actions)
        return self._obs(), reward, self.core.success.copy(), self.core.truncated.copy(), self._info()

    def step_chunk_async(self, env_ids: np.ndarray, actions: np.ndarray, keep_frames: bool = False) -> None:
        """Run the chunk now (numpy, in-process: nothing to overlap); `step_chunk_wait(env_ids)` returns it."""
        self._chunks[tuple(np.asarray(env_ids).tolist())] = self.step_chunk(env_ids, actions, keep_frames)

    def step_chunk_wait(self, env_ids: np.ndarray) -> Dict[str, Any]:
        return self._chunks.pop(tuple(np.asarray(env_ids).tolist()))

    def reset_envs_async(self, env_ids: np.ndarray, options: Dict[str, Any]) -> None:
        """Reset envs `env_ids` alone, now (options: one entry per env of env_ids); `reset_envs_wait` returns them."""
        ids = np.asarray(env_ids, dtype=np.int64)
        order = np.argsort(ids)  # reset_mask takes the masked envs' entries in env order
        mask = np.zeros(self.num_envs, dtype=bool)
        mask[ids] = True
        self.reset(options={**{k: [v[j] for j in order] for k, v in options.items()}, "reset_mask": mask})
        obs, info = self._obs(), self._info()
        self._chunks[("reset",) + tuple(ids.tolist())] = (
            {k: v[ids] for k, v in obs.items()},
            {"task_name": info["task_name"][ids].tolist(), "task_description": info["task_description"][ids].tolist(),
             "reset_s": [0.0] * len(ids), "build_s": [0.0] * len(ids)})

    def reset_envs_wait(self, env_ids: np.ndarray) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
        return self._chunks.pop(("reset",) + tuple(np.asarray(env_ids).tolist()))

    def drain(self) -> None:
        """Drop the results a stopped rollout left behind."""
        self._chunks.clear()

    def envs_ready(self, env_ids: np.ndarray) -> np.ndarray:
        """Everything runs at once in-process: always ready."""
        return np.ones(len(env_ids), dtype=bool)

    def wait_envs(self, env_ids: np.ndarray, timeout: Optional[float] = None) -> None:
        return None

    def step_chunk(self, env_ids: np.ndarray, actions: np.ndarray, keep_frames: bool = False) -> Dict[str, Any]:
        """Envs `env_ids` (k,) execute their action chunks (k, chunk, 7) step by step, each stopping when its episode
        ends; the other envs are not touched. -> per env (k,): obs after its last step, summed reward, steps taken,
        terminated, truncated, success, invalid (always False), and with `keep_frames` its agent views, one per step."""
        t0 = time.perf_counter()
        c, ids = self.core, np.asarray(env_ids, dtype=np.int64)
        actions = np.asarray(actions, dtype=np.float32)
        k = len(ids)
        if actions.ndim != 3 or actions.shape[0] != k or actions.shape[2] != 7:
            raise ValueError(f"actions must have shape ({k}, chunk, 7), got {actions.shape}")
        full = np.zeros((self.num_envs, 7), dtype=np.float32)
        live = ~c.done[ids]
        reward, steps = np.zeros(k, dtype=np.float32), np.zeros(k, dtype=np.int64)
        frames: List[List[np.ndarray]] = [[] for _ in range(k)]
        for s in range(actions.shape[1]):
            if not live.any():
                break
            full[ids] = actions[:, s]
            reward += c.step(full, ids[live])[ids]
            steps += live
            if keep_frames:
                for j in np.flatnonzero(live):
                    frames[j].append(c.agentview[ids[j]].copy())
            live &= ~c.done[ids]
        out = {"obs": {"agentview": c.agentview[ids], "wrist": c.wrist[ids], "state": c.state()[ids]},
               "reward": reward, "steps": steps, "terminated": c.success[ids].copy(),
               "truncated": c.truncated[ids].copy(), "success": c.success[ids].copy(),
               "invalid": np.zeros(k, dtype=bool)}
        if keep_frames:
            out["frames"] = [np.stack(f) if f else np.zeros((0,) + c.agentview.shape[1:], np.uint8) for f in frames]
        out["busy_s"] = np.full(k, (time.perf_counter() - t0) / max(k, 1))  # the chunk's seconds, shared out
        return out

    def expert_action(self) -> np.ndarray:
        """The scripted expert's action (N, 7) for the current state, with `expert_noise` on the xyz deltas."""
        return self.core.expert_action()


class TabletopEnv(gym.Env):
    """One tabletop env: `reset(options={"task_id": k, "trial_id": j})`; absorbing after success or truncation."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, image_size: int = 64, max_steps: Optional[int] = None, expert_noise: float = 0.0,
                 env_index: int = 0, render_mode: Optional[str] = None, suite: str = "tabletop"):
        self.core = TabletopCore(1, image_size, max_steps, expert_noise, suite=suite)
        self.env_index = env_index
        self.render_mode = render_mode
        self.observation_space = _observation_space(image_size)
        self.action_space = ACTION_SPACE
        self.num_tasks, self.num_trials = NUM_TASKS, NUM_TRIALS
        self.task_descriptions = [task_description(t, self.core.variant) for t in range(NUM_TASKS)]
        self.task_names = [task_name(t, self.core.variant) for t in range(NUM_TASKS)]

    @property
    def max_steps(self) -> int:
        return int(self.core.max_steps[0])

    def _obs(self) -> Dict[str, np.ndarray]:
        return {"agentview": self.core.agentview[0].copy(), "wrist": self.core.wrist[0].copy(), "state": self.core.state()[0]}

    def _info(self) -> Dict[str, Any]:
        t = int(self.core.task_id[0])
        return {"success": bool(self.core.success[0]), "task_id": t, "trial_id": int(self.core.trial_id[0]),
                "task_description": self.task_descriptions[t], "task_name": self.task_names[t]}

    def reset(self, *, seed: Optional[int] = None, options: Optional[Dict[str, Any]] = None):
        super().reset(seed=seed)
        if seed is not None:
            self.core.rng = np.random.default_rng(seed)
        options = options or {}
        if "task_ids" in options:  # vectorised form: this env's own entry
            task, trial = options["task_ids"][self.env_index], options["trial_ids"][self.env_index]
        else:
            task, trial = options.get("task_id", 0), options.get("trial_id", 0)
        check_ids(task, trial)
        self.core.reset(np.array([0]), [task], [trial])
        return self._obs(), self._info()

    def step(self, action: np.ndarray):
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (7,):
            raise ValueError(f"action must have shape (7,) (Δx Δy Δz Δroll Δpitch Δyaw gripper), got {action.shape}")
        reward = self.core.step(action[None])
        return self._obs(), float(reward[0]), bool(self.core.success[0]), bool(self.core.truncated[0]), self._info()

    def expert_action(self) -> np.ndarray:
        return self.core.expert_action()[0]

    def render(self) -> np.ndarray:
        return self.core.agentview[0].copy()
