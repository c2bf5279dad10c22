"""Issue 72, locks: a run.lock, export lock or auto-SFT lock that is a symbolic link (or not a regular file) is
refused in one line and what it points to is left untouched (before: the target was truncated and overwritten with
{"pid", "host"}, a dangling link created it, and the link was then removed)."""
import os

import pytest

from common.config import ConfigError
from common.run_folder import FolderLock, lock_run_dir, sibling_lock


def assert_one_line_refusal(error, path):
    message = str(error.value)
    assert "\n" not in message and path in message and "symbolic link" in message


def test_a_symlinked_run_lock_is_refused_and_its_target_untouched(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("someone's data\n")
    os.symlink(target, run / "run.lock")
    with pytest.raises(ConfigError) as e:
        lock_run_dir(str(run), "--resume")
    assert_one_line_refusal(e, str(run / "run.lock"))
    assert target.read_text() == "someone's data\n"
    assert os.path.islink(run / "run.lock")  # left where it was, for its owner to look at


def test_a_dangling_symlinked_lock_creates_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(tmp_path / "created_elsewhere", run / "run.lock")
    with pytest.raises(ConfigError):
        lock_run_dir(str(run), "--resume")
    assert not (tmp_path / "created_elsewhere").exists()


def test_a_symlinked_export_lock_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    os.symlink(target, checkpoints / ".sft_tabletop_task0.export.lock")
    lock = sibling_lock(str(checkpoints / "sft_tabletop_task0"), "export")
    with pytest.raises(ConfigError) as e:
        lock.acquire(wait=True)
    assert_one_line_refusal(e, str(checkpoints / ".sft_tabletop_task0.export.lock"))
    assert target.read_text() == "keep me"


def test_an_auto_sft_lock_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    os.mkfifo(tmp_path / ".sft.auto_sft.lock")
    with pytest.raises(ConfigError, match="not a regular file"):
        sibling_lock(str(tmp_path / "sft"), "auto_sft").acquire()


def test_a_plain_lock_still_works(tmp_path):
    lock = FolderLock(str(tmp_path / "x.lock"))
    assert lock.acquire() is None and lock.holder()[0] == os.getpid()
    lock.release()
    assert not (tmp_path / "x.lock").exists()
