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


# ---------------------------------------------------------------------------------------------------------------------
# the update structure of the references (issue 57): trajectory mini-batches, loss shares across micro-batches,
# dynamic-sampling refill, Adam betas
# ---------------------------------------------------------------------------------------------------------------------
def _steps(episode, mask, loss):
    """A PolicySteps of hand-made rows: each row's episode, (N, L) token mask and (N, L) per-token loss."""
    import numpy as np

    from common.rollout import PolicySteps

    n = len(episode)
    return PolicySteps(np.asarray(episode), np.zeros(n, np.int64), {}, [""] * n,
                       {"mask": np.asarray(mask, np.float32), "loss": np.asarray(loss, np.float32)})


def test_trajectory_minibatches_take_whole_episodes_and_every_process_as_many():
    """train.mini_batch_unit=trajectory: process 0 holds 4 episodes (rows 0-2, 3-4, 5-8, 9), process 1 one; 2
    episodes per mini-batch -> ceil(4 / 2) = 2 mini-batches per epoch on BOTH processes (the largest share decides);
    each mini-batch is whole episodes, their rows in step order; process 1's second one is empty (zero gradient)."""
    from common.train import minibatches

    torch.manual_seed(0)
    episodes = {0: [0, 0, 0, 1, 1, 2, 2, 2, 2, 3], 1: [7, 7, 7]}
    fake_gather = lambda items: [4, 1]  # noqa: E731  (episodes per process)
    got = {r: [b.tolist() for b in minibatches(len(e), 2, 2, fake_gather, episodes=e)] for r, e in episodes.items()}
    assert len(got[0]) == len(got[1]) == 2 * 2
    whole = {0: [0, 1, 2], 1: [3, 4], 2: [5, 6, 7, 8], 3: [9]}
    for epoch in (got[0][:2], got[0][2:]):
        assert sorted(i for b in epoch for i in b) == list(range(10))  # every row once per epoch
        for b in epoch:  # two whole episodes, each one's rows consecutive and in order
            parts = [whole[episodes[0][b[0]]]]
            parts.append(whole[episodes[0][b[len(parts[0])]]])
            assert b == parts[0] + parts[1]
    assert got[1] == [[0, 1, 2], [], [0, 1, 2], []]
    # the unit step is unchanged: rows, 4 per mini-batch, ceil(10 / 4) = 3 per epoch
    assert [len(b) for b in minibatches(10, 4, 1, lambda items: [10])] == [4, 4, 2]


def test_micro_batch_shares_make_token_mean_and_traj_token_mean_exact_across_micro_batches():
    """Rows (episode, mask, loss): r0 (0, [1 1], [1 2]), r1 (0, [1 0], [3 100]), r2 (1, [1 1], [4 6]), r3 (1, [1 1],
    [2 0]), r4 (2, [1 0], [10 7]); mini-batch in the order r0 r2 r1 r3 r4, micro-batches of 2 rows.
    token-mean of the whole mini-batch: (6 + 12 + 10) / 8 tokens = 3.5; the micro-batches' token means 13/4, 5/3, 10
    weighted by their tokens 4/8, 3/8, 1/8 sum to 3.5 (their plain mean, the old 1 / count, is 4.972).
    traj-token-mean: episodes' token means 6/3 = 2, 12/4 = 3, 10/1 = 10 -> (2 + 3 + 10) / 3 = 5, and each token
    weighted 1 / (its episode's tokens x 3 episodes) sums to 5 over the micro-batches, though episodes 0 and 1 are
    split across two of them."""
    from common.losses import agg_loss
    from common.train import micro_batches

    steps = _steps([0, 0, 1, 1, 2], [[1, 1], [1, 0], [1, 1], [1, 1], [1, 0]],
                   [[1, 2], [3, 100], [4, 6], [2, 0], [10, 7]])
    order = torch.tensor([0, 2, 1, 3, 4])

    def total(mode):
        micro = micro_batches(steps, order, 2, None, mode)
        out = 0.0
        for part, weight in micro:
            mask = part.tensor("mask")
            if mode == "traj-token-mean":
                mask = mask * part.tensor("traj_weight")[:, None]
            out += weight * agg_loss(part.tensor("loss"), mask, mode).item()
        return micro, out

    micro, value = total("token-mean")
    assert micro.shares == pytest.approx([4 / 8, 3 / 8, 1 / 8]) and value == pytest.approx(3.5)
    assert agg_loss(steps.tensor("loss"), steps.tensor("mask"), "token-mean").item() == pytest.approx(3.5)
    micro, value = total("traj-token-mean")
    assert micro.shares == [1.0, 1.0, 1.0] and value == pytest.approx(5.0)
    assert micro.parts[0].data["traj_weight"].tolist() == pytest.approx([1 / 9, 1 / 12])  # r0, r2
    assert micro.parts[2].data["traj_weight"].tolist() == pytest.approx([1 / 3])  # r4: 1 token, 3 episodes
    micro, value = total("seq-mean-token-mean")  # other modes: the mean over micro-batches, as before
    assert micro.shares == pytest.approx([1 / 3] * 3)
    micro = micro_batches(steps, order, 2, None, "row-mean")  # a mean over rows (FlowSAR, a value loss): 2/5 2/5 1/5
    assert micro.shares == pytest.approx([0.4, 0.4, 0.2]) and micro.rows == 5
    assert micro_batches(steps, order, 2, None).shares == [1.0, 1.0, 1.0]  # no mode: the caller divides
    # fsdp: a process with these 3 micro-batches and one whose share is 1 row pads to 3 with weight-0 rows that
    # carry a zero traj_weight (the key its traj-token-mean loss reads)
    from common.train import Padding

    pad = Padding(torch.nn.Linear(1, 1), steps.take([4]), lambda items: [3, 1])
    short = micro_batches(steps, torch.tensor([4]), 2, pad, "traj-token-mean")
    got = [(part.data["traj_weight"].tolist(), weight) for part, weight in short]
    assert got == [([1.0], 1.0), ([0.0], 0.0), ([0.0], 0.0)]  # its own row: 1 token, 1 episode


def test_refill_rounds_until_the_quota_or_the_cap_then_trims_the_surplus():
    """A fake two-process rollout, quota 2 groups per process (4 in all). Kept groups per round (process 0, 1):
    round 1 (1, 0), round 2 (0, 1), round 3 (2, 1) -> 1, 2, then 6 >= 4 after round 3: three rounds. The first 4 in the
    order (round, process): r1 p0 g0, r2 p1 g0, r3 p0 g0, r3 p0 g1; process 1's round-3 group is the surplus. With
    max_rounds 2 the loop stops after round 2 with 2 groups (the cap: train on what was kept); with refill off, one
    round."""
    import numpy as np

    from common.dynamic_sampling import refill_more, trim_to_quota

    kept_per_round = [(1, 0), (0, 1), (2, 1), (5, 5)]

    def simulate(max_rounds, refill=True):
        kept = {0: [], 1: []}  # the round of each kept group, per process
        rounds = 0
        while True:
            for p in (0, 1):
                kept[p] += [rounds] * kept_per_round[rounds][p]
            rounds += 1
            gather = lambda items: [len(kept[0]), len(kept[1])]  # noqa: E731  (each process's kept count)
            more = [refill_more(gather, len(kept[p]), 2, rounds, max_rounds, refill) for p in (0, 1)]
            assert more[0] == more[1]  # every process the same answer
            if not more[0]:
                return rounds, kept

    rounds, kept = simulate(max_rounds=10)
    assert rounds == 3 and kept == {0: [0, 2, 2], 1: [1, 2]}
    everyone = [(r, p, i) for p in (0, 1) for i, r in enumerate(kept[p])]
    calls = iter([everyone, [0, 0], everyone, [0, 0]])
    trained = {p: trim_to_quota(lambda items: next(calls), p, kept[p], 2) for p in (0, 1)}
    assert trained[0].tolist() == [True, True, True] and trained[1].tolist() == [True, False]
    assert sum(int(np.sum(t)) for t in trained.values()) == 4  # exactly the quota
    assert simulate(max_rounds=2)[0] == 2 and simulate(max_rounds=2)[1] == {0: [0], 1: [1]}
    assert simulate(max_rounds=10, refill=False)[0] == 1


def test_adam_betas_reach_torchs_optimizer_and_change_the_second_step():
    """train.adam_beta1 / adam_beta2 -> AdamW's betas. Hand values, lr 1, eps 1e-8, no decay, gradients 1 then 3 on a
    scalar at 0: step 1 moves by lr x sign = -1 whatever the betas; step 2 with betas (0.5, 0.75): m = 0.25 + 1.5 =
    1.75, v = 0.1875 + 2.25 = 2.4375, m^ = 1.75 / 0.75, v^ = 2.4375 / 0.4375 -> -1 - 2.3333 / 2.3604 = -1.98853;
    torch's defaults (0.9, 0.999): m^ = 0.39 / 0.19, v^ = 0.009999 / 0.001999 -> -1 - 2.05263 / 2.23652 = -1.91778."""
    from types import SimpleNamespace

    from common.train import adam_betas, adamw_with_warmup

    def two_steps(betas):
        w = torch.nn.Parameter(torch.zeros(1))
        opt, _ = adamw_with_warmup([w], lr=1.0, weight_decay=0.0, warmup_steps=0, betas=betas)
        for g in (1.0, 3.0):
            w.grad = torch.tensor([g])
            opt.step()
        return opt, w.item()

    opt, value = two_steps(adam_betas(SimpleNamespace(adam_beta1=0.5, adam_beta2=0.75)))
    assert opt.param_groups[0]["betas"] == (0.5, 0.75) and value == pytest.approx(-1.98853, abs=1e-5)
    assert two_steps((0.9, 0.999))[1] == pytest.approx(-1.91778, abs=1e-5)


def test_new_update_keys_have_defaults_help_and_ranges():
    """Every new key: its embedded default (today's behaviour), a one-line help in --help, a range."""
    from dataclasses import fields

    from common.config import ConfigError, check_ranges, field_comments

    import train_flowsar
    import train_gae_ppo
    import train_luffy
    import train_srpo

    for module in (train_srpo, train_gae_ppo, train_luffy, train_flowsar):
        cfg = module.Config()
        t = cfg.train
        unit = "trajectory" if module is train_srpo else "step"  # SRPO's embedded update: siiRL's (issue 56)
        assert (t.adam_beta1, t.adam_beta2, t.weight_decay, t.mini_batch_unit) == (0.9, 0.999, 0.0, unit)
        help_ = field_comments(type(t))
        assert all(help_[k] for k in ("adam_beta1", "adam_beta2", "weight_decay", "mini_batch_unit"))
    for module in (train_srpo, train_luffy):
        r = module.Config().rollout
        assert (r.refill, r.max_rounds) == (False, 10) and field_comments(type(r))["refill"]
    a = train_gae_ppo.Config().algorithm
    assert (a.ratio_unit, a.gae_unit, a.loss_agg_mode) == ("token", "step", "token-mean")
    for module in (train_srpo, train_gae_ppo, train_luffy, train_flowsar):  # each range beside its field
        ranges = {f.name: f.metadata["range"] for f in fields(module.Config().train) if "range" in f.metadata}
        assert ranges["adam_beta1"] == ranges["adam_beta2"] == "[0, 1)"
    for module in (train_srpo, train_luffy):
        assert {f.name: f.metadata.get("range") for f in fields(module.Config().rollout)}["max_rounds"] == "[1, 1000]"
    cfg = train_srpo.Config()
    cfg.train.adam_beta2 = 1.0
    with pytest.raises(ConfigError, match=r"train.adam_beta2=1.0: must be in \[0, 1\)"):
        check_ranges(cfg)
    cfg = train_gae_ppo.Config()
    cfg.algorithm.ratio_unit = "chunk"
    with pytest.raises(ConfigError, match="use gae_unit step or action and ratio_unit token or step"):
        train_gae_ppo.check_config(cfg)
    cfg = train_srpo.Config()
    cfg.train.mini_batch_unit = "episode"
    with pytest.raises(ConfigError, match="train.mini_batch_unit='episode': use step"):
        train_srpo.check_config(cfg)
