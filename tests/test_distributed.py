"""Multi-process plumbing: what every process shares (initial weights) and what it must not (sampling noise)."""
from types import SimpleNamespace

import torch

from common.run import initial_policy


def test_scratch_init_gives_every_process_the_same_weights_but_its_own_sampling_noise():
    def start(rank):
        cfg = SimpleNamespace(seed=3, init=SimpleNamespace(mode="scratch"), policy=SimpleNamespace(),
                              env=SimpleNamespace(image_size=8, action_chunk=2))
        run = SimpleNamespace(cfg=cfg, resume_path=None, device=torch.device("cpu"), rank=rank)
        torch.manual_seed(100 + rank)  # as Run seeds each process
        policy = initial_policy(run, lambda c: torch.nn.Linear(3, 4))
        return policy.weight.detach().clone(), torch.rand(5)

    (w0, noise0), (w1, noise1) = start(0), start(1)
    assert torch.equal(w0, w1)
    assert not torch.allclose(noise0, noise1)
    torch.manual_seed(3)  # process 0 draws what a one-process run draws: init from the seed, then the stream goes on
    torch.nn.Linear(3, 4)
    assert torch.equal(noise0, torch.rand(5))
