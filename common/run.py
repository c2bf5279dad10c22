"""The run's lifecycle, shared by every training script (the four RL scripts and train_sft.py), so a script holds only
its algorithm:

    with start_run(cfg, "srpo") as run:                    # accelerator, seeds, the run folder (new or resumed)
        policy = initial_policy(run, "token")               # common/policy_start.py (the checkpoint's on resume)
        run.attach(policy, {"actor": opt}, {"actor": sched})  # restores a resumed run's state; config.yaml, logger
        for iteration in run.iterations():
            metrics = run.begin_iteration(iteration)        # row 0: the starting policy evaluated
            batch = collect_rollouts(run.envs, ...)
            run.count_env_steps(batch, metrics, seconds)  # env steps, all processes
            if run.should_stop():                            # a safe point (before the update): asked to stop
                break
            ...advantages, update...
            if run.end_iteration(iteration, metrics, console_keys):  # evaluation, metrics row, checkpoint: a safe
                break                                                # point: asked to stop (this iteration saved)

One interrupt protocol, for one process or many, ddp or fsdp, RL or SFT: Ctrl-C or SIGTERM (to the launcher or to
any one process) only asks to stop; every process stops together at the next safe point, decided by one gather:
after the rollout, before the iteration's first optimizer step (nothing has changed since the last completed
iteration, so that one is saved as it stands, with the random states taken at its end: nothing is copied), or at
the end of an iteration (it is saved). Both safe points return True then (the same answer on every process) and
the script leaves its loop: `run.stopped` says so to code after the loop, and the `with` block exits 130 with the
command that continues the run. Nothing is raised to stop, and no hook watches the optimizers: `count_env_steps` and
`should_stop` are called before the iteration's first optimizer step (their contract). With one process a second Ctrl-C
stops at once (KeyboardInterrupt; the last checkpoint is kept). Resume continues the same run: every random stream is
restored per process and metrics rows past the checkpoint are dropped (common/metrics_log.py), so a resumed run is the
uninterrupted one (bitwise on one CPU thread). A failed checkpoint write ends the run in one line; the run ends with a
one-line summary (`run_summary`).

What `start_run` reads from a script's config (tests/test_configs_shipped.py loads every shipped YAML):
    seed, resume                                   the run's seed (per process: + rank), --resume's folder
    env: envs.EnvConfig                            the run name (suite, task_ids) and the vector env
    log: LogConfig                                 folders, wandb, checkpoint cadence
    train.strategy, train.fsdp_offload             ddp or fsdp (common/fsdp.py)
    train.threads                                  torch's CPU threads (common/threads.py; 0 = auto)
and, for the RL scripts' `Schedule.for_rl`: train.iterations, eval: EvalConfig, rollout.train_trials. train_sft.py
gives its own Schedule (an iteration is a block of sft.log_every steps).
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch

from common import fsdp, memory_plan, provenance, threads
from common.checkpoint import (CheckpointError, capture_rng_state, latest_checkpoint, load_run_checkpoint,
                               read_rng_state, read_rng_states, save_run_checkpoint, untrusted_message)
from common.config import ConfigError, save_config, script_file
from common.distributed import close_process_group, gather_objects, launch_command, make_accelerator
from common.evaluation import eval_trials, evaluate_policy
from common.metrics_log import Logger, MetricsWriteError, duration, format_line
from common.rollout import RolloutBatch
from common.run_folder import (check_writable, create_run_dir, default_run_prefix, lock_run_dir, remove_if_empty,
                               resolve_run_dir, trust_run)
from common.scripts import INTERRUPTED
from models.saved import PolicyLoadError


@dataclass
class EvalSettings:
    """How the run's evaluations sample actions (`Run.attach(..., evaluation=...)`; passed on to
    common.evaluation.evaluate_policy): the script's rollout settings, so that sampled evaluation episodes are drawn as
    the training ones. The defaults are evaluate_policy's."""

    temperature: float = 1.0  # token policies: the sampled episodes' temperature (greedy ones take the argmax)
    flow_steps: Optional[int] = None  # flow policies: denoising steps per action chunk (None: the policy's own)
    flow_noise_level: float = 0.0  # flow policies: the sampled episodes' noise level


def eta_seconds(elapsed: float, iterations_done: int, iterations_left: int, steps_done: float = 0,
                steps_left: Optional[float] = None) -> float:
    """Time left at this run's pace: by iterations, or by env steps when an env-step budget is set and comes sooner
    (train.total_timesteps with train.iterations as a cap: 'ETA 28h' at iteration 25 of 1000 when the budget ends it
    in 50)."""
    eta = elapsed / iterations_done * max(0, iterations_left)
    if steps_left is not None and steps_done > 0:
        eta = min(eta, elapsed / steps_done * max(0.0, steps_left))
    return eta


@dataclass
class Schedule:
    """When a run evaluates and saves, counted in iterations (the unit of the loop, the metrics rows and the
    checkpoints): `Schedule.for_rl(cfg)` for the RL scripts; train_sft.py makes one where an iteration is a block of
    `steps_per_iteration` gradient steps."""

    iterations: int
    eval_every: int  # evaluate every N iterations (and after the last); 0 = never
    checkpoint_every: int  # save every N iterations (and after the last, and when stopped)
    eval_trials: List[int] = field(default_factory=list)  # trial ids evaluated per task
    samples_per_trial: int = 0  # sampled episodes per trial besides the greedy one (val/sampled_success_rate)
    eval_at_start: bool = True  # row 0: the starting policy evaluated before the first iteration
    steps_per_iteration: int = 1  # > 1: an iteration is that many steps (train_sft.py); messages count steps
    total_steps: Optional[int] = None  # the steps of the whole run (the last iteration may be shorter)
    env_step_budget: Optional[int] = None  # train.total_timesteps: the run also stops there (the ETA takes the sooner)

    @classmethod
    def for_rl(cls, cfg: Any) -> "Schedule":
        """train.iterations; eval.every, its trials (eval.trial_start on, default the first trial after the practised
        ones) and samples; log.checkpoint_every."""
        import envs

        trials = eval_trials(envs.num_trials(cfg.env), cfg.eval.trials_per_task, cfg.eval.trial_start,
                             cfg.rollout.train_trials)
        return cls(cfg.train.iterations, cfg.eval.every, cfg.log.checkpoint_every, trials, cfg.eval.samples_per_trial,
                   env_step_budget=getattr(cfg.train, "total_timesteps", None))

    def steps(self, done: int) -> int:
        """Steps done after `done` iterations."""
        steps = done * self.steps_per_iteration
        return min(steps, self.total_steps) if self.total_steps else steps

    def position(self, done: int) -> str:
        """'iteration k', or for a run of steps 'step n'."""
        return f"iteration {done}" if self.steps_per_iteration == 1 else f"step {self.steps(done)}"

    def progress(self, done: int) -> str:
        """'iterations 1..k', or for a run of steps 'steps 1..n'."""
        return f"iterations 1..{done}" if self.steps_per_iteration == 1 else f"steps 1..{self.steps(done)}"


class Run:
    """Everything a training script needs around its algorithm; see the module docstring."""

    def __init__(self, cfg: Any, script: str, schedule: Optional[Schedule] = None):
        import envs

        try:  # robustness variants (tabletop_lan, ...) are evaluated, never trained on
            envs.check_training_suite(cfg.env.suite)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.cfg, self.script = cfg, script
        self.schedule = schedule if schedule is not None else Schedule.for_rl(cfg)
        self.accelerator = make_accelerator()
        acc = self.accelerator
        self.is_main, self.rank, self.world, self.device = (acc.is_main_process, acc.process_index,
                                                            acc.num_processes, acc.device)
        memory_plan.check(cfg, acc)  # prints the plan; refuses (one line, the fixes) a run that cannot fit
        self.threads = threads.set_threads(getattr(cfg.train, "threads", 0), self.world, self.device.type)
        if hasattr(cfg.train, "threads"):  # the count chosen goes in config.yaml: a resume reads it back
            cfg.train.threads = self.threads[0]
        random.seed(cfg.seed + self.rank)
        np.random.seed(cfg.seed + self.rank)
        torch.manual_seed(cfg.seed + self.rank)
        self.prompt_rng = np.random.default_rng([cfg.seed, self.rank])
        self.rngs: Dict[str, np.random.Generator] = {"prompt": self.prompt_rng}  # saved and restored by name
        self.t_start = time.perf_counter()
        self.created = False  # a new run folder made by this process (removed again if the start fails empty)
        self._made: List[str] = []  # the folders it made (its plots folder only when it was not there before)
        prefix = default_run_prefix(script, cfg.env.suite, cfg.env.task_ids, cfg.seed)
        error, named = None, ("", "")
        self._lock = None  # the main process holds <run>/run.lock for the run's life (one job per run folder)
        if self.is_main:  # only the main process creates (exclusively) or checks the folder; the others take its name
            try:
                if cfg.resume:
                    named = resolve_run_dir(cfg.log, prefix, cfg.resume, must_exist=True)
                    check_writable(named[1], f"--resume {named[1]}")
                    self._lock = lock_run_dir(named[1], f"--resume {named[1]}")
                else:
                    named = create_run_dir(cfg.log, prefix, self._made)
                    self.created = True
                    self._lock = lock_run_dir(named[1], f"log.output_dir={cfg.log.output_dir}")
            except ConfigError as e:
                error = str(e)
        error, (self.run_name, self.run_dir) = self.gather([(error, named)])[0]
        if error:
            raise ConfigError(error)
        try:
            self._check_resume(cfg)
        except BaseException:
            self.release_lock()
            raise
        self.start_iteration = 0
        self.state: Dict[str, Any] = {"env_steps": 0.0}  # saved in every checkpoint, restored on resume
        self.logger: Optional[Logger] = None
        self.envs = None
        self.evaluation = EvalSettings()  # how evaluations sample (Run.attach)
        self._tracked: Optional[Dict[str, Any]] = None
        self._saved_iteration = 0  # the newest checkpoint of this run
        self._last_done: Optional[Dict[str, Any]] = None  # the last completed iteration: its RNG states and run state
        self._signals = 0  # Ctrl-C / SIGTERM received
        self._stopped = False  # every process agreed to stop at the same safe point (run.stopped)
        self._stop_asked = False  # count_env_steps' gather saw a process asked to stop (should_stop answers)
        self._closing = False  # in __exit__: a signal only counts
        self._saving = False  # a checkpoint is being written: never cut short
        self._old_handlers: Dict[int, Any] = {}
        self._t_first: Optional[tuple] = None

    def release_lock(self) -> None:
        """Let go of the run folder (at the run's end, or when its start fails)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _check_resume(self, cfg: Any) -> None:
        """The checkpoint a resume continues from: complete, of this many processes, and trusted when loading it
        unpickles (fsdp shards written elsewhere: refused unless --trust-run)."""
        try:
            self.resume_path = latest_checkpoint(self.run_dir) if cfg.resume else None
        except CheckpointError as e:  # checkpoints/ or an iter_* that leads out of the run folder
            raise ConfigError(str(e)) from None
        if cfg.resume and self.resume_path is None:
            raise ConfigError(f"--resume: {self.run_dir} has no complete checkpoint to continue from; start a new run "
                              f"without --resume")
        if self.resume_path is not None:
            untrusted = next((m for m in self.gather([untrusted_message(self.resume_path) if self.is_main else None])
                              if m), None)
            if untrusted and not trust_run():
                raise ConfigError(untrusted)
            if untrusted and self.is_main:
                print(f"[{self.script}] --trust-run: loading {self.resume_path} although it was not written on this "
                      f"machine", flush=True)
            try:
                saved_world = len(read_rng_states(self.resume_path))
                note = check_resumable(self.resume_path, self.run_dir, self.schedule)
            except CheckpointError as e:
                raise ConfigError(str(e)) from None
            if note and self.is_main:
                print(f"[{self.script}] {note}", flush=True)
            if saved_world != self.world:
                raise ConfigError(f"--resume: the run had {saved_world} process(es) and this launch has {self.world} "
                                  f"(prompts are per process, so the batch would change): resume with "
                                  f"`{self.resume_command(saved_world)}`")

    # ---- start
    def gather(self, items: List) -> List:
        """The concatenation of every process's list (accelerate's gather_object; a collective)."""
        return gather_objects(self.world, items)

    def make_envs(self, num_envs: Optional[int] = None):
        """The vector env of `cfg.env` (num_envs: default env.num_envs), seeded per process (its random generator
        is kept in the checkpoint's RNG states)."""
        import envs

        self.envs = envs.make_vector_env(self.cfg.env, num_envs, seed=self.cfg.seed + self.rank)
        return self.envs

    def attach(self, policy, optimizers: Dict[str, torch.optim.Optimizer], schedulers: Optional[Dict[str, Any]] = None,
               modules: Optional[Dict[str, torch.nn.Module]] = None, evaluation: Optional[EvalSettings] = None,
               banner: str = "") -> None:
        """Track what checkpoints hold; on resume restore it (and every random stream of `self.rngs`) from the
        checkpoint. `evaluation`: how evaluations sample (default EvalSettings()). Then write config.yaml (new runs
        only), open the logger and print the banner."""
        self._tracked = dict(policy=policy, optimizers=optimizers, schedulers=schedulers or {}, modules=modules or {})
        if self.envs is None:
            self.make_envs()
        self.evaluation = evaluation if evaluation is not None else EvalSettings()
        if self.resume_path is not None:
            try:  # fsdp: each process reads its shards of the weights, optimizer state and sharded modules
                self.start_iteration, extra = load_run_checkpoint(self.resume_path, policy, optimizers, schedulers,
                                                              self._tracked["modules"], rank=self.rank)
            except (ValueError, CheckpointError) as e:  # a corrupt file: one line naming it, not a full disk
                raise ConfigError(str(e)) from None
            saved_rng = read_rng_state(self.resume_path, self.rank)
            try:
                for name, generator in self.rngs.items():
                    if name in saved_rng:
                        generator.bit_generator.state = saved_rng[name]
                if "env" in saved_rng and env_rng(self.envs) is not None:
                    env_rng(self.envs).bit_generator.state = saved_rng["env"]
            except (TypeError, ValueError, KeyError) as e:
                raise ConfigError(f"checkpoint {self.resume_path}: rng.pt[{self.rank}] holds a malformed generator "
                                  f"state ({' '.join(str(e).split())[:120]}); resume from an earlier checkpoint") \
                    from None
            self.state.update(extra.get("state", {}))
            self._saved_iteration = self.start_iteration
        fsdp.register(policy, list(optimizers.values()))  # fsdp: gathers the weights for the run (collective)
        self._last_done = {"iteration": self.start_iteration, "rng": self._rng_states(), "state": copy.deepcopy(
            self.state)}
        if self.is_main:
            config_path = os.path.join(self.run_dir, "config.yaml")
            if self.resume_path is None:  # a resumed run keeps the config it was started with (never replaced)
                save_config(self.cfg, config_path, script=self.script, exclusive=True)
            provenance.record_run(self.run_dir, self.start_iteration)  # the code and versions of this start / resume
            self.logger = Logger(self.run_dir, self.run_name, self.cfg, self.cfg.log,
                                 resume_iteration=self.start_iteration if self.resume_path else None)
            params = sum(p.numel() for p in policy.parameters() if p.requires_grad)
            print(f"[{self.script}] run {self.run_dir} | {params:,} trainable params | device {self.device} "
                  f"x{self.world} | tasks {list(self.cfg.env.task_ids)}{banner}"
                  + (f" | resumed at {self.schedule.position(self.start_iteration)}" if self.resume_path else "")
                  + f" | {threads.header(*self.threads)}",
                  flush=True)

    def iterations(self) -> range:
        return range(self.start_iteration, self.schedule.iterations)

    # ---- evaluation
    def evaluate(self, iteration: int) -> Dict[str, float]:
        """`common.evaluation.evaluate_policy` on the schedule's trials of every training task, or the subset
        eval.protocol evaluates (`envs.protocols.eval_pairs`: SimpleVLA-RL's random 496 of 500) (time/eval added)."""
        from envs.protocols import eval_pairs

        t0 = time.perf_counter()
        protocol = getattr(getattr(self.cfg, "eval", None), "protocol", "heldout")  # SimpleVLA-RL: a random 496
        pairs = eval_pairs(protocol, self.cfg.env.task_ids, self.schedule.eval_trials, self.cfg.seed, iteration)
        metrics, batches = evaluate_policy(self.envs, self._tracked["policy"], self.cfg.env.task_ids,
                                           self.schedule.eval_trials, pairs=pairs,
                                           samples_per_trial=self.schedule.samples_per_trial,
                                           rank=self.rank, world=self.world, gather=self.gather, progress=self.is_main,
                                           desc=f"eval {iteration}", **asdict(self.evaluation))
        metrics["time/eval"] = time.perf_counter() - t0
        for batch in batches.values():  # this process's evaluation episodes: env steps, and the rollout's timings
            for key, value in batch.stats.items():
                if key != "rollout/envs":
                    name = "eval/env_steps" if key == "rollout/env_steps" else key.replace("rollout", "eval_rollout")
                    metrics[name] = metrics.get(name, 0.0) + value
        return metrics

    def begin_iteration(self, iteration: int) -> Dict[str, float]:
        """The iteration's (empty) metrics dict. Before a new run's first iteration the starting policy is evaluated
        and logged as row 0, at 0 env steps, so every curve starts where the policy started."""
        s = self.schedule
        if s.eval_every > 0 and s.eval_at_start and iteration == self.start_iteration == 0:
            metrics = {**self.evaluate(0), "charts/env_steps": 0}
            if self.is_main:
                self.logger.log(metrics, 0)
                print(format_line(0, metrics, ["val/success_rate", "val/sampled_success_rate", "time/eval"],
                                  total=s.iterations), flush=True)
        if self._t_first is None:
            # the ETA counts from the first iteration's start
            self._t_first = (time.perf_counter(), iteration, self.state.get("env_steps", 0))
        return {}

    def count_env_steps(self, batch: RolloutBatch, metrics: Dict[str, float], seconds: float) -> None:
        """rollout/env_steps (all processes), the cumulative charts/env_steps and charts/SPS into `metrics`. Called
        after the rollout and before the iteration's first optimizer step; its one gather also learns whether any
        process was asked to stop (then nothing is counted: the iteration is dropped), which `should_stop` answers."""
        counts, signalled = zip(*self.gather([(batch.stats["rollout/env_steps"], self._signals > 0)]))
        self._stop_asked = any(signalled)
        if self._stop_asked:
            return
        steps = sum(counts)
        self.state["env_steps"] += steps
        metrics["rollout/env_steps"] = steps
        metrics["charts/env_steps"] = self.state["env_steps"]  # the x-axis of sample-efficiency plots
        metrics["charts/SPS"] = steps / max(seconds, 1e-9)
        # this process's rollout timings (common/rollout.py: policy, waits, the workers' physics and resets)
        metrics.update({k: v for k, v in batch.stats.items() if k.startswith("time/") or k == "rollout/envs"})

    def should_stop(self) -> bool:
        """The safe point after `count_env_steps` (before the iteration's first optimizer step): True on every
        process when any was asked to stop; the last completed iteration is then saved and the script leaves its
        loop (`if run.should_stop(): break`)."""
        if self._stop_asked:
            self._stop_asked = False
            self._stop_before_update()
            return True
        return False

    def _stop_before_update(self) -> None:
        """Every process, together, before the iteration's first optimizer step: the weights, optimizer and scheduler
        states and modules are still those of the last completed iteration, so that iteration is saved (unless it
        is) with the RNG states and run state taken at its end; the run is then stopped."""
        last = self._last_done
        if last is not None and last["iteration"] > self._saved_iteration:
            current, self.state = self.state, last["state"]
            try:
                self.save(last["iteration"], last["rng"])
            finally:
                self.state = current
        self._stopped = True

    # ---- end of iteration
    def _rng_states(self) -> List[Dict[str, Any]]:
        """Every process's random states (python, numpy, torch, the tracked generators, the environments')."""
        state = capture_rng_state()
        for name, generator in self.rngs.items():
            state[name] = generator.bit_generator.state
        if env_rng(self.envs) is not None:
            state["env"] = env_rng(self.envs).bit_generator.state
        return self.gather([state])

    def end_iteration(self, iteration: int, metrics: Dict[str, float], console_keys: Sequence[str],
                      last: Optional[bool] = None) -> bool:
        """Evaluation when due, one metrics row + console line (with an ETA), checkpoint when due. A safe point:
        returns True (on every process) when any process was asked to stop, this iteration saved; the script then
        leaves its loop (`if run.end_iteration(...): break`). `last` (default: the
        schedule's final iteration) forces evaluation and checkpoint, e.g. when a script stops on an env-step
        budget."""
        s, done = self.schedule, iteration + 1
        last = done == s.iterations if last is None else last
        if s.eval_every > 0 and (done % s.eval_every == 0 or last):
            metrics.update(self.evaluate(done))
        if self.device.type == "cuda":  # peak since the start of the process, as verl's perf/max_memory_allocated_gb
            metrics["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(self.device) / 2 ** 30
            metrics["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(self.device) / 2 ** 30
        written = None
        if self.is_main:
            try:
                self.logger.log(metrics, done)
            except MetricsWriteError as e:
                written = str(e)
        flags = self.gather([(self._signals > 0, written)])  # every process decides the same
        stop, written = any(f[0] for f in flags), next((f[1] for f in flags if f[1]), None)
        if written:  # raised on every process, reported like a failed checkpoint write (__exit__)
            raise MetricsWriteError(written)
        rng_states = self._rng_states()
        if self.is_main:
            eta = None
            if self._t_first is not None and done > self._t_first[1]:
                t0, first, steps0 = self._t_first
                eta = eta_seconds(time.perf_counter() - t0, done - first, s.iterations - done,
                                  self.state.get("env_steps", 0) - steps0, s.env_step_budget and
                                  s.env_step_budget - self.state.get("env_steps", 0))
            print(format_line(done, metrics, console_keys, total=s.iterations, eta_s=eta), flush=True)
        if done % s.checkpoint_every == 0 or last or stop:
            self.save(done, rng_states)
        self._last_done = {"iteration": done, "rng": rng_states, "state": copy.deepcopy(self.state)}
        if stop:
            self._stopped = True
            return True
        self.accelerator.wait_for_everyone()
        return False

    def save(self, iteration: int, rng_states: List[Dict[str, Any]]) -> str:
        """The checkpoint of `iteration` (process 0 writes it; under fsdp every process writes its shards). A signal
        never cuts it short. A failed write (CheckpointError) is raised on every process (under ddp process 0 writes
        alone: the others would go on into the next collective and fail there with a traceback)."""
        t = self._tracked
        self._saving = True
        error = path = None
        try:
            path = save_run_checkpoint(self.run_dir, iteration, t["policy"], t["optimizers"], t["schedulers"],
                                       t["modules"], rank=self.rank, gather=self.gather, config=self.cfg,
                                       extra={"run_name": self.run_name, "state": self.state},
                                       keep_last=self.cfg.log.keep_checkpoints, rng_states=rng_states)
        except CheckpointError as e:
            error = str(e)
        finally:
            self._saving = False
        error = next((e for e in self.gather([error]) if e), None)
        if error:
            raise CheckpointError(error)
        self._saved_iteration = iteration
        return path

    @contextlib.contextmanager
    def uninterrupted(self) -> Iterator[None]:
        """A block no signal cuts short (a one-process run's second Ctrl-C waits for it): copies and exports."""
        saving, self._saving = self._saving, True
        try:
            yield
        finally:
            self._saving = saving

    @property
    def stopped(self) -> bool:
        """Every process was asked to stop and left its loop at a safe point (the stop's checkpoint is written); the
        `with` block then exits 130 with the command that continues the run."""
        return self._stopped

    @property
    def saved_iteration(self) -> int:
        """The newest checkpoint's iteration (0: none yet)."""
        return self._saved_iteration

    # ---- interrupts and the end
    def _on_signal(self, signum, frame) -> None:
        """Ctrl-C / SIGTERM: before the policy is attached nothing can be saved, so stop at once; after, ask every
        process to stop at the next safe point (a second signal on a one-process run: at once, unless a checkpoint
        is being written)."""
        self._signals += 1
        if self._closing:  # the run is ending already (e.g. the launcher's SIGTERM once another process ended)
            return
        if self._tracked is None:
            raise KeyboardInterrupt
        if self._signals == 1:
            now = " (Ctrl-C again to stop at once, losing the iteration under way)" if self.world == 1 else ""
            if self.world > 1 and "TORCHELASTIC_RUN_ID" in os.environ:  # accelerate launch (torch's launcher)
                grace = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
                now = (f" (a signal to the launcher ends every process {grace} s later: a stop that needs longer needs "
                       f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=<seconds> set before the launch)")
            _say(f"\n[{self.script}] {signal.Signals(signum).name}: stopping after the rollout or the iteration under "
                 f"way, which is then saved{now}\n")
        elif self.world == 1 and not self._saving:
            raise KeyboardInterrupt

    def __enter__(self) -> "Run":
        self._signals = 0
        self._old_handlers = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._closing = True  # a signal from now on only counts: nothing of the teardown is cut short
        interrupted = exc_type is KeyboardInterrupt or (exc_type is None and self._stopped)  # exits 130
        try:
            if exc_type is None and self._tracked is not None and not self._stopped:
                self.check_replicas()
            if interrupted and self.is_main:
                self._report_interrupt()
            if self.logger is not None:
                self.logger.close()
            if self.envs is not None:
                try:
                    self.envs.close()
                except Exception:  # noqa: BLE001 - closing a half-dead simulator must not hide the real exit
                    pass
            # a run that ended or stopped together leaves together (a barrier first): the first process to exit
            # would make the launcher end the others, process 0 perhaps still writing the stop's checkpoint
            close_process_group(exc_type is None)
        finally:
            for sig, handler in self._old_handlers.items():
                # several processes: the process ends now, and the launcher's SIGTERM once another one has ended
                # must not cut its exit (its error line, exit code 130) short; nor may a repeated signal cut the
                # exit of a stopped run (it exits 130, never -15)
                signal.signal(sig, signal.SIG_IGN if self.world > 1 or interrupted else handler)
        self.release_lock()
        if (exc_type is not None or interrupted) and self.created and self.is_main:  # nothing written: removed
            remove_if_empty(*self._made)
        if interrupted:
            raise SystemExit(INTERRUPTED)
        if exc_type is not None and issubclass(exc_type, (ConfigError, PolicyLoadError)):  # a bad input: one line
            raise SystemExit(f"error: {' '.join(str(exc).split())}") from None
        if exc_type is not None and issubclass(exc_type, (CheckpointError, MetricsWriteError)):
            raise SystemExit(f"error: {exc}; {self._continue_advice('free the space (or fix the folder) and')}") \
                from None
        if exc_type is None and self.is_main:
            history = self.logger.history if self.logger is not None else {}
            plot = os.path.join(self.cfg.log.plots_dir, self.run_name, "training_curves.png")
            print(f"[{self.script}] done: {self.run_dir} (metrics.jsonl, config.yaml, checkpoints/)", flush=True)
            s = self.schedule
            work = f"{s.steps(s.iterations):,} steps" if s.steps_per_iteration > 1 else None
            print(f"[{self.script}] summary: " + run_summary(history, self.state["env_steps"],
                                                              time.perf_counter() - self.t_start, plot,
                                                              resumed=self.resume_path is not None, work=work),
                  flush=True)
        return False

    def _continue_advice(self, then: str = "") -> str:
        """How to go on: the --resume command when a checkpoint exists (it is then accepted), else a new run."""
        if self._saved_iteration > 0:
            return (f"{self.schedule.progress(self._saved_iteration)} are saved in {self.run_dir}/checkpoints; "
                    f"{then + ' ' if then else ''}continue with: {self.resume_command()}")
        return f"nothing was saved; {then + ' ' if then else ''}start the run again (without --resume)"

    def _report_interrupt(self) -> None:
        print(f"\n[{self.script}] interrupted: {self._continue_advice()}", flush=True)

    def check_replicas(self) -> None:
        """With several processes: the policy and every tracked module (value head, EMA) must be identical on every
        one (gradients are averaged, so they move in lockstep); prints that they are, raises if they drifted apart.
        Sharded modules (fsdp) are no replicas: each process holds its own part, so they are not compared."""
        if self.world == 1:
            return
        tracked = {"policy": self._tracked["policy"],
                   **{k: m for k, m in self._tracked["modules"].items() if not fsdp.holds_dtensors(m)}}
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

    def script_file(self) -> str:
        return script_file(self.script)

    def resume_command(self, world: Optional[int] = None) -> str:
        """The command that continues this run with `world` processes (default: this run's)."""
        return resume_command(self.script_file(), self.run_dir, self.world if world is None else world)


def check_resumable(path: str, run_dir: str, schedule: Schedule) -> Optional[str]:
    """CheckpointError (one line) when checkpoint `path` cannot continue the run in `run_dir`: its state.json is
    malformed, names another run (a folder copied or linked from elsewhere), or is past the schedule's end (the resume
    would train nothing: train.iterations or sft.steps was lowered). A note (returned) when it is at the end: nothing
    is left to train (what follows the loop still runs, e.g. train_sft.py's export of a run stopped before it)."""
    from common.checkpoint import read_state

    state = read_state(path)
    saved_name = state["extra"].get("run_name")
    if saved_name is not None and saved_name != os.path.basename(os.path.normpath(run_dir)):
        raise CheckpointError(f"{path}/state.json: 'run_name' is {saved_name!r}, but the run folder is "
                              f"{os.path.basename(os.path.normpath(run_dir))!r}: that checkpoint belongs to another "
                              f"run (a folder copied, linked or renamed from it); resume that run's own folder, or "
                              f"give this folder its name {saved_name!r} back")
    length = "sft.steps" if schedule.steps_per_iteration > 1 else "train.iterations"
    saved = state["iteration"] * schedule.steps_per_iteration
    if state["iteration"] > schedule.iterations:
        raise CheckpointError(f"--resume: {run_dir} is saved at {schedule.position(state['iteration'])}, past the "
                              f"run's end at {schedule.position(schedule.iterations)}: a resume would train nothing; "
                              f"raise {length} above {saved} to train further")
    if state["iteration"] == schedule.iterations:
        return (f"note: {run_dir} is saved at its last {schedule.position(state['iteration'])}: nothing is left to "
                f"train (raise {length} above {schedule.steps(state['iteration'])} to train further)")
    return None


def _say(text: str) -> None:
    """Write to stdout from a signal handler (os.write: a print there could re-enter an interrupted print)."""
    try:
        sys.stdout.flush()
    except (RuntimeError, ValueError):  # re-entrant flush inside an interrupted write: the bytes below still go
        pass
    os.write(sys.stdout.fileno(), text.encode())


def env_rng(vec_env) -> Optional[np.random.Generator]:
    """The environments' own random generator (tabletop: expert noise), when they have one we can save."""
    return getattr(getattr(vec_env, "core", None), "rng", None)


def resume_command(script: str, run_dir: str, world: int) -> str:
    """The command that continues the run in `run_dir` of `script` (train_srpo.py, ...) with `world` processes."""
    return f"{launch_command(world)} {script} --resume {run_dir}"


def run_summary(history: Dict[int, Dict[str, float]], env_steps: float, wall_s: float, plot: str,
                key: str = "val/success_rate", resumed: bool = False, work: Optional[str] = None) -> str:
    """The end-of-run line: `key` at the start (iteration 0), its best, the mean of the last three evaluations, the
    work done (`work`, default the env steps), wall time and where the plot is."""
    evals = [(it, row[key]) for it, row in sorted(history.items()) if key in row and not math.isnan(row[key])]
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
    parts += [work or f"{int(env_steps):,} env steps", f"wall {duration(wall_s)}" + (" (this session)" if resumed else ""),
              f"plot {plot}"]
    return " | ".join(parts)


def start_run(cfg: Any, script: str, schedule: Optional[Schedule] = None) -> Run:
    """Accelerator, seeds and the run folder (new or resumed); use as `with start_run(...) as run:`. A bad start is
    one line (`error: ...`)."""
    try:
        return Run(cfg, script, schedule)
    except ConfigError as e:
        close_process_group(False)
        raise SystemExit(f"error: {e}") from None


__all__ = ["Run", "Schedule", "EvalSettings", "start_run", "INTERRUPTED", "resume_command", "run_summary"]
