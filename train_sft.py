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
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from accelerate import Accelerator
from tqdm import tqdm

import envs
from common.checkpoint import latest_checkpoint, load_saved_policy, load_training_state, save_checkpoint
from common.config import EnvConfig, LogConfig, default_run_prefix, parse_cli, resolve_run_dir, save_config
from common.demos import demos_to_samples, generate_expert_demos
from common.evaluation import evaluate_policy
from common.logging import Logger, format_line
from models.saved import TRAIN_CONFIG
from models.action_tokenizer import ActionTokenizer
from models.flow_policy import FlowPolicy, FlowPolicyConfig
from models.token_policy import TokenPolicy, TokenPolicyConfig


@dataclass
class PolicySection:
    type: str = "token"  # token (cross-entropy on action bins) | flow (flow matching)
    init_path: Optional[str] = None  # start from a saved policy instead of a fresh one (its own type is used)
    token: TokenPolicyConfig = field(default_factory=TokenPolicyConfig)
    flow: FlowPolicyConfig = field(default_factory=FlowPolicyConfig)


@dataclass
class SFTConfig:
    num_demos: int = 10  # scripted-expert demos per task (starts 0..num_demos-1); LIBERO ships 50
    demo_starts: bool = True  # record them from the suite's demo starts (disjoint from every evaluation trial, as
                              # LIBERO's demos are); false = from trials 0..num_demos-1
    demo_noise: float = 0.3  # std of noise on the expert's executed xyz deltas (labels stay clean: DART)
    demo_seed: int = 0
    demo_paths: List[str] = field(default_factory=list)  # LIBERO HDF5 demo files (used instead of the expert)
    steps: int = 300  # gradient steps
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup_steps: int = 20  # linear LR warm-up, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    max_grad_norm: float = 1.0
    augment_shift: int = 0  # DrQ random shift: pad each camera image by this many pixels (edge-replicated) and crop
                            # back at a random offset, per sample and camera; 0 = off
    log_every: int = 10  # steps per logged iteration
    eval_every: int = 100  # steps between evaluations (and checkpoints); 0 = only at the end
    eval_trials: int = 20  # trials per task for evaluation
    eval_trial_start: Optional[int] = None  # first evaluation trial id; None = the suite's last `eval_trials` trials
    output_path: Optional[str] = "auto"  # final (best) policy; auto = checkpoints/sft_<suite>_task<ids>; null = none


@dataclass
class Config:
    seed: int = 0
    resume: Optional[str] = None
    env: EnvConfig = field(default_factory=EnvConfig)
    log: LogConfig = field(default_factory=LogConfig)
    policy: PolicySection = field(default_factory=PolicySection)
    sft: SFTConfig = field(default_factory=SFTConfig)


class SFTLoss(torch.nn.Module):
    """Wraps the policy so the SFT loss is a forward() call (what accelerate/DDP hooks into)."""

    def __init__(self, policy: torch.nn.Module):
        super().__init__()
        self.policy = policy

    def forward(self, obs: Dict[str, np.ndarray], instructions: List[str], actions: np.ndarray):
        if isinstance(self.policy, FlowPolicy):
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
    if cfg.policy.type == "token":
        tokenizer = ActionTokenizer.fit(demo_actions, n_bins=cfg.policy.token.n_bins)
        return TokenPolicy(cfg.policy.token, tokenizer)
    if cfg.policy.type == "flow":
        tokenizer = ActionTokenizer.fit(demo_actions, n_bins=cfg.policy.flow.n_bins)
        return FlowPolicy(cfg.policy.flow, tokenizer)
    raise SystemExit(f"policy.type={cfg.policy.type!r}: use token or flow")


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


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    cfg: Config = parse_cli(Config, "configs/sft.yaml", __doc__.split("\n")[0], argv)
    envs.check_task_ids(cfg.env)
    for section in (cfg.policy.token, cfg.policy.flow):  # the policy sees what the env renders and executes
        section.image_size, section.action_chunk = cfg.env.image_size, cfg.env.action_chunk
    if cfg.sft.output_path == "auto":
        cfg.sft.output_path = os.path.join("checkpoints",
                                           f"sft_{cfg.env.suite}_task{'-'.join(str(t) for t in cfg.env.task_ids)}")
    run_name, run_dir = resolve_run_dir(
        cfg.log, default_run_prefix("train_sft", cfg.env.suite, cfg.env.task_ids, cfg.seed), cfg.resume)
    accelerator = Accelerator()
    is_main = accelerator.is_main_process

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
        progress = (step - cfg.sft.warmup_steps) / max(1, cfg.sft.steps - cfg.sft.warmup_steps)
        return cfg.sft.min_lr_ratio + (1 - cfg.sft.min_lr_ratio) * 0.5 * (1 + np.cos(np.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    # resume
    start_step, best = 0, {"success": -1.0, "step": -1}
    if cfg.resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            print(f"[sft] --resume: no valid checkpoint in {run_dir}; starting from scratch")
        else:
            policy.load_state_dict(load_saved_policy(ckpt).state_dict())
            policy.train()
            start_step, extra = load_training_state(ckpt, {"policy": optimizer}, {"policy": scheduler})
            best = extra.get("best", best)
            print(f"[sft] resumed from {ckpt} at step {start_step}")

    loss_module = SFTLoss(policy)
    loss_module, optimizer, scheduler = accelerator.prepare(loss_module, optimizer, scheduler)
    policy = accelerator.unwrap_model(loss_module).policy
    policy.train()
    logger = Logger(run_dir, run_name, cfg, cfg.log) if is_main else None
    if is_main:
        save_config(cfg, os.path.join(run_dir, "config.yaml"))
    rng = np.random.default_rng([cfg.seed, accelerator.process_index, start_step])
    eval_env = envs.make_vector_env(cfg.env, min(cfg.env.num_envs, len(eval_trials) * len(cfg.env.task_ids))) \
        if eval_trials and is_main else None

    def evaluate_and_save(step: int) -> Dict[str, float]:
        """Greedy success on the evaluation trials; keep best/ and last/, write a training checkpoint."""
        out: Dict[str, float] = {}
        if eval_env is not None:
            out.update(evaluate_policy(eval_env, policy, cfg.env.task_ids, eval_trials)[0])
        policy.save(os.path.join(run_dir, "last"))
        success = out.get("val/success_rate", 0.0)
        if success >= best["success"]:  # ties go to the later (longer trained) policy
            best.update(success=success, step=step)
            policy.save(os.path.join(run_dir, "best"))
        save_checkpoint(run_dir, step, policy, {"policy": optimizer}, {"policy": scheduler}, config=cfg,
                        extra={"best": best}, keep_last=cfg.log.keep_checkpoints)
        return out

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
        optimizer.step()
        scheduler.step()
        for k, v in {**info, "train/grad_norm": float(grad_norm), "train/lr": scheduler.get_last_lr()[0]}.items():
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
                                                  "sft/token_accuracy", "train/grad_norm", "val/success_rate"]))
            window, t_window = {}, time.time()

    if is_main:
        if cfg.sft.steps <= start_step:  # nothing left to train: still leave best/ and last/
            evaluate_and_save(start_step)
        logger.close()
        if eval_env is not None:
            eval_env.close()
        if cfg.sft.output_path:
            export_policy(os.path.join(run_dir, "best"), cfg.sft.output_path, cfg)
            print(f"[sft] best policy (step {best['step']}, val success {best['success']:.1%}) -> "
                  f"{cfg.sft.output_path}")
    return {"val/success_rate": metrics.get("val/success_rate", float("nan")), "best_success": best["success"],
            "best_step": best["step"]}


if __name__ == "__main__":
    main()
