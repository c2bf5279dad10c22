"""Evaluate a saved policy (token or flow, detected from its saved config) on a suite: per-task success table, JSON,
a PNG bar chart, and a GIF of success and failure episodes side by side.

    python evaluate.py --checkpoint checkpoints/sft_tabletop_task0 --task-ids 0 1 --trials 50 --sampled

`--checkpoint` may be a policy folder (what `policy.save` writes), a training checkpoint `.../iter_XXXXXX` (uses its
`policy/`, checked against its manifest), an SFT run folder (uses `best/`, else `last/`) or an RL run folder (uses its
newest complete checkpoint). Outputs go to `plots/eval__<checkpoint name>/`. Success is measured by
`common.evaluation.evaluate_policy`, the same function the training scripts log `val/*` with.

`--protocol` (envs/protocols.py; docs/libero.md, "Protocols") says how LIBERO episodes are run and scored. A reference
protocol (simplevla-rl, siirl, openvla-oft, openpi, openvla-oft-rl, rlinf) sets exactly what that paper's code does:
every task of the suite (--task-ids narrows), trials 0..49 with one episode each (--trial-start/--trials narrow), its
episode limit, settling steps and their action, its fixture seeding, 256 px cameras with normal rendering, its decoding
(greedy or deterministic ODE; rlinf samples OpenVLA-OFT at T 1.6), a pi0 policy's ODE steps and actions per call (openpi
5; rlinf 5, libero_10 10) and an OpenVLA-OFT policy's image path (JPEG round trip + centre crop; rlinf: resize only;
openvla-oft-rl: crop + Lanczos). Every pair is run (SimpleVLA-RL's RL validation draws 496 of the 500; the full 500
estimate the same rate). `heldout`, this project's own, evaluates the trials the checkpoint's training never practised
on (an RL run's eval.trial_start onwards, else rollout.train_trials onwards; an SFT run's own evaluation trials; overlap
is refused unless --allow-practice-trials) with the checkpoint's env settings and fixtures seeded by the trial id.
Without --protocol: on the embedded suite heldout; an RL run its own eval.protocol; a published checkpoint folder (no
training config beside it) its paper's: an OpenVLA-OFT discrete SFT checkpoint (config.json model_type openvla, no
action_head file: SimpleVLA-RL's, siiRL's) simplevla-rl, an OpenVLA-OFT L1-regression one (action_head--*checkpoint*
file) openvla-oft, a pi0 policy (a flow policy carrying a pi0 checkpoint's statistics) openpi; anything else heldout.
results.json and the chart title record the protocol.

`--heldout-set N` (docs/libero.md, "Held-out sets and paired comparisons") evaluates on N initial states per task
that the checkpoint's training never practised: the official held-out trials above plus states drawn from the suite's
placement distribution by --heldout-seed, saved once (cache/heldout/, copied beside the outcomes); greedy, and sampled
with --sampled, every episode seeded from --seed; per-episode outcomes.json with a bootstrap 95% interval.
`--paired OTHER` (a checkpoint, or an earlier outcomes.json) runs OTHER on the same states with the same seeds and
writes paired.json: --checkpoint minus OTHER with its paired bootstrap 95% interval over the states. Two outcomes
files (e.g. those committed under docs/data/) give their comparison again without running anything.

    python evaluate.py --checkpoint runs/<rl run> --heldout-set 100 --sampled --paired checkpoints/<sft start>
    python evaluate.py --checkpoint docs/data/.../srpo_s1_outcomes.json --paired docs/data/.../sft_outcomes.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from typing import Any, Dict, Optional, Sequence

# envs/protocols.py NAMES (spelled out: importing envs loads gymnasium, ~0.6 s before --help could answer)
PROTOCOL_NAMES = ("simplevla-rl", "siirl", "openvla-oft", "openpi", "openvla-oft-rl", "rlinf", "heldout")


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line, checked; a bad value exits with one line (`error: ...`)."""
    class Help(argparse.RawDescriptionHelpFormatter):  # one default per option: the help's own, else argparse's
        def _get_help_string(self, action):
            text = action.help or ""
            if "default" in text or action.default in (None, False) or action.default is argparse.SUPPRESS:
                return text
            return f"{text} (default %(default)s)"

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=Help,
                                epilog=__doc__[__doc__.index("`--protocol`"):])
    p.add_argument("--checkpoint", required=True, help="policy folder, run folder or training checkpoint; or an "
                   "outcomes.json with --paired OTHER_outcomes.json: the paired comparison of two saved evaluations, "
                   "nothing run")
    p.add_argument("--protocol", choices=PROTOCOL_NAMES, default=None,
                   help="LIBERO evaluation protocol (below; default: heldout on tabletop, an RL run's eval.protocol, a "
                        "published checkpoint's paper protocol, else heldout)")
    p.add_argument("--task-ids", type=int, nargs="+", default=None,
                   help="tasks to evaluate (default: a reference protocol every task of the suite; heldout the tasks "
                        "the checkpoint was trained on, else task 0)")
    p.add_argument("--trials", type=int, default=None,
                   help="trials (initial states) per task (default: every trial from --trial-start on)")
    p.add_argument("--trial-start", type=int, default=None,
                   help="first trial id (trials are start..start+N-1; default: a reference protocol 0; heldout the "
                        "trials held out from the checkpoint's training: an RL run's eval.trial_start, else its "
                        "rollout.train_trials; an SFT run's evaluation trials, the suite's last sft.eval_trials)")
    p.add_argument("--allow-practice-trials", action="store_true",
                   help="heldout: evaluate on trials the checkpoint's training practised on (refused otherwise)")
    p.add_argument("--sampled", action="store_true", help="also evaluate with sampling (temperature below)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature for --sampled (default 1.0; the rlinf protocol's OpenVLA-OFT "
                        "sampling: 1.6)")
    p.add_argument("--flow-noise-level", type=float, default=None,
                   help="a flow policy's --sampled episodes: the exploration noise of its rollouts (the checkpoint's "
                        "rollout.flow_noise_level, else 0.5); greedy is the deterministic ODE (noise 0). Token "
                        "policies sample at --temperature instead")
    p.add_argument("--suite", default=None, help="env suite (default: the checkpoint's training suite, else tabletop)")
    p.add_argument("--suites", default=None, help="robustness: 'robustness' (the base suite and all its perturbed "
                   "variants) or a comma list (tabletop,tabletop_lan,...); writes robustness.md/.json/.png and GIFs")
    p.add_argument("--num-envs", type=int, default=None,
                   help="parallel environments (default: the checkpoint's env.num_envs, else 16)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="episode limit (heldout only; default: the checkpoint's, else the suite's)")
    p.add_argument("--gifs", type=int, default=2, help="successful and failed episodes each in the GIF (0 = none)")
    p.add_argument("--out-dir", default=None, help="output folder (default plots/eval__<checkpoint name>)")
    p.add_argument("--seed", type=int, default=0, help="torch/numpy seed of the evaluation (with --heldout-set: of "
                   "every policy's episodes alike, each sampled episode drawing from its own generator)")
    p.add_argument("--heldout-set", type=int, default=None, metavar="N",
                   help="evaluate on a held-out set of N initial states per task: the official held-out trials "
                        "(--trial-start/--trials) plus states drawn from the suite's placement distribution "
                        "(common/heldout.py); writes outcomes.json (per episode) with a bootstrap 95%% interval")
    p.add_argument("--heldout-seed", type=int, default=0, help="the seed the held-out set's states are drawn with")
    p.add_argument("--drawn-only", action="store_true",
                   help="with --heldout-set: drawn states only, no official trial (a validation set: another "
                        "--heldout-seed than the test set's, so its states are disjoint from the test set's)")
    p.add_argument("--heldout-file", default=None,
                   help="the held-out set's JSON (default cache/heldout/<name>.json): read when it exists, else "
                        "generated and written there")
    p.add_argument("--paired", default=None, metavar="OTHER",
                   help="with --heldout-set: a second checkpoint evaluated on the same states with the same seeds, or "
                        "an outcomes.json of an earlier --heldout-set evaluation; writes paired.json: --checkpoint "
                        "minus OTHER with its paired bootstrap 95%% interval")
    p.add_argument("--gpu", type=int, default=None,
                   help="CUDA device index (no such GPU: an error; leave it out to run on the CPU)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = auto (common/threads.py: the cores "
                   "this process may use, 1 on a GPU; OMP_NUM_THREADS when set)")
    args = p.parse_args(argv)
    for flag, value, low in (("--trials", args.trials, 1), ("--trial-start", args.trial_start, 0),
                             ("--num-envs", args.num_envs, 1), ("--max-steps", args.max_steps, 1),
                             ("--gifs", args.gifs, 0), ("--threads", args.threads, 0)):
        if value is not None and value < low:
            raise SystemExit(f"error: {flag} {value}: must be >= {low}")
    from common.heldout import MAX_SET_SIZE

    if args.heldout_set is not None and not 1 <= args.heldout_set <= MAX_SET_SIZE:
        raise SystemExit(f"error: --heldout-set {args.heldout_set}: must be in [1, {MAX_SET_SIZE}] states per task "
                         f"(100 gives a +-0.1 interval; each state is one episode per policy)")
    if args.checkpoint.endswith(".json"):
        if not (args.paired or "").endswith(".json"):
            raise SystemExit(f"error: --checkpoint {args.checkpoint} is an outcomes file: compare it with another "
                             f"(--paired OTHER_outcomes.json), or pass a policy folder to evaluate")
        return args
    if args.heldout_set is None and args.drawn_only:
        raise SystemExit("error: --drawn-only narrows a held-out set to its drawn states: add --heldout-set N")
    if args.heldout_set is None and (args.paired or args.heldout_file):
        raise SystemExit(f"error: {'--paired' if args.paired else '--heldout-file'} compares policies on a held-out "
                         f"set: add --heldout-set N (e.g. 100)")
    if args.heldout_set is not None and args.suites:
        raise SystemExit("error: --heldout-set and --suites: a held-out set is drawn from one base suite; run them "
                         "separately")
    if args.temperature is not None and not args.temperature > 0:
        raise SystemExit(f"error: --temperature {args.temperature}: must be > 0")
    return args


# the command line before the imports below: --help and a bad value answer in ~0.1 s (torch takes seconds to load)
if __name__ == "__main__":
    args = parse_args()

from common import threads  # before torch: its OpenMP threads sleep when they wait (common/threads.py)

import numpy as np
import torch

from common import provenance
from common.checkpoint import load_saved_policy, resolve_policy_dir
from common.run_folder import check_writable
from common.evaluation import evaluate_policy
from envs import EnvConfig, protocols
from models.policy import family_of_folder
from models.saved import TRAIN_CONFIG, PolicyLoadError


def saved_train_config(path: str) -> Dict[str, Any]:
    """The training config saved with a checkpoint (beside it, in its training checkpoint or its run folder) as a
    dict; {} when there is none."""
    policy_dir = os.path.abspath(resolve_policy_dir(path))
    parent, name = os.path.dirname(policy_dir), os.path.basename(policy_dir)
    candidates = [os.path.join(policy_dir, TRAIN_CONFIG)]
    # a parent's config.yaml only where this project's layout puts one (a plain policy folder never reads a
    # config.yaml of whatever folders happen to hold it)
    if name == "policy" and os.path.basename(parent).startswith("iter_"):  # <run>/checkpoints/iter_N/policy
        candidates.append(os.path.join(parent, "config.yaml"))
        if os.path.basename(os.path.dirname(parent)) == "checkpoints":
            candidates.append(os.path.join(os.path.dirname(os.path.dirname(parent)), "config.yaml"))
    elif name in ("best", "last"):  # <sft run>/best
        candidates.append(os.path.join(parent, "config.yaml"))
    candidates.append(os.path.join(path, "config.yaml"))  # the run folder itself was given
    for candidate in candidates:
        if os.path.isfile(candidate):
            from common import yaml_safe

            saved = yaml_safe.load_file(candidate) or {}
            if isinstance(saved, dict) and isinstance(saved.get("env"), dict):
                return saved
    return {}


def saved_env_config(path: str) -> Optional[EnvConfig]:
    """The env section of the training config saved with a checkpoint, if any."""
    env = saved_train_config(path).get("env")
    if not isinstance(env, dict):
        return None
    known = EnvConfig.__dataclass_fields__
    return EnvConfig(**{k: v for k, v in env.items() if k in known})


def practice_trials(saved: Dict[str, Any]) -> int:
    """How many trials (0..N-1) the checkpoint's training saw: an RL run practises on rollout.train_trials; an SFT run
    on its demos' trials when they were recorded from trials (sft.demo_starts false), none otherwise."""
    rollout, sft = saved.get("rollout") or {}, saved.get("sft") or {}
    if isinstance(rollout, dict) and isinstance(rollout.get("train_trials"), int):
        return int(rollout["train_trials"])
    if isinstance(sft, dict) and sft.get("demo_starts") is False and not sft.get("demo_paths"):
        return int(sft.get("num_demos") or 0)
    return 0


def heldout_start(saved: Dict[str, Any], practice: int, n_trials: int) -> int:
    """The first trial `heldout` scores by default: the training's own evaluation trials (an RL run's eval.trial_start;
    an SFT run's sft.eval_trial_start, else its last sft.eval_trials trials, as train_sft.py evaluates) when they lie
    past the practised ones, else the first trial not practised."""
    evaluation, sft = saved.get("eval") or {}, saved.get("sft") or {}
    first = evaluation.get("trial_start") if isinstance(evaluation, dict) else None
    if first is None and isinstance(sft, dict) and sft:
        first = sft.get("eval_trial_start")
        if first is None and isinstance(sft.get("eval_trials"), int):
            first = max(0, n_trials - sft["eval_trials"])
    return first if isinstance(first, int) and first >= practice else practice


def checkpoint_iteration(path: str) -> Optional[int]:
    """The training iteration (RL) or step (SFT) of a policy that lives in a training checkpoint; None otherwise."""
    state = os.path.join(resolve_policy_dir(path), "..", "state.json")
    try:
        with open(state) as f:
            return int(json.load(f)["iteration"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def trial_range(trial_ids: Sequence[int]) -> str:
    return f"{trial_ids[0]}-{trial_ids[-1]}" if len(trial_ids) > 1 else str(trial_ids[0])


def _bordered(frames: np.ndarray, color, scale: int) -> np.ndarray:
    """Upscale (T,H,W,3) frames by `scale` and draw a coloured border (green success, red failure)."""
    big = frames.repeat(scale, axis=1).repeat(scale, axis=2)
    b = max(2, scale)
    big[:, :b], big[:, -b:], big[:, :, :b], big[:, :, -b:] = color, color, color, color
    return big


def write_episode_gif(batch, path: str, per_kind: int = 2, scale: int = 2, fps: int = 10) -> Optional[str]:
    """Up to `per_kind` successful and `per_kind` failed episodes side by side (green / red border) in one GIF."""
    import imageio.v2 as imageio

    if not batch.frames:
        return None
    wins = [i for i in range(len(batch)) if batch.complete[i]][:per_kind]
    losses = [i for i in range(len(batch)) if not batch.complete[i]][:per_kind]
    chosen = [(i, (40, 200, 60)) for i in wins] + [(i, (220, 40, 40)) for i in losses]
    if not chosen:
        return None
    length = max(len(batch.frames[i]) for i, _ in chosen)
    tiles = []
    for i, color in chosen:
        f = batch.frames[i]
        f = np.concatenate([f, np.repeat(f[-1:], length - len(f), axis=0)])  # hold the last frame
        tiles.append(_bordered(f, color, scale))
    gap = np.full((length, tiles[0].shape[1], 4, 3), 255, dtype=np.uint8)
    row = np.concatenate([x for t in tiles for x in (t, gap)][:-1], axis=2)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    imageio.mimsave(path, list(row), duration=1000.0 / fps, loop=0)  # imageio >= 2.28 (pillow): milliseconds per frame
    return path


def write_bar_chart(results: Dict[str, Any], path: str) -> str:
    """Per-task success bars (greedy, and sampled when present) with the mean in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["per_task"]
    x = np.arange(len(rows))
    modes = [m for m in ("greedy", "sampled") if m in rows[0]]
    width = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 + 0.8 * len(rows)), 3.8))
    for k, mode in enumerate(modes):
        ax.bar(x + (k - (len(modes) - 1) / 2) * width, [r[mode] for r in rows], width, label=mode)
    ax.set_xticks(x, [f"task {r['task_id']}" for r in rows], rotation=30 if len(rows) > 5 else 0)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("success rate")
    means = ", ".join(f"{m} {results['mean_' + m]:.1%}" for m in modes)
    at = f" (iteration {results['iteration']})" if results.get("iteration") is not None else ""
    name, room = os.path.normpath(results["checkpoint"]), 80 - len(at)  # the first line fits a 6-inch figure
    name = name if len(name) <= room else "..." + name[-(room - 3):]
    protocol = f" | protocol {results['protocol']}" if results.get("protocol") else ""
    ax.set_title(f"{name}{at}\n{means} | trials {results['trial_range']} ({results['trials']} per task){protocol}",
                 fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def format_table(results: Dict[str, Any]) -> str:
    """Plain-text per-task success table with the mean on the last line."""
    modes = [m for m in ("greedy", "sampled") if m in results["per_task"][0]]
    lines = [f"{'task':>4}  {'name':<56}" + "".join(f"{m:>9}" for m in modes)]
    for r in results["per_task"]:
        lines.append(f"{r['task_id']:>4}  {r['name'][:56]:<56}" + "".join(f"{r[m]:>9.1%}" for m in modes))
    lines.append(f"{'mean':>4}  {'':<56}" + "".join(f"{results['mean_' + m]:>9.1%}" for m in modes))
    return "\n".join(lines)


def apply_protocol(args: argparse.Namespace, policy, saved: Dict[str, Any], env_cfg: EnvConfig) -> Dict[str, Any]:
    """The protocol (--protocol, else `protocols.default_protocol` for this folder) resolved for the suite and the
    policy's kind, applied in place to `env_cfg` (episode limit, settling steps and action, fixture seeding, 256 px
    normal rendering) and to the policy (image size; OpenVLA-OFT's image path; a flow policy's actions per call);
    ValueError for what the protocol cannot run. Returns the resolved
    settings with its "name" (envs/protocols.py `resolve`)."""
    kind = policy.kind
    name = args.protocol or protocols.default_protocol(policy.paper_protocol(), saved, env_cfg.suite)
    p = {"name": name, **protocols.resolve(name, env_cfg.suite, kind)}  # a ConfigError is a ValueError: one line
    if not protocols.is_reference(name):
        env_cfg.fixture_seed = p["fixture_seed"]  # seeded by the trial id; every other env setting the checkpoint's
        if args.max_steps is not None:
            env_cfg.max_steps = args.max_steps
        return p
    source = protocols.SOURCES[name]
    if args.max_steps is not None and args.max_steps != p["max_steps"]:
        raise ValueError(f"--max-steps {args.max_steps}: --protocol {name} runs max_steps {p['max_steps']} on "
                         f"{env_cfg.suite} ({source['max_steps']}); drop --max-steps, or use --protocol heldout")
    if p["decoding"] == "sampled" and args.temperature is not None and args.temperature != p["temperature"]:
        raise ValueError(f"--temperature {args.temperature}: --protocol {name} samples at T {p['temperature']} "
                         f"({source['decoding']}); drop --temperature")
    if p["decoding"] == "sampled" and args.suites:
        raise ValueError(f"--suites runs one greedy episode per trial; --protocol {name} samples this policy at T "
                         f"{p['temperature']}: choose another protocol for a robustness table")
    env_cfg.max_steps, env_cfg.num_steps_wait = p["max_steps"], p["num_steps_wait"]
    env_cfg.wait_action, env_cfg.fixture_seed, env_cfg.fast_render = p["wait_action"], p["fixture_seed"], False
    size = p["image_size"]
    if not policy.resizes_images and policy.cfg.image_size != size:
        raise ValueError(f"--protocol {name} renders the cameras at {size} px ({source['image']}), but this policy "
                         f"reads {policy.cfg.image_size} px images and does not resize them: use --protocol heldout "
                         f"(its own {policy.cfg.image_size} px)")
    policy.cfg = type(policy).resolve_for_suite(policy.cfg, env_cfg.suite)  # e.g. OpenVLA-OFT's LIBERO pipeline
    if policy.cfg.image_size != size:  # OpenVLA-OFT and flow policies resize to their vision tower themselves
        policy.cfg = dataclasses.replace(policy.cfg, image_size=size)
    if p["image_pipeline"] and hasattr(policy.cfg, "image_pipeline"):  # OpenVLA-OFT: the reference's image path
        policy.cfg = dataclasses.replace(policy.cfg, image_pipeline=p["image_pipeline"])
    chunk = p["action_chunk"]  # a flow policy: the actions the reference executes per call
    if chunk and chunk != getattr(policy, "action_chunk", chunk):
        horizon = getattr(policy, "horizon", chunk)
        if chunk > horizon:
            raise ValueError(f"--protocol {name} executes {chunk} actions per call on {env_cfg.suite} "
                             f"({source['action_chunk']}), but this policy predicts {horizon}: use --protocol heldout "
                             f"(its own {policy.action_chunk})")
        policy.action_chunk = chunk
        policy.cfg = dataclasses.replace(policy.cfg, action_chunk=chunk)
    if chunk:
        env_cfg.action_chunk = chunk
    return p


def heldout_paired(args: argparse.Namespace, suite: str) -> Optional[Dict[str, Any]]:
    """--paired: {"outcomes": an earlier outcomes file} or {"checkpoint", "saved", "practice"} (its practice trials
    on `suite`, which the held-out set leaves out too); None without --paired."""
    if not args.paired:
        return None
    from common import heldout

    if args.paired.endswith(".json") and os.path.isfile(args.paired):
        return {"outcomes": heldout.read_outcomes(args.paired)}
    saved = saved_train_config(args.paired)
    same_suite = (saved.get("env") or {}).get("suite", "tabletop") == suite
    return {"checkpoint": args.paired, "saved": saved, "practice": practice_trials(saved) if same_suite else 0}


def flow_noise_level(args: argparse.Namespace, checkpoint: str, policy) -> Optional[float]:
    """The exploration noise of a flow policy's sampled episodes: --flow-noise-level, else the run's
    rollout.flow_noise_level (a FlowSAR run folder), else 0.5; None for a token policy (it samples at a temperature)."""
    if getattr(policy, "kind", "token") != "flow":
        return None
    if args.flow_noise_level is not None:
        return args.flow_noise_level
    saved = (saved_train_config(checkpoint).get("rollout") or {}).get("flow_noise_level")
    return float(saved) if saved else 0.5


def heldout_policy_run(args: argparse.Namespace, checkpoint: str, policy, env_cfg: EnvConfig, protocol: Dict[str, Any],
                       task_ids: Sequence[int], hset: Dict[str, Any], set_path: str, temperature: float
                       ) -> Dict[str, Any]:
    """One policy on every state of the held-out set (greedy, and sampled with --sampled), seeded by --seed the same
    way for every policy; its outcomes (common/heldout.py `outcomes`)."""
    import envs
    from common import heldout

    cfg = dataclasses.replace(env_cfg, task_ids=list(task_ids))
    policy.cfg = type(policy).resolve_for_suite(policy.cfg, cfg.suite)
    cfg.image_size = policy.cfg.image_size
    cfg.wrist_camera = env_cfg.wrist_camera or policy.reads_wrist_camera()
    starts, options = heldout.starts_and_options(hset)
    noise = flow_noise_level(args, checkpoint, policy)
    torch.manual_seed(args.seed)  # every policy's episode i samples from the same generator seed (pipeline below)
    np.random.seed(args.seed)
    vec_env = envs.make_vector_env(cfg, min(cfg.num_envs, len(starts)))
    t0 = time.time()
    try:
        _, batches = evaluate_policy(vec_env, policy, task_ids, [], samples_per_trial=int(args.sampled),
                                     temperature=temperature, greedy=True, progress=True,
                                     flow_steps=protocol["flow_steps"], flow_noise_level=noise,
                                     pairs=starts, reset_options=options,
                                     pipeline=True, desc=f"heldout {os.path.basename(os.path.normpath(checkpoint))}")
    finally:
        vec_env.close()
    return heldout.outcomes(
        hset, set_path, batches, checkpoint=checkpoint, iteration=checkpoint_iteration(checkpoint),
        policy_type=family_of_folder(resolve_policy_dir(checkpoint)), suite=cfg.suite, task_ids=list(task_ids),
        seed=args.seed, temperature=temperature if args.sampled and noise is None else None,
        flow_noise_level=noise if args.sampled else None, protocol=protocol["name"],
        env={k: getattr(cfg, k) for k in ("suite", "max_steps", "num_steps_wait", "wait_action", "fixture_seed",
                                          "image_size", "fast_render", "wrist_camera")},
        seconds=round(time.time() - t0, 1),
        provenance=provenance.of_outcomes(checkpoint, saved_train_config(checkpoint)))  # which code made this row


def run_heldout(args: argparse.Namespace, policy, env_cfg: EnvConfig, protocol: Dict[str, Any],
                task_ids: Sequence[int], trial_ids: Sequence[int], out_dir: str, paired: Optional[Dict[str, Any]],
                practice: int) -> Dict[str, Any]:
    """--heldout-set: the set (built or read), this checkpoint's outcomes and, with --paired, the other policy's and
    the paired comparison (--checkpoint minus OTHER). Files in out_dir: heldout_set.json, outcomes.json,
    paired_outcomes.json and paired.json."""
    import shutil

    import envs
    from common import heldout

    if env_cfg.suite in envs.PERTURBED_SUITES:
        raise ValueError(f"--heldout-set draws states from a base suite's placement distribution; '{env_cfg.suite}' "
                         f"is a perturbed variant: evaluate variants with --suites")
    hset, set_path, built = heldout.load_or_build(args.heldout_file, env_cfg, task_ids, trial_ids, args.heldout_set,
                                                  args.heldout_seed)
    print(f"held-out set {set_path} ({'generated' if built else 'read'}): {len(hset['states'])} states, "
          f"official trials {trial_range(trial_ids) if trial_ids else 'none'} plus "
          f"{args.heldout_set - len(trial_ids)} drawn per task (seed {args.heldout_seed}); practice trials "
          f"{f'0-{practice - 1}' if practice else 'none'}")
    if os.path.abspath(set_path) != os.path.abspath(os.path.join(out_dir, "heldout_set.json")):
        shutil.copyfile(set_path, os.path.join(out_dir, "heldout_set.json"))
    temperature = 1.0 if args.temperature is None else args.temperature
    mine = heldout_policy_run(args, args.checkpoint, policy, env_cfg, protocol, task_ids, hset, set_path, temperature)
    heldout.write_json(os.path.join(out_dir, "outcomes.json"), mine)
    result: Dict[str, Any] = {"outcomes": mine, "files": {"set": set_path,
                                                          "outcomes": os.path.join(out_dir, "outcomes.json")}}
    for mode in mine["success"]:
        low, high = mine["interval"][mode]
        print(f"{args.checkpoint}: {mode} {mine['success'][mode]:.3f} [{low:.3f}, {high:.3f}] over "
              f"{len(hset['states'])} states ({mine['invalid'][mode]} invalid episodes)")
    if paired:
        other = paired.get("outcomes")
        if other is None:
            other_policy = load_saved_policy(paired["checkpoint"], device=policy_device(policy))
            other = heldout_policy_run(args, paired["checkpoint"], other_policy, env_cfg, protocol, task_ids, hset,
                                       set_path, temperature)
            heldout.write_json(os.path.join(out_dir, "paired_outcomes.json"), other)
            result["files"]["paired_outcomes"] = os.path.join(out_dir, "paired_outcomes.json")
        comparison = heldout.pair(other, mine)
        heldout.write_json(os.path.join(out_dir, "paired.json"), comparison)
        result["paired"], result["files"]["paired"] = comparison, os.path.join(out_dir, "paired.json")
        print(heldout.format_pair(comparison))
    print("wrote " + ", ".join(result["files"].values()))
    return result


def policy_device(policy) -> str:
    try:
        return str(next(policy.parameters()).device)
    except (StopIteration, AttributeError):
        return "cpu"


def main(argv: Optional[Sequence[str]] = None, args: Optional[argparse.Namespace] = None) -> Dict[str, Any]:
    """Parse the command line (unless `args` is given) and evaluate; every bad input exits with one line."""
    try:
        return _main(parse_args(argv) if args is None else args)
    except (PolicyLoadError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


def _main(args: argparse.Namespace) -> Dict[str, Any]:
    if args.checkpoint.endswith(".json"):  # two saved evaluations: their paired comparison, recomputed
        from common import heldout

        comparison = heldout.pair(heldout.read_outcomes(args.paired),
                                  heldout.read_outcomes(args.checkpoint, "--checkpoint"))
        print(heldout.format_pair(comparison))
        return {"paired": comparison}
    # the output folder first: a folder that cannot be written is found before the evaluation, not after it
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.normpath(args.checkpoint).strip("./")) or "checkpoint"
    out_dir = args.out_dir or os.path.join("plots", f"eval__{name}")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--out-dir {out_dir}: cannot create it ({e.strerror or e}); choose a writable "
                         f"folder") from None
    check_writable(out_dir, f"--out-dir {out_dir}")

    if args.gpu is not None:
        from common.distributed import select_gpu

        select_gpu(args.gpu)  # no such GPU: one line (a ValueError, as every check here)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"evaluate: {threads.header(*threads.set_threads(getattr(args, 'threads', 0), device=device, key='--threads'))}",
          flush=True)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    policy = load_saved_policy(args.checkpoint, device=device)
    saved = saved_train_config(args.checkpoint)
    env_cfg = saved_env_config(args.checkpoint) or EnvConfig()
    if args.suite:
        env_cfg.suite = args.suite
    if args.num_envs is not None:
        env_cfg.num_envs = args.num_envs
    if args.heldout_set is not None and args.protocol is None:
        args.protocol = "heldout"  # a held-out set runs under the checkpoint's own env settings
    protocol = apply_protocol(args, policy, saved, env_cfg)
    reference = protocols.is_reference(protocol["name"])
    policy.cfg = type(policy).resolve_for_suite(policy.cfg, env_cfg.suite)  # the family's defaults for this suite
    if policy.reads_wrist_camera():  # e.g. an OpenVLA-OFT L1 checkpoint reads the wrist camera too
        env_cfg.wrist_camera = True
    env_cfg.image_size = policy.cfg.image_size
    import envs

    task_ids = args.task_ids if args.task_ids is not None else \
        list(range(envs.num_tasks(env_cfg.suite))) if reference else list(env_cfg.task_ids)
    envs.check_task_ids(env_cfg, task_ids)
    n_trials = envs.num_trials(env_cfg)
    own_suite = not args.suite or args.suite == saved.get("env", {}).get("suite")
    practice = practice_trials(saved) if own_suite else 0
    default_start = heldout_start(saved, practice, n_trials) if own_suite else 0  # the training's own val/ trials
    paired = heldout_paired(args, env_cfg.suite)  # --paired: the other checkpoint's policy and practice trials
    if paired and paired.get("practice", 0) > practice:  # neither policy's practice trials are held out
        practice = paired["practice"]
        default_start = max(default_start, practice)
    if reference:  # the reference's trials 0..49 (RL references practise on them: that is their protocol)
        default_start = 0
    elif practice >= n_trials and args.trial_start is None and args.heldout_set is None:
        raise ValueError(f"this checkpoint's training practised on every trial 0-{n_trials - 1} (its eval.protocol "
                         f"{(saved.get('eval') or {}).get('protocol')}), so heldout has no trial left: evaluate it "
                         f"with its protocol (drop --protocol), or pass --trial-start and --allow-practice-trials")
    start = default_start if args.trial_start is None else args.trial_start
    count = n_trials - start if args.trials is None else args.trials
    if args.heldout_set is not None and (args.drawn_only or (start >= n_trials and args.trials is None)):
        count = 0  # a validation set, or every official trial practised (a reference protocol): drawn states only
    elif count < 1 or start + count > n_trials:
        raise ValueError(f"--trial-start {start} --trials {count}: suite '{env_cfg.suite}' has trial ids "
                         f"0..{n_trials - 1}")
    trial_ids = list(range(start, start + count))
    if practice and start < practice and not args.allow_practice_trials and not reference:
        raise ValueError(f"trials {trial_range(trial_ids)} overlap the trials 0-{practice - 1} this checkpoint's "
                         f"training practised on, so success there is not a held-out score: drop --trial-start (the "
                         f"default starts at {practice}), or pass --allow-practice-trials to measure them anyway")
    if args.heldout_set is not None:
        if reference:
            raise ValueError(f"--heldout-set evaluates under the heldout protocol (the checkpoint's env settings), "
                             f"not --protocol {protocol['name']}, whose trials are 0-49: drop --protocol")
        if not trial_ids and not args.drawn_only:
            print(f"every official trial 0-{n_trials - 1} was practised: the held-out set is drawn states only")
        return run_heldout(args, policy, env_cfg, protocol, task_ids, trial_ids, out_dir, paired, practice)
    if args.suites:  # one checkpoint on a base suite and its perturbed variants (common/robustness.py)
        from common.robustness import run_robustness

        return run_robustness(args, policy, env_cfg, task_ids, trial_ids, write_episode_gif)
    names = envs.suite_tasks(env_cfg)
    print(protocols.settings_line(protocol["name"], protocol))
    vec_env = envs.make_vector_env(env_cfg, min(env_cfg.num_envs, len(task_ids) * len(trial_ids)))
    # decoding: greedy (a flow policy: the deterministic ODE at the protocol's steps), or the protocol's sampling;
    # --sampled adds sampled episodes at --temperature
    sampled_protocol = protocol["decoding"] == "sampled"
    temperature = protocol["temperature"] if sampled_protocol else \
        (1.0 if args.temperature is None else args.temperature)
    samples = 1 if sampled_protocol else int(args.sampled)

    t0 = time.time()
    try:
        metrics, batches = evaluate_policy(vec_env, policy, task_ids, trial_ids, samples_per_trial=samples,
                                           temperature=temperature, greedy=not sampled_protocol,
                                           keep_frames=args.gifs > 0, progress=True, flow_steps=protocol["flow_steps"],
                                           flow_noise_level=flow_noise_level(args, args.checkpoint, policy) or 0.0)
    finally:
        vec_env.close()
    elapsed = time.time() - t0
    runs = {mode: {"batch": b, "success_rate": metrics[f"val/{'success' if mode == 'greedy' else 'sampled_success'}"
                                                        f"_rate"]} for mode, b in batches.items()}

    results: Dict[str, Any] = {
        "checkpoint": args.checkpoint, "policy_type": family_of_folder(resolve_policy_dir(args.checkpoint)),
        "iteration": checkpoint_iteration(args.checkpoint), "suite": env_cfg.suite, "task_ids": list(task_ids),
        "trial_ids": trial_ids, "trial_range": trial_range(trial_ids), "trials": len(trial_ids),
        "practice_trials": f"0-{practice - 1}" if practice else None,
        "held_out": not (practice and start < practice),
        "temperature": temperature if samples else None, "seconds": round(elapsed, 1),
        "protocol": protocol["name"],
        "protocol_settings": {k: protocol[k] for k in ("reference", "max_steps", "num_steps_wait", "wait_action",
                                                       "fixture_seed", "image_size", "fast_render", "decoding",
                                                       "temperature", "flow_steps", "practice_on_eval_trials")},
        "env": {k: getattr(env_cfg, k) for k in ("suite", "max_steps", "num_steps_wait", "wait_action",
                                                 "fixture_seed", "image_size", "fast_render", "wrist_camera")},
        "decoding": {"greedy": not sampled_protocol, "samples_per_trial": samples,
                     "temperature": temperature if samples else None, "flow_steps": protocol["flow_steps"]},
        "per_task": [],
    }
    for t in task_ids:
        row: Dict[str, Any] = {"task_id": int(t), "name": str(names[t]["description"]),
                               "max_steps": int(names[t]["max_steps"])}
        for mode, run in runs.items():
            b = run["batch"]
            row[mode] = float(b.complete[b.task_ids == t].mean())
            row[f"{mode}_episodes"] = {"trial_ids": b.trial_ids[b.task_ids == t].tolist(),
                                       "success": b.complete[b.task_ids == t].tolist(),
                                       "steps": b.finish_step[b.task_ids == t].tolist()}
        results["per_task"].append(row)
    for mode, run in runs.items():
        results[f"mean_{mode}"] = run["success_rate"]

    at = f" at iteration {results['iteration']}" if results["iteration"] is not None else ""
    print(f"{args.checkpoint}{at}: protocol {protocol['name']}, trials {results['trial_range']} per task"
          + ("" if results["held_out"] else f" (overlapping the practice trials {results['practice_trials']})"))
    print(format_table(results))
    files = {"json": os.path.join(out_dir, "results.json"),
             "chart": write_bar_chart(results, os.path.join(out_dir, "success.png"))}
    gif = write_episode_gif(next(iter(runs.values()))["batch"], os.path.join(out_dir, "episodes.gif"),
                            per_kind=args.gifs)
    if gif:
        files["gif"] = gif
    results["files"] = files
    with open(files["json"], "w") as f:
        json.dump(results, f, indent=1)
    print(f"{len(task_ids) * len(trial_ids) * len(runs)} episodes in {elapsed:.1f}s; wrote "
          + ", ".join(files.values()))
    return results


if __name__ == "__main__":
    main(args=args)
