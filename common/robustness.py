"""Robustness evaluation: one policy on a base suite and its perturbed variants (`evaluate.py --suites ...`).

    python evaluate.py --checkpoint runs/<run> --suites robustness --trial-start 30 --trials 20
    python evaluate.py --checkpoint runs/<run> --suites tabletop,tabletop_lan,tabletop_camera

`--suites robustness` is the checkpoint's base suite and every variant of it (tabletop: `tabletop_lan`, `_object`,
`_swap`, `_task`, `_camera`, `_light`, `_noise`, `_distractor`, `_gripper`); a comma list names them, and the base
suite is always evaluated (every drop is measured against it). Each suite runs the same (task, trial) starts with one
greedy episode each (`common.evaluation.evaluate_policy`), and trial j of a variant is base trial j perturbed, so a
drop is a paired comparison: `lost` counts the starts solved in the base suite and failed in the variant, `gained`
the reverse. Writes to the output folder: robustness.md (the tables, also printed), robustness.json (every episode's
0/1 result, so every aggregate can be recomputed), robustness.png (success per suite, coloured by family) and
episodes_<suite>.gif per suite. Over many runs (benchmarks/robustness.py): each run's success per family, averaged over
tasks within a seed, and the table of mean ± std over seeds and its bar chart (per_seed, table, chart).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import envs
from common.config import EnvConfig

# variant suffix -> (family, what changes). LIBERO-PRO's suites use the first four suffixes too.
VARIANT_INFO = {
    "lan": ("language", "the instruction reworded, same meaning"),
    "task": ("task", "a different task in the same scene"),
    "object": ("objects", "a task object replaced by another colour or shape (instruction names it)"),
    "distractor": ("objects", "an extra block or plate of a new colour"),
    "swap": ("positions", "two objects swap places"),
    "gripper": ("positions", "the gripper starts elsewhere (0.15-0.3 from home, another height)"),
    "camera": ("vision", "the agent camera shifted and zoomed"),
    "light": ("vision", "brighter or dimmer light, a colour cast and a gradient"),
    "noise": ("vision", "Gaussian sensor noise on both cameras"),
}
FAMILIES = ("language", "task", "objects", "positions", "vision")


def base_of(suite: str) -> str:
    """The unperturbed suite of `suite` ('tabletop' for 'tabletop_lan'; a base suite is its own)."""
    return suite.rsplit("_", 1)[0] if suite in envs.PERTURBED_SUITES else suite


def variants_of(base: str) -> List[str]:
    """The perturbed suites of base suite `base`, in the order envs lists them."""
    return [s for s in envs.PERTURBED_SUITES if base_of(s) == base]


def family_of(suite: str) -> Optional[str]:
    """'language', 'task', 'objects', 'positions' or 'vision' for a variant; None for a base suite."""
    if suite not in envs.PERTURBED_SUITES:
        return None
    return VARIANT_INFO[suite.rsplit("_", 1)[1]][0]


def expand_suites(spec: str, default_base: str) -> List[str]:
    """'robustness' -> the base of `default_base` and all its variants; 'a,b,...' -> the base suite of those names
    first, then the named variants. ValueError for an unknown name or for variants of two base suites."""
    parts = list(dict.fromkeys(p.strip() for p in spec.split(",") if p.strip()))
    if parts == ["robustness"]:
        base = base_of(default_base)
        if not variants_of(base):
            raise ValueError(f"--suites robustness: suite '{base}' has no perturbed variants; name the suites, e.g. "
                             f"--suites tabletop,tabletop_lan")
        return [base] + variants_of(base)
    if not parts:
        raise ValueError("--suites is empty: give 'robustness' or a comma list such as tabletop,tabletop_lan")
    for p in parts:
        if p == "robustness":
            raise ValueError("--suites robustness stands alone (it means the base suite and all its variants)")
        envs.check_suite(p)
    bases = sorted({base_of(p) for p in parts})
    if len(bases) > 1:
        raise ValueError(f"--suites mixes the base suites {', '.join(bases)}: evaluate one base suite and its variants "
                         f"at a time")
    return bases + [p for p in parts if p != bases[0]]


def evaluate_suite(policy, env_cfg: EnvConfig, suite: str, task_ids: Sequence[int], trial_ids: Sequence[int],
                   keep_frames: bool = False, progress: bool = True):
    """One greedy episode per (task, trial) on `suite` -> (record for the JSON, the RolloutBatch)."""
    from common.evaluation import evaluate_policy  # (torch: imported only when evaluating)

    cfg = dataclasses.replace(env_cfg, suite=suite)
    envs.check_task_ids(cfg, list(task_ids))
    n = envs.num_trials(cfg)
    if max(trial_ids) >= n:
        raise ValueError(f"suite '{suite}' has trial ids 0..{n - 1}; lower --trial-start/--trials")
    tasks = envs.suite_tasks(cfg)
    vec_env = envs.make_vector_env(cfg, min(cfg.num_envs, len(task_ids) * len(trial_ids)))
    t0 = time.time()
    try:
        _, batches = evaluate_policy(vec_env, policy, task_ids, trial_ids, keep_frames=keep_frames,
                                     progress=progress, desc=suite)
    finally:
        vec_env.close()
    b = batches["greedy"]
    record = {
        "family": family_of(suite),
        "changes": VARIANT_INFO[suite.rsplit("_", 1)[1]][1] if family_of(suite) else "nothing (the base suite)",
        "instructions": {str(t): str(tasks[t]["description"]) for t in task_ids},
        "episodes": {"task_id": b.task_ids.tolist(), "trial_id": b.trial_ids.tolist(),
                     "success": [int(c) for c in b.complete.tolist()], "steps": b.finish_step.tolist()},
        "seconds": round(time.time() - t0, 1),
    }
    return record, b


def _outcomes(record: Dict[str, Any]) -> Dict[tuple, int]:
    e = record["episodes"]
    return {(t, j): s for t, j, s in zip(e["task_id"], e["trial_id"], e["success"])}


def summarize(per_suite: Dict[str, Dict[str, Any]], base: str) -> Dict[str, Any]:
    """Add to every suite's record its success, binomial standard error, drop against the base suite (success -
    base success, on the same starts) and the paired counts lost / gained; and the per-family aggregates (episodes of
    a family's variants pooled). Pure: recomputes everything from the per-episode 0/1 results."""
    base_out = _outcomes(per_suite[base])
    base_rate = float(np.mean(list(base_out.values())))
    families: Dict[str, Dict[str, Any]] = {}
    for suite, rec in per_suite.items():
        out = _outcomes(rec)
        s = np.array(list(out.values()), dtype=float)
        rec["success"] = float(s.mean())
        rec["stderr"] = float(np.sqrt(s.mean() * (1 - s.mean()) / len(s)))
        rec["n"] = int(len(s))
        rec["drop"] = rec["success"] - base_rate
        rec["lost"] = int(sum(1 for k, v in out.items() if base_out.get(k) == 1 and v == 0))
        rec["gained"] = int(sum(1 for k, v in out.items() if base_out.get(k) == 0 and v == 1))
        if rec["family"]:
            fam = families.setdefault(rec["family"], {"suites": [], "success_list": []})
            fam["suites"].append(suite)
            fam["success_list"] += list(out.values())
    per_family = {}
    for name in [f for f in FAMILIES if f in families] + [f for f in families if f not in FAMILIES]:
        s = np.array(families[name]["success_list"], dtype=float)
        per_family[name] = {"suites": families[name]["suites"], "success": float(s.mean()), "n": int(len(s)),
                            "drop": float(s.mean()) - base_rate}
    variants = [v for k, v in per_suite.items() if k != base]
    return {"base_success": base_rate, "per_family": per_family,
            "mean_variant_success": float(np.mean([v["success"] for v in variants])) if variants else None}


def markdown(results: Dict[str, Any]) -> str:
    """The per-suite and per-family tables (success in %, drops in points)."""
    base = results["base_suite"]
    lines = [f"Robustness of `{results['checkpoint']}` ({results['policy_type']} policy): tasks "
             f"{' '.join(map(str, results['task_ids']))}, trials {results['trial_ids'][0]}-{results['trial_ids'][-1]} "
             f"({results['trials']} per task), one greedy episode each, seed {results['seed']}. Drop = success - "
             f"`{base}` success on the same starts (points); lost / gained = starts solved in `{base}` and failed in "
             f"the variant / the reverse.",
             "",
             "| suite | family | what changes | success | ± s.e. | drop vs base | lost / gained | episodes |",
             "|---|---|---|---|---|---|---|---|"]
    for suite, r in results["per_suite"].items():
        drop = "-" if suite == base else f"{100 * r['drop']:+.1f}"
        lost = "-" if suite == base else f"{r['lost']} / {r['gained']}"
        lines.append(f"| {suite} | {r['family'] or 'base'} | {r['changes']} | {100 * r['success']:.1f}% | "
                     f"{100 * r['stderr']:.1f} | {drop} | {lost} | {r['n']} |")
    lines += ["", "| family | suites | success | drop vs base | episodes |", "|---|---|---|---|---|"]
    for fam, r in results["per_family"].items():
        lines.append(f"| {fam} | {', '.join(r['suites'])} | {100 * r['success']:.1f}% | {100 * r['drop']:+.1f} | "
                     f"{r['n']} |")
    return "\n".join(lines)


def suites_table(per_suite: Dict[str, Dict[str, Any]]) -> List[str]:
    """Several policies side by side (name -> its robustness.json's per_suite; benchmarks/libero_learning.py --pro):
    markdown lines, per suite what changes and each policy's success."""
    names = list(per_suite)
    return ["| suite | what changes | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)] + [
        f"| {suite} | {first['changes']} | " + " | ".join(f"{per_suite[n][suite]['success']:.2f}" for n in names)
        + " |" for suite, first in per_suite[names[0]].items()]


def write_chart(results: Dict[str, Any], path: str) -> str:
    """Success per suite (bars coloured by family, ± s.e.) with the base suite's success as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    suites = list(results["per_suite"])
    recs = [results["per_suite"][s] for s in suites]
    colors = {None: "0.35", **{f: c for f, c in zip(FAMILIES, plt.cm.tab10.colors)}}
    fig, ax = plt.subplots(figsize=(max(5.0, 0.75 * len(suites) + 1.5), 3.8))
    x = np.arange(len(suites))
    ax.bar(x, [r["success"] for r in recs], yerr=[r["stderr"] for r in recs], capsize=3,
           color=[colors.get(r["family"], "0.6") for r in recs])
    ax.axhline(results["base_success"], color="0.35", ls="--", lw=1)
    ax.set_xticks(x, suites, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("greedy success")
    for fam in [None] + list(FAMILIES):
        if any(r["family"] == fam for r in recs):
            ax.bar([0], [0], color=colors[fam], label=fam or "base")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    name = os.path.basename(results["checkpoint"].rstrip("/"))
    ax.set_title(f"{name}: base {results['base_success']:.0%}, {results['trials']} trials x "
                 f"{len(results['task_ids'])} task(s) per suite", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run_robustness(args, policy, env_cfg: EnvConfig, task_ids: Sequence[int], trial_ids: Sequence[int],
                   gif_writer: Optional[Callable] = None) -> Dict[str, Any]:
    """evaluate.py's --suites: evaluate every suite, then print and write the tables, JSON, chart and GIFs."""
    from common.checkpoint import resolve_policy_dir
    from models.policy import family_of_folder as policy_type

    if args.sampled:
        raise ValueError("--suites evaluates one greedy episode per start; drop --sampled")
    suites = expand_suites(args.suites, env_cfg.suite)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.normpath(args.checkpoint).strip("./")) or "checkpoint"
    out_dir = args.out_dir or os.path.join("plots", f"robustness__{name}")
    os.makedirs(out_dir, exist_ok=True)
    results: Dict[str, Any] = {
        "checkpoint": args.checkpoint, "policy_type": policy_type(resolve_policy_dir(args.checkpoint)),
        "base_suite": suites[0], "suites": suites, "task_ids": [int(t) for t in task_ids],
        "trial_ids": [int(j) for j in trial_ids], "trials": len(trial_ids), "seed": args.seed, "per_suite": {},
    }
    if envs.is_tabletop(suites[0]):
        from envs import tabletop

        results["trial_seeds"] = {"TRIAL_SEED": tabletop.TRIAL_SEED, "VARIANT_SEED": tabletop.VARIANT_SEED}
    files: Dict[str, str] = {}
    t0 = time.time()
    for suite in suites:
        record, batch = evaluate_suite(policy, env_cfg, suite, task_ids, trial_ids, keep_frames=args.gifs > 0)
        results["per_suite"][suite] = record
        if gif_writer is not None and args.gifs > 0:
            gif = gif_writer(batch, os.path.join(out_dir, f"episodes_{suite}.gif"), per_kind=args.gifs)
            if gif:
                files[f"gif_{suite}"] = gif
        del batch
    results.update(summarize(results["per_suite"], suites[0]))
    results["seconds"] = round(time.time() - t0, 1)
    text = markdown(results)
    print(text)
    files["markdown"] = os.path.join(out_dir, "robustness.md")
    files["json"] = os.path.join(out_dir, "robustness.json")
    files["chart"] = write_chart(results, os.path.join(out_dir, "robustness.png"))
    results["files"] = files
    with open(files["markdown"], "w") as f:
        f.write(text + "\n")
    with open(files["json"], "w") as f:
        json.dump(results, f, indent=1)
    episodes = sum(r["n"] for r in results["per_suite"].values())
    print(f"{episodes} episodes on {len(suites)} suites in {results['seconds']:.1f}s; wrote "
          + ", ".join(files.values()))
    return results


# ---- over runs: benchmarks/robustness.py's table (unit-tested on hand-made results in tests/test_robustness.py)
COLUMNS = ("base",) + FAMILIES + ("all variants",)


def family_values(res: dict) -> Dict[str, float]:
    """One evaluation's success per column: the base suite, each family (its variants' episodes pooled) and all
    variants pooled."""
    base = res["base_suite"]
    out = {"base": res["per_suite"][base]["success"]}
    for fam, r in res["per_family"].items():
        out[fam] = r["success"]
    episodes = [s for suite, r in res["per_suite"].items() if suite != base for s in r["episodes"]["success"]]
    out["all variants"] = float(np.mean(episodes)) if episodes else float("nan")
    return out


def per_seed(results: Dict[Tuple[int, int], dict]) -> Dict[str, List[float]]:
    """column -> one value per seed (tasks averaged within a seed), from {(task, seed): robustness.json}."""
    by_seed: Dict[int, List[Dict[str, float]]] = {}
    for (task, seed), res in sorted(results.items()):
        by_seed.setdefault(seed, []).append(family_values(res))
    return {c: [float(np.mean([v[c] for v in vals if c in v])) for _, vals in sorted(by_seed.items())
                if any(c in v for v in vals)] for c in COLUMNS}


def cell(values: Sequence[float]) -> str:
    """'mean ± std' in percent (one value: no spread)."""
    v = [x for x in values if np.isfinite(x)]
    if not v:
        return "-"
    return f"{100 * np.mean(v):.1f}" + (f" ± {100 * np.std(v):.1f}" if len(v) > 1 else "")


def table(rows: Dict[str, Dict[str, List[float]]], starts: Dict[str, str]) -> str:
    """Markdown: one row per policy (SFT starts and arms): success per column, the drop of all variants against the
    base suite, and all variants against the row's SFT start (`starts`: row -> its SFT row)."""
    head = ["policy", "seeds", *COLUMNS, "drop: all variants - base", "all variants - its SFT start"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, vals in rows.items():
        n = len(vals["base"])
        drop = [a - b for a, b in zip(vals["all variants"], vals["base"])]
        sft = rows.get(starts.get(label, ""), {}).get("all variants")
        gain = [a - float(np.mean(sft)) for a in vals["all variants"]] if sft and label in starts else []
        lines.append("| " + " | ".join([label, str(n)] + [cell(vals[c]) for c in COLUMNS] +
                                       [cell(drop), cell(gain)]) + " |")
    return "\n".join(lines)


def chart(rows: Dict[str, Dict[str, List[float]]], title: str, path: str) -> None:
    """table()'s rows as grouped bars: one group per column, one bar per policy (mean over seeds, ± std)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    x = np.arange(len(COLUMNS))
    width = 0.8 / max(1, len(rows))
    for k, ((label, vals), color) in enumerate(zip(rows.items(), plt.cm.tab10.colors)):
        mean = [np.mean(vals[c]) if vals[c] else np.nan for c in COLUMNS]
        std = [np.std(vals[c]) if len(vals[c]) > 1 else 0.0 for c in COLUMNS]
        ax.bar(x + (k - (len(rows) - 1) / 2) * width, mean, width, yerr=std, capsize=2, color=color, label=label)
    ax.set_xticks(x, COLUMNS)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("held-out greedy success")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=min(5, len(rows)), loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
