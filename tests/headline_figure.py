"""README's headline figure, from committed data only: does RL learn on real LIBERO (docs/results.md, "Does RL learn on
real LIBERO?")? Held-out greedy success on libero_spatial task 0 (100 held-out states) of the SFT start and of each
arm's runs at their end (~305 k env steps), with each evaluation's bootstrap 95% interval, read from the per-episode
outcomes in docs/data/libero_learning/libero_spatial_t0/*_outcomes.json (nothing is run).

    python tests/headline_figure.py                      # writes docs/headline_libero_spatial_t0.png
    python tests/headline_figure.py --out /tmp/fig.png

A tool beside the test that checks its output (it measures nothing, so it is no benchmark): tests/test_first_run.py
regenerates the figure and compares it with the committed PNG.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0")
OUT = os.path.join(ROOT, "docs", "headline_libero_spatial_t0.png")
ARMS = (("grpo", "GRPO (binary reward)", "tab:blue"), ("srpo", "SRPO (progress reward)", "tab:green"),
        ("control", "control (shuffled reward)", "tab:gray"))


def read(path: str) -> Tuple[float, float, float]:
    """(greedy success, its 95% interval's low, high) of one outcomes.json."""
    with open(path) as f:
        data = json.load(f)
    low, high = data["interval"]["greedy"]
    return float(data["success"]["greedy"]), float(low), float(high)


def runs(folder: str = DATA) -> Dict[str, List[Tuple[int, Tuple[float, float, float]]]]:
    """arm -> [(seed, (success, low, high)), ...] of the committed end-of-run outcomes, seeds in order."""
    out: Dict[str, List] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*_s*_outcomes.json"))):
        match = re.fullmatch(r"(\w+?)_s(\d+)_outcomes\.json", os.path.basename(path))
        if match:
            out.setdefault(match.group(1), []).append((int(match.group(2)), read(path)))
    return {arm: sorted(seeds) for arm, seeds in out.items()}


def figure(out: str = OUT, folder: str = DATA) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = read(os.path.join(folder, "sft_outcomes.json"))
    ends = runs(folder)
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=90)
    ax.errorbar([0], [start[0]], yerr=[[start[0] - start[1]], [start[2] - start[0]]], fmt="o", color="black",
                capsize=3)
    ax.annotate("SFT start", (0, start[0]), textcoords="offset points", xytext=(8, -4), fontsize=8)
    for i, (arm, label, colour) in enumerate(ARMS):
        seeds = ends.get(arm, [])
        for j, (seed, (mean, low, high)) in enumerate(seeds):
            x = 1 + i + (j - (len(seeds) - 1) / 2) * 0.18
            ax.plot([0, x], [start[0], mean], color=colour, alpha=0.25, linewidth=1)
            ax.errorbar([x], [mean], yerr=[[mean - low], [high - mean]], fmt="o", color=colour, capsize=3,
                        label=label if j == 0 else None)
    ax.axhline(start[0], color="black", linewidth=0.6, linestyle=":")
    ax.set_xticks([0, 1, 2, 3], ["start", "GRPO\n3 seeds", "SRPO\n3 seeds", "control\n2 seeds"], fontsize=8)
    ax.set_ylim(0.3, 1.0)
    ax.set_ylabel("held-out greedy success", fontsize=8)
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title("libero_spatial task 0, 100 held-out states: each run's end (~305 k env steps), 95% CI",
                 fontsize=8)
    ax.legend(fontsize=7, loc="upper left", frameon=False)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, metadata={"Software": None})  # no version stamp: the same data give the same file
    plt.close(fig)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT, help=f"the PNG to write (default {os.path.relpath(OUT, ROOT)})")
    args = p.parse_args()
    print(figure(args.out))


if __name__ == "__main__":
    main()
