"""Where an RL run starts from: `initial_policy(run, kind)` returns the policy on the run's device.

    resumed run            its checkpoint's policy (the family its folder holds)
    init.mode=scratch      a fresh policy of `policy.type` (not for families that start from a published checkpoint)
    init.mode=checkpoint   the folder at init.path (default checkpoints/sft_<suite>_task<ids>), started as its family
                           says (`start_from`, models/policy.py): a policy this project saved keeps its architecture
                           and gets the run's LoRA; a published OpenVLA-OFT or pi0 folder runs with the YAML's keys
    init.mode=auto_sft     the same, after running train_sft.py to make that folder when it is missing (and
                           continuing an interrupted one); a default folder that holds a start made with other
                           arguments than the auto-SFT's (init.sft_args) is not reused: the asked-for start goes to
                           <folder>__<hash of its SFT config> (`_auto_sft_path`; common/sft_record.py)

Everything family-specific is the family's own (models/policy.py PolicyFamily); here only what every family shares:
the kind of actions the script trains, the folder's family against `policy.type`, the auto-SFT subprocess, and
`cfg.policy` / `cfg.env.image_size|action_chunk` set to what runs, so the saved config is what ran.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, List, Optional

import torch

from common.config import ROOT, ConfigError
from common import yaml_safe
from common.run_folder import run_order, sibling_lock
from common.scripts import INTERRUPTED
from common.sft_record import describe, differences, keyed_path, sft_config

SCRIPTS_FOR = {"token": "train_srpo.py, train_gae_ppo.py or train_luffy.py",
               "flow": "train_flowsar.py or train_gae_ppo.py"}


def default_sft_path(family: str, suite: str, task_ids: List[int]) -> str:
    """Where init.mode=auto_sft writes (and init.path defaults to) the SFT start of this family, suite and tasks."""
    tasks = "-".join(str(t) for t in task_ids)
    return os.path.join("checkpoints", f"{'sft' if family == 'token' else 'sft_' + family}_{suite}_task{tasks}")


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
            saved = yaml_safe.load_file(os.path.join(run_dir, "config.yaml")) or {}
        except (OSError, ConfigError):
            continue
        if not isinstance(saved, dict) or not isinstance(saved.get("sft") or {}, dict):
            continue
        done = os.path.join(run_dir, "checkpoints")
        if (saved.get("sft") or {}).get("output_path") == path and os.path.isdir(done) and \
                any(d.startswith("iter_") for d in os.listdir(done)):
            return run_dir
    return None


def run_auto_sft(cfg: Any, path: str, family: str) -> None:
    """init.mode=auto_sft: train_sft.py in a subprocess (continuing an interrupted one) to write `path`; Ctrl-C and
    SIGTERM are passed on to it (it saves and says how to resume), then this run exits 130 (INTERRUPTED): it has
    nothing of its own to save, and running the same command again continues the SFT."""
    cmd = sft_command(cfg, path, family)
    shown = " ".join(["python", os.path.relpath(cmd[1])] + cmd[2:])
    unfinished = unfinished_sft_run(cfg.log.output_dir, path)
    if unfinished:  # an earlier auto-SFT was interrupted: continue it instead of starting over
        cmd, shown = cmd + ["--resume", unfinished], f"{shown} --resume {unfinished}"
        print(f"[init] no SFT checkpoint at {path}; continuing the interrupted SFT run: {shown}", flush=True)
    else:
        print(f"[init] no SFT checkpoint at {path}; running: {shown}", flush=True)
    # its own session: a Ctrl-C in the terminal reaches this process only, which passes exactly one SIGINT on per
    # Ctrl-C (the first stops the SFT at its next safe point, saved; a second at once), also for a SIGTERM sent to
    # this process alone (a cluster's scheduler)
    proc = subprocess.Popen(cmd, start_new_session=True)
    interrupted = False
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:
            interrupted = True
            proc.send_signal(signal.SIGINT)
    if interrupted or code == INTERRUPTED:
        raise SystemExit(INTERRUPTED)
    if code != 0:
        raise ConfigError(f"the SFT run for init.mode=auto_sft failed (its output is above): {shown}")


def make_sft_start(cfg: Any, path: str, family: str) -> None:
    """init.mode=auto_sft with `path` missing: one run makes it (a lock beside it); another run of the same SFT start
    (several seeds launched at once) waits for that one and uses what it wrote."""
    lock = sibling_lock(path, "auto_sft")
    held = lock.acquire()
    if held is not None:
        print(f"[init] {path} is being made by pid {held[0]} on {held[1]}; waiting for it", flush=True)
        lock.acquire(wait=True)
    try:
        if not os.path.isdir(path):
            run_auto_sft(cfg, path, family)
        else:
            print(f"[init] using {path}, made by another run meanwhile", flush=True)
    finally:
        lock.release()


def initial_policy(run: Any, kind: str):
    """The policy RL starts from (module docstring), on the run's device; `kind` is what the script trains: 'token'
    (discrete actions with log-probs) or 'flow'. A policy that reads the wrist camera needs it rendered."""
    from models.policy import FAMILIES, action_kind, family_of_folder, policy_class
    from models.saved import PolicyLoadError, load_errors, no_rl_message

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
        return policy_class(family_of_folder(saved)).load(saved, device=str(run.device))
    cls = policy_class(family)
    if cfg.init.mode == "scratch":
        if cls.published:
            raise ConfigError(f"policy.type={family} starts from a published checkpoint, not from scratch: set "
                              f"init.mode=checkpoint init.path=<the checkpoint folder> (docs/checkpoints.md)")
        cfg.policy.image_size, cfg.policy.action_chunk = cfg.env.image_size, cfg.env.action_chunk
        torch.manual_seed(cfg.seed)  # the same initial weights on every process ...
        policy = cls(cfg.policy).to(run.device)
        if run.rank:  # ... then each its own sampling noise (process 0 keeps the one-process stream)
            torch.manual_seed(cfg.seed + run.rank)
        return _checked(run, policy)
    path = cfg.init.path or default_sft_path(family, cfg.env.suite, cfg.env.task_ids)
    if cfg.init.mode == "auto_sft" and not cls.published:
        path = _auto_sft_path(run, path, family)
    if not os.path.isdir(path):
        if cls.published:
            raise ConfigError(f"no {family} checkpoint at {path}: download a published one (docs/checkpoints.md) and "
                              f"set init.path to its folder")
        if not _has_demos(cfg):
            raise ConfigError(_libero_start_message(cfg, path))
        if cfg.init.mode != "auto_sft":
            cmd = sft_command(cfg, path, family)
            shown = " ".join(["python", os.path.relpath(cmd[1])] + cmd[2:])
            raise ConfigError(f"no SFT checkpoint at {path}: RL starts from a supervised policy; make it with `{shown}`, "
                              f"or set init.mode=auto_sft to run that first, or init.path=<dir> to use another one")
        if run.is_main:
            make_sft_start(cfg, path, family)
    run.accelerator.wait_for_everyone()
    try:
        found = family_of_folder(path)
    except PolicyLoadError as e:
        raise ConfigError(f"init.path {path}: not a saved policy ({e}); point init.path at a train_sft.py output") \
            from None
    if found != family and cls.reads_folder_of(found, cfg.policy):  # e.g. policy.from_l1_checkpoint
        found = family
    if action_kind(found) == "regression":
        raise ConfigError(no_rl_message(path))
    if found != family:
        if action_kind(found) != kind:
            raise ConfigError(f"init.path {path} holds a policy of family {found} ({action_kind(found)} actions): "
                              f"train it with {SCRIPTS_FOR[action_kind(found)]}; this script needs a {family} "
                              f"policy there (train_sft.py policy.type={family} makes one)")
        raise ConfigError(f"init.path {path} holds a policy of family {found} but policy.type={family}: set "
                          f"policy.type={found} (and that family's policy keys, as configs/*_libero.yaml do)")
    import envs

    stale = envs.stale_suite_message(path, cfg.env.suite)
    if stale and run.is_main:
        print(f"[init] warning: {stale}", flush=True)
    say = (lambda line: print(f"[init] {line}", flush=True)) if run.is_main else (lambda line: None)
    if not cls.published:
        say(f"start: {path}, {describe(path)}")
    try:  # a statistics key, a wrong layout, a pi0.5 checkpoint, a truncated shard: one line
        with load_errors(path, family):
            policy = cls.start_from(path, cfg.policy, cfg.env, str(run.device), say)
    except PolicyLoadError as e:
        raise ConfigError(f"init.path {path}: {' '.join(str(e).split())}") from None
    cfg.policy = policy.cfg
    cfg.env.image_size, cfg.env.action_chunk = policy.cfg.image_size, policy.action_chunk
    return _checked(run, policy.to(run.device))


def _has_demos(cfg: Any) -> bool:
    """Whether the auto-SFT command has demos to train on: the embedded suite's scripted expert, or HDF5 files given
    through init.sft_args (sft.demo_paths=...)."""
    import envs

    return envs.is_tabletop(cfg.env.suite) or any(a.startswith("sft.demo_paths=") for a in cfg.init.sft_args)


def _libero_start_message(cfg: Any, path: str) -> str:
    """No SFT start at `path` on a suite without a scripted expert in train_sft.py: how to make one (demos first)."""
    suite, ids = cfg.env.suite, " ".join(str(t) for t in cfg.env.task_ids)
    return (f"no SFT checkpoint at {path}, and {suite} has no demos train_sft.py can make by itself: record demos "
            f"with `python record_demos.py --record 50 --suite {suite} --task-ids {ids} --out "
            f"data/libero_demos/` and train the start with `python train_sft.py --config configs/sft_libero.yaml "
            f"--task-ids {ids} "
            f"env.suite={suite} sft.demo_paths=[...the .hdf5 files] sft.output_path={path}` (or both in one: "
            f"`python benchmarks/libero_learning.py --suite {suite} --task-id {cfg.env.task_ids[0]} --sft-only --out "
            f"D`, then init.path=D/sft; docs/libero.md), or set init.path=<an SFT start>")


def _auto_sft_path(run: Any, path: str, family: str) -> str:
    """init.mode=auto_sft: the folder of the SFT start that the auto-SFT command (init.sft_args included) makes.
    `path` when it is missing or holds that start (its train_config.yaml, common/sft_record.py); a start there made
    with other arguments is never reused in silence: with init.path given (you named the folder) it is used with a
    warning; at the default folder this run trains (or reuses) the asked-for start in `path`__<hash of its config>
    instead, and says so."""
    cfg = run.cfg
    if not os.path.isdir(path):
        return path
    expected = sft_config(sft_command(cfg, path, family)[2:])
    diff = differences(expected, path)
    say = (lambda line: print(f"[init] {line}", flush=True)) if run.is_main else (lambda line: None)
    if diff == []:
        return path
    if diff is None:
        say(f"warning: {path} has no train_config.yaml this code reads, to compare with init.sft_args="
            f"{list(cfg.init.sft_args)}: using it as it is (init.mode=checkpoint says so and silences this)")
        return path
    shown = ", ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
    if cfg.init.path:
        say(f"warning: init.path {path} was made with {shown}; using it because init.path names it (leave "
            f"init.path out to have auto_sft train the start init.sft_args asks for)")
        return path
    keyed = keyed_path(path, expected)
    say(f"{path} was made with {shown}, not what this run's auto-SFT trains (init.sft_args="
        f"{list(cfg.init.sft_args)}): not reusing it; this run's SFT start is {keyed} "
        f"(init.mode=checkpoint init.path={path} starts from the other one)")
    return keyed


def _checked(run: Any, policy: Any) -> Any:
    """The policy, refused in one line when it reads a camera the env does not render."""
    import envs

    env = run.cfg.env
    if not env.wrist_camera and policy.reads_wrist_camera() and not envs.is_tabletop(env.suite):
        raise ConfigError("env.wrist_camera=false but the policy reads the wrist camera (policy.use_wrist=true): "
                          "set env.wrist_camera=true, or train a policy without it")
    return policy


__all__ = ["initial_policy", "sft_command", "default_sft_path", "unfinished_sft_run", "SCRIPTS_FOR"]
