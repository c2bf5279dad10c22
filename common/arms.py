"""Arms over seeds, in numbers: one run's row from its metrics rows, its curve against env steps, and an arm's end
against its start or against another arm on one held-out set, pooled over the seeds (the statistics of the
benchmarks' tables: libero_learning.py, tabletop_default.py, compare_algorithms.py and its presets; and of the tests
that check the numbers docs/results.md quotes), and the tables built from them that libero_learning.py (seeds_table,
arms_table) and tabletop_default.py (plateau_table, pairs_table) print, checked on hand data by
tests/test_libero_learning_table.py and tests/test_tabletop_default_table.py. The bootstraps and the permutation test
themselves are common/heldout.py's."""
from __future__ import annotations

import math
import os
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from common import heldout

SIGNALS = ("train/explained_variance", "train/value_loss",  # GAE-PPO: does the value head learn?
           "train/demo_step_fraction",  # LUFFY: the demos' share of the update's steps
           "train/flow_sar_weight_std",  # FlowSAR: how unevenly the credit weights spread
           "train/entropy")  # every script: the policy's token entropy (sharpening)


def mean(values: List[float]) -> float:
    return sum(values) / max(1, len(values))


# ---------------------------------------------------------------------------------------- one run's row

def summary(rows: List[Dict], last: int = 3) -> Dict:
    """One run's row of the table: held-out greedy / sampled success at the start (iteration 0), the best and the mean
    of the last `last` evaluations, practice success over the first and last `last` iterations, env steps, and the
    wall time (training + evaluation seconds from metrics.jsonl: iteration 1's time includes evaluation 0)."""
    evals = [r for r in rows if "val/success_rate" in r]
    practice = [r["rollout/success_rate"] for r in rows if "rollout/success_rate" in r]
    out: Dict = {"eval_iterations": [r["iteration"] for r in evals],
                 "env_steps": [r.get("charts/env_steps", 0.0) for r in evals],
                 "practice_first": round(mean(practice[:last]), 3), "practice_last": round(mean(practice[-last:]), 3),
                 "total_env_steps": int(max(r.get("charts/env_steps", 0.0) for r in rows)),
                 "wall_s": round(sum(r.get("time/iteration", 0.0) for r in rows)
                                 + sum(r.get("time/eval", 0.0) for r in evals if r["iteration"] > 0))}
    for key in SIGNALS:  # the algorithm's own signals, first -> last `last` iterations (docs/metrics.md)
        values = [r[key] for r in rows if key in r]
        if values:
            out.setdefault("signals", {})[key] = [round(mean(values[:last]), 4), round(mean(values[-last:]), 4)]
    if any("demos/in_update" in r for r in rows):  # LUFFY: the demonstrations its updates trained on
        out["demo_episodes"] = int(sum(r.get("demos/in_update", 0.0) for r in rows))
        out["demos_dropped"] = int(sum(r.get("demos/dropped", 0.0) for r in rows))
    for name, key in (("greedy", "val/success_rate"), ("sampled", "val/sampled_success_rate")):
        values = [round(r.get(key, float("nan")), 3) for r in evals]
        out[name] = values
        out[name + "_start"], out[name + "_best"] = values[0], max(values)
        out[name + "_last"] = round(mean(values[-last:]), 3)
    return out


def seeds_table(results: Dict[str, Dict[int, Dict]]) -> List[str]:
    """benchmarks/libero_learning.py's --reward table (markdown lines), `results`: arm -> seed -> summary(rows): per
    arm and seed, then the mean over seeds of every number, start / best / mean of the last three evaluations."""
    lines = ["| arm | seed | held-out greedy: start / best / last 3 | held-out sampled: start / best / last 3 | "
             "practice, first 3 -> last 3 iterations | env steps | wall |", "|---|---|---|---|---|---|---|"]
    for arm, seeds in results.items():
        rows = list(seeds.items())
        if len(rows) > 1:  # the mean over seeds of every number (the per-evaluation lists are not in the table)
            first = rows[0][1]
            rows.append(("mean", {k: mean([r[k] for r in seeds.values()]) for k, v in first.items()
                                  if isinstance(v, (int, float))}))
        for seed, r in rows:
            lines.append(f"| {arm} | {seed} | {r['greedy_start']:.2f} / {r['greedy_best']:.2f} / "
                         f"{r['greedy_last']:.2f} | {r['sampled_start']:.2f} / {r['sampled_best']:.2f} / "
                         f"{r['sampled_last']:.2f} | {r['practice_first']:.2f} -> {r['practice_last']:.2f} | "
                         f"{int(r['total_env_steps']):,} | {r['wall_s'] / 60:.0f} min |")
    return lines


WINDOW = 10  # iterations at each end for practice success and entropy (plateau_measures)


def series(rows: Sequence[dict], key: str) -> List[float]:
    return [float(r[key]) for r in rows if key in r and r[key] is not None and not math.isnan(float(r[key]))]


def plateau_measures(rows: Sequence[dict]) -> Dict[str, float]:
    """Does a run hold what it learns? Its metrics.jsonl rows (iteration 0 is the evaluation before any update) as
    practice success over the first and last WINDOW iterations, held-out greedy (and sampled) success at the start, its
    best and the mean of the last three evaluations, token entropy at both ends, env steps, and the checks: practice
    does not fall, the last three evaluations are within 0.1 of the best."""
    train = [r for r in rows if r.get("iteration", 0) > 0 and "rollout/success_rate" in r]
    practice, entropy = series(train, "rollout/success_rate"), series(train, "train/entropy")
    greedy, sampled = series(rows, "val/success_rate"), series(rows, "val/sampled_success_rate")
    m = {"practice_first": np.mean(practice[:WINDOW]), "practice_last": np.mean(practice[-WINDOW:]),
         "greedy_start": greedy[0], "greedy_best": max(greedy), "greedy_last3": np.mean(greedy[-3:]),
         "entropy_first": np.mean(entropy[:WINDOW]), "entropy_last": np.mean(entropy[-WINDOW:]),
         "env_steps": max(series(rows, "charts/env_steps") or [0.0])}
    if sampled:
        m.update(sampled_start=sampled[0], sampled_last3=np.mean(sampled[-3:]))
        m.update(sampled_best=max(sampled))
        m["sampled_holds"] = float(m["sampled_best"] - m["sampled_last3"] <= 0.1 + 1e-9)
    m["practice_holds"] = float(m["practice_last"] >= m["practice_first"])
    m["greedy_holds"] = float(m["greedy_best"] - m["greedy_last3"] <= 0.1 + 1e-9)
    m["evaluations"] = float(len(greedy))
    return {k: float(v) for k, v in m.items()}


def false_alarm(p: float, evaluations: int, trials: int, sims: int = 100_000, seed: int = 0) -> float:
    """How often a run on a plateau fails the held-out check (mean of the last three evaluations within 0.1 of the
    best) by evaluation noise alone: each of `evaluations` evaluations scores `trials` episodes that succeed
    independently with probability p. A fixed policy's greedy outcomes on fixed states do not change, but the weights
    move between evaluations and borderline states flip; outcomes that re-draw every time, with one p for every
    state, are the most noise a plateau at p can have, so this is the check's worst-case false-alarm rate (13
    evaluations of 20 trials: 0.65 at p = 0.8)."""
    scores = np.random.default_rng(seed).binomial(trials, p, size=(sims, evaluations)) / trials
    return float(np.mean(scores.max(axis=1) - scores[:, -3:].mean(axis=1) > 0.1 + 1e-9))


def plateau_table(tasks: Sequence[int], rows: Sequence[Dict[str, float]]) -> List[str]:
    """benchmarks/tabletop_default.py's table (markdown lines): per task its run's plateau_measures (plus `minutes`),
    the mean over tasks with how many pass each check, then the held-out check's false-alarm rate at the runs' number
    of greedy evaluations."""
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    lines = ["| task | practice first 10 -> last 10 | held-out greedy start / best / last 3 | held-out sampled start "
             "/ best / last 3 | token entropy first 10 -> last 10 | env steps | minutes | practice holds | greedy last "
             "3 >= best - 0.1 | sampled last 3 >= best - 0.1 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for task, m in zip(tasks, rows):
        sampled = (f"{m['sampled_start']:.2f} / {m['sampled_best']:.2f} / {m['sampled_last3']:.2f}"
                   if "sampled_start" in m else "")
        lines.append(f"| {task} | {m['practice_first']:.2f} -> {m['practice_last']:.2f} | {m['greedy_start']:.2f} / "
                     f"{m['greedy_best']:.2f} / {m['greedy_last3']:.2f} | {sampled} | {m['entropy_first']:.2f} -> "
                     f"{m['entropy_last']:.2f} | {m['env_steps'] / 1e3:.0f} k | {m['minutes']:.1f} | "
                     f"{yes(m['practice_holds'])} | {yes(m['greedy_holds'])} | {yes(m.get('sampled_holds'))} |")
    avg = {k: np.mean([m[k] for m in rows]) for k in rows[0]}
    lines.append(f"| mean | {avg['practice_first']:.2f} -> {avg['practice_last']:.2f} | {avg['greedy_start']:.2f} / "
                 f"{avg['greedy_best']:.2f} / {avg['greedy_last3']:.2f} | | {avg['entropy_first']:.2f} -> "
                 f"{avg['entropy_last']:.2f} | {avg['env_steps'] / 1e3:.0f} k | {avg['minutes']:.1f} | "
                 + " | ".join(f"{int(sum(m.get(k, 0) for m in rows))} of {len(rows)}"
                              for k in ("practice_holds", "greedy_holds", "sampled_holds")) + " |")
    evaluations = int(max(m["evaluations"] for m in rows))
    return lines + ["", "The held-out check's noise: a plateau whose outcomes re-draw at every evaluation fails it "
                    "with probability " + ", ".join(f"{false_alarm(p, evaluations, 20):.2f} at p = {p}"
                                                    for p in (0.6, 0.7, 0.8, 0.9))
                    + f" ({evaluations} greedy evaluations of 20 trials; sampled evaluations have 20 x "
                    f"eval.samples_per_trial episodes: {false_alarm(0.7, evaluations, 160):.2f} at p = 0.7 with 160)"]


def pairs_table(tasks: Sequence[int], ends: Sequence[Dict[str, Dict]]) -> List[str]:
    """benchmarks/tabletop_default.py's held-out table (markdown lines): per task the SFT start -> the final policy,
    greedy and sampled (`ends`: per task, mode -> evaluate.py --paired's record), and the mean over tasks with how
    many tasks' intervals lie above and below 0."""
    lines = ["| task | greedy | sampled |", "|---|---|---|"]
    lines += [f"| {task} | {fmt_pair(e['greedy'])} | {fmt_pair(e['sampled'])} |" for task, e in zip(tasks, ends)]
    return lines + ["| mean | " + " | ".join(f"{np.mean([e[m]['mean_a'] for e in ends]):.2f} -> "
                                             f"{np.mean([e[m]['mean_b'] for e in ends]):.2f}, "
                                             f"{np.mean([e[m]['diff'] for e in ends]):+.2f}; above 0: "
                                             f"{sum(e[m]['low'] > 0 for e in ends)} of {len(ends)}, below 0: "
                                             f"{sum(e[m]['high'] < 0 for e in ends)}" for m in ("greedy", "sampled"))
                    + " |"]


# ---------------------------------------------------------------------- curves against env steps

def steps_to_reach(rows: List[Dict[str, float]], metric: str, target: float, hold: int = 1) -> Optional[float]:
    """Cumulative env steps at the first evaluation that starts `hold` evaluations in a row with `metric` >= target
    (None if never; a run that ends before `hold` evaluations have passed has not held it)."""
    evals = [r for r in rows if r.get(metric) is not None]  # a NaN is logged as null
    for i in range(len(evals) - hold + 1):
        if all(r[metric] >= target for r in evals[i:i + hold]):
            return evals[i].get("charts/env_steps", 0.0)
    return None


def curve(rows: List[Dict[str, float]], metric: str):
    """(cumulative env steps, metric) at the rows that logged `metric` (a NaN, logged as null, is left out)."""
    xs = [r.get("charts/env_steps", 0.0) for r in rows if r.get(metric) is not None]
    ys = [r[metric] for r in rows if r.get(metric) is not None]
    return np.array(xs, dtype=float), np.array(ys, dtype=float)


# ------------------------------------------------------------------------ arms on one held-out set

def arm_lift(start: Dict, ends: Dict[int, Dict], mode: str) -> Dict:
    """End minus start of one arm on one held-out set, `mode` (greedy or sampled): per seed the paired bootstrap of
    its per-state successes against the start's (heldout.paired_bootstrap), and pooled over the seeds: the per-state
    differences pooled, i.e. each state's end success averaged over the seeds minus its start success, bootstrapped
    over the states (the mean of that is the mean over seeds of end - start). The pooled interval covers the choice of
    states (and through them the episodes' noise), not the choice of seeds; `over_seeds` is the same mean with an
    interval that resamples the seeds too (heldout.seeds_and_states_bootstrap), and the per-seed rows and
    `seeds_above_0` show the seeds' spread."""
    a = heldout.per_state(start, mode)
    ends_per_state = np.array([heldout.per_state(o, mode) for o in ends.values()])
    per_seed = {seed: heldout.paired_bootstrap(a, b) for seed, b in zip(ends, ends_per_state)}
    pooled = heldout.paired_bootstrap(a, ends_per_state.mean(axis=0))
    return {"per_seed": per_seed, "pooled": pooled, "over_seeds": heldout.seeds_and_states_bootstrap(a, ends_per_state),
            "seeds": len(ends), "seeds_above_0": sum(r["diff"] > 0 for r in per_seed.values())}


def arm_difference(ends_a: Dict[int, Dict], ends_b: Dict[int, Dict], mode: str) -> Dict:
    """Arm b minus arm a at the end, on the same held-out states: each state's success averaged over each arm's seeds,
    the difference bootstrapped over the states (heldout.paired_bootstrap)."""
    mean_over_seeds = [np.mean([heldout.per_state(o, mode) for o in ends.values()], axis=0)
                       for ends in (ends_a, ends_b)]
    return heldout.paired_bootstrap(*mean_over_seeds)


def seed_level(arm_a: Dict[int, Dict], arm_b: Dict[int, Dict], mode: str) -> Dict:
    """Arm b minus arm a with the seeds as the unit: the exact permutation test over the runs' end success on the
    held-out set (each seed's mean over the states; with one start for all, its lift plus a constant) and the
    bootstrap that resamples each arm's seeds and the states (common/heldout.py). `arm_*`: seed -> {"outcomes": ...}."""
    ends = [np.array([heldout.per_state(r["outcomes"], mode) for r in arm.values()]) for arm in (arm_a, arm_b)]
    return {"permutation": heldout.seed_permutation_test(ends[0].mean(axis=1), ends[1].mean(axis=1)),
            "bootstrap": heldout.arms_seeds_and_states_bootstrap(ends[0], ends[1])}


# ---------------------------------------------------------------------------------------- the --arms table

def wall(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 7200 else f"{seconds / 60:.0f} min"


def fmt_pair(r: Dict) -> str:
    return f"{r['mean_a']:.2f} -> {r['mean_b']:.2f}, {r['diff']:+.2f} [{r['low']:+.2f}, {r['high']:+.2f}]"


def arms_table(start: Dict, arms: Dict[str, Dict[int, Dict]], header: Dict,
               comparisons: Sequence[Tuple[str, str]]) -> Dict:
    """benchmarks/libero_learning.py's --arms table (markdown lines) and its numbers. `start`: the SFT start's outcomes
    on the held-out set; `arms`: arm -> seed -> {"outcomes": the run's final policy's outcomes on the same set,
    "summary": summary(rows)}; `header`: the SFT start's token accuracy and loss and its demos and steps;
    `comparisons`: (a, b) pairs whose b - a is reported when both arms ran."""
    modes = [m for m in ("greedy", "sampled") if m in start["episodes"]]
    n = start["heldout_set"]["states"]
    acc, loss = header.get("token_accuracy"), header.get("loss")
    fit = f"flow-matching loss {header['flow_mse']:.3f}" if header.get("flow_mse") is not None else \
        "token accuracy " + (f"{acc:.2f}" if acc is not None else "?") + ", " + \
        (f"{loss:.2f} nats/token" if loss is not None else "loss ?")
    lines = [f"SFT start ({header.get('demos')} demos, {header.get('sft_steps')} steps): {fit}; held-out "
             + ", ".join(f"{m} {start['success'][m]:.2f} [{start['interval'][m][0]:.2f}, {start['interval'][m][1]:.2f}]"
                         for m in modes)
             + f" over {n} states ({start['heldout_set']['name']})", "",
             "| arm | seed | " + " | ".join(f"held-out {m}: start -> end, end - start [95% CI] (states up / down)"
                                           for m in modes)
             + " | practice, first 3 -> last 3 iterations | env steps | iterations | wall |",
             "|---|---|" + "---|" * len(modes) + "---|---|---|---|"]
    out: Dict = {"heldout_set": start["heldout_set"], "start": {m: start["success"][m] for m in modes},
                 "sft": header, "arms": {}, "differences": {}}
    for arm, seeds in arms.items():
        ends = {seed: r["outcomes"] for seed, r in seeds.items()}
        lifts = {m: arm_lift(start, ends, m) for m in modes}
        out["arms"][arm] = {"lift": lifts, "summaries": {s: r["summary"] for s, r in seeds.items()}}
        for seed, r in seeds.items():
            s = r["summary"]
            lines.append(f"| {arm} | {seed} | " + " | ".join(f"{fmt_pair(p)} ({p['up']} / {p['down']})" for p in
                                                             (lifts[m]["per_seed"][seed] for m in modes))
                         + f" | {s['practice_first']:.2f} -> {s['practice_last']:.2f} | {s['total_env_steps']:,} | "
                         f"{s['eval_iterations'][-1]} | {wall(s['wall_s'])} |")
        summaries = [r["summary"] for r in seeds.values()]
        lines.append(f"| {arm} | **pooled, {len(seeds)} seed{'s' if len(seeds) != 1 else ''}** | "
                     + " | ".join(f"**{fmt_pair(lifts[m]['pooled'])}**, {lifts[m]['seeds_above_0']} of "
                                  f"{len(seeds)} seeds > 0; seeds resampled too [{lifts[m]['over_seeds']['low']:+.2f}, "
                                  f"{lifts[m]['over_seeds']['high']:+.2f}]" for m in modes)
                     + f" | {mean([x['practice_first'] for x in summaries]):.2f} -> "
                     f"{mean([x['practice_last'] for x in summaries]):.2f} | "
                     f"{mean([x['total_env_steps'] for x in summaries]):,.0f} | | "
                     f"{wall(mean([x['wall_s'] for x in summaries]))} |")
    for arm, seeds in arms.items():
        signals = {seed: r["summary"]["signals"] for seed, r in seeds.items() if r["summary"].get("signals")}
        if signals:
            lines += ["", f"{arm}: its signals, first 3 -> last 3 iterations, per seed: " + "; ".join(
                f"seed {s} " + ", ".join(f"{k.split('/')[-1]} {v[0]:.3g} -> {v[1]:.3g}" for k, v in sig.items())
                for s, sig in signals.items())]
        demos = {seed: r["summary"]["demo_episodes"] for seed, r in seeds.items() if "demo_episodes" in r["summary"]}
        if demos:
            lines += ["", f"{arm}: demo episodes in its updates (the expert's, from the practice states), per seed: "
                      + ", ".join(f"seed {s} {n:,} ({seeds[s]['summary']['demos_dropped']} dropped at replay)"
                                  for s, n in demos.items())]
    for a, b in comparisons:
        if a in arms and b in arms:
            diff = {m: arm_difference({s: r["outcomes"] for s, r in arms[a].items()},
                                      {s: r["outcomes"] for s, r in arms[b].items()}, m) for m in modes}
            out["differences"][f"{b} - {a}"] = diff
            steps = [mean([r["summary"]["total_env_steps"] for r in arms[x].values()]) for x in (a, b)]
            lines.append("")
            lines.append(f"{b} - {a} at the end (each state's success averaged over each arm's seeds; env steps "
                         f"{steps[1]:,.0f} vs {steps[0]:,.0f}): "
                         + "; ".join(f"{m} {diff[m]['diff']:+.2f} [{diff[m]['low']:+.2f}, {diff[m]['high']:+.2f}]"
                                     for m in modes))
            seeds = {m: seed_level(arms[a], arms[b], m) for m in modes}
            out["differences"][f"{b} - {a}, seed level"] = seeds
            lines.append(f"{b} - {a} at the level of seeds ({len(arms[b])} against {len(arms[a])}): "
                         + "; ".join(f"{m} seeds and states resampled {seeds[m]['bootstrap']['diff']:+.2f} "
                                     f"[{seeds[m]['bootstrap']['low']:+.2f}, {seeds[m]['bootstrap']['high']:+.2f}], "
                                     f"exact permutation test of the seeds' lifts p = "
                                     f"{seeds[m]['permutation']['p_one_sided']:.3f} (one-sided; smallest possible "
                                     f"{seeds[m]['permutation']['p_min']:.3f})" for m in modes))
    out["lines"] = lines
    return out


# ------------------------------------------------------------------ the --data-out folder, and the table again from it

DATA_FILE = re.compile(r"^(?P<arm>[a-z_]+)_s(?P<seed>\d+)_outcomes\.json$")  # one run's final policy: <arm>_s<seed>


def data_files(start: Dict, arms: Dict[str, Dict[int, Dict]], header: Dict, title: str) -> Dict[str, Dict]:
    """What libero_learning.py --data-out writes, by file stem: the SFT start's outcomes on the held-out set with the
    table's `title` and the start's `sft` header, and each run's final policy's outcomes (`<arm>_s<seed>`) with its
    `run` row (summary(): the in-run curve, practice, env steps, wall time, the algorithm's signals), so that the table
    and the figure come back from the folder alone (read_data). Each is still an outcomes file (evaluate.py
    --paired reads it)."""
    return {"sft": {**start, "title": title, "sft": header},
            **{f"{arm}_s{seed}": {**r["outcomes"], "run": r["summary"]}
               for arm, seeds in arms.items() for seed, r in seeds.items()}}


def read_data(folder: str, order: Sequence[str] = ()) -> Tuple[Dict, Dict[str, Dict[int, Dict]], Dict, str]:
    """(start, arms, header, title) from a --data-out folder (data_files): arm -> seed -> {"outcomes", "summary"},
    the arms in `order` first, then by name. ValueError (one line, naming the fix) for a run file without its row
    (written before --data-out kept it) or a folder without the start's outcomes."""
    start_path = os.path.join(folder, "sft_outcomes.json")
    if not os.path.isfile(start_path):
        raise ValueError(f"{folder}: no sft_outcomes.json; give a folder benchmarks/libero_learning.py --arms ... "
                         f"--data-out wrote")
    start = heldout.read_outcomes(start_path, "--table")
    arms: Dict[str, Dict[int, Dict]] = {}
    for name in sorted(os.listdir(folder)):
        m = DATA_FILE.match(name)
        if not m:
            continue
        outcomes = heldout.read_outcomes(os.path.join(folder, name), "--table")
        if "run" not in outcomes:
            raise ValueError(f"--table {os.path.join(folder, name)}: no run row (written before --data-out kept "
                             f"it); run its block's libero_learning.py --arms command again with --data-out")
        if outcomes["heldout_set"]["sha256"] != start["heldout_set"]["sha256"]:
            raise ValueError(f"--table {os.path.join(folder, name)}: scored on another held-out set than "
                             f"{start_path}; one table pairs the same states")
        arms.setdefault(m["arm"], {})[int(m["seed"])] = {"outcomes": outcomes, "summary": outcomes["run"]}
    rank = {arm: i for i, arm in enumerate(order)}
    arms = {arm: dict(sorted(arms[arm].items())) for arm in sorted(arms, key=lambda a: (rank.get(a, len(rank)), a))}
    return start, arms, start.get("sft", {}), start.get("title", os.path.basename(os.path.normpath(folder)))
