"""One metrics sink for every script: `<run_dir>/metrics.jsonl`, matplotlib PNG panels, and wandb (offline by default).

`Logger.log(metrics, step)` writes one JSON line per update (`iteration` + every metric), redraws
`<plots_dir>/<run_name>/training_curves.png` every `plot_every` updates (atomic replace), and forwards the metrics to
wandb when `log_cfg.wandb` is on. A resumed run first drops the rows past its checkpoint (`resume_iteration`), then
appends, so no iteration appears twice. A PNG or wandb write that fails is a warning, never a lost run.
"""
from __future__ import annotations

import json
import math
import os
import re
import uuid
import warnings
from dataclasses import asdict, is_dataclass
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from common.config import LogConfig

# Panels of training_curves.png (as the OpenVLA GAE-PPO reference's "Matplotlib Plots"): title -> substrings that put
# a metric in the panel. Success shows rates only (not counts such as sampling/all_success_groups); x is cumulative env
# steps when logged (train_sft.py: gradient steps).
PANELS: Dict[str, Sequence[str]] = {
    "Success rate": ("success_rate", "/success_task"),
    "Reward": ("reward/mean", "reward/failure_"),  # SRPO's progress reward (failures graded in [0, max_failure_reward])
    "Losses": ("loss",),
    "PPO metrics (clip fraction, KL)": ("clipfrac", "kl"),
    "Gradient norms": ("grad_norm",),
}
# legend labels a reader understands without the metric names (docs/metrics.md has every key)
LABELS: Dict[str, str] = {
    "val/success_rate": "held-out trials, greedy",
    "val/sampled_success_rate": "held-out trials, sampled",
    "rollout/success_rate": "practice rollouts (sampled)",
    "sampling/success_rate": "practice rollouts, before dynamic sampling",
    "demos/success_rate": "demos replayed in the simulator",
    "reward/mean": "mean reward of the kept episodes",
    "reward/failure_mean": "failures' progress reward, mean",
    "reward/failure_max": "failures' progress reward, max",
}


class Series(NamedTuple):
    """One curve of a panel: its legend label, the iterations and values, and how it is drawn."""
    label: str
    xs: List[int]
    ys: List[float]
    marker: Optional[str]  # "o" on evaluation points (val/*: sparse) and on short series
    linestyle: str  # "--" for a series whose values equal an earlier one's (drawn over it, the earlier one shows)


def panel_series(history: Dict[int, Dict[str, float]], keys: Sequence[str]) -> List[Series]:
    """One Series per key, labelled for a reader (LABELS, else the key). Every key is drawn and named in the legend:
    a series whose values equal an earlier one's (greedy and sampled held-out success alike, or sampling/success_rate
    when dynamic sampling drops nothing) is dashed over it and its label says so. Evaluation points (val/*) are
    marked: they are sparse."""
    steps = sorted(history)
    series: List[Series] = []
    for key in keys:
        xs = [s for s in steps if key in history[s]]
        ys = [history[s][key] for s in xs]
        label = LABELS.get(key, key)
        same = next((s.label for s in series if s.xs == xs and s.ys == ys), None)
        if same is not None:
            label = f"{label} (= {same})"
        marker = "o" if key.startswith("val/") or len(xs) < 30 else None
        series.append(Series(label, xs, ys, marker, "--" if same is not None else "-"))
    return series


def read_rows(run_dir: str) -> List[Dict[str, Any]]:
    """The rows of a run's metrics.jsonl (what Logger.log wrote), in order; a last line still being written (no newline
    yet) is left out, so a running run can be read."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.endswith("\n") and line.strip()]


def _to_float(value: Any) -> Optional[float]:
    """A plain float from a python/numpy/torch scalar; None for anything that is not one number."""
    try:
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)):
            return float(value)
    except (ValueError, RuntimeError):  # tensors/arrays with more than one element
        return None
    return None


def duration(seconds: float) -> str:
    """Seconds with a unit: 5.7s, 3m12s, 1h02m."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def display_name(key: str) -> str:
    """A metric's one console spelling: the key without the `charts/` or `train/` namespace (SPS, pg_loss, grad_norm);
    every other key in full (rollout/success_rate and val/success_rate are different metrics)."""
    for prefix in ("charts/", "train/"):
        if key.startswith(prefix):
            return key[len(prefix):]
    return key


def format_line(iteration: int, metrics: Dict[str, Any], keys: Sequence[str], total: Optional[int] = None,
                eta_s: Optional[float] = None) -> str:
    """One concise console line, e.g. `iter 12/30 | SPS 812 | rollout/success_rate 0.625 | pg_loss -0.0132 |
    time/iteration 5.7s | ETA 1m40s`: each metric always spelled the same, seconds (time/*, *_s but not the
    rates *_per_s) with a unit."""
    parts = [f"iter {iteration}" + (f"/{total}" if total else "")]
    for key in keys:
        value = _to_float(metrics.get(key)) if key in metrics else None
        if value is None:
            continue
        name = display_name(key)
        if (key.startswith("time/") or key.endswith("_s")) and not key.endswith("_per_s"):  # a rate is no duration
            parts.append(f"{name} {duration(value)}")
        elif value == int(value) and abs(value) >= 10:
            parts.append(f"{name} {int(value)}")
        elif abs(value) >= 100:
            parts.append(f"{name} {value:.1f}")
        else:
            parts.append(f"{name} {value:.4g}")
    if eta_s is not None:
        parts.append(f"ETA {duration(eta_s)}")
    return " | ".join(parts)


def _config_dict(config_obj: Any) -> Dict[str, Any]:
    if config_obj is None:
        return {}
    if is_dataclass(config_obj):
        return asdict(config_obj)
    return dict(config_obj)


class MetricsWriteError(RuntimeError):
    """metrics.jsonl could not take an iteration's row (a full disk, a folder gone read-only)."""


class Logger:
    """Writes every `log(metrics, step)` to metrics.jsonl, PNG panels and (optionally) wandb; `close()` at the end."""

    def __init__(self, run_dir: str, run_name: str, config_obj: Any, log_cfg: LogConfig,
                 resume_iteration: Optional[int] = None):
        self.run_dir, self.run_name, self.log_cfg = run_dir, run_name, log_cfg
        os.makedirs(run_dir, exist_ok=True)
        self.metrics_path = os.path.join(run_dir, "metrics.jsonl")
        self.plot_path = os.path.join(log_cfg.plots_dir, run_name, "training_curves.png")
        self.history: Dict[int, Dict[str, float]] = {}  # iteration -> last logged metrics (resume-safe)
        self._warned: set = set()
        if os.path.isfile(self.metrics_path):
            kept = []
            with open(self.metrics_path) as f:
                for number, line in enumerate(f, 1):
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:  # a line cut short by a crash
                        continue
                    if not isinstance(row, dict) or not isinstance(row.get("iteration", -1), int) or \
                            isinstance(row.get("iteration"), bool):
                        from base.config_fields import ConfigError

                        raise ConfigError(f"{self.metrics_path}:{number}: not a metrics row (a JSON object whose "
                                          f"'iteration' is an integer, as this logger writes); remove that line")
                    if resume_iteration is not None and int(row.get("iteration", -1)) > resume_iteration:
                        continue  # logged after the checkpoint we continue from: that iteration runs again
                    kept.append(json.dumps(row))
                    step = int(row.pop("iteration", -1))
                    self.history.setdefault(step, {}).update({k: v for k, v in row.items() if v is not None})
            tmp = self.metrics_path + f".tmp{os.getpid()}"
            try:
                with open(tmp, "w") as f:
                    f.write("".join(line + "\n" for line in kept))
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.metrics_path)
            except OSError as e:  # a full disk: metrics.jsonl stays as it was, no .tmp left
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise MetricsWriteError(f"cannot rewrite {self.metrics_path} ({e.strerror or e})") from None
        self._file = open(self.metrics_path, "a")
        self._num_logged = 0
        self.wandb_run = None
        if log_cfg.wandb:
            self.wandb_run = self._init_wandb(config_obj)

    def _init_wandb(self, config_obj: Any) -> Any:
        """wandb under <run_dir>/wandb; the same wandb id is reused when the run folder is resumed."""
        if self.log_cfg.wandb_mode not in ("offline", "online", "disabled"):
            raise ValueError(f"log.wandb_mode={self.log_cfg.wandb_mode!r} is not a wandb mode: use offline or online "
                             f"(or --no-wandb to switch it off)")
        import wandb

        id_path = os.path.join(self.run_dir, "wandb_id.txt")
        if os.path.isfile(id_path):
            with open(id_path) as f:
                run_id = f.read().strip()
        else:
            run_id = uuid.uuid4().hex[:8]
            with open(id_path, "w") as f:
                f.write(run_id)
        os.environ.setdefault("WANDB_SILENT", "true")
        return wandb.init(
            project=self.log_cfg.wandb_project, name=self.run_name, id=run_id, resume="allow",
            dir=os.path.abspath(self.run_dir), mode=self.log_cfg.wandb_mode, config=_config_dict(config_obj),
        )

    def log(self, metrics: Dict[str, Any], step: int) -> None:
        """Record one update's scalar metrics (non-scalars are skipped) at iteration `step`."""
        scalars = {k: _to_float(v) for k, v in metrics.items()}
        clean = {k: (v if math.isfinite(v) else None) for k, v in scalars.items() if v is not None}  # NaN -> null
        try:
            self._file.write(json.dumps({"iteration": int(step), **clean}) + "\n")
            self._file.flush()
        except OSError as e:  # a row cut short is skipped when the run is resumed
            raise MetricsWriteError(f"could not write iteration {int(step)}'s row to {self.metrics_path}: "
                                    f"{e.strerror or e}") from None
        self.history.setdefault(int(step), {}).update({k: v for k, v in clean.items() if v is not None})
        if self.wandb_run is not None:
            try:
                self.wandb_run.log({k: v for k, v in clean.items() if v is not None}, step=int(step))
            except Exception as e:  # noqa: BLE001 - wandb's own errors vary; metrics.jsonl has the row anyway
                self._warn("wandb", f"wandb log failed ({e}); metrics.jsonl still has every row")
        self._num_logged += 1
        if self.log_cfg.plot_every > 0 and self._num_logged % self.log_cfg.plot_every == 0:
            self.safe_plot()

    def _warn(self, kind: str, message: str) -> None:
        if kind not in self._warned:  # once per kind, not once per iteration
            self._warned.add(kind)
            warnings.warn(message, stacklevel=3)

    def safe_plot(self) -> Optional[str]:
        """plot(), with a failed write (read-only or full disk) turned into a one-time warning."""
        try:
            return self.plot()
        except Exception as e:  # noqa: BLE001 - a plot never ends a run (a full disk; matplotlib's import cut short
            # by a second Ctrl-C leaves a half-imported module whose next use raises AttributeError)
            self._warn("plot", f"could not write {self.plot_path} ({e}); training goes on, metrics.jsonl has every row")
            return None

    def plot(self) -> Optional[str]:
        """Redraw training_curves.png (one panel per group of metrics that exist); returns its path."""
        panels = {}
        keys = sorted({k for row in self.history.values() for k in row})
        task_keys = {k.rsplit("task", 1)[-1] for k in keys if re.search(r"task\d+$", k)}
        for title, patterns in PANELS.items():
            chosen = [k for k in keys if any(p in k.lower() for p in patterns)
                      and not (len(task_keys) == 1 and re.search(r"task\d+$", k))]  # one task: the mean says it
            if chosen:
                panels[title] = chosen
        if not panels:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import EngFormatter

        steps = sorted(self.history)
        # the x axis: cumulative env steps (RL), gradient steps (train_sft.py's rows carry charts/step), else rows
        x_key, x_label = next(((k, label) for k, label in (("charts/env_steps", "env steps (cumulative)"),
                                                             ("charts/step", "gradient steps"))
                               if all(k in self.history[s] for s in steps if s > 0)), (None, "iteration"))
        x_of = {s: self.history[s].get(x_key, 0.0) if x_key else s for s in steps}
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.5), squeeze=False)
        for ax, (title, chosen) in zip(axes[0], panels.items()):
            for curve in panel_series(self.history, chosen):
                ax.plot([x_of[s] for s in curve.xs], curve.ys, marker=curve.marker, markersize=4,
                        linestyle=curve.linestyle, label=curve.label)
            ax.set_title(title)
            ax.set_xlabel(x_label)
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 50k, 100k, 1M: full numbers overlap
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            if title == "Success rate":
                ax.set_ylim(-0.02, 1.02)
        fig.suptitle(self.run_name, fontsize=9)
        fig.tight_layout()
        os.makedirs(os.path.dirname(self.plot_path), exist_ok=True)
        tmp = self.plot_path + f".tmp{os.getpid()}"
        fig.savefig(tmp, format="png", dpi=90)
        plt.close(fig)
        os.replace(tmp, self.plot_path)
        return self.plot_path

    def close(self) -> None:
        """Final plot, close the JSONL file and finish wandb."""
        if self.history:
            self.safe_plot()
        if not self._file.closed:
            try:
                self._file.close()
            except OSError:  # the flush of a row that already failed (MetricsWriteError): reported there
                pass
        if self.wandb_run is not None:
            try:
                self.wandb_run.finish()
            except Exception as e:  # noqa: BLE001
                self._warn("wandb", f"wandb finish failed ({e})")
            self.wandb_run = None
