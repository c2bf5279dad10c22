"""Supervised warm start (SFT) of a VLA policy on expert demonstrations: the embedded suite's scripted expert, or
LIBERO HDF5 demos (`sft.demo_paths`). The loss is the policy family's own (its `sft_loss`: a token policy's
cross-entropy on action tokens, a flow policy's flow-matching loss), and so is its fresh start (its `fresh`: the
action statistics fitted on the demo actions first) from the section `policy.<policy.type>` (token, flow, or any
family in models/configs.py FAMILIES that starts fresh).

    python train_sft.py --task-id 0                        # weak baseline -> checkpoints/sft_tabletop_task0/
    python train_sft.py --config configs/sft.yaml --task-id 0 sft.num_demos=50 sft.steps=1500   # strong recipe

Writes `<run_dir>/{config.yaml, metrics.jsonl, best/, last/, checkpoints/}`, PNG panels in `plots/<run_name>/`, and
the best policy (by greedy success on held-out trials) to `sft.output_path` for the RL scripts to start from.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import envs
from common import memory_plan
from common.config import (ConfigError, EnvConfig, LogConfig, check_ranges, exit_on_bad_config, parse_cli, ranged,
                           save_config)
from models.configs import FAMILIES, FlowPolicyConfig, TokenPolicyConfig


@dataclass
class PolicySection:
    type: str = "token"  # fresh policy: token (cross-entropy on action bins) | flow (flow matching) | another family
                         # (its section policy.<type>); openvla_oft starts from its published folder (policy.init_path)
    init_path: Optional[str] = None  # start from a saved or published policy folder (its own family is used)
    token: TokenPolicyConfig = field(default_factory=lambda: TokenPolicyConfig(hidden_size=256))  # 256-wide tiny LM
    flow: FlowPolicyConfig = field(default_factory=lambda: FlowPolicyConfig(hidden_size=128, num_heads=4,
                                                                            expert_dim=128))


@dataclass
class SFTConfig:
    num_demos: int = ranged(10, "[0, 100000]")  # demos per task: the scripted expert's (starts 0..num_demos-1), or
                                                # the first of each task in sft.demo_paths (0 = all; LIBERO ships 50)
    demo_starts: bool = True  # record them from the suite's demo starts (disjoint from every evaluation trial, as
                              # LIBERO's demos are); false = from trials 0..num_demos-1
    demo_noise: float = ranged(0.0, "[0, inf)")  # std of noise on the expert's executed
                                                 # xyz deltas (labels stay clean: DART)
    demo_seed: int = ranged(0, "[0, inf)")  # seed of the expert's demo noise (sft.demo_noise)
    demo_paths: List[str] = field(default_factory=list)  # LIBERO HDF5 demo files (used instead of the expert)
    steps: int = ranged(1000, "[1, inf)", "0 steps would export the untrained policy as the best one")  # gradient steps
    batch_size: int = ranged(16, "[1, 65536]")  # samples per gradient step (all processes together)
    lr: float = ranged(1e-3, "[0, inf)")  # AdamW peak learning rate
    weight_decay: float = ranged(0.0, "[0, inf)")  # AdamW weight decay
    warmup_steps: int = ranged(20, "[0, inf)")  # linear LR warm-up, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = ranged(0.1, "[0, 1]")  # the cosine decay ends at lr * min_lr_ratio
    max_grad_norm: float = ranged(1.0, "(0, inf)")  # clip the gradient's global norm to this
    augment_shift: int = ranged(4, "[0, 256]")  # DrQ random shift: pad each camera image by this many pixels
                                                # (edge-replicated) and crop back at a random offset, per
                                                # sample and camera; 0 = off (task 0 held-out 15% -> 40%)
    log_every: int = ranged(10, "[1, inf)")  # steps per logged iteration
    eval_every: int = ranged(0, "[0, inf)")  # steps between evaluations (and checkpoints); 0 = once
                                             # at the end, so the exported policy is the last one (> 0
                                             # exports the best, picked on the trials RL evaluates on)
    checkpoint_every: int = ranged(0, "[0, inf)")  # steps between checkpoints (resume points); 0 = at each
                                                   # evaluation only. A long SFT with sft.eval_every=0 sets it:
                                                   # a crash or kill then loses at most this many steps
    eval_trials: int = ranged(20, "[1, 10000]")  # trials per task for evaluation
    eval_trial_start: Optional[int] = ranged(None, "[0, inf)")  # first evaluation trial id; None = the
                                                                # suite's last `eval_trials` trials
    output_path: Optional[str] = "auto"  # final (best) policy; auto = checkpoints/sft_<suite>_task<ids>; null = none


@dataclass
class TrainSection:  # how the processes share the work: the RL scripts' train.strategy and train.fsdp_offload keys
    threads: int = ranged(0, "[0, 4096]")  # torch CPU threads per process; 0 = auto (common/threads.py: its cores
                                         # / processes; 1 on a GPU); config.yaml keeps the count chosen
    strategy: str = "ddp"  # ddp: a full replica per process | fsdp: weights + optimizer state sharded (common/fsdp.py)
    fsdp_offload: bool = False  # fsdp: the shards and the optimizer step on the CPU (torch's CPUOffloadPolicy)


@dataclass
class Config:
    seed: int = ranged(0, "[0, inf)")  # seeds the initial weights, the batches and the augmentation (--seed)
    resume: Optional[str] = None  # --resume: "auto" or a run folder
    env: EnvConfig = field(default_factory=lambda: EnvConfig(num_envs=20))
    log: LogConfig = field(default_factory=lambda: LogConfig(wandb=False))
    policy: PolicySection = field(default_factory=PolicySection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    train: TrainSection = field(default_factory=TrainSection)

    def memory_parts(self, world: int) -> memory_plan.Parts:
        """What the memory plan counts (common/memory_plan.py): the policy (policy.init_path's family, else the
        policy.<type> section) and each process's slice of sft.batch_size, its gradients allocated in every forward."""
        folder = self.policy.init_path
        family = memory_plan.folder_family(folder) if folder else self.policy.type
        batch = max(1, self.sft.batch_size // world)
        return memory_plan.Parts("train_sft.py", family, folder, getattr(self.policy, family, None), batch, batch,
                                 "sft.batch_size", key_per_micro=world, grads_in_forward=True, start_note=False)


def check_config(cfg: Config) -> None:
    """ConfigError (one line with the fix) for values that would crash or mislead minutes into the run: every key's
    range (declared beside its field: `ranged`), then what depends on several keys."""
    check_ranges(cfg)
    try:
        envs.check_training_suite(cfg.env.suite)  # robustness variants (tabletop_lan, ...) are never demoed or trained on
        envs.check_task_ids(cfg.env)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    sft = cfg.sft
    if sft.eval_every % sft.log_every:
        raise ConfigError(f"sft.eval_every={sft.eval_every}: evaluations happen at the end of a logged block of "
                          f"sft.log_every={sft.log_every} steps: make it a multiple of {sft.log_every}")
    if cfg.log.checkpoint_every != LogConfig.checkpoint_every:  # the shared log section's key, RL iterations
        raise ConfigError(f"log.checkpoint_every={cfg.log.checkpoint_every}: train_sft.py does not use it (it counts "
                          f"an RL script's iterations): set sft.checkpoint_every=<steps> instead")
    if sft.checkpoint_every % sft.log_every:
        raise ConfigError(f"sft.checkpoint_every={sft.checkpoint_every}: checkpoints are written at the end of a "
                          f"logged block of sft.log_every={sft.log_every} steps: make it a multiple of {sft.log_every}")
    if sft.checkpoint_every and sft.eval_every % sft.checkpoint_every:
        raise ConfigError(f"sft.checkpoint_every={sft.checkpoint_every}: every evaluation (sft.eval_every="
                          f"{sft.eval_every}) needs a checkpoint: make sft.eval_every a multiple of it")
    if sft.num_demos < 1 and not sft.demo_paths:
        raise ConfigError(f"sft.num_demos={sft.num_demos}: needs at least 1 expert demo per task")
    if cfg.policy.type not in FAMILIES and not cfg.policy.init_path:
        raise ConfigError(f"policy.type={cfg.policy.type!r}: use token or flow (or policy.init_path=<a saved policy>)")
    if cfg.train.strategy != "ddp" or cfg.train.fsdp_offload:  # (common.fsdp loads torch: not for the default)
        from common.fsdp import check_strategy

        try:
            check_strategy(cfg.train.strategy, cfg.train.fsdp_offload)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if cfg.env.image_size % 16:
        raise ConfigError(f"env.image_size={cfg.env.image_size}: the policies cut images into 16 px patches; use a "
                          f"multiple of 16 (64, 128, 224, 256)")
    if not cfg.policy.init_path and cfg.policy.type not in ("token", "flow"):  # the family's module tells (it loads
        from models.policy import policy_class  # torch: only for a family other than the two defaults)

        if policy_class(cfg.policy.type).published:
            raise ConfigError(f"policy.type={cfg.policy.type!r} starts from its published checkpoint: set "
                              f"policy.init_path=<the folder>")


def parse(argv: Optional[List[str]] = None) -> Config:
    """The config from configs/sft.yaml + the command line, checked: a bad value exits with one line."""
    cfg: Config = parse_cli(Config, "configs/sft.yaml", __doc__, argv, script="train_sft",
                            resumable=("resume", "log.", "sft.output_path"))
    return exit_on_bad_config(check_config, cfg)  # values checked: the config the run uses


# the command line before the imports below: --help and a bad value answer in ~1 s (torch takes seconds to load)
if __name__ == "__main__":
    cfg = parse()
    memory_plan.dry_run(cfg)  # --dry-run: print the memory plan and exit (nothing loads)

import numpy as np
import torch

from common.checkpoint import load_saved_policy
from common.demos import demos_to_samples, generate_expert_demos, load_hdf5_demos
from common.fsdp import shard_policy, sharded
from common.run import Schedule, start_run
from common.run_folder import replace_folder, sibling_lock
from common.sft_record import write_made_by
from common.train import adamw, optimizer_step
from models.policy import policy_class
from models.saved import TRAIN_CONFIG


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
    family_cfg = getattr(cfg.policy, cfg.policy.type)  # the section of that family (common/config.py adds it)
    return policy_class(cfg.policy.type).fresh(family_cfg, demo_actions)


def family_sections(policy: PolicySection) -> List[Any]:
    """The family sections of `policy` (policy.token, policy.flow and the one common/config.py added for another
    policy.type)."""
    return [getattr(policy, f.name) for f in dataclasses.fields(policy) if f.name in FAMILIES]


def copy_policy(src: str, dst: str, cfg: Optional[Config] = None, run_dir: Optional[str] = None,
                score: Optional[Dict[str, Any]] = None) -> None:
    """Copy a saved policy folder to `dst` (replacing it; written beside it first, then moved into place); with `cfg`,
    the run's config (marked with `run_dir`, the run that exported it), suite version and what made it (made_by.yaml:
    commit, command line, `score`'s held-out success; common/sft_record.py) go beside the weights."""
    tmp = dst.rstrip("/") + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if cfg is not None:
        save_config(cfg, os.path.join(tmp, TRAIN_CONFIG), script="train_sft")
        with open(os.path.join(tmp, EXPORTED_BY), "w") as f:
            f.write(os.path.realpath(run_dir or "") + "\n")
        envs.write_suite_version(tmp, cfg.env.suite)
        write_made_by(tmp, score)
    replace_folder(tmp, dst)  # the old folder is never missing (another run may be loading it)


EXPORTED_BY = "exported_by.txt"  # in an exported policy: the train_sft.py run folder that wrote it


def check_output_path(path: Optional[str], run_dir: Optional[str]) -> None:
    """sft.output_path is written at the end, replacing what is there: refuse (one line) a folder that is not empty
    unless this run exported it (a resumed run), so nothing of the user's is ever deleted."""
    if not path or not os.path.exists(path):
        return
    if os.path.isdir(path) and not os.listdir(path):
        return
    try:
        with open(os.path.join(path, EXPORTED_BY)) as f:
            mine = run_dir is not None and f.read().strip() == os.path.realpath(run_dir)
    except OSError:
        mine = False
    if not mine:
        raise ConfigError(f"sft.output_path={path} already exists and is not empty: the exported policy would replace "
                          f"it; choose another sft.output_path (or remove that folder yourself)")


def export_policy(best: str, cfg: Config, run_dir: str, score: Optional[Dict[str, Any]] = None) -> None:
    """The best policy to sft.output_path, one exporter at a time (a lock beside it), checked again under the lock:
    another run may have written that folder since this run started (ConfigError; this run's best/ stays)."""
    lock = sibling_lock(cfg.sft.output_path, "export")
    lock.acquire(wait=True)
    try:
        try:
            check_output_path(cfg.sft.output_path, run_dir)
        except ConfigError as e:
            raise ConfigError(f"{e} (written since this run started; its best policy stays in {best})") from None
        copy_policy(best, cfg.sft.output_path, cfg, run_dir, score)
    finally:
        lock.release()


def schedule(cfg: Config, eval_trials: List[int]) -> Schedule:
    """The run's Schedule: an iteration is a block of sft.log_every steps (one metrics row and console line); a
    checkpoint every sft.checkpoint_every steps (0: at each evaluation) and after the last. The evaluations (every
    sft.eval_every steps, and after the last: the only one with sft.eval_every=0) fall on checkpoints (check_config),
    so each one's policy can become best/ and last/ (main's loop evaluates; the Schedule's eval_every stays 0)."""
    iterations = math.ceil(cfg.sft.steps / cfg.sft.log_every)
    every = cfg.sft.eval_every // cfg.sft.log_every if cfg.sft.eval_every > 0 else iterations
    if cfg.sft.checkpoint_every > 0:
        every = cfg.sft.checkpoint_every // cfg.sft.log_every
    return Schedule(iterations, eval_every=0, checkpoint_every=every, eval_trials=eval_trials, eval_at_start=False,
                    steps_per_iteration=cfg.sft.log_every, total_steps=cfg.sft.steps)


def main(argv: Optional[List[str]] = None, cfg: Optional[Config] = None) -> Dict[str, float]:
    """Parse (unless `cfg` is given), check, train on the run plumbing every script shares (common/run.py: run folder,
    resume, one interrupt protocol, checkpoints, console lines with ETA). Several processes (`accelerate launch`)
    draw the same batch of sft.batch_size samples each step and run their slice of it; the gradients are averaged
    (common/train.py `optimizer_step`, ddp and fsdp alike), so the run is the one-process run at the same batch up
    to float rounding. Returns the last evaluation and the best one."""
    cfg = parse(argv) if cfg is None else cfg
    if cfg.sft.output_path == "auto":
        cfg.sft.output_path = os.path.join("checkpoints",
                                           f"sft_{cfg.env.suite}_task{'-'.join(str(t) for t in cfg.env.task_ids)}")
    # evaluation trials: by default the last `eval_trials` of the suite (held out: demos come from demo starts)
    n_trials = envs.num_trials(cfg.env)
    first = max(0, n_trials - cfg.sft.eval_trials) if cfg.sft.eval_trial_start is None else cfg.sft.eval_trial_start
    eval_trials = list(range(first, min(n_trials, first + cfg.sft.eval_trials)))
    try:  # before the run folder is made (a resumed run: cfg.resume is its folder)
        check_output_path(cfg.sft.output_path, cfg.resume)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    with start_run(cfg, "train_sft", schedule(cfg, eval_trials)) as run:
        if cfg.sft.batch_size % run.world:
            raise ConfigError(f"sft.batch_size={cfg.sft.batch_size} is the batch of each step, split over the "
                              f"{run.world} processes: make it a multiple of {run.world}")
        for section in family_sections(cfg.policy):  # the policy sees what the env renders and executes
            section.image_size, section.action_chunk = cfg.env.image_size, cfg.env.action_chunk

        # demos -> (observation, instruction, action chunk) samples
        t0 = time.time()
        with run.accelerator.main_process_first():  # process 0 records (and caches) the expert demos
            demos = load_demos(cfg)
        torch.manual_seed(cfg.seed)  # the same initial weights on every process, then each its own torch stream
        policy = build_policy(cfg, np.concatenate([d["actions"] for d in demos]))
        torch.manual_seed(cfg.seed + run.rank)
        if run.resume_path is not None:  # the weights first (plain), then sharding, the optimizer on the shards
            policy.load_state_dict(load_saved_policy(run.resume_path).state_dict())
        samples = demos_to_samples(demos, policy.action_chunk)
        num_samples = len(samples["actions"])
        if run.is_main:
            print(f"[sft] {len(demos)} demos, {num_samples} samples (chunk {policy.action_chunk}) in "
                  f"{time.time() - t0:.1f}s" + (f"; {run.world} processes, train.strategy={cfg.train.strategy}"
                                                if run.world > 1 else ""), flush=True)
        overlap = sorted({int(d["trial_id"]) for d in demos if not d.get("demo_start")} & set(eval_trials))
        if overlap and run.is_main:
            print(f"[sft] note: {len(overlap)} evaluation trials also have demos (not held out)", flush=True)

        policy = shard_policy(run, policy.to(run.device))  # train.strategy
        params = [p for p in policy.parameters() if p.requires_grad]
        optimizer = adamw(params, lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay)

        def lr_factor(step: int) -> float:
            """Linear warm-up, then cosine decay to min_lr_ratio. A Python float (math.cos, not np.cos): the lr goes
            into checkpoints, and torch.load's weights_only reader refuses numpy scalars (a resume after the
            warm-up failed that way)."""
            if step < cfg.sft.warmup_steps:
                return (step + 1) / cfg.sft.warmup_steps
            frac = (step - cfg.sft.warmup_steps) / max(1, cfg.sft.steps - cfg.sft.warmup_steps)
            return cfg.sft.min_lr_ratio + (1 - cfg.sft.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        rng = run.rngs["sft"] = np.random.default_rng([cfg.seed, 0, 0])  # the batch sampler: the same everywhere
        run.state.setdefault("best", {"success": -1.0, "step": -1})  # the best evaluation so far (checkpointed)
        pairs = len(eval_trials) * len(cfg.env.task_ids)
        run.make_envs(max(1, min(cfg.env.num_envs, math.ceil(pairs / run.world))))  # each process: its share
        run.attach(policy, {"policy": optimizer}, {"policy": scheduler})
        policy.train()

        b, s = cfg.sft.batch_size, run.schedule
        mine = slice(run.rank * (b // run.world), (run.rank + 1) * (b // run.world))  # this process's rows
        metrics: Dict[str, float] = {}
        for iteration in run.iterations():  # a block of sft.log_every steps
            metrics = run.begin_iteration(iteration)
            window: Dict[str, List[float]] = {}
            t0 = time.perf_counter()
            with sharded(policy):  # fsdp: sharded weights (every process runs one forward and backward a step)
                for step in range(iteration * s.steps_per_iteration, s.steps(iteration + 1)):
                    idx = rng.integers(0, num_samples, b)[mine]
                    obs = {k: samples[k][idx] for k in ("agentview", "wrist", "state")}
                    for k in ("agentview", "wrist"):
                        obs[k] = random_shift(obs[k], cfg.sft.augment_shift, rng, b, mine)
                    loss, info = policy.sft_loss(obs, samples["instructions"][idx].tolist(), samples["actions"][idx])
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    grad_norm = optimizer_step(run, params, optimizer, scheduler, cfg.sft.max_grad_norm, policy=policy)
                    for k, v in {**info, "train/grad_norm": float(grad_norm),
                                 "train/lr": scheduler.get_last_lr()[0]}.items():
                        window.setdefault(k, []).append(float(v))

            # the block's row: its statistics averaged over the steps and the processes (their slices are equal)
            means = run.gather([{k: float(np.mean(v)) for k, v in window.items()}])
            metrics.update({k: float(np.mean([m[k] for m in means])) for k in means[0]})
            steps_done = s.steps(iteration + 1)
            metrics["charts/step"] = steps_done
            metrics["charts/samples_per_s"] = len(window["train/lr"]) * b / (time.perf_counter() - t0)
            evaluating = iteration + 1 == s.iterations or (cfg.sft.eval_every > 0 and
                                                            steps_done % cfg.sft.eval_every == 0)
            if evaluating:  # greedy success on the held-out trials: picks the best policy (ties: the later one)
                metrics.update(run.evaluate(iteration + 1))
                improved = metrics["val/success_rate"] >= run.state["best"]["success"]
                if improved:
                    run.state["best"] = {"success": metrics["val/success_rate"], "step": steps_done}
            try:
                stop = run.end_iteration(iteration, metrics, ["charts/step", "charts/samples_per_s", "sft/loss",
                                                              "sft/flow_mse", "sft/token_accuracy", "train/grad_norm",
                                                              "val/success_rate"])
            finally:  # the checkpoint just written, also by a stop: its policy as last/ (and best/, which its state
                # names and a resume exports)
                if evaluating and run.is_main and run.saved_iteration == iteration + 1:
                    with run.uninterrupted():
                        saved = os.path.join(run.run_dir, "checkpoints", f"iter_{iteration + 1:06d}", "policy")
                        copy_policy(saved, os.path.join(run.run_dir, "last"))
                        if improved:
                            copy_policy(saved, os.path.join(run.run_dir, "best"))
            if stop:  # Ctrl-C / SIGTERM: every process stops (this block saved)
                break

        best = run.state["best"]
        if run.is_main and cfg.sft.output_path and not run.stopped:
            with run.uninterrupted():
                export_policy(os.path.join(run.run_dir, "best"), cfg, run.run_dir, best)
            print(f"[sft] best policy (step {best['step']}, val success {best['success']:.1%}) -> "
                  f"{cfg.sft.output_path}", flush=True)
    return {"val/success_rate": metrics.get("val/success_rate", float("nan")), "best_success": best["success"],
            "best_step": best["step"]}


if __name__ == "__main__":
    main(cfg=cfg)
