"""Run plumbing shared by every RL script, so a script holds only its algorithm:

    with start_run(cfg, "srpo") as run:                    # accelerator, threads, seeds, run folder, logger, envs
        policy = ...                                        # from run.resume_path + "/policy" when resuming
        run.attach(policy, {"actor": opt}, {"actor": sched}, eval_kwargs=dict(temperature=...))  # restores state
        for iteration in run.iterations():
            metrics = run.begin_iteration(iteration)        # row 0: the starting policy evaluated
            ...rollout, advantages, update...
            run.end_iteration(iteration, metrics, console_keys)  # evaluation, metrics.jsonl/PNG/wandb, checkpoint

Resume continues the same run: every random stream (python, numpy, torch, the prompt sampler, the environments) is
saved per process and restored, and metrics rows past the checkpoint are dropped. Ctrl-C / SIGTERM stop at once,
save the last completed iteration (from an in-memory snapshot when its checkpoint was not due) and exit 130; under
train.strategy=fsdp every process stops together after the rollout or the update (`_stop_before_update`). A new
run's folder is created exclusively (never shared with another run) and checked writable, with its plots folder,
before the model is built; a failed checkpoint write ends the run in one line with the command that continues it; the
run ends with a one-line summary (`run_summary`).

What a script's Config must have for `start_run` (every RL script's has these; tests/test_configs_shipped.py
loads every shipped YAML into them):
    seed, resume                                   the run's seed (per process: + rank), --resume's folder
    env: envs.EnvConfig                            suite, task_ids, num_envs, image_size, action_chunk, ...
    policy: a family's config (models/configs.py)  type, lora_rank/alpha/dropout, image_size, action_chunk
    init: InitConfig                               mode, path, sft_args (where RL starts from)
    rollout.train_trials                           the practice trials (prompts; evaluation refuses overlap)
    train.iterations, train.strategy, train.fsdp_offload
    eval: EvalConfig, log: LogConfig               when and where to evaluate; folders, wandb, checkpoints
"""
from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
import yaml

from common import fsdp
from common.checkpoint import CheckpointError, capture_rng_state, latest_checkpoint, read_rng_state, read_rng_states
from common.config import (ROOT, ConfigError, check_writable, create_run_dir, default_run_prefix,
                           remove_if_empty, resolve_run_dir, run_order, save_config, script_file)
from common.evaluation import eval_trials, evaluate_policy
from common.logging import Logger, duration, format_line
from common.rollout import RolloutBatch

INTERRUPTED = 130  # exit code of a run stopped by Ctrl-C / SIGTERM (the shell's convention for SIGINT)
QUIET_LAUNCH = "--num_machines 1 --mixed_precision no --dynamo_backend no"  # accelerate warns when it picks these


def launched_alone_for_several() -> bool:
    """True when `accelerate launch` was asked for several processes but ran this one alone: its one-process launcher
    (no multi-process config) marks the process with ACCELERATE_USE_CPU and, for --num_processes > 1, MASTER_PORT,
    while a real multi-process launch gives every process its WORLD_SIZE."""
    env = os.environ
    return "ACCELERATE_USE_CPU" in env and "MASTER_PORT" in env and "WORLD_SIZE" not in env


def make_accelerator():
    """An Accelerator (CPU when no GPU), refusing in one line a launch that asked for several processes but started
    one."""
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    if accelerator.num_processes == 1 and launched_alone_for_several():
        raise ConfigError("accelerate launch asked for several processes but started 1 (without a multi-process "
                          "config it runs one): use `accelerate launch --config_file configs/accelerate/cpu_2proc.yaml "
                          f"...` (or 8gpu.yaml, ...), or `accelerate launch --multi_gpu --num_processes N {QUIET_LAUNCH} "
                          "...` (works on CPU machines too)")
    if accelerator.device.type == "cpu":  # one share of the cores per process (OMP_NUM_THREADS wins when set)
        world = accelerator.num_processes
        omp = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(omp) if omp.isdigit() and int(omp) > 0 else max(1, (os.cpu_count() or 1) // world))
    return accelerator


def env_rng(vec_env) -> Optional[np.random.Generator]:
    """The environments' own random generator (tabletop: expert noise), when they have one we can save."""
    return getattr(getattr(vec_env, "core", None), "rng", None)


def average_gradients(accelerator, params: Sequence[torch.nn.Parameter]) -> None:
    """Mean of every process's gradients through accelerate, in one reduction (missing grads count as zeros); for a
    policy sharded by train.strategy=fsdp the same mean, each process keeping its shard's slice (common/fsdp.py)."""
    owners = fsdp.sharded_owners(params)
    if owners:
        return fsdp.average_sharded(accelerator, params, owners)
    if accelerator.num_processes == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = accelerator.reduce(torch.cat([g.reshape(-1) for g in grads]), reduction="mean")
    offset = 0
    for p, g in zip(params, grads):
        p.grad = flat[offset:offset + g.numel()].view_as(g).clone()
        offset += g.numel()


def minibatches(num_local: int, mini_batch_size: int, epochs: int, gather: Callable[[List], List]
                ) -> Iterator[torch.Tensor]:
    """Shuffled index sets of this process's `num_local` samples, `epochs` times; every process gets the same number
    of mini-batches (the largest share decides; a process that runs out yields empty ones, contributing zeros)."""
    steps = max(1, math.ceil(max(gather([num_local])) / mini_batch_size))
    for _ in range(epochs):
        perm = torch.randperm(num_local)
        for k in range(steps):
            yield perm[k * mini_batch_size:(k + 1) * mini_batch_size]


class Run:
    """Everything a training script needs around its algorithm; see the module docstring.

    What it reads from the script's config (a dataclass tree; every RL script's `Config` has these sections):
      seed, resume                 seeding per process; the run folder to continue
      env: EnvConfig               the vector env, the run name (suite, task_ids) and the evaluation tasks
      log: LogConfig               run folder, plots, wandb, checkpoint cadence
      eval: EvalConfig             when and on which trials to evaluate
      train.iterations             the loop's length
      rollout.train_trials         practice trials: evaluation starts after them unless eval.trial_start is set
    and, through `initial_policy`, init: InitConfig and policy (its LoRA keys; the architecture for init.mode=scratch).
    """

    def __init__(self, cfg: Any, script: str):
        import envs

        try:  # robustness variants (tabletop_lan, ...) are evaluated, never practised
            envs.check_training_suite(cfg.env.suite)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.cfg, self.script = cfg, script
        self.accelerator = make_accelerator()
        acc = self.accelerator
        self.is_main, self.rank, self.world, self.device = (acc.is_main_process, acc.process_index,
                                                            acc.num_processes, acc.device)
        random.seed(cfg.seed + self.rank)
        np.random.seed(cfg.seed + self.rank)
        torch.manual_seed(cfg.seed + self.rank)
        self.prompt_rng = np.random.default_rng([cfg.seed, self.rank])
        self.t_start = time.perf_counter()
        prefix = default_run_prefix(script, cfg.env.suite, cfg.env.task_ids, cfg.seed)
        self.created = False  # a new run folder made by this process (removed again if the start fails empty)
        error, named = None, ("", "")
        if self.is_main:  # only the main process creates (exclusively) or checks the folder; the others take its name
            try:
                if cfg.resume:
                    named = resolve_run_dir(cfg.log, prefix, cfg.resume, must_exist=True)
                    check_writable(named[1], f"--resume {named[1]}")
                else:
                    named = create_run_dir(cfg.log, prefix)
                    self.created = True
            except ConfigError as e:
                error = str(e)
        error, (self.run_name, self.run_dir) = self.gather([(error, named)])[0]
        if error:
            raise ConfigError(error)
        self.resume_path = latest_checkpoint(self.run_dir) if cfg.resume else None
        if cfg.resume and self.resume_path is None:
            raise ConfigError(f"--resume: {self.run_dir} has no complete checkpoint to continue from; start a new run "
                              f"without --resume")
        if self.resume_path is not None:
            saved_world = len(read_rng_states(self.resume_path))
            if saved_world != self.world:
                raise ConfigError(f"--resume: the run had {saved_world} process(es) and this launch has {self.world} "
                                  f"(prompts are per process, so the batch would change): resume with "
                                  f"`{self.resume_command(saved_world)}`")
        self.start_iteration = 0
        self.state: Dict[str, Any] = {"env_steps": 0.0}  # saved in every checkpoint, restored on resume
        self.logger: Optional[Logger] = None
        self.envs = None
        self._tracked: Optional[Dict[str, Any]] = None
        self._snapshot: Optional[Dict[str, Any]] = None
        self._saved_iteration = 0
        self._old_handlers: Dict[int, Any] = {}
        self._deferring = self._pending_signal = False
        self._lockstep = False  # fsdp: a signal only sets _pending_signal; every process stops at the same point
        self._updated = False  # an optimizer step ran in this iteration (fsdp: the weights moved since its start)
        self._start: Optional[Dict[str, Any]] = None  # fsdp: RNG states + run state of the last completed iteration
        self._t_first: Optional[tuple] = None

    # ---- start
    def gather(self, items: List) -> List:
        """accelerate's gather_object: the concatenation of every process's list."""
        if self.world == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(list(items))

    def make_envs(self):
        """The vector env of `cfg.env`, seeded per process (kept in the checkpoint's RNG states)."""
        import envs

        self.envs = envs.make_vector_env(self.cfg.env, seed=self.cfg.seed + self.rank)
        return self.envs

    def attach(self, policy, optimizers: Dict[str, torch.optim.Optimizer], schedulers: Optional[Dict[str, Any]] = None,
               modules: Optional[Dict[str, torch.nn.Module]] = None, eval_kwargs: Optional[Dict[str, Any]] = None,
               banner: str = "") -> None:
        """Track what checkpoints hold; on resume restore it (and every random stream) from the checkpoint. Then
        write config.yaml (new runs only), open the logger and print the banner."""
        self._tracked = dict(policy=policy, optimizers=optimizers, schedulers=schedulers or {}, modules=modules or {})
        if self.envs is None:
            self.make_envs()
        self.eval_kwargs = eval_kwargs or {}
        if self.resume_path is not None:
            try:  # fsdp: each process reads its shards of the weights, optimizer state and sharded modules
                self.start_iteration, extra = fsdp.load_checkpoint(self.resume_path, policy, optimizers, schedulers,
                                                                   self._tracked["modules"], rank=self.rank)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            rng = read_rng_state(self.resume_path, self.rank)
            if "prompt" in rng:
                self.prompt_rng.bit_generator.state = rng["prompt"]
            if "env" in rng and env_rng(self.envs) is not None:
                env_rng(self.envs).bit_generator.state = rng["env"]
            self.state.update(extra.get("state", {}))
            self._saved_iteration = self.start_iteration
        fsdp.register(policy, list(optimizers.values()))  # fsdp: gathers the weights for the run (collective)
        if fsdp.is_sharded(policy):
            for opt in optimizers.values():
                opt.register_step_pre_hook(lambda *_: setattr(self, "_updated", True))
            self._lockstep = True
        if self.is_main:
            config_path = os.path.join(self.run_dir, "config.yaml")
            if self.resume_path is None:  # a resumed run keeps the config it was started with (never replaced)
                save_config(self.cfg, config_path, script=self.script, exclusive=True)
            self.logger = Logger(self.run_dir, self.run_name, self.cfg, self.cfg.log,
                                 resume_iteration=self.start_iteration if self.resume_path else None)
            params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
            print(f"[{self.script}] run {self.run_dir} | {params:,} trainable params | device {self.device} "
                  f"x{self.world} | tasks {list(self.cfg.env.task_ids)}{banner}"
                  + (f" | resumed at iteration {self.start_iteration}" if self.resume_path else ""), flush=True)

    def _sharded_modules(self) -> Dict[str, torch.nn.Module]:
        """The tracked extra modules that hold shards (fsdp: FlowSAR's EMA copy), saved in shards/ with the policy."""
        return {k: m for k, m in self._tracked["modules"].items() if fsdp.holds_dtensors(m)}

    def iterations(self) -> range:
        return range(self.start_iteration, self.cfg.train.iterations)

    # ---- evaluation
    def evaluate(self, iteration: int) -> Dict[str, float]:
        """`common.evaluation.evaluate_policy` on the eval trials of every training task (time/eval added)."""
        import envs

        cfg = self.cfg
        t0 = time.perf_counter()
        trials = eval_trials(envs.num_trials(cfg.env), cfg.eval.trials_per_task, cfg.eval.trial_start,
                             cfg.rollout.train_trials)
        metrics, _ = evaluate_policy(self.envs, self._tracked["policy"], cfg.env.task_ids, trials,
                                     samples_per_trial=cfg.eval.samples_per_trial, rank=self.rank, world=self.world,
                                     gather=self.gather, progress=self.is_main, desc=f"eval {iteration}",
                                     **self.eval_kwargs)
        metrics["time/eval"] = time.perf_counter() - t0
        return metrics

    def begin_iteration(self, iteration: int) -> Dict[str, float]:
        """The iteration's (empty) metrics dict. Before a new run's first iteration the starting policy is evaluated
        and logged as row 0, at 0 env steps, so every curve starts where the policy started."""
        if self.cfg.eval.every > 0 and iteration == self.start_iteration == 0:
            metrics = {**self.evaluate(0), "charts/env_steps": 0}
            if self.is_main:
                self.logger.log(metrics, 0)
                print(format_line(0, metrics, ["val/success_rate", "val/sampled_success_rate", "time/eval"],
                                  total=self.cfg.train.iterations), flush=True)
        if self._t_first is None:
            self._t_first = (time.perf_counter(), iteration)  # the ETA counts from the first iteration's start
        self._updated = False
        return {}

    def count_env_steps(self, batch: RolloutBatch, metrics: Dict[str, float], seconds: float) -> None:
        """rollout/env_steps (all processes), the cumulative charts/env_steps and charts/SPS into `metrics`. Under
        fsdp also where an interrupt of the rollout stops every process (`_stop_before_update`)."""
        counts, signalled = zip(*self.gather([(batch.stats["rollout/env_steps"], self._pending_signal)]))
        if self._lockstep and any(signalled) and not self._updated:
            self._stop_before_update()
        steps = sum(counts)
        self.state["env_steps"] += steps
        metrics["rollout/env_steps"] = steps
        metrics["charts/env_steps"] = self.state["env_steps"]  # the x-axis of sample-efficiency plots
        metrics["charts/SPS"] = steps / max(seconds, 1e-9)

    def _stop_before_update(self) -> None:
        """fsdp, an interrupt before the iteration's first optimizer step (every process, together): the weights,
        optimizer and scheduler states and modules are still those of the last completed iteration, so that iteration
        is saved with the RNG states and run state taken at its end (nothing is copied), then KeyboardInterrupt."""
        start = self._start
        if start is not None and start["iteration"] > self._saved_iteration:
            current, self.state = self.state, start["state"]
            try:
                self.save(start["iteration"], start["rng"])
            finally:
                self.state = current
        raise KeyboardInterrupt

    # ---- end of iteration
    def _rng_states(self) -> List[Dict[str, Any]]:
        state = capture_rng_state()
        state["prompt"] = self.prompt_rng.bit_generator.state
        if env_rng(self.envs) is not None:
            state["env"] = env_rng(self.envs).bit_generator.state
        return self.gather([state])

    def end_iteration(self, iteration: int, metrics: Dict[str, float], console_keys: Sequence[str],
                      last: Optional[bool] = None) -> None:
        """Evaluation when due, one metrics row + console line, checkpoint when due (or an in-memory snapshot that an
        interrupt turns into one). `last` (default: the final iteration of train.iterations) forces both, e.g. when a
        script stops on an env-step budget."""
        cfg, done = self.cfg, iteration + 1
        last = done == cfg.train.iterations if last is None else last
        # fsdp: an interrupt since the rollout (every process decides together) finishes this iteration and saves it
        stop = self._lockstep and any(self.gather([self._pending_signal]))
        if cfg.eval.every > 0 and (done % cfg.eval.every == 0 or last):
            metrics.update(self.evaluate(done))
        if self.device.type == "cuda":  # peak since the start of the process, as verl's perf/max_memory_allocated_gb
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 2 ** 30
        rng_states = self._rng_states()
        saving = done % cfg.log.checkpoint_every == 0 or last or stop
        sharded = fsdp.is_sharded(self._tracked["policy"])
        # fsdp: no in-memory snapshot (it would copy the model); what an interrupt saves needs only these
        self._start = {"iteration": done, "rng": rng_states, "state": copy.deepcopy(self.state)} if sharded else None
        if self.is_main:
            self._deferring = True  # the row and the state it describes are written together, or not at all
            try:
                self.logger.log(metrics, done)
                eta = None
                if self._t_first is not None and done > self._t_first[1]:
                    per_iteration = (time.perf_counter() - self._t_first[0]) / (done - self._t_first[1])
                    eta = per_iteration * max(0, cfg.train.iterations - done)
                print(format_line(done, metrics, console_keys, total=cfg.train.iterations, eta_s=eta), flush=True)
                if saving and not sharded:
                    self.save(done, rng_states)
                self._snapshot = None if saving or sharded else self._take_snapshot(done, rng_states)
            finally:
                self._deferring = sharded and saving  # ... and, under fsdp, the checkpoint every process writes
        if sharded and saving:
            self._deferring = True
            try:
                self.save(done, rng_states)
            finally:
                self._deferring = False
        if stop or (self._pending_signal and not self._lockstep):
            raise KeyboardInterrupt
        self.accelerator.wait_for_everyone()

    def save(self, iteration: int, rng_states: List[Dict[str, Any]]) -> str:
        """The checkpoint of `iteration` (process 0; under fsdp every process: each writes its shards)."""
        t = self._tracked
        path = fsdp.save_checkpoint(self.run_dir, iteration, t["policy"], t["optimizers"], t["schedulers"],
                                    t["modules"], rank=self.rank, gather=self.gather, config=self.cfg,
                                    extra={"run_name": self.run_name, "state": self.state},
                                    keep_last=self.cfg.log.keep_checkpoints, rng_states=rng_states)
        self._saved_iteration = iteration
        return path

    def _take_snapshot(self, iteration: int, rng_states: List[Dict[str, Any]]) -> Dict[str, Any]:
        """What a checkpoint of this iteration would hold, in memory: trainable weights, buffers, optimizer and
        scheduler states, extra modules, RNG states (frozen weights cannot change, so they are not copied)."""
        t = self._tracked
        modules = {"policy": t["policy"], **t["modules"]}
        return {
            "iteration": iteration, "rng": rng_states, "state": copy.deepcopy(self.state),
            "params": {m: {n: p.detach().cpu().clone() for n, p in mod.named_parameters() if p.requires_grad}
                       for m, mod in modules.items()},
            "buffers": {m: {n: b.detach().cpu().clone() for n, b in mod.named_buffers()} for m, mod in modules.items()},
            "optimizers": {k: copy.deepcopy(o.state_dict()) for k, o in t["optimizers"].items()},
            "schedulers": {k: copy.deepcopy(s.state_dict()) for k, s in t["schedulers"].items()},
        }

    def _restore_snapshot(self, snap: Dict[str, Any]) -> None:
        t = self._tracked
        modules = {"policy": t["policy"], **t["modules"]}
        with torch.no_grad():
            for m, mod in modules.items():
                named = dict(mod.named_parameters())
                named.update(dict(mod.named_buffers()))
                for n, value in {**snap["params"][m], **snap["buffers"][m]}.items():
                    named[n].copy_(value)
        for k, o in t["optimizers"].items():
            o.load_state_dict(snap["optimizers"][k])
        for k, s in t["schedulers"].items():
            s.load_state_dict(snap["schedulers"][k])
        self.state = snap["state"]

    # ---- interrupts and the end
    def __enter__(self) -> "Run":
        def on_signal(signum, frame):  # Ctrl-C, and SIGTERM (a cluster's scheduler, `kill`), stop at once ...
            if self._deferring or self._lockstep:  # ... except while an iteration's row and its snapshot are being
                # written, and under fsdp, where every process stops at the same point of the iteration
                self._pending_signal = True
                return
            raise KeyboardInterrupt

        self._deferring, self._pending_signal = False, False
        self._old_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old_handlers[sig] = signal.signal(sig, on_signal)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        if exc_type is None and self._tracked is not None:
            self.check_replicas()
        if exc_type is KeyboardInterrupt:
            self._on_interrupt()
        if self.logger is not None:
            self.logger.close()
        if self.envs is not None:
            try:
                self.envs.close()
            except Exception:  # noqa: BLE001 - closing a half-dead simulator must not hide the real exit
                pass
        if self.world > 1:
            close_process_group(exc_type is None)
        if exc_type is not None and self.created and self.is_main:  # a start that failed before writing anything
            remove_if_empty(self.run_dir, os.path.join(self.cfg.log.plots_dir, self.run_name))
        if exc_type is KeyboardInterrupt:
            raise SystemExit(INTERRUPTED)
        if exc_type is not None and issubclass(exc_type, ConfigError):  # a bad input found at start: one line
            raise SystemExit(f"error: {exc}") from None
        if exc_type is not None and issubclass(exc_type, CheckpointError):
            raise SystemExit(f"error: {exc}; free the space (or fix the folder) and continue from the last saved "
                             f"iteration ({self._saved_iteration}) with: {self.resume_command()}") from None
        if exc_type is None and self.is_main:
            history = self.logger.history if self.logger is not None else {}
            plot = os.path.join(self.cfg.log.plots_dir, self.run_name, "training_curves.png")
            print(f"[{self.script}] done: {self.run_dir} (metrics.jsonl, config.yaml, checkpoints/)", flush=True)
            print(f"[{self.script}] summary: " + run_summary(history, self.state["env_steps"],
                                                              time.perf_counter() - self.t_start, plot,
                                                              resumed=self.resume_path is not None), flush=True)
        return False

    def check_replicas(self) -> None:
        """With several processes: the policy and every tracked module (value head, EMA) must be identical on every
        one (gradients are averaged, so they move in lockstep); prints that they are, raises if they drifted apart.
        Sharded modules (fsdp) are no replicas: each process holds its own part, so they are not compared."""
        if self.world == 1:
            return
        sharded = self._sharded_modules()
        tracked = {"policy": self._tracked["policy"],
                   **{k: m for k, m in self._tracked["modules"].items() if k not in sharded}}
        with fsdp.plain_state_dicts(self._tracked["policy"]):  # fsdp: the gathered copies must agree
            checksums = [float(sum(t.detach().double().sum().item() for t in m.state_dict().values()))
                         for m in tracked.values()]
        per_process = self.gather([checksums])  # one list of checksums per process
        for i, name in enumerate(tracked):
            sums = [c[i] for c in per_process]
            if max(sums) != min(sums):
                raise RuntimeError(f"{name} weights differ between processes (checksums {sums}): gradients were not "
                                   f"averaged identically")
        if self.is_main:
            print(f"[{self.script}] {' and '.join(tracked)} weights identical on all {self.world} processes",
                  flush=True)

    def _on_interrupt(self) -> None:
        if not self.is_main:
            return
        snap = self._snapshot
        try:
            if snap is not None and snap["iteration"] > self._saved_iteration:
                self._restore_snapshot(snap)
                self.save(snap["iteration"], snap["rng"])
        except Exception as e:  # noqa: BLE001 - any failed write: one line, the earlier checkpoints stay
            saved = (f"iterations 1..{self._saved_iteration} are saved; continue with: {self.resume_command()}"
                     if self._saved_iteration > 0 else "nothing was saved before")
            print(f"\n[{self.script}] interrupted; could not save iteration {snap['iteration']} "
                  f"({' '.join(str(e).split())}); {saved}", flush=True)
            return
        if self._saved_iteration > 0:
            print(f"\n[{self.script}] interrupted: iterations 1..{self._saved_iteration} are saved in "
                  f"{self.run_dir}/checkpoints; continue with: {self.resume_command()}", flush=True)
        else:
            print(f"\n[{self.script}] interrupted before the first iteration finished: nothing to save", flush=True)

    def script_file(self) -> str:
        return script_file(self.script)

    def resume_command(self, world: Optional[int] = None) -> str:
        """The command that continues this run with `world` processes (default: this run's)."""
        return resume_command(self.script_file(), self.run_dir, self.world if world is None else world)


def resume_command(script: str, run_dir: str, world: int) -> str:
    """The command that continues the run in `run_dir` of `script` (train_srpo.py, ...) with `world` processes."""
    launch = f"accelerate launch --multi_gpu --num_processes {world} {QUIET_LAUNCH}" if world > 1 else "python"
    return f"{launch} {script} --resume {run_dir}"


def close_process_group(ok: bool) -> None:
    """Tear the process group down before interpreter exit, after a barrier when the run ended normally (no process
    closes its connections while another still has work in flight on them, e.g. fsdp's weight gather after the last
    step): left to the finaliser, gloo's threads sometimes abort a process ("terminate called without an active
    exception")."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        if ok:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def run_summary(history: Dict[int, Dict[str, float]], env_steps: float, wall_s: float, plot: str,
                key: str = "val/success_rate", resumed: bool = False) -> str:
    """The end-of-run line: `key` at the start (iteration 0), its best, the mean of the last three evaluations, env
    steps, wall time and where the plot is."""
    evals = [(it, row[key]) for it, row in sorted(history.items()) if key in row]
    parts = []
    if evals:
        if evals[0][0] == 0:
            parts.append(f"start {evals[0][1]:.3f}")
        best = max(evals, key=lambda e: (e[1], e[0]))
        parts.append(f"best {best[1]:.3f} (iter {best[0]})")
        last = evals[-3:]
        parts.append(f"mean of the last {len(last)} evaluations {np.mean([v for _, v in last]):.3f} (iters "
                     f"{', '.join(str(it) for it, _ in last)})")
        parts[0] = f"{key} " + parts[0]
    else:
        parts.append(f"no {key} (eval.every=0)")
    parts += [f"{int(env_steps):,} env steps", f"wall {duration(wall_s)}" + (" (this session)" if resumed else ""),
              f"plot {plot}"]
    return " | ".join(parts)


def start_run(cfg: Any, script: str) -> Run:
    """Accelerator, seeds and the run folder (new or resumed); use as `with start_run(...) as run:`."""
    try:
        run = Run(cfg, script)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    return run


SCRIPTS_FOR = {"token": "train_srpo.py, train_gae_ppo.py or train_luffy.py",
               "flow": "train_flowsar.py or train_gae_ppo.py"}
LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_vision", "bf16")  # the RL run's own policy keys


def sft_command(cfg: Any, path: str, policy_type: str) -> List[str]:
    """The train_sft.py command line that makes the SFT start `path` for this config (init.sft_args appended)."""
    ids = [str(t) for t in cfg.env.task_ids]
    return [sys.executable, os.path.join(ROOT, "train_sft.py"), "--task-ids", *ids, f"policy.type={policy_type}",
            f"env.suite={cfg.env.suite}", f"env.image_size={cfg.env.image_size}",
            f"env.action_chunk={cfg.env.action_chunk}", f"sft.output_path={path}", f"log.output_dir={cfg.log.output_dir}",
            f"log.plots_dir={cfg.log.plots_dir}", f"log.wandb={str(cfg.log.wandb).lower()}", *cfg.init.sft_args]


def unfinished_sft_run(output_dir: str, path: str) -> Optional[str]:
    """The newest train_sft.py run folder in `output_dir` that writes `path` (sft.output_path) and holds a
    checkpoint: an auto-SFT stopped by Ctrl-C before it exported `path`. Rerunning the RL command continues it."""
    if not os.path.isdir(output_dir):
        return None
    for name in sorted((d for d in os.listdir(output_dir) if d.startswith("train_sft__")), key=run_order,
                       reverse=True):
        run_dir = os.path.join(output_dir, name)
        try:
            with open(os.path.join(run_dir, "config.yaml")) as f:
                saved = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError):
            continue
        done = os.path.join(run_dir, "checkpoints")
        if (saved.get("sft") or {}).get("output_path") == path and os.path.isdir(done) and \
                any(d.startswith("iter_") for d in os.listdir(done)):
            return run_dir
    return None


def initial_policy(run: "Run", kind: str):
    """The start policy (`_start_policy`), checked against the env: a policy that reads the wrist camera needs it
    rendered (env.wrist_camera)."""
    policy = _start_policy(run, kind)
    env = run.cfg.env
    if not env.wrist_camera and getattr(policy.cfg, "use_wrist", False) and not env.suite.startswith("tabletop"):
        raise ConfigError("env.wrist_camera=false but the policy reads the wrist camera (policy.use_wrist=true): "
                          "set env.wrist_camera=true, or train a policy without it")
    return policy


def _published_family(policy_cfg: Any) -> bool:
    """A family that starts from its published folder (its config has `init_path`: OpenVLA-OFT), never from scratch
    or an SFT run of this project."""
    return getattr(policy_cfg, "init_path", None) is not None


def _start_policy(run: "Run", kind: str):
    """The policy RL starts from, on the run's device; `kind` is what the script trains: 'token' (discrete actions
    with log-probs) or 'flow'. The family (models/policy.py FAMILIES) is `policy.type`; a checkpoint folder must hold
    that family. The start is the resumed checkpoint's policy; a fresh one (init.mode=scratch); or the checkpoint at
    init.path (auto_sft trains it first on the main process: token and flow families) with its LoRA merged into the
    base and fresh LoRA of policy.lora_rank on top, so the KL reference (adapters off) is exactly the policy RL started
    from. Architecture keys come from the checkpoint (one line names those that differ from the YAML) and `cfg.policy`
    / `cfg.env.image_size|action_chunk` are set to what runs, so the saved config is what ran."""
    import envs
    from models.policy import FAMILIES, action_kind, policy_class
    from models.saved import policy_type as saved_family

    from models.saved import no_rl_message

    cfg = run.cfg
    family = cfg.policy.type
    if action_kind(family) == "regression":  # an L1-regression head: no log-probs, so no RL script can train it
        raise ConfigError(no_rl_message(cfg.init.path or f"policy.type={family}"))
    if action_kind(family) != kind:
        fits = "|".join(f for f in FAMILIES if action_kind(f) == kind)
        raise ConfigError(f"this script trains policies with {kind} actions (policy.type: {fits}); {family} policies "
                          f"have {action_kind(family)} actions: train them with {SCRIPTS_FOR[action_kind(family)]}")
    if run.resume_path is not None:
        saved = os.path.join(run.resume_path, "policy")
        return policy_class(saved_family(saved)).load(saved, device=str(run.device))
    cls = policy_class(family)
    if cfg.init.mode == "scratch":
        if _published_family(cfg.policy):
            raise ConfigError(f"policy.type={family} starts from a published checkpoint, not from scratch: set "
                              f"init.mode=checkpoint init.path=<the checkpoint folder> (README: Start from the papers' "
                              f"checkpoints)")
        cfg.policy.image_size, cfg.policy.action_chunk = cfg.env.image_size, cfg.env.action_chunk
        torch.manual_seed(cfg.seed)  # the same initial weights on every process ...
        policy = cls(cfg.policy).to(run.device)
        if run.rank:  # ... then each its own sampling noise (process 0 keeps the one-process stream)
            torch.manual_seed(cfg.seed + run.rank)
        return policy
    tasks = "-".join(str(t) for t in cfg.env.task_ids)
    path = cfg.init.path or os.path.join("checkpoints", f"{'sft' if family == 'token' else 'sft_' + family}_"
                                                        f"{cfg.env.suite}_task{tasks}")
    if not os.path.isdir(path):
        if _published_family(cfg.policy):
            raise ConfigError(f"no {family} checkpoint at {path}: download a published one (README: Start from the "
                              f"papers' checkpoints) and set init.path to its folder")
        cmd = sft_command(cfg, path, family)
        shown = " ".join(["python", os.path.relpath(cmd[1])] + cmd[2:])
        if cfg.init.mode != "auto_sft":
            raise ConfigError(f"no SFT checkpoint at {path}: RL starts from a supervised policy; make it with `{shown}`, "
                              f"or set init.mode=auto_sft to run that first, or init.path=<dir> to use another one")
        if run.is_main:
            unfinished = unfinished_sft_run(cfg.log.output_dir, path)
            if unfinished:  # an earlier auto-SFT was interrupted: continue it instead of starting over
                cmd, shown = cmd + ["--resume", unfinished], f"{shown} --resume {unfinished}"
                print(f"[init] no SFT checkpoint at {path}; continuing the interrupted SFT run: {shown}", flush=True)
            else:
                print(f"[init] no SFT checkpoint at {path}; running: {shown}", flush=True)
            proc = subprocess.Popen(cmd)
            try:
                code = proc.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the SFT too (it saves and says how to resume); a SIGTERM
                try:                   # to this process alone is passed on
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait()
                raise
            if code == INTERRUPTED:
                raise KeyboardInterrupt
            if code != 0:
                raise ConfigError(f"the SFT run for init.mode=auto_sft failed (its output is above): {shown}")
    run.accelerator.wait_for_everyone()
    try:
        found = saved_family(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"init.path {path}: not a saved policy ({e}); point init.path at a train_sft.py output") from None
    if action_kind(found) == "regression":
        raise ConfigError(no_rl_message(path))
    if found != family:
        if action_kind(found) != kind:
            raise ConfigError(f"init.path {path} holds a policy of family {found} ({action_kind(found)} actions): "
                              f"train it with {SCRIPTS_FOR[action_kind(found)]}; this script needs a {family} "
                              f"policy there (train_sft.py policy.type={family} makes one)")
        raise ConfigError(f"init.path {path} holds a policy of family {found} but policy.type={family}: set "
                          f"policy.type={found} (and that family's policy keys, as configs/*_libero.yaml do)")
    if _published_family(cfg.policy):  # the YAML's policy keys (LoRA, precision, memory) apply to its weights
        return _published_start(run, cls, path)
    if family == "flow":  # a pi0 checkpoint (openpi / RLinf, LeRobot): its weights and statistics, run with the
        from models.pi0_checkpoint import is_pi0_folder  # YAML's policy section (no saved policy config to take)

        if is_pi0_folder(path):
            cfg.policy.pretrained_path = path
            cfg.policy.image_size, cfg.policy.action_chunk = cfg.env.image_size, cfg.env.action_chunk
            try:
                return cls(cfg.policy).to(run.device)
            except ValueError as e:  # pi0.5, legacy layout, missing weights or tokenizer: one line
                raise ConfigError(f"init.path {path}: {e}") from None
    stale = envs.stale_suite_message(path, cfg.env.suite)
    if stale and run.is_main:
        print(f"[init] warning: {stale}", flush=True)
    policy = cls.load(path, device=str(run.device))
    differ = [f"policy.{k}" for k in policy_keys_from_checkpoint(cfg.policy, policy.cfg, LORA_KEYS)]
    differ += [f"env.{k}" for k in ("image_size", "action_chunk") if getattr(cfg.env, k) != getattr(policy.cfg, k)]
    if differ and run.is_main:
        print(f"[init] taken from the checkpoint {path} (its architecture), not the config: {', '.join(differ)}",
              flush=True)
    policy.cfg = dataclasses.replace(policy.cfg, **{k: getattr(cfg.policy, k) for k in LORA_KEYS
                                                    if hasattr(policy.cfg, k)})
    policy.set_lora_rank(cfg.policy.lora_rank)  # merge the SFT's LoRA, fresh adapters on top (or none: full FT)
    cfg.policy = policy.cfg
    cfg.env.image_size, cfg.env.action_chunk = policy.cfg.image_size, policy.cfg.action_chunk
    return policy.to(run.device)


def _published_start(run: "Run", cls: Any, path: str):
    """A family whose architecture is the published folder's config.json (OpenVLA-OFT): every key of the YAML's policy
    section is the run's own (LoRA, precision, gradient checkpointing, image size, statistics key); the folder's own
    LoRA (a checkpoint this project saved) is merged and fresh LoRA of policy.lora_rank goes on top. The statistics
    key defaults to the suite's (`<suite>_no_noops`), or the only one there on the embedded suite."""
    cfg = run.cfg
    keys = {f.name: getattr(cfg.policy, f.name) for f in dataclasses.fields(cfg.policy)
            if f.name not in ("type", "init_path", "lora_rank", "lora_alpha", "lora_dropout", "action_chunk")}
    embedded = cfg.env.suite.startswith("tabletop")
    if keys.get("unnorm_key") is None and not embedded:
        keys["unnorm_key"] = cfg.env.suite
    keys["image_size"] = cfg.env.image_size
    if keys.get("image_pipeline") == "auto":
        keys["image_pipeline"] = "resize" if embedded else "libero"
    try:
        policy = cls.load(path, device=str(run.device), **keys)
    except ValueError as e:  # statistics key, wrong layout, L1-regression checkpoint: one line
        raise ConfigError(f"init.path {path}: {e}") from None
    policy.cfg = dataclasses.replace(policy.cfg, lora_alpha=cfg.policy.lora_alpha, lora_dropout=cfg.policy.lora_dropout)
    policy.set_lora_rank(cfg.policy.lora_rank)
    if cfg.env.action_chunk != policy.action_chunk and run.is_main:
        print(f"[init] env.action_chunk={cfg.env.action_chunk} -> {policy.action_chunk}: {path} predicts "
              f"{policy.action_chunk} actions per call", flush=True)
    cfg.env.action_chunk = policy.action_chunk
    cfg.policy = dataclasses.replace(policy.cfg, init_path=path)
    return policy.to(run.device)


def policy_keys_from_checkpoint(yaml_policy: Any, loaded_policy: Any, kept: Sequence[str]) -> List[str]:
    """Names of `policy.*` keys whose YAML value differs from the loaded checkpoint's (the checkpoint wins); keys in
    `kept` (LoRA, precision) are the run's own and are not compared."""
    return [f.name for f in dataclasses.fields(yaml_policy) if f.name not in kept
            and getattr(yaml_policy, f.name) != getattr(loaded_policy, f.name, None)]


__all__ = ["Run", "start_run", "average_gradients", "minibatches", "make_accelerator", "INTERRUPTED", "resume_command",
           "close_process_group",
           "policy_keys_from_checkpoint", "initial_policy", "sft_command"]
