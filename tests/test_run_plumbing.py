"""The shared run plumbing (common/run.py) as train_srpo.py uses it, CleanRL-style in subprocesses: a resumed run is
bitwise the uninterrupted one, keeps its config and refuses a changed hyper-parameter; Ctrl-C saves the last
completed iteration and a resume logs every iteration exactly once; two accelerate processes on CPU; the KL reference
is the policy RL started from; and every bad input stops with one line naming the fix."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
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


@pytest.mark.parametrize("pipeline", ["false", "true"])  # true: streamed episodes, per-episode generators
def test_resume_is_bitwise_the_uninterrupted_run_and_keeps_its_config(tmp_path, pipeline):
    # a constant step: a cosine step decays over train.iterations, so extending a run changes its later steps
    fast = [*FAST, f"env.pipeline={pipeline}", "train.lr_schedule=constant"]
    srpo([*fast, "train.iterations=4", f"log.output_dir={tmp_path}/a", f"log.plots_dir={tmp_path}/plots"])
    srpo([*fast, "train.iterations=2", f"log.output_dir={tmp_path}/b", f"log.plots_dir={tmp_path}/plots"])
    a, b = the_run(tmp_path / "a"), the_run(tmp_path / "b")
    with open(os.path.join(b, "config.yaml")) as f:
        saved = f.read()
    # only the run folder and the new length: every other key comes from b/config.yaml
    out = srpo(["--resume", b, "train.iterations=4"])
    assert "resumed at iteration 2" in out.stdout and "note: train.lr_schedule=cosine" not in out.stdout
    with open(os.path.join(b, "config.yaml")) as f:
        assert f.read() == saved  # never overwritten
    # which code made the run: one provenance entry per start and resume (common/provenance.py)
    assert [e["from_iteration"] for e in json.load(open(os.path.join(b, "provenance.json")))] == [0, 2]
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_one_process_when_two_were_asked_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", os.path.join(ROOT, "train_srpo.py"), *FAST,
           "train.iterations=1", f"log.output_dir={tmp_path}/runs"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "accelerate launch asked for several processes but started 1" in out.stderr and "--multi_gpu" in out.stderr
    assert "--config_file configs/accelerate/cpu_2proc.yaml" in out.stderr
    assert "had defaults used instead" not in out.stderr  # the flags the README's command passes silence it


def test_the_readme_multi_process_command_passes_the_flags_that_silence_accelerate():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    launches = re.findall(r"`(accelerate launch [^`]*)`", text)
    assert launches and any("--config_file" in c for c in launches)
    for command in launches:  # a shipped launch file sets what the flags would (accelerate warns about each unset)
        assert "--config_file configs/accelerate/" in command or \
            "--num_machines 1 --mixed_precision no --dynamo_backend no" in command, command
    for name in os.listdir(os.path.join(ROOT, "configs", "accelerate")):
        with open(os.path.join(ROOT, "configs", "accelerate", name)) as f:
            launch = yaml.safe_load(f)
        assert {"num_machines", "mixed_precision", "dynamo_config", "num_processes"} <= set(launch), name


@pytest.mark.parametrize("rl_rank", [4, 8])
def test_kl_reference_is_the_policy_rl_started_from(tmp_path, rl_rank):
    """An SFT checkpoint with trained LoRA (rank 4) and a trained action head: at RL's iteration 0 the policy, its
    reference (adapters off) and the SFT policy give the same log-probs, for an RL LoRA rank equal to the SFT's and
    different from it."""
    from common.config import load_config
    from common.policy_start import initial_policy
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
    policy = initial_policy(run, "token").eval()
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
    ("log.checkpoint_every=0", "log.checkpoint_every=0: must be in [1, inf)"),
    ("rollout.temperature=0", "rollout.temperature=0.0: must be in (0, inf)"),
    ("env.num_envs=0", "env.num_envs=0: must be in [1, 4096]"),
    ("rollout.prompts_per_iteration=0", "rollout.prompts_per_iteration=0: must be in [1, 65536]"),
    ("algorithm.clip_ratio=0.2", "unknown key 'algorithm.clip_ratio'"),  # never read: gone (low/high are the keys)
])
def test_bad_values_stop_before_any_work(override, message):
    from common.config import ConfigError, load_config
    from train_srpo import Config, check_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        check_config(load_config(Config, os.path.join(ROOT, "configs", "srpo.yaml"), [override]))


# #47's probes that ran into a traceback minutes in, or were accepted: each is one line before any model loads, in
# every script that has the key
PROBES = [
    ("train.lr=-1", "train.lr=-1.0: must be in [0, inf)", ("srpo", "luffy", "flowsar")),
    ("algorithm.clip_ratio_c=0.5", "algorithm.clip_ratio_c=0.5: must be in (1, inf)", ("srpo", "gae_ppo")),
    ("algorithm.clip_ratio_low=-0.5", "algorithm.clip_ratio_low=-0.5: must be in [0, 1)", ("srpo", "gae_ppo")),
    ("algorithm.clip_ratio=-1", "algorithm.clip_ratio=-1.0: must be in (0, 1)", ("luffy",)),
    ("env.image_size=30", "env.image_size=30: must be in [32, 1024]", ("srpo", "gae_ppo", "luffy", "flowsar", "sft")),
    ("env.image_size=72", "env.image_size=72: the policies cut images into 16 px patches",
     ("srpo", "gae_ppo", "luffy", "flowsar", "sft")),
    ("env.num_envs=100000000", "env.num_envs=100000000: must be in [1, 4096]",
     ("srpo", "gae_ppo", "luffy", "flowsar", "sft")),
    ("policy.image_size=48", "policy.image_size=48 but env.image_size=64: a new policy sees what the env renders",
     ("srpo", "gae_ppo", "luffy", "flowsar")),
    ("eval.trial_start=0", "eval.trial_start=0: evaluation trials 0..19 overlap the practice trials 0..",
     ("srpo", "luffy")),
    ("--task-ids 0 0", "task ids [0, 0]: task 0 is given twice", ("srpo", "gae_ppo", "luffy", "flowsar", "sft")),
]


@pytest.mark.parametrize("override, message, script", [(o, m, s) for o, m, scripts in PROBES for s in scripts])
def test_a_bad_value_is_one_line_before_any_model_loads(override, message, script):
    """The script's own command-line parse and value checks (what runs before the model is built), in-process."""
    import importlib

    from common.config import parse_cli

    module = importlib.import_module(f"train_{script}")
    default = os.path.join(ROOT, "configs", f"{script}.yaml")
    args = override.split() if override.startswith("--") else ["--task-id", "0", override]
    with pytest.raises(SystemExit) as e:
        cfg = parse_cli(module.Config, default, argv=args + (["init.mode=scratch"] if "policy." in override else []))
        exit_on_bad = importlib.import_module("common.config").exit_on_bad_config
        exit_on_bad(module.check_config, cfg)
    assert str(e.value).startswith("error: ") and "\n" not in str(e.value) and message in str(e.value), str(e.value)


@pytest.mark.parametrize("key", ["log.output_dir", "log.plots_dir"])
def test_unwritable_output_folders_are_refused_before_the_model_is_built(tmp_path, key):
    (tmp_path / "a_file").write_text("folders cannot go under a file")
    paths = {"log.output_dir": f"{tmp_path}/runs", "log.plots_dir": f"{tmp_path}/plots"}
    paths[key] = f"{tmp_path}/a_file/sub"
    out = srpo([*FAST, "train.iterations=1", *(f"{k}={v}" for k, v in paths.items())], check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith(f"error: {key}=") and out.stderr.strip().count("\n") == 0, out.stderr
    assert "choose a writable folder" in out.stderr and "trainable params" not in out.stdout  # no model was built
    assert not os.path.isdir(tmp_path / "runs") or os.listdir(tmp_path / "runs") == []  # no empty run folder left


# the clock frozen, so two runs started together are sure to pick the same timestamped name
FROZEN = ("import runpy, sys, time; time.strftime = lambda *a: '20260101-000000'; sys.argv = sys.argv[1:]; "
          "runpy.run_path(sys.argv[0], run_name='__main__')")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two train_srpo.py processes started together, in the same (frozen) second, into one output folder."""
    tmp = tmp_path_factory.mktemp("two")
    args = [*FAST, "train.iterations=3", "log.checkpoint_every=2", f"log.output_dir={tmp}/runs",
            f"log.plots_dir={tmp}/plots"]
    procs = [subprocess.Popen([sys.executable, "-c", FROZEN, os.path.join(ROOT, "train_srpo.py"), *args], cwd=ROOT,
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-3000:]
    return tmp, [o[0] for o in outs]


def test_two_runs_started_in_the_same_second_get_a_folder_each(two_runs):
    tmp, stdouts = two_runs
    name = "srpo__tabletop__t0__s1__20260101-000000"
    assert sorted(os.listdir(tmp / "runs")) == [name, name + "-2"]
    for run_dir in (tmp / "runs" / name, tmp / "runs" / f"{name}-2"):
        assert [r["iteration"] for r in rows(run_dir)] == [0, 1, 2, 3]  # every row of its own run, none twice
        with open(run_dir / "config.yaml") as f:
            assert f.readline().startswith("# run of script srpo")
        assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter_000002", "iter_000003"]
    assert sum(f"run {tmp}/runs/{name}-2 " in out for out in stdouts) == 1


def test_the_end_of_run_summary_reads_the_run_metrics(two_runs):
    tmp, stdouts = two_runs
    stdout = next(out for out in stdouts if "runs/srpo__tabletop__t0__s1__20260101-000000 |" in out)
    logged = rows(tmp / "runs" / "srpo__tabletop__t0__s1__20260101-000000")
    val = [r["val/success_rate"] for r in logged]
    (summary,) = [line for line in stdout.splitlines() if line.startswith("[srpo] summary: ")]
    assert f"val/success_rate start {val[0]:.3f} | best {max(val):.3f}" in summary
    assert f"mean of the last 3 evaluations {np.mean(val[1:]):.3f} (iters 1, 2, 3)" in summary
    assert f"| {int(logged[-1]['charts/env_steps']):,} env steps | wall " in summary
    assert summary.endswith("plots/srpo__tabletop__t0__s1__20260101-000000/training_curves.png")
    progress = [line for line in stdout.splitlines() if line.startswith("iter 2/3 | SPS ")]
    assert len(progress) == 1 and " | ETA " in progress[0] and re.search(r"time/iteration [0-9.]+s \|", progress[0])


def test_weight_files_are_readable_like_every_other_file(two_runs):
    tmp, _ = two_runs
    run_dir = tmp / "runs" / "srpo__tabletop__t0__s1__20260101-000000"
    umask = os.umask(0)
    os.umask(umask)
    expected = 0o666 & ~umask  # what `open(path, "w")` gives the other files (0644 under the usual umask 022)
    for dirpath, _, files in os.walk(run_dir):
        for name in files:
            assert os.stat(os.path.join(dirpath, name)).st_mode & 0o777 == expected, name


def test_a_new_run_never_writes_into_an_existing_folder(tmp_path):
    from common.config import ConfigError, LogConfig, save_config
    from common.run_folder import create_run_dir
    from train_srpo import Config

    log = LogConfig(output_dir=str(tmp_path / "runs"), plots_dir=str(tmp_path / "plots"), run_name="mine")
    assert create_run_dir(log, "srpo") == ("mine", str(tmp_path / "runs" / "mine"))
    save_config(Config(), str(tmp_path / "runs" / "mine" / "config.yaml"), script="srpo", exclusive=True)
    with pytest.raises(ConfigError, match=r"log.run_name=mine: .*runs/mine already exists; continue that run with "
                                          r"--resume .*runs/mine"):
        create_run_dir(log, "srpo")
    with pytest.raises(FileExistsError):  # config.yaml is never replaced
        save_config(Config(), str(tmp_path / "runs" / "mine" / "config.yaml"), script="srpo", exclusive=True)


def train_srpo_with(patch: str, tmp_path) -> tuple:
    """train_srpo.py (FAST, 3 iterations) in a process that first runs `patch` (code that breaks a write); its
    (CompletedProcess, run folder, stderr lines)."""
    code = f"import runpy, sys\n{patch}\nsys.argv = sys.argv[1:]\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "train_srpo.py"), *FAST, "train.iterations=3",
                          "eval.every=0", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"],
                         cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    return out, the_run(tmp_path / "runs"), out.stderr.strip().splitlines()


@pytest.mark.parametrize("error", ["OSError", "SafetensorError", "RuntimeError"])
def test_a_failed_checkpoint_write_ends_training_with_one_line(tmp_path, error):
    """The second checkpoint's write fails (full disk: OSError from a file write, safetensors' SafetensorError,
    torch.save's RuntimeError): exit non-zero with one line saying how to continue, no temporary folder, the first
    checkpoint intact and loadable."""
    inject = {
        "OSError": "import common.checkpoint as ck; ck.json.dump = fail(OSError(28, "
                   "'No space left on device'), ck.json.dump)",
        "SafetensorError": "import safetensors.torch as st; from safetensors import SafetensorError; "
                           "st.save_model = fail(SafetensorError('Error while serializing: IoError(No space left on "
                           "device)'), st.save_model)",
        "RuntimeError": "import common.checkpoint as ck; ck.torch.save = fail(RuntimeError('[enforce fail at "
                        "inline_container.cc:595] . unexpected pos 64 vs 0'), ck.torch.save)",
    }[error]
    out, run_dir, err = train_srpo_with("def fail(exc, real):\n"
                                        "    def writer(*a, **k):\n"
                                        "        if 'iter_000002' in ' '.join(str(x) for x in\n"
                                        "                                     list(a) + list(k.values())):\n"
                                        "            raise exc\n"
                                        "        return real(*a, **k)\n"
                                        "    return writer\n"
                                        f"{inject}", tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert err[-1].startswith("error: could not write checkpoint ") and f"{error}" in err[-1]
    assert "earlier checkpoints are intact" in err[-1] and f"--resume {run_dir}" in err[-1]
    assert os.listdir(os.path.join(run_dir, "checkpoints")) == ["iter_000001"]  # no .tmp_iter_* left behind
    from common.checkpoint import verify_checkpoint
    from common.checkpoint import load_saved_policy

    verify_checkpoint(os.path.join(run_dir, "checkpoints", "iter_000001"))
    load_saved_policy(os.path.join(run_dir, "checkpoints", "iter_000001"))


def test_a_failed_metrics_row_ends_training_with_one_line(tmp_path):
    """#47 probe full_disk_sft_completely: a disk full to the last byte fails the next metrics.jsonl row (and the
    file's close at exit) before any checkpoint write; it ended in two tracebacks. Now: one line with the advice to
    continue from the last checkpoint, which stays intact."""
    out, run_dir, err = train_srpo_with("import common.metrics_log as lg\n"
                                        "class Full:\n"
                                        "    closed = False\n"
                                        "    def __init__(self, f): self.f = f\n"
                                        "    def write(self, s): raise OSError(28, 'No space left on device')\n"
                                        "    def flush(self): raise OSError(28, 'No space left on device')\n"
                                        "    def close(self):\n"
                                        "        self.f.close()\n"
                                        "        raise OSError(28, 'No space left on device')\n"
                                        "real = lg.Logger.log\n"
                                        "def log(self, metrics, step):\n"
                                        "    if step == 2: self._file = Full(self._file)\n"
                                        "    return real(self, metrics, step)\n"
                                        "lg.Logger.log = log", tmp_path)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert err[-1].startswith(f"error: could not write iteration 2's row to {run_dir}/metrics.jsonl: No space left "
                              f"on device;"), err[-1]
    assert "continue with:" in err[-1] and f"--resume {run_dir}" in err[-1], err[-1]
    assert os.listdir(os.path.join(run_dir, "checkpoints")) == ["iter_000001"]
    from common.checkpoint import verify_checkpoint

    verify_checkpoint(os.path.join(run_dir, "checkpoints", "iter_000001"))


def test_the_advice_after_a_stop_names_a_resume_only_when_a_checkpoint_exists():
    """#47: after a failed first checkpoint (full disk) the old line advised `--resume` to a run that had none (and
    the resume was refused); the advice now names --resume only when something is saved, else a new run."""
    from common.run import Run, Schedule

    fake = SimpleNamespace(_saved_iteration=0, run_dir="runs/r", schedule=Schedule(10, 1, 1),
                           resume_command=lambda: "python train_srpo.py --resume runs/r")
    assert Run._continue_advice(fake, "free the space and") == \
        "nothing was saved; free the space and start the run again (without --resume)"
    fake._saved_iteration = 2
    assert Run._continue_advice(fake) == ("iterations 1..2 are saved in runs/r/checkpoints; continue with: "
                                          "python train_srpo.py --resume runs/r")
    fake.schedule = Schedule(3, 0, 1, steps_per_iteration=10, total_steps=25)  # train_sft.py: blocks of 10 steps
    fake._saved_iteration = 3
    assert Run._continue_advice(fake).startswith("steps 1..25 are saved")


def saved_run(tmp_path, script="srpo", iterations=(1, 2), processes=1):
    """A run folder with config.yaml (written by `script`) and checkpoints, as a finished run leaves it."""
    from common.checkpoint import capture_rng_state, save_checkpoint
    from common.config import save_config
    from models import TokenPolicy, TokenPolicyConfig
    from train_srpo import Config

    run_dir = tmp_path / "runs" / "r"
    cfg = Config()
    cfg.log.output_dir = str(tmp_path / "runs")
    save_config(cfg, str(run_dir / "config.yaml"), script=script)
    policy = TokenPolicy(TokenPolicyConfig(hidden_size=32, num_layers=1, num_heads=2))
    for it in iterations:
        save_checkpoint(str(run_dir), it, policy, {"actor": torch.optim.AdamW(policy.parameters())}, keep_last=1,
                        rng_states=[capture_rng_state()] * processes)
    return run_dir


def test_resume_refuses_a_pruned_or_earlier_checkpoint_naming_those_that_exist(tmp_path):
    run_dir = saved_run(tmp_path, iterations=(1, 2, 3))  # keep_last=1: only iter_000003 is left
    msg = parse_error(["--resume", str(run_dir / "checkpoints" / "iter_000001")])
    assert "that checkpoint does not exist (pruned?)" in msg and "has iter_000003" in msg
    assert f"--resume {run_dir}" in msg
    saved_run(tmp_path / "c", iterations=(1,))
    os.rename(tmp_path / "c" / "runs" / "r" / "checkpoints" / "iter_000001", tmp_path / "c" / "keep")
    saved_run(tmp_path / "c", iterations=(4,))
    os.rename(tmp_path / "c" / "keep", tmp_path / "c" / "runs" / "r" / "checkpoints" / "iter_000001")
    msg = parse_error(["--resume", str(tmp_path / "c" / "runs" / "r" / "checkpoints" / "iter_000001")])
    assert "continues from its newest complete checkpoint (iter_000004 of iter_000001, iter_000004)" in msg


def test_resume_names_the_script_a_run_belongs_to(tmp_path):
    run_dir = saved_run(tmp_path, script="gae_ppo")
    msg = parse_error(["--resume", str(run_dir)])
    assert msg == (f"error: --resume {run_dir}: {run_dir} is a run of train_gae_ppo.py, not of train_srpo.py: "
                   f"continue it with python train_gae_ppo.py --resume {run_dir}")
    legacy = tmp_path / "runs" / "luffy__tabletop__t0__s1__20260101-000000"  # no first line: the folder's name
    legacy.mkdir()
    from common.config import config_to_yaml
    from train_srpo import Config

    (legacy / "config.yaml").write_text(config_to_yaml(Config()))
    assert "is a run of train_luffy.py" in parse_error(["--resume", str(legacy)])


def test_resume_with_another_number_of_processes_is_refused(tmp_path):
    from common.config import ConfigError, load_config
    from common.run import Run
    from train_srpo import Config

    run_dir = saved_run(tmp_path, processes=2)
    cfg = load_config(Config, str(run_dir / "config.yaml"), [f"resume={run_dir}"])
    with pytest.raises(ConfigError, match=r"--resume: the run had 2 process\(es\) and this launch has 1 .*"
                                          r"`accelerate launch --multi_gpu --num_processes 2 --num_machines 1 "
                                          r"--mixed_precision no --dynamo_backend no train_srpo.py --resume"):
        Run(cfg, "srpo")


def test_run_summary_values():
    from common.run import run_summary

    history = {0: {"val/success_rate": 0.5}, 1: {"rollout/success_rate": 0.1}, 5: {"val/success_rate": 0.75},
               10: {"val/success_rate": 0.6}, 15: {"val/success_rate": 0.65}}
    line = run_summary(history, 12800.0, 312.0, "plots/r/training_curves.png")
    assert line == ("val/success_rate start 0.500 | best 0.750 (iter 5) | mean of the last 3 evaluations 0.667 "
                    "(iters 5, 10, 15) | 12,800 env steps | wall 5m12s | plot plots/r/training_curves.png")
    assert run_summary({1: {"x": 1.0}}, 0, 5.0, "p").startswith("no val/success_rate (eval.every=0) | 0 env steps")


@pytest.mark.slow
def test_runs_from_another_working_directory(tmp_path):
    """Shipped configs and sibling scripts resolve against the repository; output paths against the cwd."""
    out = srpo([*FAST, "train.iterations=1", "eval.every=0", "log.output_dir=runs", "log.plots_dir=plots"],
               cwd=str(tmp_path))
    assert "done" in out.stdout and os.path.isdir(tmp_path / "runs") and os.path.isdir(tmp_path / "plots")
    out = srpo([*FAST, "--config", "configs/srpo.yaml", "train.iterations=1", "eval.every=0",
                "log.output_dir=runs2"], cwd=str(tmp_path))
    assert os.path.isdir(tmp_path / "runs2")


def test_benchmarks_run_as_the_readme_writes_them():
    out = subprocess.run([sys.executable, "benchmarks/env_throughput.py", "--help"], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=""),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage" in out.stdout, out.stderr[-2000:]


def test_missing_sft_checkpoint_says_how_to_make_it(tmp_path):
    from common.config import ConfigError, load_config
    from common.policy_start import initial_policy
    from train_srpo import Config

    cfg = load_config(Config, None, ["env.task_ids=[3]", f"init.path={tmp_path}/nope", "init.mode=checkpoint"])
    run = SimpleNamespace(cfg=cfg, resume_path=None, is_main=True, device=torch.device("cpu"))
    with pytest.raises(ConfigError) as e:
        initial_policy(run, "token")
    msg = str(e.value)
    assert f"no SFT checkpoint at {tmp_path}/nope" in msg and "\n" not in msg
    assert "train_sft.py --task-ids 3 policy.type=token env.suite=tabletop env.image_size=64" in msg
    assert "init.mode=auto_sft" in msg


def test_minibatches_give_every_process_the_same_number_of_steps():
    from common.train import minibatches

    torch.manual_seed(0)
    shares = {0: 10, 1: 3}  # two processes with different kept counts
    fake_gather = lambda items: list(shares.values())  # noqa: E731
    steps = {r: [b.tolist() for b in minibatches(n, 4, 2, fake_gather)] for r, n in shares.items()}
    assert len(steps[0]) == len(steps[1]) == 2 * 3  # ceil(10 / 4) per epoch on both
    assert sorted(i for b in steps[0][:3] for i in b) == list(range(10))
    assert [len(b) for b in steps[1][:3]] == [3, 0, 0]  # the small share runs out: empty (zero-gradient) steps
    assert np.array_equal(sorted(i for b in steps[1][3:] for i in b), [0, 1, 2])


def _broken_oft(tmp_path, how):
    """A copy of the tiny OpenVLA-OFT folder with one defect: a truncated safetensors shard, or no tokenizer.json."""
    import shutil

    folder = tmp_path / f"oft_{how}"
    shutil.copytree(os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft"), folder)
    if how == "truncated":
        shard = folder / "model-00002-of-00002.safetensors"
        shard.write_bytes(shard.read_bytes()[:1000])
    else:
        (folder / "tokenizer.json").unlink()
    return str(folder)


@pytest.mark.parametrize("how", ["truncated", "no_tokenizer"])
def test_a_broken_checkpoint_is_one_line_for_rl_sft_and_evaluate(tmp_path, how):
    """#47: a truncated shard under policy.type=openvla_oft printed a traceback in the RL scripts, and train_sft.py
    did not catch PolicyLoadError at all; one place (models/saved.py load_errors) makes every load error one line."""
    import evaluate
    import train_sft
    from common.config import ConfigError, load_config
    from common.policy_start import initial_policy
    from train_srpo import Config

    folder = _broken_oft(tmp_path, how)
    cfg = load_config(Config, os.path.join(ROOT, "configs", "srpo_libero.yaml"),
                      ["init.mode=checkpoint", f"init.path={folder}", "env.suite=tabletop", "env.image_size=64",
                       "policy.unnorm_key=libero_10", "policy.bf16_weights=false"])
    run = SimpleNamespace(cfg=cfg, resume_path=None, device=torch.device("cpu"), rank=0, is_main=True,
                          accelerator=SimpleNamespace(wait_for_everyone=lambda: None))
    with pytest.raises(ConfigError) as e:
        initial_policy(run, "token")
    assert str(e.value).startswith(f"init.path {folder}: ") and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:
        train_sft.main(["--task-id", "0", "--no-wandb", f"policy.init_path={folder}", f"log.output_dir={tmp_path}/runs",
                        f"log.plots_dir={tmp_path}/plots", "sft.num_demos=1", "env.max_steps=8",
                        f"sft.output_path={tmp_path}/out"])
    assert str(e.value).startswith("error: ") and folder in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", folder, "--trials", "1", "--out-dir", str(tmp_path / "eval")])
    assert str(e.value).startswith("error: ") and folder in str(e.value) and "\n" not in str(e.value)


def test_an_empty_folder_is_one_line_for_sft(tmp_path):
    import train_sft

    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        train_sft.main(["--task-id", "0", "--no-wandb", f"policy.init_path={tmp_path}/empty",
                        f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots", "sft.num_demos=1",
                        "env.max_steps=8", f"sft.output_path={tmp_path}/out"])
    assert str(e.value).startswith("error: ") and "empty" in str(e.value) and "\n" not in str(e.value)


def test_the_end_of_an_iteration_keeps_no_copy_of_the_weights_or_the_optimizer(monkeypatch):
    """#46: the old ddp path deep-copied the optimizer at every iteration that did not checkpoint (+56 GiB of moments
    on the GPU at 7B: OOM in iteration 2). A stop now waits for the next safe point, so what an iteration's end keeps
    is the run state and the RNG states: no tensor is copied, none is kept."""
    from common import run as run_module
    from common.run import Run, Schedule

    policy = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(policy.parameters())
    policy(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # moments exist
    copied, deepcopy = [], run_module.copy.deepcopy
    monkeypatch.setattr(run_module.copy, "deepcopy", lambda x, *a: copied.append(x) or deepcopy(x, *a))
    saved = []
    fake = SimpleNamespace(schedule=Schedule(10, 0, 5), device=torch.device("cpu"), gather=lambda items: list(items),
                           _signals=0, _stop_asked=False, _rng_states=lambda: [{"python": 1}], is_main=False, state={"best": 0.5},
                           save=lambda it, rng: saved.append(it), accelerator=SimpleNamespace(
                               wait_for_everyone=lambda: None), evaluate=lambda done: {},
                           _tracked={"policy": policy, "optimizers": {"actor": optimizer}})
    for iteration in range(5):  # four iterations without a checkpoint, then one with
        Run.end_iteration(fake, iteration, {}, [])
    assert saved == [5]

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return 1
        if isinstance(x, dict):
            return sum(tensors(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(tensors(v) for v in x)
        return 0

    assert copied and all(tensors(x) == 0 and not isinstance(x, (torch.optim.Optimizer, torch.nn.Module))
                          for x in copied), copied
    assert tensors(fake._last_done) == 0 and fake._last_done["iteration"] == 5


def test_a_stop_is_a_return_value_at_both_safe_points():
    """Issue 54: Ctrl-C / SIGTERM is no exception raised through the script. After the rollout's `count_env_steps`,
    `should_stop` returns True and saves the last completed iteration (3) with its own run state, not the rollout's
    env steps; without a signal the steps are counted and it returns False (issue 69: the stop is its own call, apart
    from the counting); `end_iteration` returns True with this iteration (4) saved."""
    from common.run import Run, Schedule

    run = Run.__new__(Run)
    saved = []
    run.__dict__.update(schedule=Schedule(10, 0, 100), device=torch.device("cpu"), gather=lambda items: list(items),
                        _signals=0, _stop_asked=False, _rng_states=lambda: [{"python": 1}], is_main=False, state={"env_steps": 30.0},
                        save=lambda it, rng: saved.append((it, rng, dict(run.state))), _stopped=False,
                        accelerator=SimpleNamespace(wait_for_everyone=lambda: None), evaluate=lambda done: {},
                        _saved_iteration=0, _last_done={"iteration": 3, "rng": [{"python": 0}],
                                                        "state": {"env_steps": 30.0}})
    batch = SimpleNamespace(stats={"rollout/env_steps": 8})
    metrics: dict = {}
    run.count_env_steps(batch, metrics, 2.0)
    assert run.should_stop() is False and not run.stopped
    assert run.state["env_steps"] == 38.0 and metrics["charts/SPS"] == 4.0
    run._signals = 1
    run.count_env_steps(batch, {}, 1.0)
    assert run.should_stop() is True and run.stopped
    assert saved == [(3, [{"python": 0}], {"env_steps": 30.0})] and run.state["env_steps"] == 38.0
    run._stopped, saved[:] = False, []
    assert run.end_iteration(3, {}, []) is True and run.stopped and [s[0] for s in saved] == [4]


def test_the_eta_takes_the_env_step_budget_when_it_ends_the_run_sooner():
    """A real-LIBERO arm runs train.iterations=1000 as a cap and train.total_timesteps=300000 as its end: at iteration
    25 after 140k env steps in 100 s, the iteration count said 'ETA 28h'. By env steps 160k more take 100/140k*160k
    = 114.3 s; by iterations 975 more take 3,900 s: the sooner wins. Without a budget, the iteration count; with the
    budget spent, 0."""
    from common.run import eta_seconds

    assert eta_seconds(100.0, 25, 975, 140_000, 160_000) == pytest.approx(100 / 140_000 * 160_000)
    assert eta_seconds(100.0, 25, 975) == pytest.approx(3_900.0)
    assert eta_seconds(100.0, 25, 5, 140_000, 10_000_000) == pytest.approx(20.0)  # the iteration cap comes first
    assert eta_seconds(100.0, 25, 975, 140_000, -5) == 0.0
    assert eta_seconds(100.0, 1, 9, 0, 1_000) == pytest.approx(900.0)  # no env step counted yet: iterations only


def test_the_rl_schedule_carries_the_env_step_budget():
    from common.config import parse_cli
    from common.run import Schedule
    from train_srpo import Config

    cfg = parse_cli(Config, "configs/srpo.yaml", argv=["train.total_timesteps=300000", "train.iterations=1000"])
    assert Schedule.for_rl(cfg).env_step_budget == 300_000
    assert Schedule.for_rl(parse_cli(Config, "configs/srpo.yaml", argv=[])).env_step_budget is None
