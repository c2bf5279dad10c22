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
import math
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
    num_demos: int = 10  # demos per task: the scripted expert's (starts 0..num_demos-1), or the first of each task in
                        # sft.demo_paths (0 = all; LIBERO ships 50)
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
class TrainSection:  # how the processes share the work: the RL scripts' train.strategy and train.fsdp_offload keys
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)


@dataclass
class Config:
    seed: int = 0
    resume: Optional[str] = None
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=20))
    log: LogConfig = field(default_factory=lambda: LogConfig(wandb=False))
    policy: PolicySection = field(default_factory=PolicySection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainSection = field(default_factory=TrainSection)


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
    if cfg.train.strategy != "ddp" or cfg.train.fsdp_offload:  # (common.fsdp loads torch: not for the default)
        from common.fsdp import check_strategy

        try:
            check_strategy(cfg.train.strategy, cfg.train.fsdp_offload)
        except ValueError as e:
            raise ConfigError(str(e)) from None
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

from types import SimpleNamespace

import numpy as np
import torch
from tqdm import tqdm

from common import fsdp
from common.checkpoint import (CheckpointError, capture_rng_state, latest_checkpoint, load_saved_policy,
                               read_rng_state, read_rng_states)
from common.demos import demos_to_samples, generate_expert_demos, load_hdf5_demos
from common.evaluation import evaluate_policy
from common.logging import Logger, format_line
from common.run import close_process_group, make_accelerator, resume_command
from common.train import optimizer_step
from models.action_tokenizer import ActionTokenizer
from models.policy import policy_class
from models.saved import TRAIN_CONFIG


def sft_loss(policy: torch.nn.Module, obs: Dict[str, np.ndarray], instructions: List[str], actions: np.ndarray):
    """(loss, info) of the policy's family: flow matching (a flow family, models/policy.py) or token cross-entropy."""
    if callable(getattr(policy, "flow_matching_loss", None)):
        return policy.flow_matching_loss(obs, instructions, actions)
    return policy.sft_loss(obs, instructions, actions)


def random_shift(images: np.ndarray, pad: int, rng: np.random.Generator, batch: Optional[int] = None,
                 rows: slice = slice(None)) -> np.ndarray:
    """DrQ augmentation: (B, H, W, C) images edge-padded by `pad` and cropped back to (H, W) at a random offset each.
    With several processes every one draws the offsets of the whole batch of `batch` samples (the draws of one
    process) and `images` are its `rows` of that batch."""
    if pad <= 0:
        return images
    b, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * pad + 1, (2, b if batch is None else batch))
    dy, dx = dy[rows], dx[rows]
    rows = (dy[:, None] + np.arange(h))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + np.arange(w))[:, None, :]  # (B, 1, W)
    return padded[np.arange(b)[:, None, None], rows, cols]


def load_demos(cfg: Config) -> List[Dict[str, Any]]:
    """LIBERO HDF5 demos when `sft.demo_paths` is set, else scripted-expert demos (tabletop only)."""
    if cfg.sft.demo_paths:  # sft.num_demos per task (0: all), images at env.image_size, each file of a trained task
        try:
            return load_hdf5_demos(cfg.sft.demo_paths, cfg.env, cfg.sft.num_demos, "sft.demo_paths")
        except ConfigError as e:
            raise SystemExit(f"error: {e}") from None
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


def copy_policy(src: str, dst: str, cfg: Optional[Config] = None) -> None:
    """Copy a saved policy folder to `dst` (replacing it; written beside it first, then moved into place); with `cfg`,
    the run's config and suite version go beside the weights (the exported policy)."""
    tmp = dst.rstrip("/") + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if cfg is not None:
        save_config(cfg, os.path.join(tmp, TRAIN_CONFIG))
        envs.write_suite_version(tmp, cfg.env.suite)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.replace(tmp, dst)


def main(argv: Optional[List[str]] = None, cfg: Optional[Config] = None) -> Dict[str, float]:
    """Parse (unless `cfg` is given), check, train; bad input is one line (`error: ...`), Ctrl-C / SIGTERM save the
    last completed step and exit 130 with the command that resumes it, a failed checkpoint write is one line with the
    same command. Several processes (`accelerate launch`) split each batch and stop together on a signal."""
    cfg = parse(argv) if cfg is None else cfg
    if cfg.sft.output_path == "auto":
        cfg.sft.output_path = os.path.join("checkpoints",
                                           f"sft_{cfg.env.suite}_task{'-'.join(str(t) for t in cfg.env.task_ids)}")
    try:
        accelerator = make_accelerator()
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    is_main, world = accelerator.is_main_process, accelerator.num_processes
    if cfg.sft.batch_size % world:
        close_process_group(False)
        raise SystemExit(f"error: sft.batch_size={cfg.sft.batch_size} is the batch of each step, split over the "
                         f"{world} processes: make it a multiple of {world}")
    prefix = default_run_prefix("train_sft", cfg.env.suite, cfg.env.task_ids, cfg.seed)
    error, named = None, ("", "")
    try:
        if cfg.resume:
            named = resolve_run_dir(cfg.log, prefix, cfg.resume, must_exist=True)
        elif is_main:  # a new run gets a folder of its own, created exclusively; the other processes take its name
            named = create_run_dir(cfg.log, prefix)
    except ConfigError as e:
        error = f"error: {e}"
    if world > 1:
        from accelerate.utils import broadcast_object_list

        error, named = broadcast_object_list([error, named], from_process=0)
    if error:
        close_process_group(False)
        raise SystemExit(error)
    run_name, run_dir = named

    # Ctrl-C / SIGTERM: one process stops at once, except while an update or a save is under way; several processes
    # (`lockstep`, from the first step on) only note it, and all stop together after the step (`train`)
    state = {"defer": False, "pending": False, "stopping": False, "lockstep": False}

    def on_signal(signum, frame):
        if state["defer"] or state["stopping"] or state["lockstep"]:  # a second signal never cuts a save short
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
    ok = False
    try:
        out = train(cfg, accelerator, run_name, run_dir, state, progress)
        ok = True
        return out
    except KeyboardInterrupt:
        for sig in old:
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the save short
        code = interrupted(run_dir, progress, is_main, world)
        raise SystemExit(code) from None
    except CheckpointError as e:
        raise SystemExit(f"error: {e}; free the space (or fix the folder) and continue with: "
                         f"{resume_command('train_sft.py', run_dir, world)}") from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        close_process_group(ok)
        if is_main and not cfg.resume:
            remove_if_empty(run_dir, os.path.join(cfg.log.plots_dir, run_name))  # a start that wrote nothing


def interrupted(run_dir: str, progress: Dict[str, Any], is_main: bool, world: int) -> int:
    """Save the last completed step (unless its checkpoint exists; under fsdp every process writes its shards), say
    how to resume; the exit code (130)."""
    step = progress.get("step", 0)
    if step > progress.get("saved", 0):
        try:
            progress["save"](step, progress["rng"])
        except CheckpointError as e:
            if is_main:
                print(f"\n[sft] interrupted; could not save step {step} ({e})", flush=True)
    if not is_main:
        return INTERRUPTED
    if progress.get("saved", 0) > 0:
        print(f"\n[sft] interrupted: steps 1..{progress['saved']} are saved in {run_dir}/checkpoints; continue with: "
              f"{resume_command('train_sft.py', run_dir, world)}", flush=True)
    else:
        print("\n[sft] interrupted before the first step finished: nothing to save", flush=True)
    return INTERRUPTED


def train(cfg: Config, accelerator: Any, run_name: str, run_dir: str, signals: Dict[str, bool],
          progress: Dict[str, Any]) -> Dict[str, float]:
    """The SFT run; `progress` always holds the last completed step, for the interrupt path to save.

    Several processes: every process draws the same batch of sft.batch_size samples (and augmentation offsets), runs
    its own slice of it, and the gradients are averaged by the RL scripts' `optimizer_step` (common/train.py:
    `average_gradients` under ddp and fsdp alike), so the run is the one-process run at the same batch up to float
    rounding. Process 0 evaluates and logs; every process takes part in a checkpoint (its RNG states, and under fsdp
    its shards)."""
    is_main, rank, world = accelerator.is_main_process, accelerator.process_index, accelerator.num_processes
    for section in (cfg.policy.token, cfg.policy.flow):  # the policy sees what the env renders and executes
        section.image_size, section.action_chunk = cfg.env.image_size, cfg.env.action_chunk

    # seeding: the same initial weights on every process, then each its own torch stream (flow matching's noise)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    # demos -> (observation, instruction, action chunk) samples
    t0 = time.time()
    with accelerator.main_process_first():  # process 0 records (and caches) the expert demos, the others read them
        demos = load_demos(cfg)
    policy = build_policy(cfg, np.concatenate([d["actions"] for d in demos]))
    if rank:
        torch.manual_seed(cfg.seed + rank)
    chunk = policy.action_chunk
    samples = demos_to_samples(demos, chunk)
    num_samples = len(samples["actions"])
    if is_main:
        print(f"[sft] {len(demos)} demos, {num_samples} samples (chunk {chunk}) in {time.time() - t0:.1f}s; "
              f"run {run_dir}" + (f"; {world} processes, train.strategy={cfg.train.strategy}" if world > 1 else ""))

    # evaluation trials: by default the last `eval_trials` of the suite (held out when num_demos leaves them unused)
    n_trials = envs.num_trials(cfg.env)
    first = max(0, n_trials - cfg.sft.eval_trials) if cfg.sft.eval_trial_start is None else cfg.sft.eval_trial_start
    eval_trials = list(range(first, min(n_trials, first + cfg.sft.eval_trials)))
    overlap = sorted({int(d["trial_id"]) for d in demos if not d.get("demo_start")} & set(eval_trials))
    if overlap and is_main:
        print(f"[sft] note: {len(overlap)} evaluation trials also have demos (not held out)")

    # resume: the weights first (plain), then sharding (train.strategy), the optimizer on the shards, its state
    ckpt = None
    if cfg.resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise SystemExit(f"error: --resume: {run_dir} has no complete checkpoint to continue from; start a new run "
                             f"without --resume")
        saved_world = len(read_rng_states(ckpt))
        if saved_world != world:
            raise SystemExit(f"error: --resume: the run had {saved_world} process(es) and this launch has {world}: "
                             f"resume with `{resume_command('train_sft.py', run_dir, saved_world)}`")
        policy.load_state_dict(load_saved_policy(ckpt).state_dict())
    # what shard_policy and optimizer_step read of an RL script's Run
    dist = SimpleNamespace(cfg=cfg, accelerator=accelerator, device=accelerator.device, world=world)
    policy = fsdp.shard_policy(dist, policy.to(accelerator.device))

    # optimizer, cosine schedule with warm-up
    params = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)

    def lr_lambda(step: int) -> float:
        # a Python float (math.cos, not np.cos): the optimizer's lr goes into checkpoints, and torch.load's
        # weights_only reader refuses numpy scalars (a resume after the warm-up failed that way)
        if step < cfg.sft.warmup_steps:
            return (step + 1) / cfg.sft.warmup_steps
        frac = (step - cfg.sft.warmup_steps) / max(1, cfg.sft.steps - cfg.sft.warmup_steps)
        return cfg.sft.min_lr_ratio + (1 - cfg.sft.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    # resume: optimizer, schedule, every random stream (a one-thread resume is bitwise the uninterrupted run)
    start_step, best = 0, {"success": -1.0, "step": -1}
    rng = np.random.default_rng([cfg.seed, 0, start_step])  # the batch sampler: the same on every process
    if ckpt is not None:
        try:
            start_step, extra = fsdp.load_checkpoint(ckpt, policy, {"policy": optimizer}, {"policy": scheduler},
                                                     rank=rank)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        best = extra.get("best", best)
        saved_rng = read_rng_state(ckpt, rank)
        if "sft" in saved_rng:
            rng.bit_generator.state = saved_rng["sft"]
        else:  # a checkpoint from before the sampler's state was saved
            rng = np.random.default_rng([cfg.seed, 0, start_step])
        if is_main:
            print(f"[sft] resumed from {ckpt} at step {start_step}")
    fsdp.register(policy, [optimizer])  # fsdp: gathers the weights to compute with (collective)
    policy.train()
    logger = Logger(run_dir, run_name, cfg, cfg.log, resume_iteration=start_step if cfg.resume else None) \
        if is_main else None
    if is_main and not cfg.resume:  # a resumed run keeps the config it was started with
        save_config(cfg, os.path.join(run_dir, "config.yaml"), script="train_sft", exclusive=True)
    eval_env = envs.make_vector_env(cfg.env, min(cfg.env.num_envs, len(eval_trials) * len(cfg.env.task_ids))) \
        if eval_trials and is_main else None

    def rng_state() -> Dict[str, Any]:
        return {**capture_rng_state(), "sft": rng.bit_generator.state}

    def gather(items: List) -> List:
        if world == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(list(items))

    def save(step: int, rng_now: Dict[str, Any]) -> str:
        """The checkpoint of `step` (every process calls it: each adds its RNG states, under fsdp its shards)."""
        path = fsdp.save_checkpoint(run_dir, step, policy, {"policy": optimizer}, {"policy": scheduler}, rank=rank,
                                    gather=gather, config=cfg, extra={"best": best},
                                    keep_last=cfg.log.keep_checkpoints, rng_states=gather([rng_now]))
        progress["saved"] = step
        return path

    progress.update(step=start_step, saved=start_step, rng=rng_state(), save=save)

    def deferred_signals(fn, *args):
        """fn(*args) with Ctrl-C / SIGTERM held back until it returns (an update or a save is never cut in half)."""
        signals["defer"] = True
        try:
            return fn(*args)
        finally:
            signals["defer"] = False
            if signals["pending"] and not signals["lockstep"]:
                signals["pending"], signals["stopping"] = False, True
                raise KeyboardInterrupt

    def save_policies(step: int, success: float) -> None:
        """The checkpoint, then its policy/ as last/ (and best/ when it is the best so far) on process 0."""
        improved = success >= best["success"]  # ties go to the later (longer trained) policy
        if improved:
            best.update(success=success, step=step)
        path = save(step, rng_state())
        if is_main:
            copy_policy(os.path.join(path, "policy"), os.path.join(run_dir, "last"))
            if improved:
                copy_policy(os.path.join(path, "policy"), os.path.join(run_dir, "best"))

    def evaluate_and_save(step: int) -> Dict[str, float]:
        """Greedy success on the evaluation trials (process 0); keep best/ and last/, write a training checkpoint."""
        out: Dict[str, float] = {}
        if eval_env is not None:
            out.update(evaluate_policy(eval_env, policy, cfg.env.task_ids, eval_trials)[0])
        deferred_signals(save_policies, step, out.get("val/success_rate", 0.0))
        return out

    def update(step: int) -> tuple:
        """Gradients averaged over the processes, clipped; the optimizer and schedule step."""
        norm = optimizer_step(dist, params, optimizer, scheduler, cfg.sft.max_grad_norm)
        progress.update(step=step + 1, rng=rng_state())
        return norm, scheduler.get_last_lr()[0]

    def over_processes(info: Dict[str, float]) -> tuple:
        """The step's statistics averaged over the processes (their slices are equal), and whether any process was
        signalled, in one small all-reduce: then every process stops after this step, together."""
        keys = sorted(info)
        flags = torch.tensor([float(signals["pending"])] + [float(info[k]) for k in keys], dtype=torch.float64,
                             device=accelerator.device)
        flags = accelerator.reduce(flags, reduction="sum").cpu()
        return {k: float(v) / world for k, v in zip(keys, flags[1:])}, bool(flags[0] > 0)

    # training loop
    b = cfg.sft.batch_size
    mine = slice(rank * (b // world), (rank + 1) * (b // world))  # this process's rows of each batch
    bar = tqdm(range(start_step, cfg.sft.steps), initial=start_step, total=cfg.sft.steps, desc="sft",
               disable=not is_main)
    window: Dict[str, List[float]] = {}
    t_window = time.time()
    metrics: Dict[str, float] = {}
    t_start = time.time()
    signals["lockstep"] = world > 1
    for step in bar:
        idx = rng.integers(0, num_samples, b)[mine]
        obs = {k: samples[k][idx] for k in ("agentview", "wrist", "state")}
        for k in ("agentview", "wrist"):
            obs[k] = random_shift(obs[k], cfg.sft.augment_shift, rng, b, mine)
        loss, info = sft_loss(policy, obs, samples["instructions"][idx].tolist(), samples["actions"][idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm, lr = deferred_signals(update, step)
        stop = False
        if world > 1:
            info, stop = over_processes(info)
        for k, v in {**info, "train/grad_norm": float(grad_norm), "train/lr": lr}.items():
            window.setdefault(k, []).append(float(v))

        done = step + 1
        do_eval = done == cfg.sft.steps or (cfg.sft.eval_every > 0 and done % cfg.sft.eval_every == 0)
        if done % cfg.sft.log_every == 0 or do_eval:
            if is_main:
                metrics = {k: float(np.mean(v)) for k, v in window.items()}
                metrics["charts/samples_per_s"] = len(window["train/lr"]) * b / (time.time() - t_window)
            evaluated = evaluate_and_save(done) if do_eval else {}
            if is_main:
                metrics.update(evaluated)
                metrics["charts/elapsed_s"] = time.time() - t_start
                logger.log(metrics, step=done)
                bar.write(format_line(done, metrics, ["charts/samples_per_s", "sft/loss", "sft/flow_mse",
                                                      "sft/token_accuracy", "train/grad_norm", "val/success_rate"],
                                      total=cfg.sft.steps))
            window, t_window = {}, time.time()
            progress["rng"] = rng_state()  # evaluation may draw random numbers too
        if stop:  # every process, after the same step: `interrupted` saves it (unless just saved) on every process
            raise KeyboardInterrupt

    if cfg.sft.steps <= start_step:  # nothing left to train: still leave best/ and last/
        evaluate_and_save(start_step)
    if is_main:
        logger.close()
        if eval_env is not None:
            eval_env.close()
        if cfg.sft.output_path:
            deferred_signals(copy_policy, os.path.join(run_dir, "best"), cfg.sft.output_path, cfg)
            print(f"[sft] best policy (step {best['step']}, val success {best['success']:.1%}) -> "
                  f"{cfg.sft.output_path}")
    return {"val/success_rate": metrics.get("val/success_rate", float("nan")), "best_success": best["success"],
            "best_step": best["step"]}


if __name__ == "__main__":
    main(cfg=cfg)
