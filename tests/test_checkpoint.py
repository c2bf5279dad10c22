"""Checkpoint round trip (identical next loss after save -> load), pruning, and corrupt-checkpoint fallback."""
import os
import random
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from common.checkpoint import CheckpointError, latest_checkpoint, load_training_state, save_checkpoint, verify_checkpoint

torch.set_num_threads(1)


class TinyPolicy(torch.nn.Module):
    """A stand-in policy with the save(dir)/load(dir) interface of models/."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        save_file(self.state_dict(), os.path.join(path, "model.safetensors"))

    @classmethod
    def load(cls, path: str) -> "TinyPolicy":
        policy = cls()
        policy.load_state_dict(load_file(os.path.join(path, "model.safetensors")))
        return policy


def make(seed: int = 0):
    torch.manual_seed(seed)
    policy, head = TinyPolicy(), torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(list(policy.parameters()) + list(head.parameters()), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return policy, head, opt, sched


def train_step(policy, head, opt, sched) -> float:
    """One step whose batch and dropout mask come from the global RNGs (so RNG restore matters)."""
    x = torch.randn(8, 4) + float(np.random.randn()) + random.random()
    loss = (policy(x) - head(x)).pow(2).mean() + policy(x).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def test_round_trip_restores_identical_training_state(tmp_path):
    policy, head, opt, sched = make()
    for _ in range(3):
        train_step(policy, head, opt, sched)
    path = save_checkpoint(str(tmp_path), 3, policy, {"actor": opt}, {"actor": sched}, {"value_head": head},
                           extra={"best_success": 0.5})
    expected = [train_step(policy, head, opt, sched) for _ in range(2)]

    torch.manual_seed(123)
    np.random.seed(7)  # scramble RNGs; the checkpoint must restore them
    policy2 = TinyPolicy.load(os.path.join(path, "policy"))
    _, head2, opt2, sched2 = make(seed=99)
    opt2 = torch.optim.AdamW(list(policy2.parameters()) + list(head2.parameters()), lr=1e-2)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    iteration, extra = load_training_state(path, {"actor": opt2}, {"actor": sched2}, {"value_head": head2})
    assert iteration == 3 and extra == {"best_success": 0.5}
    assert sched2.last_epoch == 3
    got = [train_step(policy2, head2, opt2, sched2) for _ in range(2)]
    assert got == expected  # bit-identical: weights, AdamW moments, LR schedule and RNG streams all restored


def test_layout_and_pruning(tmp_path):
    policy, head, opt, sched = make()
    for it in (1, 2, 3):
        save_checkpoint(str(tmp_path), it, policy, {"actor": opt}, keep_last=2)
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["iter_000002", "iter_000003"]
    files = set(os.listdir(tmp_path / "checkpoints" / "iter_000003"))
    assert {"policy", "optimizers.pt", "rng.pt", "state.json", "MANIFEST.json"} <= files
    assert latest_checkpoint(str(tmp_path)).endswith("iter_000003")
    assert latest_checkpoint(str(tmp_path / "nothing_here")) is None


def test_truncated_checkpoint_falls_back_to_previous(tmp_path):
    policy, head, opt, sched = make()
    save_checkpoint(str(tmp_path), 1, policy, {"actor": opt})
    newest = save_checkpoint(str(tmp_path), 2, policy, {"actor": opt})
    weights = os.path.join(newest, "policy", "model.safetensors")
    with open(weights, "r+b") as f:
        f.truncate(os.path.getsize(weights) // 2)
    with pytest.raises(CheckpointError, match=r"iter_000002.*policy/model.safetensors is truncated"):
        verify_checkpoint(newest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = latest_checkpoint(str(tmp_path))
    assert chosen.endswith("iter_000001")
    assert any("iter_000002" in str(w.message) and "truncated" in str(w.message) for w in caught)


def test_bit_flip_and_missing_manifest_are_detected(tmp_path):
    policy, head, opt, sched = make()
    first = save_checkpoint(str(tmp_path), 1, policy, {"actor": opt}, keep_last=5)
    second = save_checkpoint(str(tmp_path), 2, policy, {"actor": opt}, keep_last=5)
    third = save_checkpoint(str(tmp_path), 3, policy, {"actor": opt}, keep_last=5)
    with open(os.path.join(third, "optimizers.pt"), "r+b") as f:  # same size, different bytes
        f.seek(10)
        byte = f.read(1)
        f.seek(10)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.remove(os.path.join(second, "MANIFEST.json"))  # as if the process died before finishing
    with pytest.warns(UserWarning) as record:
        assert latest_checkpoint(str(tmp_path)) == first
    messages = " ".join(str(w.message) for w in record)
    assert "sha256" in messages and "not completely written" in messages


def test_extra_must_be_json(tmp_path):
    policy, head, opt, sched = make()
    with pytest.raises(TypeError, match="JSON"):
        save_checkpoint(str(tmp_path), 1, policy, {"actor": opt}, extra={"x": torch.zeros(2)})


@pytest.mark.parametrize("where, error", [
    ("policy", lambda: __import__("safetensors").SafetensorError("Error while serializing: IoError(No space left)")),
    ("torch.save", lambda: RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos 64 vs 0")),
    ("fsync", lambda: OSError(28, "No space left on device")),
    ("policy", lambda: KeyboardInterrupt()),
    # an fsdp shards/ write on a full disk: DCP raises its CheckpointException, a BaseException (#47 probe
    # full_disk_fsdp_shards: it went past the cleanup as if it were an interrupt, a traceback on every process)
    ("shards", lambda: __import__("torch.distributed.checkpoint.api", fromlist=["x"]).CheckpointException(
        "CheckpointException ranks:dict_keys([0, 1])", {})),
])
def test_any_failed_write_removes_its_temporary_folder_and_keeps_the_earlier_checkpoint(tmp_path, monkeypatch, where,
                                                                                        error):
    import common.checkpoint as ck

    policy, head, opt, _ = make()
    first = save_checkpoint(str(tmp_path), 1, policy, {"actor": opt}, modules={"value": head})
    exc = error()

    def fail(*args, **kwargs):
        raise exc

    if where == "policy":
        monkeypatch.setattr(policy, "save", fail)
    elif where == "torch.save":
        monkeypatch.setattr(ck.torch, "save", fail)
    elif where == "fsync":
        monkeypatch.setattr(ck.os, "fsync", fail)
    shards = fail if where == "shards" else None
    if not isinstance(exc, KeyboardInterrupt):
        with pytest.raises(CheckpointError) as e:
            save_checkpoint(str(tmp_path), 2, policy, {"actor": opt}, modules={"value": head}, shards=shards)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith(f"could not write checkpoint {tmp_path}/checkpoints/iter_000002: "
                                                  f"{type(exc).__name__}: ")
        assert msg.endswith("(no partial checkpoint was left; earlier checkpoints are intact)")
    else:  # an interrupt in the middle of a write: cleaned up, then on its way
        with pytest.raises(KeyboardInterrupt):
            save_checkpoint(str(tmp_path), 2, policy, {"actor": opt}, modules={"value": head})
    monkeypatch.undo()
    assert os.listdir(tmp_path / "checkpoints") == ["iter_000001"]  # no .tmp_iter_* left
    verify_checkpoint(first)
    fresh = TinyPolicy.load(os.path.join(first, "policy"))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), policy.state_dict().values()))


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_weight_files_get_the_mode_of_normal_files(tmp_path, umask):
    """safetensors writes 0600; every file of a checkpoint and of a saved policy gets 0666 less the umask."""
    from models import TokenPolicy, TokenPolicyConfig

    old = os.umask(umask)
    try:
        policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2))
        policy.save(str(tmp_path / "policy"))
        path = save_checkpoint(str(tmp_path / "run"), 1, TinyPolicy(), {"a": torch.optim.AdamW(policy.parameters())},
                               modules={"value": torch.nn.Linear(2, 1)})
    finally:
        os.umask(old)
    files = [os.path.join(d, f) for root in (str(tmp_path / "policy"), path) for d, _, fs in os.walk(root) for f in fs]
    assert any(f.endswith("model.safetensors") for f in files) and any(f.endswith("value.safetensors") for f in files)
    assert {f: os.stat(f).st_mode & 0o777 for f in files} == {f: 0o666 & ~umask for f in files}
