"""Arms against env steps, in a table: each run's held-out success curve, the env steps to a target held for `hold`
evaluations in a row, the late mean and the last evaluations, practice success, seconds per phase, the mean ± std band
over seeds, and one markdown row per arm (benchmarks/compare_algorithms.py's table and its presets'; tested on fake
rows in tests/test_compare_algorithms.py). Runs are (task, seed) -> their metrics.jsonl rows; seeds are the unit of
spread, tasks are averaged within a seed."""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from common.arms import curve, steps_to_reach

METRIC = "val/success_rate"  # held-out greedy success (one episode per trial 30..49); --metric
LAST = 3  # "last 3": the mean of a run's last 3 evaluations
PRACTICE = 10  # practice success (rollout/success_rate) over the first and the last 10 iterations
PHASES = {"rollout": ["time/rollout"], "reward": ["time/reward", "time/values", "time/annotation"],
          "update": ["time/update"]}  # reward: SRPO's reward, GAE-PPO's value pass, FlowSAR's self-annotation
TARGETS = (0.5, 0.9)
HOLD = 2  # a target counts as reached at the first of 2 evaluations in a row at or above it (one is +-0.15 noise)
LATE = 2 / 3  # "late mean": the mean of the evaluations from this fraction of the budget on


def eval_curve(rows: List[dict], metric: str = METRIC) -> Tuple[np.ndarray, np.ndarray]:
    """(env steps, metric) at every evaluation; the start's evaluation is row 0, at 0 env steps."""
    return curve(rows, metric)


def steps_to(rows: List[dict], target: float, metric: str = METRIC, hold: int = HOLD) -> Optional[float]:
    """Env steps at the first of `hold` evaluations in a row with metric >= target (None if never)."""
    return steps_to_reach(rows, metric, target, hold=hold)


def late_mean(rows: List[dict], budget: float, metric: str = METRIC) -> Optional[float]:
    """Mean metric over the evaluations at >= LATE * budget env steps (None if there are none)."""
    xs, ys = eval_curve(rows, metric)
    late = ys[xs >= LATE * budget]
    return float(late.mean()) if len(late) else None


def band(runs: Dict[Tuple[int, int], List[dict]], budget: float, points: int = 41, metric: str = METRIC):
    """(grid, mean, std, per-seed curves) of `metric` over env steps 0..budget: each run's evaluations interpolated onto
    the grid (held at its last value past its last evaluation), averaged over tasks within a seed, then mean and std
    over seeds."""
    grid = np.linspace(0.0, budget, points)
    by_seed: Dict[int, List[np.ndarray]] = {}
    for (task, seed), rows in sorted(runs.items()):
        xs, ys = eval_curve(rows, metric)
        if len(xs):
            by_seed.setdefault(seed, []).append(np.interp(grid, xs, ys))
    seeds = np.array([np.mean(c, 0) for _, c in sorted(by_seed.items())])
    if not len(seeds):
        return grid, np.full(points, np.nan), np.full(points, np.nan), seeds
    return grid, seeds.mean(0), seeds.std(0), seeds


def mean_std(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    v = [x for x in values if x is not None and np.isfinite(x)]
    if not v:
        return "-"
    return fmt.format(np.mean(v)) + (" ± " + fmt.format(np.std(v)) if len(v) > 1 else "")


def per_seed(runs: Dict[Tuple[int, int], List[dict]], value) -> List[float]:
    """value(rows) averaged over tasks within each seed (one number per seed)."""
    out: Dict[int, List[float]] = {}
    for (task, seed), rows in runs.items():
        v = value(rows)
        if v is not None:
            out.setdefault(seed, []).append(v)
    return [float(np.mean(v)) for _, v in sorted(out.items())]


def kilo(x: float) -> str:
    return f"{x / 1000:.1f} k"


def summarize(runs: Dict[Tuple[int, int], List[dict]], walls: Dict[Tuple[int, int], float],
              budget: float, metric: str = METRIC, targets: Sequence[float] = TARGETS,
              hold: int = HOLD) -> Dict[str, str]:
    """The table cells of one algorithm from its runs' metric rows ((task, seed) -> rows), wall seconds and budget."""
    def evals(rows):
        return eval_curve(rows, metric)[1]

    def practice(rows, end):
        p = [r["rollout/success_rate"] for r in rows if r.get("rollout/success_rate") is not None]
        return float(np.mean(p[:PRACTICE] if end == "first" else p[-PRACTICE:])) if p else None

    seeds = sorted({s for _, s in runs})
    cells = {"seeds": " ".join(str(s) for s in seeds),
             "env steps used": mean_std(per_seed(runs, lambda r: r[-1].get("charts/env_steps")), "{:,.0f}"),
             "start": mean_std(per_seed(runs, lambda r: evals(r)[0] if len(evals(r)) else None)),
             "at budget": mean_std(per_seed(runs, lambda r: evals(r)[-1] if len(evals(r)) else None)),
             "late mean": mean_std(per_seed(runs, lambda r: late_mean(r, budget, metric))),
             "last 3": mean_std(per_seed(runs, lambda r: evals(r)[-LAST:].mean() if len(evals(r)) else None)),
             "practice": mean_std(per_seed(runs, lambda r: practice(r, "first"))) + " -> "
             + mean_std(per_seed(runs, lambda r: practice(r, "last")))}
    for target in targets:
        reach = [steps_to(rows, target, metric, hold) for rows in runs.values()]
        hit = [r for r in reach if r is not None]
        cells[f"to {target:.0%}"] = (f"{kilo(float(np.mean(hit)))} ({len(hit)}/{len(reach)} runs)" if hit
                                     else "not reached")
    rows = [r for run_rows in runs.values() for r in run_rows]
    iters = max(1, sum(int(r[-1].get("iteration", 0)) for r in runs.values()))
    for phase, keys in PHASES.items():
        vals = [r[k] for r in rows for k in keys if r.get(k) is not None]
        cells[phase] = f"{np.mean(vals):.2f}" if vals else "-"
    eval_total = sum(r.get("time/eval") or 0.0 for r in rows)
    cells["eval"] = f"{eval_total / iters:.2f}"
    cells["iterations"] = mean_std([r[-1].get("iteration", 0) for r in runs.values()], "{:.0f}")
    cells["total wall"] = mean_std(list(walls.values()), "{:.0f} s")
    return cells


def markdown_table(rows: Dict[str, Dict[str, str]], metric: str = METRIC, targets: Sequence[float] = TARGETS,
                   hold: int = HOLD) -> str:
    what = "held-out greedy" if metric == METRIC else f"`{metric}`"
    columns = ["seeds", "iterations", "env steps used", "start", "at budget", "late mean", "last 3",
               *[f"to {t:.0%}" for t in targets], "practice", "rollout", "reward", "update", "eval", "total wall"]
    head = ["algorithm", "seeds", "iterations", "env steps used", f"{what} at start", f"{what} at budget",
            "mean of the evaluations from 2/3 of the budget on", f"mean of the last {LAST} evaluations",
            *[f"env steps to {t:.0%}" + (f" ({hold} evaluations in a row)" if i == 0 else "")
              for i, t in enumerate(targets)], f"practice success, first -> last {PRACTICE} iterations",
            "rollout s/it", "reward s/it", "update s/it", "eval s/it", "wall per run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, cells in rows.items():
        lines.append("| " + " | ".join([label] + [cells.get(c, "") for c in columns]) + " |")
    return "\n".join(lines)


def run_lines(label: str, runs: Dict[Tuple[int, int], List[dict]], metric: str, targets: Sequence[float],
              hold: int) -> List[str]:
    """Each run's evaluations (env steps: success) and its env steps to each target, one line per run."""
    xs_ys = {k: eval_curve(rows, metric) for k, rows in sorted(runs.items())}
    return [f"  {label} task {t} seed {s}: " + " ".join(f"{int(x)}:{y:.2f}" for x, y in zip(*xs_ys[(t, s)]))
            + "; to " + ", ".join(f"{target:.0%}: " + ("not reached" if r is None else f"{int(r)}") for target, r in
                                  ((target, steps_to(runs[(t, s)], target, metric, hold)) for target in targets))
            for t, s in xs_ys]


def ratio_lines(a: str, b: str, runs_a: Dict[Tuple[int, int], List[dict]], runs_b: Dict[Tuple[int, int], List[dict]],
                metric: str, targets: Sequence[float], hold: int) -> List[str]:
    """Two arms: b's env steps to each target over a's, the mean of the ratios over the (task, seed) runs where both
    reached it."""
    out = []
    for target in targets:
        both = [(steps_to(runs_a[k], target, metric, hold), steps_to(runs_b[k], target, metric, hold))
                for k in sorted(set(runs_a) & set(runs_b))]
        ok = [(x, y) for x, y in both if x is not None and y is not None and x > 0]
        out.append(f"{b} / {a} env steps to {target:.0%}: " + (f"{np.mean([y / x for x, y in ok]):.2f}x over "
                                                                 f"{len(ok)} run(s)" if ok else
                                                                 "needs both arms to reach it in the same seed"))
    return out
