"""Run folders: `<log.output_dir>/<run name>/` and `<log.plots_dir>/<run name>/`. A new run's folder is created
exclusively (two runs started in the same second get `-2`, ...; an existing `log.run_name` is refused), checked
writable, and removed again when its start fails before writing anything; `--resume` finds the run to continue (a
bare `--resume`: the newest run of the same script, suite, tasks and seed that holds a checkpoint). One job per run
folder: `RunLock` holds `<run>/run.lock` for the run's life; `FolderLock` serialises writers of a shared folder."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import tempfile
import time
from typing import Any, Optional, Sequence, Tuple

from base.config_fields import ConfigError


def default_run_prefix(script: str, suite: str, task_ids: Sequence[int], seed: int) -> str:
    return f"{script}__{suite}__t{'-'.join(str(t) for t in task_ids)}__s{seed}"


def resolve_run_dir(log: Any, prefix: str, resume: Optional[str], must_exist: bool = False) -> Tuple[str, str]:
    """(run_name, run_dir): the run to continue when `resume` is "auto" or a folder (`must_exist`: ConfigError when
    there is none to continue), else the name a new run would get (`create_run_dir` makes it exclusively)."""
    if resume not in (None, "", "auto"):
        run_dir = resume.rstrip("/")
        if _is_checkpoint_dir(run_dir):  # a checkpoint folder (<run>/checkpoints/iter_N) was given: use its run
            run_dir = _run_of_checkpoint(run_dir, resume)
        if not os.path.isdir(run_dir):
            raise ConfigError(f"--resume {resume}: no such run folder (runs live in {log.output_dir}/<run name>/; "
                              f"a bare --resume picks the latest one)")
        return os.path.basename(run_dir), run_dir
    if log.run_name:
        check_run_name(log.run_name)
    if log.run_name and not (must_exist and not os.path.isdir(os.path.join(log.output_dir, log.run_name))):
        return log.run_name, os.path.join(log.output_dir, log.run_name)
    if resume == "auto" and os.path.isdir(log.output_dir):
        previous = sorted((d for d in os.listdir(log.output_dir) if d.startswith(prefix + "__")), key=run_order)
        # the newest that can be continued: a run stopped before its first checkpoint holds nothing to resume
        resumable = [d for d in previous if _newest(os.path.join(log.output_dir, d))]
        if resumable:
            return resumable[-1], os.path.join(log.output_dir, resumable[-1])
        if previous and must_exist:
            raise ConfigError(f"--resume: no run {prefix}__* in {log.output_dir}/ holds a checkpoint ({previous[-1]} "
                              f"stopped before its first one); drop --resume to start a new run")
    if must_exist:
        raise ConfigError(f"--resume: no run {prefix}__* in {log.output_dir}/ to continue; give the run folder, "
                          f"or drop --resume to start a new run")
    name = f"{prefix}__{time.strftime('%Y%m%d-%H%M%S')}"
    return name, os.path.join(log.output_dir, name)


def check_run_name(name: str) -> None:
    """ConfigError (one line) for a log.run_name that is not one folder name: a separator, "..", or an absolute path
    would put the run (and its plots) outside log.output_dir and log.plots_dir."""
    if name in (".", "..") or "/" in name or "\\" in name or "\0" in name or os.path.isabs(name):
        raise ConfigError(f"log.run_name={name!r}: a run name is one folder name (no '/', '\\' or '..'); the run "
                          f"goes in log.output_dir/<run name>: set log.output_dir to choose where")


def _is_checkpoint_dir(path: str) -> bool:
    """Whether `path` names a checkpoint folder <run>/checkpoints/iter_<digits> (a run may be named iter_test)."""
    name = os.path.basename(path)
    return name.startswith("iter_") and name[5:].isdigit() and \
        os.path.basename(os.path.dirname(path)) == "checkpoints"


def run_order(name: str) -> Tuple[str, int]:
    """Sort key of run folder names: the timestamp, then the collision suffix (-2, -3, ...) as a number."""
    stem, _, suffix = name.rpartition("-")
    return (stem, int(suffix)) if suffix.isdigit() and len(suffix) < 4 else (name, 0)


def _run_of_checkpoint(path: str, given: str) -> str:
    """The run folder of `<run>/checkpoints/iter_XXXXXX`, which must be the run's newest complete checkpoint (a resume
    continues from there; an older or pruned one is refused, naming those that exist)."""
    from common.checkpoint import CheckpointError, iteration_dirs

    run_dir = os.path.dirname(os.path.dirname(path))
    try:
        existing = [os.path.basename(d) for d in iteration_dirs(run_dir)]
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    if not os.path.isdir(path):
        raise ConfigError(f"--resume {given}: that checkpoint does not exist (pruned?); {run_dir} has "
                          f"{', '.join(existing) or 'no checkpoints'}: resume with --resume {run_dir} (its newest)")
    newest = _newest(run_dir)
    if newest is None or os.path.realpath(newest) != os.path.realpath(path):
        raise ConfigError(f"--resume {given}: a run continues from its newest complete checkpoint "
                          f"({os.path.basename(newest) if newest else 'none'} of {', '.join(existing)}), not an "
                          f"earlier one: resume with --resume {run_dir}, or evaluate that checkpoint with evaluate.py")
    return run_dir


def _newest(run_dir: str) -> Optional[str]:
    """latest_checkpoint (sizes only); ConfigError (one line) for checkpoints that lead out of the run folder."""
    from common.checkpoint import CheckpointError, latest_checkpoint

    try:
        return latest_checkpoint(run_dir, check_hashes=False)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None


def check_writable(folder: str, what: str) -> None:
    """ConfigError unless a file can be created in `folder` (checked by writing and removing a probe file)."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_probe_"):
            pass
    except OSError as e:
        raise ConfigError(f"{what}: cannot write in {folder} ({e.strerror or e}); choose a writable folder") from None


def create_run_dir(log: Any, prefix: str, made: Optional[list] = None) -> Tuple[str, str]:
    """Create a new run's folder exclusively (os.mkdir, race-free across processes) and check that it and
    `<plots_dir>/<run_name>` are writable; returns (run_name, run_dir). A timestamped name taken by a run started in
    the same second gets a suffix (-2, -3, ...); an explicit `log.run_name` that exists is refused (--resume continues
    it). Every failure is a one-line ConfigError. `made` (a list) gets the folders this call created (a failed start
    removes only those: a plots folder that was there already is someone's)."""
    try:
        os.makedirs(log.output_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"log.output_dir={log.output_dir}: cannot create it ({e.strerror or e}); choose a writable "
                          f"folder") from None
    if log.run_name:
        check_run_name(log.run_name)
        names = [log.run_name]
    else:
        stamp = f"{prefix}__{time.strftime('%Y%m%d-%H%M%S')}"
        names = [stamp] + [f"{stamp}-{k}" for k in range(2, 1000)]
    for name in names:
        run_dir = os.path.join(log.output_dir, name)
        try:
            os.mkdir(run_dir)
        except FileExistsError:
            if log.run_name:
                raise ConfigError(f"log.run_name={log.run_name}: {run_dir} already exists; continue that run with "
                                  f"--resume {run_dir}, or choose another name (a new run never writes into an "
                                  f"existing folder)") from None
            continue
        except OSError as e:
            raise ConfigError(f"log.output_dir={log.output_dir}: cannot create the run folder {run_dir} "
                              f"({e.strerror or e}); choose a writable folder") from None
        break
    else:
        raise ConfigError(f"log.output_dir={log.output_dir}: 999 runs named {stamp}* exist; wait a second")
    check_writable(run_dir, f"log.output_dir={log.output_dir}")
    plots = os.path.join(log.plots_dir, name)
    made_plots = not os.path.lexists(plots)
    try:
        os.makedirs(plots, exist_ok=True)
    except OSError as e:
        os.rmdir(run_dir)
        raise ConfigError(f"log.plots_dir={log.plots_dir}: cannot create {plots} ({e.strerror or e}); choose a "
                          f"writable folder") from None
    try:
        check_writable(plots, f"log.plots_dir={log.plots_dir}")
    except ConfigError:
        os.rmdir(run_dir)
        if made_plots:
            remove_if_empty(plots)
        raise
    if made is not None:
        made += [run_dir] + ([plots] if made_plots else [])
    return name, run_dir


def remove_if_empty(*folders: str) -> None:
    """Remove the folders of a new run that a failed start left empty, so a bare --resume does not pick them."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:
            pass


_trust_run = False


def set_trust_run(trusted: bool) -> None:
    """--trust-run: resume an fsdp run folder not written on this machine (its shards' .metadata is unpickled)."""
    global _trust_run
    _trust_run = bool(trusted)


def trust_run() -> bool:
    return _trust_run


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class FolderLock:
    """An exclusive lock on the file `path` (flock), holding `{"pid", "host"}` of its holder. The kernel drops the
    lock of a dead holder, so a stale lock file is taken over; where the filesystem has no flock, a lock file of a
    dead pid on this host is taken over and any other is respected. `acquire(wait=False)` returns the holder's
    (pid, host) when it is held elsewhere, None once this process holds it."""

    def __init__(self, path: str):
        self.path, self.fd = path, None
        self.me = {"pid": os.getpid(), "host": socket.gethostname()}

    def holder(self) -> tuple:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with os.fdopen(fd) as f:
                info = json.loads(f.read(4096))
            return int(info["pid"]), str(info["host"])
        except (OSError, ValueError, KeyError, TypeError):
            return None, "?"

    def _open(self) -> int:
        """The lock file, opened (created) without following a link: a symbolic link or anything but a regular file
        at `path` is refused (ConfigError, one line), its target left untouched."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            if e.errno != errno.ELOOP:
                raise
            fd = None
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        if fd is not None:
            os.close(fd)
        raise ConfigError(f"{self.path} is a symbolic link or not a regular file: a lock must be a plain file (it is "
                          f"written to); remove {self.path} (what it points to is left untouched) and start again")

    def acquire(self, wait: bool = False) -> Optional[tuple]:
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    return self.holder()
                pid, host = self.holder()  # no flock here (ENOLCK): the pid and host in the file decide
                if pid is not None and pid != os.getpid() and (host != self.me["host"] or _alive(pid)):
                    if not wait:
                        return pid, host
                    time.sleep(1.0)
                    continue
                fd = self._open()
            try:  # the file we locked must still be the one at `path` (a releasing holder unlinks it)
                if os.fstat(fd).st_ino != os.lstat(self.path).st_ino:
                    os.close(fd)
                    continue
            except FileNotFoundError:
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(self.me).encode())
            os.fsync(fd)
            self.fd = fd
            return None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            if os.fstat(self.fd).st_ino == os.lstat(self.path).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)  # closing drops the flock
        self.fd = None


RUN_LOCK = "run.lock"


def lock_run_dir(run_dir: str, what: str) -> FolderLock:
    """Hold `<run_dir>/run.lock` for the run's life; ConfigError (one line naming the holder's pid and host) when
    another job holds it: the same run started or resumed twice would interleave both."""
    lock = FolderLock(os.path.join(run_dir, RUN_LOCK))
    try:
        held = lock.acquire()
    except OSError as e:
        raise ConfigError(f"{what}: cannot lock {lock.path} ({e.strerror or e}); choose a writable folder") from None
    if held is not None:
        pid, host = held
        raise ConfigError(f"{what}: {run_dir} is in use by pid {pid if pid is not None else '?'} on {host} (it holds "
                          f"{lock.path}); one job per run folder: wait for that job to end or stop it, then resume")
    return lock


def sibling_lock(path: str, purpose: str) -> FolderLock:
    """The lock serialising `purpose` ("export", "auto_sft") on the folder `path`: `.<name>.<purpose>.lock`
    beside it."""
    path = os.path.abspath(path.rstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return FolderLock(os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{purpose}.lock"))


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the system or filesystem cannot."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)


def replace_folder(tmp: str, dst: str) -> None:
    """Put the folder `tmp` at `dst`, replacing the folder there without a moment where `dst` is missing (an atomic
    exchange, then the old one removed); where the filesystem cannot exchange, the old folder is moved aside and the
    new one renamed in right after (a gap of one rename, never a delete before the rename)."""
    import shutil

    if not os.path.exists(dst):
        os.replace(tmp, dst)
        return
    if _exchange(tmp, dst):
        shutil.rmtree(tmp, ignore_errors=True)  # now the old folder
        return
    old = f"{dst.rstrip('/')}.old{os.getpid()}"
    os.replace(dst, old)
    os.replace(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)
