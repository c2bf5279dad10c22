"""Supervised warm start (SFT) of a VLA policy on expert demonstrations: the embedded suite's scripted expert, or
LIBERO HDF5 demos (`sft.demo_paths`). Token policy: cross-entropy on action tokens (the action tokenizer is fitted on
the demo actions first); flow policy: flow-matching loss (`policy.type: token|flow`).

    python train_sft.py --task-id 0                        # weak baseline -> checkpoints/sft_tabletop_task0/
    python train_sft.py --config configs/sft.yaml --task-id 0 sft.num_demos=50 sft.steps=1500   # strong recipe

Writes `<run_dir>/{config.yaml, metrics.jsonl, best/, last/, checkpoints/}`, PNG panels in `plots/<run_name>/`, and
the best policy (by greedy success on held-out trials) to `sft.output_path` for the RL scripts to start from.
"""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import envs
from common.config import (ConfigError, EnvConfig, LogConfig, create_run_dir, default_run_prefix, exit_on_bad_config,
                           parse_cli, remove_if_empty, resolve_run_dir, save_config)
from models.configs import FAMILIES, FlowPolicyConfig, TokenPolicyConfig


INTERRUPTED = 130  # exit code of a run stopped by Ctrl-C / SIGTERM (as the RL scripts')


@dataclass
class PolicySection:
    type: str = "token"  # fresh policy: token (cross-entropy on action bins) | flow (flow matching); openvla_oft
                         # starts from its published folder (policy.init_path)
    init_path: Optional[str] = None  # start from a saved or published policy folder (its own family is used)
    token: TokenPolicyConfig = field(default_factory=lambda: TokenPolicyConfig(hidden_size=256))  # 256-wide tiny LM
    flow: FlowPolicyConfig = field(default_factory=lambda: FlowPolicyConfig(hidden_size=128, num_heads=4,
                                                                            expert_dim=128))


@dataclass
class SFTConfig:
    num_demos: int = 10  # scripted-expert demos per task (starts 0..num_demos-1); LIBERO ships 50
    demo_starts: bool = True  # record them from the suite's demo starts (disjoint from every evaluation trial, as
                              # LIBERO's demos are); false = from trials 0..num_demos-1
    demo_noise: float = 0.0  # std of noise on the expert's executed xyz deltas (labels stay clean: DART)
    demo_seed: int = 0
    demo_paths: List[str] = field(default_factory=list)  # LIBERO HDF5 demo files (used instead of the expert)
    steps: int = 1000  # gradient steps
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20  # linear LR warm-up, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    augment_shift: int = 4  # DrQ random shift: pad each camera image by this many pixels (edge-replicated) and crop
                            # back at a random offset, per sample and camera; 0 = off (task 0 held-out 15% -> 40%)
    log_every: int = 10  # steps per logged iteration
    eval_every: int = 0  # steps between evaluations (and checkpoints); 0 = once at the end, so the exported policy
                         # is the last one (> 0 exports the best, picked on the trials RL evaluates on)
    eval_trials: int = 20  # trials per task for evaluation
    eval_trial_start: Optional[int] = None  # first evaluation trial id; None = the suite's last `eval_trials` trials
    output_path: Optional[str] = "auto"  # final (best) policy; auto = checkpoints/sft_<suite>_task<ids>; null = none


@dataclass
class Config:
    seed: int = 0
    resume: Optional[str] = None
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=20))
    log: LogConfig = field(default_factory=lambda: LogConfig(wandb=False))
    policy: PolicySection = field(default_factory=PolicySection)
    sft: SFTConfig = field(default_factory=SFTConfig)


def check_config(cfg: Config) -> None:
    """ConfigError (one line with the fix) for values that would crash or mislead minutes into the run."""
    try:
        envs.check_training_suite(cfg.env.suite)  # robustness variants (tabletop_lan, ...) are never demoed or trained on
        envs.check_task_ids(cfg.env)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    sft = cfg.sft
    if sft.steps < 1:
        raise ConfigError(f"sft.steps={sft.steps}: needs at least 1 gradient step (0 would export the untrained "
                          f"policy as the best one)")
    if sft.batch_size < 1 or sft.log_every < 1:
        raise ConfigError(f"sft.batch_size={sft.batch_size} and sft.log_every={sft.log_every} must be >= 1")
    if sft.eval_every < 0 or sft.eval_trials < 1 or sft.warmup_steps < 0 or sft.augment_shift < 0:
        raise ConfigError(f"sft.eval_every={sft.eval_every} (>= 0, 0 = only at the end), sft.eval_trials="
                          f"{sft.eval_trials} (>= 1), sft.warmup_steps={sft.warmup_steps} (>= 0), sft.augment_shift="
                          f"{sft.augment_shift} (>= 0)")
    if sft.num_demos < 1 and not sft.demo_paths:
        raise ConfigError(f"sft.num_demos={sft.num_demos}: needs at least 1 expert demo per task")
    if not sft.lr > 0:
        raise ConfigError(f"sft.lr={sft.lr}: must be > 0")
    if cfg.policy.type not in ("token", "flow") and not cfg.policy.init_path:
        hint = (" starts from its published checkpoint: set policy.init_path=<the folder>"
                if cfg.policy.type in FAMILIES else ": use token or flow (or policy.init_path=<a saved policy>)")
        raise ConfigError(f"policy.type={cfg.policy.type!r}{hint}")
    if cfg.env.num_envs < 1 or cfg.log.keep_checkpoints < 1:
        raise ConfigError(f"env.num_envs={cfg.env.num_envs} and log.keep_checkpoints={cfg.log.keep_checkpoints} "
                          f"must be >= 1")


def parse(argv: Optional[List[str]] = None) -> Config:
    """The config from configs/sft.yaml + the command line, checked: a bad value exits with one line."""
    cfg: Config = parse_cli(Config, "configs/sft.yaml", __doc__, argv, script="train_sft",
                            resumable=("resume", "log.", "sft.output_path"))
    exit_on_bad_config(check_config, cfg)
    return cfg


# the command line before the imports below: --help and a bad value answer in ~1 s (torch takes seconds to load)
if __name__ == "__main__":
    cfg = parse()

import numpy as np
import torch
from accelerate import Accelerator
from tqdm import tqdm

from common.checkpoint import (CheckpointError, capture_rng_state, latest_checkpoint, load_training_state,
                               load_saved_policy, read_rng_state, save_checkpoint)
from common.demos import demos_to_samples, generate_expert_demos
from common.evaluation import evaluate_policy
from common.logging import Logger, format_line
from models.action_tokenizer import ActionTokenizer
from models.policy import policy_class
from models.saved import TRAIN_CONFIG


class SFTLoss(torch.nn.Module):
    """Wraps the policy so the SFT loss is a forward() call (what accelerate/DDP hooks into)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, obs: Dict[str, np.ndarray], instructions: List[str], actions: np.ndarray):
        if callable(getattr(self.policy, "flow_matching_loss", None)):  # a flow family (models/policy.py)
            return self.policy.flow_matching_loss(obs, instructions, actions)
        return self.policy.sft_loss(obs, instructions, actions)


def random_shift(images: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
    """DrQ augmentation: (B, H, W, C) images edge-padded by `pad` and cropped back to (H, W) at a random offset each."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * pad + 1, (2, b))
    rows = (dy[:, None] + np.arange(h))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + np.arange(w))[:, None, :]  # (B, 1, W)
    return padded[np.arange(b)[:, None, None], rows, cols]


def load_demos(cfg: Config) -> List[Dict[str, Any]]:
    """LIBERO HDF5 demos when `sft.demo_paths` is set, else scripted-expert demos (tabletop only)."""
    if cfg.sft.demo_paths:
        from envs.libero import load_libero_demos

        demos = [d for path in cfg.sft.demo_paths for d in load_libero_demos(path)]
        demos = [d for d in demos if int(d["task_id"]) in cfg.env.task_ids] or demos
        return demos[: cfg.sft.num_demos * len(cfg.env.task_ids)] if cfg.sft.num_demos > 0 else demos
    if cfg.env.suite != "tabletop":
        raise SystemExit(f"env.suite={cfg.env.suite} has no scripted expert: give LIBERO HDF5 files with "
                         f"sft.demo_paths=[path/to/task_demo.hdf5]")
    demo_env = dataclasses.replace(cfg.env, max_steps=None)  # the expert gets the suite's full episode length
    demos = generate_expert_demos(demo_env, cfg.env.task_ids, cfg.sft.num_demos, cfg.sft.demo_noise, cfg.sft.demo_seed,
                                  demo_starts=cfg.sft.demo_starts)
    if not demos:
        raise SystemExit(f"no successful expert demos for tasks {cfg.env.task_ids} (sft.demo_noise="
                         f"{cfg.sft.demo_noise} too high?)")
    return demos


def build_policy(cfg: Config, demo_actions: np.ndarray) -> torch.nn.Module:
    """A fresh policy (action statistics fitted on the demos) or the one at `policy.init_path`."""
    if cfg.policy.init_path:
        return load_saved_policy(cfg.policy.init_path).train()
    family_cfg = getattr(cfg.policy, cfg.policy.type)  # the section of that family (check_config: token or flow)
    tokenizer = ActionTokenizer.fit(demo_actions, n_bins=family_cfg.n_bins)
    return policy_class(cfg.policy.type)(family_cfg, tokenizer)


def export_policy(src: str, dst: str, cfg: Config) -> None:
    """Copy a saved policy folder to `dst` (replacing it) with the run's config beside it."""
    tmp = dst.rstrip("/") + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    save_config(cfg, os.path.join(tmp, TRAIN_CONFIG))
    envs.write_suite_version(tmp, cfg.env.suite)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def main(argv: Optional[List[str]] = None, cfg: Optional[Config] = None) -> Dict[str, float]:
    """Parse (unless `cfg` is given), check, train; bad input is one line (`error: ...`), Ctrl-C / SIGTERM save the
    last completed step and exit 130 with the command that resumes it, a failed checkpoint write is one line with the
    same command."""
    cfg = parse(argv) if cfg is None else cfg
    if cfg.sft.output_path == "auto":
        cfg.sft.output_path = os.path.join("checkpoints",
                                           f"sft_{cfg.env.suite}_task{'-'.join(str(t) for t in cfg.env.task_ids)}")
    accelerator = Accelerator()
    is_main = accelerator.is_main_process
    prefix = default_run_prefix("train_sft", cfg.env.suite, cfg.env.task_ids, cfg.seed)
    try:
        if cfg.resume:
            run_name, run_dir = resolve_run_dir(cfg.log, prefix, cfg.resume, must_exist=True)
        elif is_main:  # a new run gets a folder of its own, created exclusively
            run_name, run_dir = create_run_dir(cfg.log, prefix)
        else:
            run_name, run_dir = "", ""
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None

    state = {"defer": False, "pending": False, "stopping": False}

    def on_signal(signum, frame):  # Ctrl-C / SIGTERM stop at once, except while an update or a save is under way
        if state["defer"] or state["stopping"]:  # a second signal never cuts the save of the first one short
            state["pending"] = not state["stopping"]
            return
        state["stopping"] = True
        raise KeyboardInterrupt

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, on_signal)
        except ValueError:  # not the main thread: Ctrl-C is the caller's
            pass
    progress: Dict[str, Any] = {}  # the last completed step and its RNG states; filled by train()
    try:
        return train(cfg, accelerator, run_name, run_dir, state, progress)
    except KeyboardInterrupt:
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the save short
        code = interrupted(cfg, run_dir, progress, is_main)
        raise SystemExit(code) from None
    except CheckpointError as e:
        raise SystemExit(f"error: {e}; free the space (or fix the folder) and continue with: python train_sft.py "
                         f"--resume {run_dir}") from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if is_main and not cfg.resume:
            remove_if_empty(run_dir, os.path.join(cfg.log.plots_dir, run_name))  # a start that wrote nothing


def interrupted(cfg: Config, run_dir: str, progress: Dict[str, Any], is_main: bool) -> int:
    """Save the last completed step (unless its checkpoint exists), say how to resume; the exit code (130)."""
    if not is_main:
        return INTERRUPTED
    step = progress.get("step", 0)
    if step > progress.get("saved", 0):
        try:
            save_checkpoint(run_dir, step, progress["policy"], {"policy": progress["optimizer"]},
                            {"policy": progress["scheduler"]}, config=cfg, extra={"best": progress["best"]},
                            keep_last=cfg.log.keep_checkpoints, rng_states=[progress["rng"]])
            progress["saved"] = step
        except CheckpointError as e:
            print(f"\n[sft] interrupted; could not save step {step} ({e})", flush=True)
    if progress.get("saved", 0) > 0:
        print(f"\n[sft] interrupted: steps 1..{progress['saved']} are saved in {run_dir}/checkpoints; continue with: "
              f"python train_sft.py --resume {run_dir}", flush=True)
    else:
        print("\n[sft] interrupted before the first step finished: nothing to save", flush=True)
    return INTERRUPTED


def train(cfg: Config, accelerator: Any, run_name: str, run_dir: str, signals: Dict[str, bool],
          progress: Dict[str, Any]) -> Dict[str, float]:
    """The SFT run; `progress` always holds the last completed step, for the interrupt path to save."""
    is_main = accelerator.is_main_process
    for section in (cfg.policy.token, cfg.policy.flow):  # the policy sees what the env renders and executes
        section.image_size, section.action_chunk = cfg.env.image_size, cfg.env.action_chunk

    # seeding
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # demos -> (observation, instruction, action chunk) samples
    t0 = time.time()
    demos = load_demos(cfg)
    policy = build_policy(cfg, np.concatenate([d["actions"] for d in demos]))
    chunk = policy.action_chunk
    samples = demos_to_samples(demos, chunk)
    num_samples = len(samples["actions"])
    if is_main:
        print(f"[sft] {len(demos)} demos, {num_samples} samples (chunk {chunk}) in {time.time() - t0:.1f}s; "
              f"run {run_dir}")

    # evaluation trials: by default the last `eval_trials` of the suite (held out when num_demos leaves them unused)
    n_trials = envs.num_trials(cfg.env)
    first = max(0, n_trials - cfg.sft.eval_trials) if cfg.sft.eval_trial_start is None else cfg.sft.eval_trial_start
    eval_trials = list(range(first, min(n_trials, first + cfg.sft.eval_trials)))
    overlap = sorted({int(d["trial_id"]) for d in demos if not d.get("demo_start")} & set(eval_trials))
    if overlap and is_main:
        print(f"[sft] note: {len(overlap)} evaluation trials also have demos (not held out)")

    # optimizer, cosine schedule with warm-up
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)

    def lr_lambda(step: int) -> float:
        if step < cfg.sft.warmup_steps:
            return (step + 1) / cfg.sft.warmup_steps
        frac = (step - cfg.sft.warmup_steps) / max(1, cfg.sft.steps - cfg.sft.warmup_steps)
        return cfg.sft.min_lr_ratio + (1 - cfg.sft.min_lr_ratio) * 0.5 * (1 + np.cos(np.pi * min(1.0, frac)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    # resume: weights, optimizer, schedule, every random stream (a one-thread resume is bitwise the uninterrupted run)
    start_step, best = 0, {"success": -1.0, "step": -1}
    rng = np.random.default_rng([cfg.seed, accelerator.process_index, start_step])
    if cfg.resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise SystemExit(f"error: --resume: {run_dir} has no complete checkpoint to continue from; start a new run "
                             f"without --resume")
        policy.load_state_dict(load_saved_policy(ckpt).state_dict())
        policy.train()
        start_step, extra = load_training_state(ckpt, {"policy": optimizer}, {"policy": scheduler})
        best = extra.get("best", best)
        saved_rng = read_rng_state(ckpt)
        if "sft" in saved_rng:
            rng.bit_generator.state = saved_rng["sft"]
        else:  # a checkpoint from before the sampler's state was saved
            rng = np.random.default_rng([cfg.seed, accelerator.process_index, start_step])
        print(f"[sft] resumed from {ckpt} at step {start_step}")

    loss_module = SFTLoss(policy)
    loss_module, optimizer, scheduler = accelerator.prepare(loss_module, optimizer, scheduler)
    policy = accelerator.unwrap_model(loss_module).policy
    policy.train()
    logger = Logger(run_dir, run_name, cfg, cfg.log, resume_iteration=start_step if cfg.resume else None) \
        if is_main else None
    if is_main and not cfg.resume:  # a resumed run keeps the config it was started with
        save_config(cfg, os.path.join(run_dir, "config.yaml"), script="train_sft", exclusive=True)
    eval_env = envs.make_vector_env(cfg.env, min(cfg.env.num_envs, len(eval_trials) * len(cfg.env.task_ids))) \
        if eval_trials and is_main else None

    def rng_state() -> Dict[str, Any]:
        return {**capture_rng_state(), "sft": rng.bit_generator.state}

    progress.update(step=start_step, saved=start_step, rng=rng_state(), best=best, policy=policy, optimizer=optimizer,
                    scheduler=scheduler)

    def deferred_signals(fn, *args):
        """fn(*args) with Ctrl-C / SIGTERM held back until it returns (an update or a save is never cut in half)."""
        signals["defer"] = True
        try:
            return fn(*args)
        finally:
            signals["defer"] = False
            if signals["pending"]:
                signals["pending"], signals["stopping"] = False, True
                raise KeyboardInterrupt

    def save_policies(step: int, success: float) -> None:
        policy.save(os.path.join(run_dir, "last"))
        if success >= best["success"]:  # ties go to the later (longer trained) policy
            best.update(success=success, step=step)
            policy.save(os.path.join(run_dir, "best"))
        save_checkpoint(run_dir, step, policy, {"policy": optimizer}, {"policy": scheduler}, config=cfg,
                        extra={"best": best}, keep_last=cfg.log.keep_checkpoints, rng_states=[rng_state()])
        progress["saved"] = step

    def evaluate_and_save(step: int) -> Dict[str, float]:
        """Greedy success on the evaluation trials; keep best/ and last/, write a training checkpoint."""
        out: Dict[str, float] = {}
        if eval_env is not None:
            out.update(evaluate_policy(eval_env, policy, cfg.env.task_ids, eval_trials)[0])
        deferred_signals(save_policies, step, out.get("val/success_rate", 0.0))
        return out

    def update(step: int) -> float:
        optimizer.step()
        scheduler.step()
        progress.update(step=step + 1, rng=rng_state())
        return scheduler.get_last_lr()[0]

    # training loop
    bar = tqdm(range(start_step, cfg.sft.steps), initial=start_step, total=cfg.sft.steps, desc="sft",
               disable=not is_main)
    window: Dict[str, List[float]] = {}
    t_window = time.time()
    metrics: Dict[str, float] = {}
    t_start = time.time()
    for step in bar:
        idx = rng.integers(0, num_samples, cfg.sft.batch_size)
        obs = {k: samples[k][idx] for k in ("agentview", "wrist", "state")}
        for k in ("agentview", "wrist"):
            obs[k] = random_shift(obs[k], cfg.sft.augment_shift, rng)
        loss, info = loss_module(obs, samples["instructions"][idx].tolist(), samples["actions"][idx])
        optimizer.zero_grad(set_to_none=True)
        accelerator.backward(loss)
        grad_norm = accelerator.clip_grad_norm_(params, cfg.sft.max_grad_norm)
        lr = deferred_signals(update, step)
        for k, v in {**info, "train/grad_norm": float(grad_norm), "train/lr": lr}.items():
            window.setdefault(k, []).append(float(v))

        done = step + 1
        if not is_main:
            continue
        do_eval = done == cfg.sft.steps or (cfg.sft.eval_every > 0 and done % cfg.sft.eval_every == 0)
        if done % cfg.sft.log_every == 0 or do_eval:
            metrics = {k: float(np.mean(v)) for k, v in window.items()}
            metrics["charts/samples_per_s"] = len(window["train/lr"]) * cfg.sft.batch_size / (time.time() - t_window)
            if do_eval:
                metrics.update(evaluate_and_save(done))
            metrics["charts/elapsed_s"] = time.time() - t_start
            logger.log(metrics, step=done)
            bar.write(format_line(done, metrics, ["charts/samples_per_s", "sft/loss", "sft/flow_mse",
                                                  "sft/token_accuracy", "train/grad_norm", "val/success_rate"],
                                  total=cfg.sft.steps))
            window, t_window = {}, time.time()
            progress["rng"] = rng_state()  # evaluation may draw random numbers too

    if is_main:
        if cfg.sft.steps <= start_step:  # nothing left to train: still leave best/ and last/
            evaluate_and_save(start_step)
        logger.close()
        if eval_env is not None:
            eval_env.close()
        if cfg.sft.output_path:
            deferred_signals(export_policy, os.path.join(run_dir, "best"), cfg.sft.output_path, cfg)
            print(f"[sft] best policy (step {best['step']}, val success {best['success']:.1%}) -> "
                  f"{cfg.sft.output_path}")
    return {"val/success_rate": metrics.get("val/success_rate", float("nan")), "best_success": best["success"],
            "best_step": best["step"]}


if __name__ == "__main__":
    main(cfg=cfg)
