"""Multi-process plumbing: what every process shares (initial weights) and what it must not (sampling noise)."""
import copy
from types import SimpleNamespace

import pytest
import torch

from common.policy_start import initial_policy


def test_scratch_init_gives_every_process_the_same_weights_but_its_own_sampling_noise():
    from models import TokenPolicy, TokenPolicyConfig

    def policy_cfg():
        return TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, image_size=64, action_chunk=2)

    def start(rank):
        cfg = SimpleNamespace(seed=3, init=SimpleNamespace(mode="scratch"), policy=policy_cfg(),
                              env=SimpleNamespace(image_size=64, action_chunk=2, wrist_camera=True, suite="tabletop"))
        run = SimpleNamespace(cfg=cfg, resume_path=None, device=torch.device("cpu"), rank=rank)
        torch.manual_seed(100 + rank)  # as Run seeds each process
        policy = initial_policy(run, "token")
        return torch.cat([p.detach().flatten() for p in policy.parameters()]), torch.rand(5)

    (w0, noise0), (w1, noise1) = start(0), start(1)
    assert torch.equal(w0, w1)
    assert not torch.allclose(noise0, noise1)
    torch.manual_seed(3)  # process 0 draws what a one-process run draws: init from the seed, then the stream goes on
    TokenPolicy(policy_cfg())
    assert torch.equal(noise0, torch.rand(5))


# ---- train.strategy over two real processes (gloo on CPU): ddp and fsdp each equal one process at the same batch

class Toy(torch.nn.Module):
    """A frozen input layer (as LoRA's base), two blocks in `layers` (sharded one by one under fsdp), a head whose
    rows do not split evenly over two processes and a one-element parameter (the second process holds none of it)."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(4, 6)
        self.inp.weight.requires_grad_(False)
        self.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
                                           for _ in range(2)])
        self.out = torch.nn.Linear(6, 3)
        self.scale = torch.nn.Parameter(torch.ones(1))

    def predict(self, x):  # not forward(): the scripts call policy methods, which must see gathered weights
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.out(h) * self.scale


X = torch.linspace(-1, 1, 8 * 4).reshape(8, 4)
Y = torch.linspace(1, -1, 8 * 3).reshape(8, 3)
# rows of each process per update: uneven, so processes run different numbers of micro-batches (of up to 4 rows);
# in the second update process 1 has none at all and adds zeros
SPLITS = [[range(0, 6), range(6, 8)], [range(0, 8), range(0, 0)]]


def _train(rank: int, world: int, strategy: str, offload: bool = False, stop_after: int = 2, resume=None,
           shards: str = ""):
    """Two AdamW updates (clipped) of Toy on the global batch X, Y split over `world` processes, through the scripts'
    update plumbing (sharded_update, micro_batches: under fsdp the short process runs zero-weight padding
    micro-batches); returns the gathered weights, the gradient norms and (after `stop_after` updates) what a
    checkpoint holds: under fsdp the shards of weights and optimizer state each process wrote into the folder
    `shards` (torch.distributed.checkpoint)."""
    from accelerate import Accelerator

    from common import fsdp
    from common.distributed import gather_objects
    from common.train import adamw_with_warmup, micro_batches, optimizer_step, sharded_update

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = Toy()
    if resume is not None:
        model.load_state_dict(resume["weights"])
    run = SimpleNamespace(accelerator=accelerator, device=torch.device("cpu"), world=world, rank=rank,
                          gather=lambda items: gather_objects(world, items),
                          cfg=SimpleNamespace(train=SimpleNamespace(strategy=strategy, fsdp_offload=offload)))
    model = fsdp.shard_policy(run, model)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = adamw_with_warmup(params, lr=0.05, weight_decay=0.1, warmup_steps=1)
    if resume is not None:
        if fsdp.is_sharded(model):
            fsdp.load_shards(model, {"actor": optimizer}, shards)
        else:
            optimizer.load_state_dict(resume["optimizers"]["actor"])
        scheduler.load_state_dict(resume["scheduler"])
    fsdp.register(model, [optimizer])
    norms, saved = [], None
    for update in range(0 if resume is None else stop_after, 2):
        rows = torch.tensor(list(SPLITS[update][rank]) if world > 1 else list(range(8)), dtype=torch.long)
        with sharded_update(run, model, rows) as pad:
            optimizer.zero_grad(set_to_none=True)
            for part, weight in micro_batches(rows, torch.arange(len(rows)), 4, pad):
                loss = ((model.predict(X[part]) - Y[part]) ** 2).sum() / (8 / world)  # a mean over the global batch
                (loss * weight).backward()
            norms.append(float(optimizer_step(run, params, optimizer, scheduler, max_norm=1.0, policy=model)))
        if update + 1 == stop_after and resume is None:
            with fsdp.plain_state_dicts(model):
                weights = {k: v.clone() for k, v in model.state_dict().items()}
            if fsdp.is_sharded(model):
                fsdp.save_shards(model, {"actor": optimizer}, shards)
            states = {} if fsdp.is_sharded(model) else {"actor": optimizer.state_dict()}
            fsdp.gather_weights(model)
            saved = copy.deepcopy({"weights": weights, "optimizers": states, "scheduler": scheduler.state_dict()})
    with fsdp.plain_state_dicts(model):
        final = {k: v.clone() for k, v in model.state_dict().items()}
    return final, norms, saved


def _on_two_processes(rank: int, port: int, strategy: str, offload: bool, zero3: bool, shards: str, results) -> None:
    import os

    from common import fsdp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
    if zero3:  # a reduce-scatter in every micro-batch's backward (as on GPUs) and layers freed after their forward
        fsdp.REDUCE_EVERY_MICRO_BATCH, fsdp.RESHARD_AFTER_FORWARD = True, True
    final, norms, saved = _train(rank, 2, strategy, offload, stop_after=1, shards=shards)
    shared = [saved]  # the weights as process 0 writes them into policy/ (fsdp: the optimizer state is in `shards`)
    torch.distributed.broadcast_object_list(shared, src=0)
    resumed, norms2, _ = _train(rank, 2, strategy, offload, stop_after=1, resume=shared[0], shards=shards)
    results[rank] = (final, norms, resumed, norms2)
    torch.distributed.destroy_process_group()


def _spawn(strategy: str, offload: bool = False, zero3: bool = False):
    import os
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as tmp:
        results = manager.dict()
        shards = os.path.join(tmp, "shards")
        mp.spawn(_on_two_processes, args=(port, strategy, offload, zero3, shards, results), nprocs=2, join=True)
        if strategy == "fsdp":  # one file per process, nothing gathered
            assert sorted(os.listdir(shards)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
        return dict(results)


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_ddp_and_fsdp_on_two_processes_equal_one_process_and_fsdp_resumes_exactly():
    import pytest

    torch.manual_seed(0)
    start = {k: v.clone() for k, v in Toy().state_dict().items()}
    one, one_norms, _ = _train(0, 1, "ddp")
    assert max((one[k] - start[k]).abs().max() for k in start) > 0.05  # the updates really move the weights
    assert one_norms[0] > 1.0  # and the first one is clipped
    finals = {}
    # fsdp: the CPU default (micro-batches accumulated unreduced, one reduce-scatter per mini-batch), with offload,
    # and ZeRO-3 (a reduce-scatter in every micro-batch's backward, as on GPUs; layers freed after their forward)
    for strategy, offload, zero3 in (("ddp", False, False), ("fsdp", False, False), ("fsdp", True, False),
                                     ("fsdp", False, True)):
        results = _spawn(strategy, offload, zero3)
        for rank in (0, 1):
            final, norms, resumed, norms2 = results[rank]
            assert norms == pytest.approx(one_norms, rel=1e-5), (strategy, offload, zero3)
            for k in one:
                torch.testing.assert_close(final[k], one[k], rtol=1e-5, atol=1e-6, msg=f"{strategy} {zero3} {k}")
                if strategy == "fsdp":  # restarted after update 1 from its checkpoint: the uninterrupted run
                    assert torch.equal(resumed[k], final[k]), (offload, zero3, k)
            if strategy == "fsdp":
                assert norms2 == norms[1:]
        finals[strategy, offload, zero3] = results[0][0]
    # process 1 ran one micro-batch and a zero-weight one in update 1, two borrowed zero-weight ones in update 2: on
    # CPU fsdp adds ddp's sums in ddp's order, so its weights are ddp's bitwise
    for k in one:
        for offload in (False, True):
            assert torch.equal(finals["fsdp", offload, False][k], finals["ddp", False, False][k]), (offload, k)


# ---- train_srpo.py with train.strategy=fsdp on two accelerate processes: as ddp, sharded checkpoints, resumable,
# evaluate.py reads them in one process

def _command(args, tmp_path, port, script="train_srpo.py", fast=None):
    import os
    import sys

    from tests.test_run_plumbing import FAST, ROOT

    fast = [*FAST, "train.iterations=2", "train.lr=1e-3"] if fast is None else fast
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",  # the shipped CPU launch file
            os.path.join(ROOT, "configs", "accelerate", "cpu_2proc.yaml"), "--main_process_port", str(port),
            os.path.join(ROOT, script), *fast, f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots",
            *args]


def _launch(args, tmp_path, port, script="train_srpo.py", fast=None):
    import subprocess

    from tests.test_run_plumbing import ENV, ROOT

    out = subprocess.run(_command(args, tmp_path, port, script, fast), cwd=ROOT, env=ENV, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, "\n".join(line for line in out.stderr.splitlines() if "ep/s" not in line)[-3000:]
    return out


def _policy_weights(run_dir, it):
    """The policy weights of checkpoint `it` of a run (what a one-process reader loads)."""
    import os

    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, "checkpoints", f"iter_{it:06d}", "policy", "model.safetensors"))


def _assert_rows_equal_but_grad_norm(ddp, fsdp_run):
    """Same metric rows, the gradient norm to rounding (fsdp sums sharded norms)."""
    import pytest

    from tests.test_run_plumbing import deterministic, rows

    for a, b in zip(rows(ddp), rows(fsdp_run), strict=True):
        a, b = deterministic(a), deterministic(b)
        assert a.keys() == b.keys() and a.pop("train/grad_norm", 0) == pytest.approx(b.pop("train/grad_norm", 0))
        assert a == b


def _resume_from_iteration_1(run_dir, tmp_path, port, *launch):
    """A copy of a 2-iteration run without iteration 2's checkpoint, resumed: (the copy, the launch's output)."""
    import os
    import shutil

    copy = tmp_path / "resumed" / "runs" / os.path.basename(run_dir)
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "iter_000002")
    return str(copy), _launch(["--resume", str(copy)], tmp_path / "resumed", port, *launch)


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_srpo_fsdp_on_two_processes_is_ddp_resumes_bitwise_after_an_interrupt_and_loads_in_one_process(
        tmp_path):
    import glob
    import json
    import os
    import signal
    import subprocess
    import time

    from common.checkpoint import load_saved_policy
    from tests.test_run_plumbing import ENV, ROOT, deterministic, rows, the_run

    _launch([], tmp_path / "ddp", 29561)
    out = _launch(["train.strategy=fsdp"], tmp_path / "fsdp", 29563)
    assert "policy weights identical on all 2 processes" in out.stdout
    ddp, fsdp_run = the_run(tmp_path / "ddp" / "runs"), the_run(tmp_path / "fsdp" / "runs")

    weights = _policy_weights

    last = os.path.join(fsdp_run, "checkpoints", "iter_000002")  # sharded: one file per process, nothing gathered
    assert sorted(os.listdir(os.path.join(last, "shards"))) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert torch.load(os.path.join(last, "optimizers.pt"), weights_only=True) == {}  # the actor's state is in shards/
    with open(os.path.join(last, "MANIFEST.json")) as f:
        assert {"shards/__0_0.distcp", "shards/__1_0.distcp", "shards/.metadata"} <= set(json.load(f)["files"])
    assert not [n for n in os.listdir(os.path.dirname(last)) if n.startswith(".tmp")]
    final = weights(fsdp_run, 2)
    moved = max(float((final[k] - weights(fsdp_run, 1)[k]).abs().max()) for k in final)
    assert moved > 1e-5  # the second update really moved the weights (float32 steps there are ~1e-8)
    for k, v in weights(ddp, 2).items():  # no clipping in these updates: the same sums in the same order
        assert torch.equal(final[k], v), k
    _assert_rows_equal_but_grad_norm(ddp, fsdp_run)

    # interrupted after iteration 1 (its checkpoint kept, iteration 2's gone): the resume is the uninterrupted run
    copy, _ = _resume_from_iteration_1(fsdp_run, tmp_path, 29565)
    for k, v in weights(copy, 2).items():
        assert torch.equal(final[k], v), k
    assert [deterministic(r) for r in rows(copy)] == [deterministic(r) for r in rows(fsdp_run)]

    # Ctrl-C in the terminal (SIGINT to the launcher and both processes) right after iteration 1 is logged, with no
    # checkpoint due: both processes stop together, iteration 1 is saved, and the resume is the uninterrupted run
    stopped = tmp_path / "stopped"
    proc = subprocess.Popen(_command(["train.strategy=fsdp", "log.checkpoint_every=100"], stopped, 29567), cwd=ROOT,
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        metrics = glob.glob(str(stopped / "runs" / "*" / "metrics.jsonl"))
        if metrics and len(open(metrics[0]).read().splitlines()) >= 2:  # rows 0 and 1
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    interrupted = the_run(stopped / "runs")
    saved = sorted(os.listdir(os.path.join(interrupted, "checkpoints")))
    assert saved == ["iter_000001"], (saved, stderr[-3000:])  # written though not due; nothing of iteration 2
    assert [r["iteration"] for r in rows(interrupted)] == [0, 1]
    said = f"interrupted: iterations 1..1 are saved in {interrupted}/checkpoints; continue with: accelerate launch " \
           f"--multi_gpu --num_processes 2 "  # the launcher itself exits 1 with torch's SignalException traceback
    assert said in stdout and f"train_srpo.py --resume {interrupted}" in stdout, stdout[-2000:]
    assert "Traceback" not in "".join(line for line in stderr.splitlines() if "[rank" in line)  # none from ours
    _launch(["--resume", interrupted], stopped, 29569)
    for k, v in weights(interrupted, 2).items():
        assert torch.equal(final[k], v), k
    assert [deterministic(r) for r in rows(interrupted)] == [deterministic(r) for r in rows(fsdp_run)]

    policy = load_saved_policy(fsdp_run)  # one process, the consolidated policy/ of the newest checkpoint
    for k, v in policy.net.state_dict().items():
        assert torch.equal(v, final[k]), k

    assert _evaluated(fsdp_run, tmp_path / "eval_fsdp") == _evaluated(ddp, tmp_path / "eval_ddp")


# ---- train_flowsar.py with train.strategy=fsdp: its EMA reference theta_old lives as shards (swapped in shard by
# shard for the self-annotation, saved in shards/), and the run is the ddp run

def _evaluated(run_dir, out_dir):
    """evaluate.py in one process on the run's newest checkpoint: its results without wall-clock figures."""
    import json
    import os
    import subprocess
    import sys

    from tests.test_run_plumbing import ENV, ROOT

    out = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint", run_dir, "--trials", "3",
                          "--max-steps", "16", "--sampled", "--gifs", "0", "--out-dir", str(out_dir)], cwd=ROOT,
                         env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(out_dir, "results.json")) as f:
        results = json.load(f)
    assert results["iteration"] == 2
    return {k: v for k, v in results.items() if k not in ("checkpoint", "seconds", "files")}


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_flowsar_fsdp_on_two_processes_is_ddp_with_a_sharded_ema_resumes_bitwise_and_loads_in_one_process(
        tmp_path):
    import os

    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from tests.test_run_plumbing import deterministic, rows, the_run
    from tests.test_train_flowsar import FAST

    # lr 3e-3 and the fixed EMA (beta 0.995): in iteration 2 theta_old is far from theta, so a reference pass on
    # the wrong weights changes its metrics. No clipping: the gradient norm sums sharded norms (equal to rounding),
    # so the updates are the same sums in the same order
    fast = [*FAST, "--task-id", "0", "train.iterations=2", "train.lr=3e-3", "train.grad_clip=1e6", "eval.every=1",
            "eval.trials_per_task=2", "log.checkpoint_every=1", "log.keep_checkpoints=10"]
    _launch([], tmp_path / "ddp", 29571, "train_flowsar.py", fast)
    out = _launch(["train.strategy=fsdp"], tmp_path / "fsdp", 29573, "train_flowsar.py", fast)
    assert "policy weights identical on all 2 processes" in out.stdout  # the EMA shards are no replicas
    ddp, fsdp_run = the_run(tmp_path / "ddp" / "runs"), the_run(tmp_path / "fsdp" / "runs")

    def checkpoint(run_dir, it):
        return os.path.join(run_dir, "checkpoints", f"iter_{it:06d}")

    weights = _policy_weights

    def sharded_ema(run_dir, it, name):  # theta_old from the shards every process wrote, read in one process
        target = str(tmp_path / f"{name}_{it}.pt")
        dcp_to_torch_save(os.path.join(checkpoint(run_dir, it), "shards"), target)
        return torch.load(target, weights_only=True)["modules"]["ema"]

    last = checkpoint(fsdp_run, 2)
    assert sorted(os.listdir(os.path.join(last, "shards"))) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not os.path.exists(os.path.join(last, "modules"))  # theta_old is in shards/, not gathered anywhere
    final = weights(fsdp_run, 2)
    assert max(float((final[k] - weights(fsdp_run, 1)[k]).abs().max()) for k in final) > 1e-3  # the weights move
    for it in (1, 2):
        for k, v in weights(ddp, it).items():
            assert torch.equal(weights(fsdp_run, it)[k], v), (it, k)
        ema = load_file(os.path.join(checkpoint(ddp, it), "modules", "ema.safetensors"))
        shards = sharded_ema(fsdp_run, it, "fsdp")
        assert shards.keys() == ema.keys() and len(ema) > 10
        for k, v in ema.items():
            assert torch.equal(shards[k], v), (it, k)
    policy = weights(ddp, 2)  # theta_old (keys net__a__b for a.b) is not theta
    assert max(float((v - policy[k[len("net__"):].replace("__", ".")]).abs().max()) for k, v in ema.items()) > 1e-3
    _assert_rows_equal_but_grad_norm(ddp, fsdp_run)

    # resumed after iteration 1 (iteration 2's checkpoint gone): bitwise the uninterrupted run, theta_old included
    copy, out = _resume_from_iteration_1(fsdp_run, tmp_path, 29575, "train_flowsar.py", [])
    assert "resumed at iteration 1" in out.stdout
    for k, v in weights(copy, 2).items():
        assert torch.equal(final[k], v), k
    resumed_ema, ema = sharded_ema(copy, 2, "resumed"), sharded_ema(fsdp_run, 2, "fsdp")
    assert all(torch.equal(resumed_ema[k], ema[k]) for k in ema)
    assert [deterministic(r) for r in rows(copy)] == [deterministic(r) for r in rows(fsdp_run)]

    assert _evaluated(fsdp_run, tmp_path / "eval_fsdp") == _evaluated(ddp, tmp_path / "eval_ddp")


def test_shipped_accelerate_launch_files_load():
    import os

    from accelerate.commands.config.config_args import load_config_from_file

    from tests.test_run_plumbing import ROOT

    expected = {"1gpu.yaml": 1, "8gpu.yaml": 8, "8gpu_fsdp.yaml": 8, "2nodes_8gpu.yaml": 16, "cpu_2proc.yaml": 2}
    folder = os.path.join(ROOT, "configs", "accelerate")
    assert sorted(os.listdir(folder)) == sorted(expected)
    for name, processes in expected.items():
        cfg = load_config_from_file(os.path.join(folder, name))
        assert cfg.num_processes == processes and cfg.mixed_precision == "no", name
        assert (cfg.distributed_type == "NO") == (processes == 1), name


# ---- save_checkpoint with shards written by every process: one atomic checkpoint, or the same error on all

def _save_on_two_processes(rank: int, port: int, run_dir: str, results) -> None:
    import os

    from common.checkpoint import CheckpointError, save_checkpoint
    from tests.test_checkpoint import make

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)

    def gather(items):
        out = [None, None]
        torch.distributed.all_gather_object(out, list(items))
        return [x for part in out for x in part]

    policy, _, opt, _ = make()

    def shards(fail_on=None):
        def write(folder):
            os.makedirs(folder, exist_ok=True)
            if rank == fail_on:
                raise OSError(28, "No space left on device")
            torch.save({"rank": rank}, os.path.join(folder, f"rank{rank}.pt"))
        return write

    def quota_exceeded(path):
        raise RuntimeError("disk quota exceeded")

    outcome = []
    for iteration, fail_on, policy_fails in ((1, None, False), (2, 1, False), (3, None, True)):
        if policy_fails and rank == 0:
            policy.save = quota_exceeded
        try:
            save_checkpoint(run_dir, iteration, policy, {}, rank=rank, gather=gather, shards=shards(fail_on),
                            rng_states=[{}, {}])
            outcome.append("saved")
        except CheckpointError as e:
            outcome.append(str(e))
    results[rank] = outcome
    torch.distributed.destroy_process_group()


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_sharded_save_is_one_atomic_checkpoint_and_a_failure_on_any_process_is_one_line_on_every_one(tmp_path):
    import os
    import socket

    import torch.multiprocessing as mp

    from common.checkpoint import verify_checkpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_save_on_two_processes, args=(port, str(tmp_path), results), nprocs=2, join=True)
        results = dict(results)
    assert results[0] == results[1]  # every process saw the same outcome
    saved, disk_full, policy_failed = results[0]
    assert saved == "saved"
    tail = "(no partial checkpoint was left; earlier checkpoints are intact)"
    assert disk_full == f"could not write checkpoint {tmp_path}/checkpoints/iter_000002: OSError: No space left on " \
                        f"device {tail}"  # raised on process 1 only
    assert policy_failed == f"could not write checkpoint {tmp_path}/checkpoints/iter_000003: RuntimeError: disk " \
                            f"quota exceeded {tail}"  # raised on process 0 only
    assert os.listdir(tmp_path / "checkpoints") == ["iter_000001"]  # no .tmp_iter_* left
    first = tmp_path / "checkpoints" / "iter_000001"
    verify_checkpoint(str(first))  # the manifest covers both processes' shards
    with open(first / "MANIFEST.json") as f:
        assert {"shards/rank0.pt", "shards/rank1.pt"} <= set(__import__("json").load(f)["files"])


# ---- train_sft.py with train.strategy=ddp|fsdp on two accelerate processes: each process runs its half of the same
# batch, the gradients are averaged by the RL scripts' optimizer_step, so both equal one process at the same batch

SFT_FAST = ["--task-id", "0", "--no-wandb", "policy.token.hidden_size=32", "policy.token.num_layers=1",
            "policy.token.num_heads=2", "sft.num_demos=2", "sft.batch_size=8", "sft.eval_every=0", "sft.eval_trials=1",
            "env.max_steps=4", "env.num_envs=1", "sft.augment_shift=2"]


def _sft_args(tmp_path, *args):
    return [*SFT_FAST, f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots",
            f"sft.output_path={tmp_path}/exported", *args]


def _sft_rows(run_dir):
    """metrics.jsonl of an SFT run without wall-clock figures."""
    from tests.test_run_plumbing import rows

    return [{k: v for k, v in r.items() if not k.startswith(("charts/", "time/"))} for r in rows(run_dir)]


def _assert_adam_steps_match(got, expected, lr, steps, what):
    """Weights after `steps` AdamW steps on two processes vs one. The two-process mean of half-batch gradients rounds
    differently from the one-process gradient (by CPU: AVX-512 and AVX2 differ), and AdamW's first steps move every
    weight by about lr * g / |g|: where a gradient is ~0 its rounding can flip the direction of that weight's step.
    So: nearly every weight equal to 1e-5, none further apart than those flips allow (2 lr per step). A sum taken for
    the mean would still match here (AdamW normalises it): the logged gradient norms (rel 1e-5) catch that."""
    total = far = 0
    for k, v in expected.items():
        diff = (got[k].float() - v.float()).abs()
        assert float(diff.max()) <= 2 * lr * steps + 1e-6, f"{what} {k}: {float(diff.max())}"
        far += int((diff > 1e-5 + 1e-5 * v.float().abs()).sum())
        total += v.numel()
    assert far <= 1e-3 * total, f"{what}: {far} of {total} weights differ by more than 1e-5"


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_sft_ddp_and_fsdp_on_two_processes_equal_one_process_and_the_fsdp_policy_evaluates_in_one_process(
        tmp_path):
    import json
    import os
    import subprocess
    import sys

    import pytest
    from safetensors.torch import load_file

    from tests.test_run_plumbing import ENV, ROOT, the_run

    # two steps of lr 0.01 (no warm-up), clipped at 1 (the gradient norm is ~6): a sum taken for the mean would
    # double the logged gradient norm (the update itself hardly changes: AdamW and the clip normalise the scale)
    steps = ["sft.steps=2", "sft.log_every=1", "sft.lr=0.01", "sft.warmup_steps=0", "sft.eval_every=1"]
    one = subprocess.run([sys.executable, os.path.join(ROOT, "train_sft.py"), *_sft_args(tmp_path / "one", *steps)],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-3000:]
    expected = load_file(str(tmp_path / "one" / "exported" / "model.safetensors"))
    first = _policy_weights(the_run(tmp_path / "one" / "runs"), 1)
    assert max(float((expected[k] - v).abs().max()) for k, v in first.items()) > 1e-3  # step 2 moves the weights
    expected_rows = _sft_rows(the_run(tmp_path / "one" / "runs"))
    assert [r["iteration"] for r in expected_rows] == [1, 2] and expected_rows[0]["train/grad_norm"] > 2
    for port, strategy in ((29581, "ddp"), (29583, "fsdp")):
        out = _launch(_sft_args(tmp_path / strategy, "train.strategy=" + strategy, *steps), tmp_path / strategy, port,
                      "train_sft.py", [])
        assert f"2 processes, train.strategy={strategy}" in out.stdout
        run_dir = the_run(tmp_path / strategy / "runs")
        got = load_file(str(tmp_path / strategy / "exported" / "model.safetensors"))
        assert got.keys() == expected.keys()
        _assert_adam_steps_match(got, expected, lr=0.01, steps=2, what=strategy)
        _assert_adam_steps_match(_policy_weights(run_dir, 1), first, lr=0.01, steps=1, what=strategy)
        for a, b in zip(_sft_rows(run_dir), expected_rows, strict=True):
            assert a.keys() == b.keys() and a == pytest.approx(b, rel=1e-5), strategy
        last = os.path.join(run_dir, "checkpoints", "iter_000002")
        shards = os.path.join(last, "shards")
        if strategy == "fsdp":  # one file per process, the AdamW state only there
            assert sorted(os.listdir(shards)) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
            assert torch.load(os.path.join(last, "optimizers.pt"), weights_only=True) == {}
        else:
            assert not os.path.exists(shards)
        assert len(torch.load(os.path.join(last, "rng.pt"), weights_only=True)) == 2  # every process's streams

    # the exported fsdp policy in one process: evaluate.py reads it (the gathered weights, as written by process 0)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--checkpoint",
                          str(tmp_path / "fsdp" / "exported"), "--trials", "1", "--max-steps", "4", "--gifs", "0",
                          "--out-dir", str(tmp_path / "eval")], cwd=ROOT, env=ENV, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(tmp_path / "eval" / "results.json") as f:
        results = json.load(f)
    assert results["trials"] == 1, results  # the SFT run's own held-out trial (sft.eval_trials=1: trial 49)


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_sft_fsdp_interrupted_on_two_processes_stops_together_and_resumes_bitwise(tmp_path):
    import glob
    import os
    import signal
    import subprocess
    import time

    from safetensors.torch import load_file

    from tests.test_run_plumbing import ENV, ROOT, the_run

    steps = ["train.strategy=fsdp", "sft.steps=60", "sft.log_every=5"]
    _launch(_sft_args(tmp_path / "full", *steps), tmp_path / "full", 29585, "train_sft.py", [])

    # Ctrl-C in the terminal (SIGINT to the launcher and both processes) once steps 5 and 10 are logged: each process
    # only notes it, and all stop after the same step, which every process saves (its shards, its RNG streams)
    cut = tmp_path / "cut"
    proc = subprocess.Popen(_command(_sft_args(cut, *steps), cut, 29587, "train_sft.py", []), cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        metrics = glob.glob(str(cut / "runs" / "*" / "metrics.jsonl"))
        if metrics and len(open(metrics[0]).read().splitlines()) >= 2:
            break
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    run_dir = the_run(cut / "runs")
    (saved,) = os.listdir(os.path.join(run_dir, "checkpoints"))
    block = int(saved[len("iter_"):])  # an iteration is a block of sft.log_every=5 steps
    step = 5 * block
    assert 10 <= step < 60, stderr[-3000:]
    checkpoint = os.path.join(run_dir, "checkpoints", saved)
    assert sorted(os.listdir(os.path.join(checkpoint, "shards"))) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert len(torch.load(os.path.join(checkpoint, "rng.pt"), weights_only=True)) == 2
    said = f"[train_sft] interrupted: steps 1..{step} are saved in {run_dir}/checkpoints; continue with: accelerate " \
           f"launch --multi_gpu --num_processes 2 "
    assert said in stdout and f"train_sft.py --resume {run_dir}" in stdout, stdout[-2000:]
    assert "Traceback" not in "".join(line for line in stderr.splitlines() if "[rank" in line)  # none from ours
    assert not os.path.exists(cut / "exported")  # nothing exported from a cut-short run

    out = _launch(["--resume", run_dir], cut, 29589, "train_sft.py", [])
    assert f"resumed at step {step}" in out.stdout
    full, resumed = load_file(str(tmp_path / "full" / "exported" / "model.safetensors")), \
        load_file(str(cut / "exported" / "model.safetensors"))
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    rows, expected = _sft_rows(run_dir), _sft_rows(the_run(tmp_path / "full" / "runs"))
    assert [r["iteration"] for r in rows] == list(range(1, 13))  # each logged block of 5 steps once
    assert [r for r in rows if 5 * r["iteration"] <= step] == [r for r in expected if 5 * r["iteration"] <= step]


@pytest.mark.slow  # two processes: the full tier (python test_all.py --all)
def test_srpo_fsdp_signal_during_the_update_of_one_process_finishes_and_saves_that_iteration_then_resumes_bitwise(
        tmp_path):
    """A SIGINT that lands inside iteration 2's update on process 0 only (tests/fixtures/signal_in_update.py): the
    update is not cut, both processes finish iteration 2 and save it (not due: log.checkpoint_every=100), exit 130
    with the resume command, and the resume is the uninterrupted 3-iteration run bitwise."""
    import os
    import subprocess

    from tests.test_run_plumbing import ENV, FAST, ROOT, deterministic, rows, the_run

    fast = [*FAST, "train.iterations=3", "train.lr=1e-3", "train.strategy=fsdp"]
    _launch([], tmp_path / "full", 29593, fast=fast)
    full = the_run(tmp_path / "full" / "runs")

    cut = tmp_path / "cut"
    out = subprocess.run(_command(["log.checkpoint_every=100"], cut, 29595, "tests/fixtures/signal_in_update.py",
                                  ["train_srpo.py", *fast]), cwd=ROOT, env=dict(ENV, SIGNAL_ITERATION="2"),
                         capture_output=True, text=True, timeout=600)
    run_dir = the_run(cut / "runs")
    assert "[test] SIGINT sent to process 0 in iteration 2's update" in out.stdout, out.stderr[-3000:]
    assert os.listdir(os.path.join(run_dir, "checkpoints")) == ["iter_000002"], out.stderr[-3000:]
    assert f"interrupted: iterations 1..2 are saved in {run_dir}/checkpoints; continue with: accelerate launch " \
           f"--multi_gpu --num_processes 2 " in out.stdout, out.stdout[-2000:]
    assert "exitcode  : 130" in out.stderr  # torch's launcher reports each process's exit code
    assert "Traceback" not in "".join(line for line in out.stderr.splitlines() if "[rank" in line)
    assert [r["iteration"] for r in rows(run_dir)] == [0, 1, 2]
    _launch(["--resume", run_dir], cut, 29597, fast=[])
    for k, v in _policy_weights(full, 3).items():
        assert torch.equal(_policy_weights(run_dir, 3)[k], v), k
    assert [deterministic(r) for r in rows(run_dir)] == [deterministic(r) for r in rows(full)]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_fsdp_checkpoints_an_iteration_without_an_update_and_resumes_from_it(tmp_path, processes):
    """#47: dynamic sampling from a scratch policy (every group fails) leaves iteration 1 without an optimizer step;
    fsdp's checkpoint of it (an AdamW without state: torch's get_optimizer_state_dict raised KeyError: 0) is written
    with the optimizer marked fresh, and --resume goes on from it to iteration 2."""
    import json
    import os
    import subprocess
    import sys

    from tests.test_run_plumbing import ENV, FAST, ROOT, rows, the_run

    args = [*FAST, "algorithm.filter_accuracy=true", "train.strategy=fsdp", "train.iterations=1", "eval.every=0"]
    if processes == 1:
        def launch(extra):
            out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), *extra], cwd=ROOT, env=ENV,
                                 capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, out.stderr[-3000:]
    else:
        def launch(extra):
            _launch(extra, tmp_path, 29591, fast=[])
    launch([*args, f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"])
    run_dir = the_run(tmp_path / "runs")
    first = os.path.join(run_dir, "checkpoints", "iter_000001")
    assert rows(run_dir)[-1]["train/skipped_update"] == 1.0
    with open(os.path.join(first, "shards", "fresh_optimizers.json")) as f:
        assert json.load(f) == ["actor"]
    launch(["--resume", run_dir, "train.iterations=2"])
    assert [r["iteration"] for r in rows(run_dir)] == [1, 2]
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", "iter_000002"))
