"""The shared run plumbing (common/run.py) as train_srpo.py uses it, CleanRL-style in subprocesses: a resumed run is
bitwise the uninterrupted one, keeps its config and refuses a changed hyper-parameter; Ctrl-C saves the last
completed iteration and a resume logs every iteration exactly once; two accelerate processes on CPU; the KL reference
is the policy RL started from; and every bad input stops with one line naming the fix."""
import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# updates that really change the weights: filter off (scratch policies fail every group), entropy bonus on
FAST = ["--task-id", "0", "init.mode=scratch", "env.num_envs=8", "env.max_steps=16", "rollout.n=4",
        "rollout.prompts_per_iteration=2", "rollout.train_trials=10", "eval.every=1", "eval.trials_per_task=2",
        "eval.samples_per_trial=2", "reward.encoder.num_frames=4", "--no-wandb", "algorithm.filter_accuracy=false",
        "algorithm.entropy_coeff=0.01", "log.checkpoint_every=1", "log.keep_checkpoints=10"]
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_SILENT="true", WANDB_MODE="offline")


def srpo(args, cwd=ROOT, check=True, script="train_srpo.py"):
    out = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, env=ENV, capture_output=True,
                         text=True, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def deterministic(row):
    """A metrics row without wall-clock figures."""
    return {k: v for k, v in row.items() if not k.startswith("time/") and k != "charts/SPS"}


def weights(run_dir, iteration):
    return load_file(os.path.join(run_dir, "checkpoints", f"iter_{iteration:06d}", "policy", "model.safetensors"))


def the_run(folder):
    (name,) = os.listdir(folder)
    return os.path.join(folder, name)


def test_resume_is_bitwise_the_uninterrupted_run_and_keeps_its_config(tmp_path):
    srpo([*FAST, "train.iterations=4", f"log.output_dir={tmp_path}/a", f"log.plots_dir={tmp_path}/plots"])
    srpo([*FAST, "train.iterations=2", f"log.output_dir={tmp_path}/b", f"log.plots_dir={tmp_path}/plots"])
    a, b = the_run(tmp_path / "a"), the_run(tmp_path / "b")
    with open(os.path.join(b, "config.yaml")) as f:
        saved = f.read()
    # only the run folder and the new length: every other key comes from b/config.yaml
    out = srpo(["--resume", b, "train.iterations=4"])
    assert "resumed at iteration 2" in out.stdout
    with open(os.path.join(b, "config.yaml")) as f:
        assert f.read() == saved  # never overwritten
    assert "n: 4" in saved and "entropy_coeff: 0.01" in saved and "filter_accuracy: false" in saved
    ra, rb = rows(a), rows(b)
    assert [r["iteration"] for r in rb] == [0, 1, 2, 3, 4]  # row 0: the start evaluated
    assert [deterministic(r) for r in ra] == [deterministic(r) for r in rb]
    wa, wb, w1 = weights(a, 4), weights(b, 4), weights(a, 1)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert sum(not torch.equal(wa[k], w1[k]) for k in wa) > 10  # the updates really moved the weights

    out = srpo(["--resume", b, "algorithm.entropy_coeff=0.1"], check=False)
    assert out.returncode != 0 and out.stderr.strip().count("\n") == 0
    assert "--resume: algorithm.entropy_coeff was 0.01 in the run and would become 0.1" in out.stderr
    with open(os.path.join(b, "config.yaml")) as f:
        assert f.read() == saved


def test_ctrl_c_saves_the_last_completed_iteration_and_resume_logs_each_once(tmp_path):
    args = [*FAST, "train.iterations=6", "log.checkpoint_every=100", f"log.output_dir={tmp_path}/runs",
            f"log.plots_dir={tmp_path}/plots"]
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "train_srpo.py"), *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    metrics = None
    while time.time() < deadline:  # interrupt as soon as iteration 2 is logged: somewhere inside iteration 3
        if os.path.isdir(tmp_path / "runs") and os.listdir(tmp_path / "runs"):
            metrics = os.path.join(the_run(tmp_path / "runs"), "metrics.jsonl")
            if os.path.isfile(metrics) and len(open(metrics).read().splitlines()) >= 3:  # rows 0, 1, 2
                break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    run_dir = the_run(tmp_path / "runs")
    before = rows(run_dir)
    done = before[-1]["iteration"]
    assert done >= 2 and [r["iteration"] for r in before] == list(range(0, done + 1))
    assert f"interrupted: iterations 1..{done} are saved" in stdout and f"--resume {run_dir}" in stdout, stdout[-600:]
    assert os.listdir(os.path.join(run_dir, "checkpoints")) == [f"iter_{done:06d}"]  # written though not due

    srpo(["--resume", run_dir])
    after = rows(run_dir)
    assert [r["iteration"] for r in after] == [0, 1, 2, 3, 4, 5, 6]  # each exactly once
    assert after[:done + 1] == before  # nothing before the interrupt lost or rewritten


def test_two_accelerate_processes_on_cpu(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29517",
           os.path.join(ROOT, "train_srpo.py"), *FAST, "train.iterations=2", f"log.output_dir={tmp_path}/runs",
           f"log.plots_dir={tmp_path}/plots"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert " x2 | tasks [0]" in out.stdout
    assert "policy weights identical on all 2 processes" in out.stdout
    run_dir = the_run(tmp_path / "runs")  # one run folder, one metrics file, written by the main process
    logged = rows(run_dir)
    assert [r["iteration"] for r in logged] == [0, 1, 2]
    # each process rolls out its own 2 prompts x 4 samples of at most 16 steps: both are counted
    assert all(r["rollout/env_steps"] == 2 * 2 * 4 * 16 for r in logged[1:])


def test_one_process_when_two_were_asked_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", os.path.join(ROOT, "train_srpo.py"), *FAST,
           "train.iterations=1", f"log.output_dir={tmp_path}/runs"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "accelerate launch asked for 2 processes but started 1" in out.stderr and "--multi_gpu" in out.stderr


@pytest.mark.parametrize("rl_rank", [4, 8])
def test_kl_reference_is_the_policy_rl_started_from(tmp_path, rl_rank):
    """An SFT checkpoint with trained LoRA (rank 4) and a trained action head: at RL's iteration 0 the policy, its
    reference (adapters off) and the SFT policy give the same log-probs, for an RL LoRA rank equal to the SFT's and
    different from it."""
    from common.config import load_config
    from common.run import initial_policy
    from models import TokenPolicy, TokenPolicyConfig
    from tests.test_models_token_policy import INSTR, make_obs
    from train_srpo import Config

    torch.manual_seed(0)
    sft = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, lora_rank=4))
    with torch.no_grad():  # as after SFT: LoRA B non-zero, head and projector moved away from the base copy
        for name, p in sft.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    sft.save(str(tmp_path / "sft"))
    cfg = load_config(Config, None, [f"init.path={tmp_path}/sft", f"policy.lora_rank={rl_rank}",
                                     "policy.lora_alpha=8"])
    run = SimpleNamespace(cfg=cfg, resume_path=None, is_main=True, device=torch.device("cpu"),
                          accelerator=SimpleNamespace(wait_for_everyone=lambda: None))
    policy = initial_policy(run, TokenPolicy).eval()
    assert policy.cfg.lora_rank == rl_rank and policy.cfg.lora_alpha == 8 and cfg.policy.lora_alpha == 8
    obs, instr = make_obs(4, 64), INSTR[:4]
    with torch.no_grad():
        _, tokens, _ = sft.eval().act(obs, instr, temperature=1.0)
        lp_sft = sft.log_prob(obs, instr, tokens)[0]
        lp = policy.log_prob(obs, instr, tokens)[0]
        with policy.reference():
            lp_ref = policy.log_prob(obs, instr, tokens)[0]
    torch.testing.assert_close(lp, lp_sft, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_ref, lp_sft, atol=1e-5, rtol=0)


def parse_error(argv):
    """parse_cli's one-line error (SystemExit) for a bad command line."""
    from common.config import parse_cli
    from train_srpo import Config

    with pytest.raises(SystemExit) as e:
        parse_cli(Config, "configs/srpo.yaml", argv=argv, script="srpo")
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def test_bad_command_lines_stop_with_one_line(tmp_path):
    assert "--resume" in parse_error(["--resume", str(tmp_path / "nope")]) and "no such run folder" in \
        parse_error(["--resume", str(tmp_path / "nope")])
    assert "give --task-id or --task-ids, not both" in parse_error(["--task-id", "0", "--task-ids", "1", "2"])
    assert "no run srpo__tabletop__t0__s1__*" in parse_error(["--resume", f"log.output_dir={tmp_path}/runs"])
    (tmp_path / "not_a_run").mkdir()
    assert "has no config.yaml" in parse_error(["--resume", str(tmp_path / "not_a_run")])


@pytest.mark.parametrize("override, message", [
    ("log.checkpoint_every=0", "log.checkpoint_every=0 and log.keep_checkpoints=2 must be >= 1"),
    ("rollout.temperature=0", "rollout.temperature=0.0: must be > 0"),
    ("env.num_envs=0", "env.num_envs=0: needs at least 1 environment"),
    ("rollout.prompts_per_iteration=0", "rollout.prompts_per_iteration=0: needs at least 1"),
    ("algorithm.clip_ratio=0.2", "unknown key 'algorithm.clip_ratio'"),  # never read: gone (low/high are the keys)
])
def test_bad_values_stop_before_any_work(override, message):
    from common.config import ConfigError, load_config
    from train_srpo import Config, check_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.").replace("*", r"\*")):
        check_config(load_config(Config, os.path.join(ROOT, "configs", "srpo.yaml"), [override]))


def test_unwritable_plots_warn_and_the_checkpoint_is_still_written(tmp_path):
    (tmp_path / "a_file").write_text("plots cannot go under a file")
    out = srpo([*FAST, "train.iterations=1", "eval.every=0", f"log.output_dir={tmp_path}/runs",
                f"log.plots_dir={tmp_path}/a_file/plots"])
    assert "could not write" in out.stderr and "training goes on" in out.stderr and "Traceback" not in out.stderr
    assert os.path.isdir(os.path.join(the_run(tmp_path / "runs"), "checkpoints", "iter_000001", "policy"))


def test_failed_checkpoint_write_leaves_no_temporary_folder(tmp_path, monkeypatch):
    import common.checkpoint as ck
    from models import TokenPolicy, TokenPolicyConfig

    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2))
    opt = torch.optim.AdamW(policy.parameters())
    ck.save_checkpoint(str(tmp_path), 1, policy, {"actor": opt})

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "_write_files", disk_full)
    with pytest.raises(ck.CheckpointError, match="No space left on device.*earlier checkpoints are intact"):
        ck.save_checkpoint(str(tmp_path), 2, policy, {"actor": opt})
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["iter_000001"]  # no .tmp_iter_* left behind


def test_runs_from_another_working_directory(tmp_path):
    """Shipped configs and sibling scripts resolve against the repository; output paths against the cwd."""
    out = srpo([*FAST, "train.iterations=1", "eval.every=0", "log.output_dir=runs", "log.plots_dir=plots"],
               cwd=str(tmp_path))
    assert "done" in out.stdout and os.path.isdir(tmp_path / "runs") and os.path.isdir(tmp_path / "plots")
    out = srpo([*FAST, "--config", "configs/srpo.yaml", "train.iterations=1", "eval.every=0",
                "log.output_dir=runs2"], cwd=str(tmp_path))
    assert os.path.isdir(tmp_path / "runs2")


@pytest.mark.parametrize("script", ["benchmarks/env_throughput.py", "benchmarks/rollout_overhead.py"])
def test_benchmarks_run_as_the_readme_writes_them(script):
    out = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=""),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr[-2000:]


def test_missing_sft_checkpoint_says_how_to_make_it(tmp_path):
    from common.config import ConfigError, load_config
    from common.run import initial_policy
    from models import TokenPolicy
    from train_srpo import Config

    cfg = load_config(Config, None, ["env.task_ids=[3]", f"init.path={tmp_path}/nope"])
    run = SimpleNamespace(cfg=cfg, resume_path=None, is_main=True, device=torch.device("cpu"))
    with pytest.raises(ConfigError) as e:
        initial_policy(run, TokenPolicy)
    msg = str(e.value)
    assert f"no SFT checkpoint at {tmp_path}/nope" in msg and "\n" not in msg
    assert "train_sft.py --task-ids 3 policy.type=token env.suite=tabletop env.image_size=64" in msg
    assert "init.mode=auto_sft" in msg


def test_minibatches_give_every_process_the_same_number_of_steps():
    from common.run import minibatches

    torch.manual_seed(0)
    shares = {0: 10, 1: 3}  # two processes with different kept counts
    fake_gather = lambda items: list(shares.values())  # noqa: E731
    steps = {r: [b.tolist() for b in minibatches(n, 4, 2, fake_gather)] for r, n in shares.items()}
    assert len(steps[0]) == len(steps[1]) == 2 * 3  # ceil(10 / 4) per epoch on both
    assert sorted(i for b in steps[0][:3] for i in b) == list(range(10))
    assert [len(b) for b in steps[1][:3]] == [3, 0, 0]  # the small share runs out: empty (zero-gradient) steps
    assert np.array_equal(sorted(i for b in steps[1][3:] for i in b), [0, 1, 2])
