"""common/train.py, the plumbing the RL scripts share: the optimizer step over two real processes (gloo on CPU) takes
the MEAN of their gradients (a sum would double every step), clips and steps; the update statistics are read once."""
import os
import socket
import types

import pytest
import torch
import torch.multiprocessing as mp

from common.train import mean_stats


def _step_on_two_processes(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    from accelerate import Accelerator

    from common.train import optimizer_step

    run = types.SimpleNamespace(accelerator=Accelerator(cpu=True))
    weight = torch.nn.Parameter(torch.zeros(2))
    weight.grad = torch.full((2,), 1.0 + 2.0 * rank)  # process 0: [1, 1], process 1: [3, 3]
    optimizer = torch.optim.SGD([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    norm = optimizer_step(run, [weight], optimizer, scheduler, max_norm=100.0)
    results[rank] = (weight.grad.tolist(), float(norm), weight.detach().tolist())
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_optimizer_step_averages_gradients_over_processes():
    """Mean of [1, 1] and [3, 3] = [2, 2] (a sum gives [4, 4]); its norm sqrt(8) is not clipped at 100; SGD with lr 1
    moves both replicas from 0 to -2."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_step_on_two_processes, args=(port, results), nprocs=2, join=True)
        results = dict(results)
    for rank in (0, 1):
        grad, norm, weight = results[rank]
        assert grad == [2.0, 2.0] and norm == pytest.approx(8 ** 0.5) and weight == [-2.0, -2.0]


def test_mean_stats_reads_tensors_once_and_skips_empty_lists():
    stats = {"pg_loss": [torch.tensor(1.0), torch.tensor(2.0)], "grad_norm": [0.5, 1.5], "kl_loss": []}
    assert mean_stats(stats) == {"train/pg_loss": 1.5, "train/grad_norm": 1.0}


def test_adamw_off_cuda_is_torchs_cpu_default_bitwise():
    """common.train.adamw (every script's AdamW; fused on CUDA): off CUDA the single-tensor loop (foreach=False), torch's
    CPU default, so CPU runs are bitwise what they were with a plain AdamW."""
    from common.train import adamw

    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a = adamw(a.parameters(), 1e-2, 0.1)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1)
    assert opt_a.param_groups[0]["foreach"] is False and not opt_a.param_groups[0]["fused"]
    x = torch.randn(8, 4)
    for _ in range(3):
        for m, o in ((a, opt_a), (b, opt_b)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_a_decay_scales_the_step_it_belongs_to_and_the_warmup_goes_on():
    """optimizer_step's lr_scale: the step is taken at the warm-up's lr times the scale of its own iteration (the old
    schedule read a clock set at each iteration's start, so an iteration's first step used the previous factor);
    the scheduler then sets the next step's warm-up lr, unscaled."""
    from common.train import adamw_with_warmup, cosine_decay, optimizer_step

    run = types.SimpleNamespace(accelerator=types.SimpleNamespace(num_processes=1))
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer, scheduler = adamw_with_warmup([weight], lr=0.1, weight_decay=0.0, warmup_steps=2)
    weight.grad = torch.ones(1)
    optimizer_step(run, [weight], optimizer, scheduler, max_norm=10.0, lr_scale=cosine_decay(1, 2))  # 0.5
    assert float(weight) == pytest.approx(-0.1 * 0.5 * 0.5, rel=1e-6)  # AdamW's first step: lr * sign(g)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.1)  # warm-up step 2 of 2, no scale carried over
    assert cosine_decay(0, 4) == 1.0 and cosine_decay(2, 4) == pytest.approx(0.5)
