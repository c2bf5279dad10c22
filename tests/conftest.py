"""Shared test set-up: repo root on sys.path, one torch thread, wandb silent and offline."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")

try:
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass
