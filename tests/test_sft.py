"""train_sft.py: SFT beats the untrained policy (fixed seed), outputs (best/last/output_path/metrics), resume, demos."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import envs
import train_sft
from envs import EnvConfig
from common.demos import demos_to_samples, generate_expert_demos, load_demos_npz
from common.rollout import collect_rollouts
from common.checkpoint import load_saved_policy
from models import ActionTokenizer, TokenPolicy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["policy.token.hidden_size=32", "policy.token.num_layers=1", "policy.token.num_heads=2"]


def run(tmp_path, *extra):
    """train_sft.main in-process with outputs under tmp_path; returns (summary, run_dir)."""
    args = ["--task-id", "0", "--no-wandb", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots",
            "log.run_name=r", f"sft.output_path={tmp_path}/exported", "sft.log_every=2", "env.num_envs=4", *extra]
    return train_sft.main(args), os.path.join(tmp_path, "runs", "r")


def test_demos_are_expert_successes_and_chunks_repeat_last_action(tmp_path):
    cfg = EnvConfig(task_ids=[7])
    demos = generate_expert_demos(cfg, [7], 3, noise=0.3, seed=1, cache_dir=str(tmp_path), verbose=False)
    assert [d["trial_id"] for d in demos] == [0, 1, 2] and demos[0]["task_description"] == "put the red block in the basket"
    assert demos[0]["agentview"].dtype == np.uint8 and demos[0]["agentview"].shape[1:] == (64, 64, 3)
    assert len(demos[0]["actions"]) == len(demos[0]["state"]) < 100
    cached = load_demos_npz(os.path.join(tmp_path, os.listdir(tmp_path)[0]))
    assert all(np.array_equal(a["wrist"], b["wrist"]) for a, b in zip(demos, cached))
    again = generate_expert_demos(cfg, [7], 3, noise=0.3, seed=1, cache_dir=None, verbose=False)
    assert np.array_equal(again[2]["actions"], demos[2]["actions"])  # deterministic for a seed
    s = demos_to_samples(demos, chunk=4)
    t_len = len(demos[0]["actions"])
    assert s["actions"].shape == (sum(len(d["actions"]) for d in demos), 4, 7)
    np.testing.assert_array_equal(s["actions"][0], demos[0]["actions"][:4])
    np.testing.assert_array_equal(s["actions"][t_len - 2], demos[0]["actions"][[t_len - 2, t_len - 1, t_len - 1,
                                                                                   t_len - 1]])


def test_outputs_and_resume(tmp_path):
    summary, run_dir = run(tmp_path, *TINY, "sft.num_demos=2", "sft.steps=4", "sft.eval_every=2",
                           "sft.eval_trials=2", "env.max_steps=8")
    assert summary["best_step"] in (2, 4) and summary["best_success"] == 0.0
    for name in ("config.yaml", "metrics.jsonl", "best/model.safetensors", "last/action_stats.json"):
        assert os.path.isfile(os.path.join(run_dir, name)), name
    # an iteration is a block of sft.log_every=2 steps: checkpoints and rows count blocks, charts/step the steps
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000001", "iter_000002"]
    assert os.path.isfile(tmp_path / "exported" / "train_config.yaml")
    assert envs.stale_suite_message(str(tmp_path / "exported"), "tabletop") is None  # records the suite version
    assert os.path.isfile(tmp_path / "plots" / "r" / "training_curves.png")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["iteration"] for r in rows] == [1, 2] and [r["charts/step"] for r in rows] == [2, 4]
    assert rows[0]["sft/loss"] > rows[1]["sft/loss"] > 0
    assert rows[1]["val/success_rate"] == 0.0
    # resume continues at step 4 and appends to metrics.jsonl
    run(tmp_path, *TINY, "sft.num_demos=2", "sft.steps=6", "sft.eval_every=2", "sft.eval_trials=2",
        "env.max_steps=8", f"resume={run_dir}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["charts/step"] for r in rows] == [2, 4, 6]


def test_checkpoint_every_saves_between_evaluations(tmp_path):
    """sft.checkpoint_every=4 with sft.log_every=2, 8 steps and one evaluation at the end: checkpoints at steps 4 and
    8 (blocks 2 and 4) and the evaluation only in the last row; the export is the last block's policy."""
    summary, run_dir = run(tmp_path, *TINY, "sft.num_demos=2", "sft.steps=8", "sft.eval_every=0",
                           "sft.checkpoint_every=4", "sft.eval_trials=2", "env.max_steps=8", "log.keep_checkpoints=5")
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["iter_000002", "iter_000004"]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["charts/step"] for r in rows] == [2, 4, 6, 8]
    assert ["val/success_rate" in r for r in rows] == [False, False, False, True] and summary["best_step"] == 8
    last = load_file(os.path.join(run_dir, "checkpoints", "iter_000004", "policy", "model.safetensors"))
    exported = load_file(os.path.join(tmp_path, "exported", "model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in last.items())


def greedy_success(policy, trials):
    """Greedy rollouts of task 0 on `trials` -> success (N,) bool."""
    vec = envs.make_vector_env(EnvConfig(num_envs=len(trials)), len(trials))
    return collect_rollouts(vec, policy, [0] * len(trials), trials, greedy=True, keep_obs=False,
                            progress=False).complete


def test_flow_family_trains_on_the_flow_matching_loss(tmp_path):
    """policy.type=flow: the family table builds a FlowPolicy and the loss is its flow-matching loss (the token
    family's cross-entropy does not exist there); the exported folder is a flow policy."""
    from models.policy import family_of_folder as policy_type

    run(tmp_path, "policy.type=flow", "policy.flow.hidden_size=32", "policy.flow.expert_dim=32",
        "policy.flow.num_layers=1", "policy.flow.num_heads=2", "sft.num_demos=2", "sft.steps=4", "sft.eval_every=0",
        "sft.eval_trials=2", "env.max_steps=8")
    with open(os.path.join(tmp_path, "runs", "r", "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    assert any("sft/flow_mse" in r for r in rows) and not any("sft/token_accuracy" in r for r in rows)
    assert policy_type(str(tmp_path / "exported")) == "flow"


@pytest.mark.slow
def test_sft_learns_its_demos_and_the_untrained_policy_does_not(tmp_path):
    """400 steps on three expert demos (DART noise 0.3 on the executed actions): the exported policy predicts the
    demos' action tokens (greedy, teacher-forced) with >= 50% accuracy (measured: 72%; chance is 1/256) where the
    untrained policy of the same architecture and action statistics is at chance, and the mean loss of the last 50
    steps is below half that of the first 50 (measured: 1.03 vs 2.63). Closed-loop success is not asserted: it hangs
    on float rounding (on an AVX-512 CPU a 98%-accurate policy of this test drifted off-course on every trial, on AVX2
    it solved one); the learning tests measure success over seeds."""
    model = ["policy.token.hidden_size=64", "policy.token.num_layers=1", "policy.token.num_heads=4"]
    summary, run_dir = run(tmp_path, *model, "sft.num_demos=3", "sft.demo_starts=false", "sft.demo_noise=0.3",
                           "sft.steps=400", "sft.batch_size=8", "sft.lr=0.003", "sft.warmup_steps=20", "sft.eval_every=0",
                           "sft.eval_trial_start=0", "sft.eval_trials=3", "sft.log_every=50", "seed=0")
    trained = load_saved_policy(os.path.join(run_dir, "best"))
    torch.manual_seed(0)
    untrained = TokenPolicy(trained.cfg, ActionTokenizer.from_state_dict(trained.action_tokenizer.state_dict()))
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    demos = generate_expert_demos(EnvConfig(max_steps=None), [0], 3, 0.3, 0, demo_starts=False)
    samples = demos_to_samples(demos, trained.action_chunk)
    obs = {k: samples[k] for k in ("agentview", "wrist", "state")}
    with torch.no_grad():
        accuracy = {name: p.eval().sft_loss(obs, samples["instructions"].tolist(), samples["actions"])[1]
                    ["sft/token_accuracy"] for name, p in (("trained", trained), ("untrained", untrained))}
    assert accuracy["trained"] >= 0.5 and accuracy["untrained"] < 0.05, accuracy
    assert rows[-1]["sft/loss"] < 0.5 * rows[0]["sft/loss"], [r["sft/loss"] for r in rows]  # blocks of 50 steps


def test_random_shift_is_an_edge_padded_crop():
    """DrQ: pad 1 and the offset drawn per image; offset (0, 0) of a 3x3 image is its edge-padded top-left crop."""
    img = np.arange(9, dtype=np.uint8).reshape(1, 3, 3, 1)
    assert train_sft.random_shift(img, 0, np.random.default_rng(0)) is img  # off: untouched, no random draw

    class Fixed:  # the generator's draw: dy = 0, dx = 2
        def integers(self, low, high, size):
            assert (low, high) == (0, 3)
            return np.array([[0], [2]])

    out = train_sft.random_shift(img, 1, Fixed())[0, :, :, 0]
    # padded rows: [0 0 1 2 2] / [0 0 1 2 2] / [3 3 4 5 5] / [6 6 7 8 8] / [6 6 7 8 8]; rows 0-2, columns 2-4
    np.testing.assert_array_equal(out, [[1, 2, 2], [1, 2, 2], [4, 5, 5]])
    batch = np.random.default_rng(1).integers(0, 255, (16, 8, 8, 3), dtype=np.uint8)
    shifted = train_sft.random_shift(batch, 2, np.random.default_rng(2))
    assert shifted.shape == batch.shape and shifted.dtype == np.uint8
    padded = np.pad(batch, ((0, 0), (2, 2), (2, 2), (0, 0)), mode="edge")
    for b in range(16):  # every output is one of the 25 crops of its own padded image
        assert any(np.array_equal(shifted[b], padded[b, y:y + 8, x:x + 8]) for y in range(5) for x in range(5))
    assert not all(np.array_equal(shifted[b], batch[b]) for b in range(16))


@pytest.mark.parametrize("override, message", [
    ("--task-id=99", "task id 99 is out of range: suite 'tabletop' has task ids 0..9"),
    ("sft.batch_size=0", "sft.batch_size=0: must be in [1, 65536]"),
    ("sft.steps=0", "sft.steps=0: must be in [1, inf) (0 steps would export the untrained policy"),
    ("sft.eval_every=15", "sft.eval_every=15: evaluations happen at the end of a logged block of sft.log_every=10"),
    ("log.checkpoint_every=100", "log.checkpoint_every=100: train_sft.py does not use it (it counts an RL script's "
                                 "iterations): set sft.checkpoint_every=<steps> instead"),
    ("sft.checkpoint_every=15", "sft.checkpoint_every=15: checkpoints are written at the end of a logged block of "
                                "sft.log_every=10"),
    ("sft.eval_every=30 sft.checkpoint_every=20", "every evaluation (sft.eval_every=30) needs a checkpoint: make "
                                                  "sft.eval_every a multiple of it"),
])
def test_bad_values_stop_with_one_line(tmp_path, override, message):
    with pytest.raises(SystemExit) as e:
        train_sft.main([*override.split(), "--no-wandb", f"log.output_dir={tmp_path}/runs",
                        f"log.plots_dir={tmp_path}/plots"])
    assert str(e.value).startswith("error: ") and "\n" not in str(e.value) and message in str(e.value), str(e.value)
    assert not os.path.exists(tmp_path / "runs")  # refused before any folder was made


SFT_ENV = dict(os.environ, OMP_NUM_THREADS="1", WANDB_MODE="disabled")
SMALL = [*TINY, "--task-id", "0", "--no-wandb", "sft.num_demos=2", "sft.steps=60", "sft.batch_size=8",
         "sft.log_every=5", "sft.eval_every=0", "sft.eval_trials=2", "env.max_steps=8", "env.num_envs=2",
         "sft.augment_shift=2"]


def sft_process(tmp_path, *args):
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train_sft.py"), *SMALL, *args], cwd=ROOT,
                            env=SFT_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_saves_the_sft_and_resume_finishes_it_bitwise(tmp_path):
    """SIGINT after some steps: exit 130 with the resume command, no traceback, the steps so far in a checkpoint;
    --resume reaches sft.steps, and with one thread its weights are bitwise those of an uninterrupted run."""
    full = sft_process(tmp_path, f"log.output_dir={tmp_path}/full", f"log.plots_dir={tmp_path}/plots",
                       f"sft.output_path={tmp_path}/full_export")
    assert full.wait(timeout=600) == 0, full.stderr.read()[-3000:]
    proc = sft_process(tmp_path, f"log.output_dir={tmp_path}/cut", f"log.plots_dir={tmp_path}/plots",
                       f"sft.output_path={tmp_path}/cut_export")
    deadline = time.time() + 300
    while time.time() < deadline:  # interrupt once five rows (steps 5..25) are logged: past the warm-up (20 steps)
        runs = os.listdir(tmp_path / "cut") if os.path.isdir(tmp_path / "cut") else []
        metrics = os.path.join(tmp_path, "cut", runs[0], "metrics.jsonl") if runs else ""
        if metrics and os.path.isfile(metrics) and len(open(metrics).read().splitlines()) >= 5:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    run_dir = os.path.join(tmp_path, "cut", os.listdir(tmp_path / "cut")[0])
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-3000:]
    (saved,) = os.listdir(os.path.join(run_dir, "checkpoints"))
    step = 5 * int(saved[5:])  # an iteration is a block of sft.log_every=5 steps
    assert 25 <= step < 60  # past the warm-up of 20 steps (#47: a resume after it failed on a numpy lr)
    assert f"[train_sft] interrupted: steps 1..{step} are saved in {run_dir}/checkpoints; continue with: python " \
           f"train_sft.py --resume {run_dir}" in stdout
    assert not os.path.exists(tmp_path / "cut_export")  # nothing exported from a cut-short run

    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_sft.py"), "--resume", run_dir], cwd=ROOT,
                         env=SFT_ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resumed at step {step}" in out.stdout
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["charts/step"] for r in rows] == list(range(5, 65, 5))  # each logged block once
    a = load_file(os.path.join(tmp_path, "full_export", "model.safetensors"))
    b = load_file(os.path.join(tmp_path, "cut_export", "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_stop_at_the_last_block_exports_that_blocks_policy_on_resume(tmp_path):
    """#47: a SIGINT that lands while block 1's checkpoint is written (tests/fixtures/signal_in_save.py) stops the run
    at the end of block 2, its last: that checkpoint is saved, but best/ and last/ were copied only after a block that
    did not stop, so the resume (nothing left to train) exported block 1's best/ while the run said step 10 (with
    sft.eval_every=0 best/ did not exist and the resume crashed). The export is now the last checkpoint's policy."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "fixtures", "signal_in_save.py"), "train_sft.py",
                          *SMALL, "sft.steps=10", "sft.eval_every=5", f"log.output_dir={tmp_path}/runs",
                          f"log.plots_dir={tmp_path}/plots", f"sft.output_path={tmp_path}/exported"], cwd=ROOT,
                         env=dict(SFT_ENV, SIGNAL_CHECKPOINT="iter_000001", SIGNALS="1"), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 130 and "[test] 1 SIGINT sent" in out.stdout, out.stderr[-3000:]
    (name,) = os.listdir(tmp_path / "runs")
    run_dir = tmp_path / "runs" / name
    assert sorted(os.listdir(run_dir / "checkpoints")) == ["iter_000001", "iter_000002"]  # block 2 saved by the stop
    last = load_file(str(run_dir / "checkpoints" / "iter_000002" / "policy" / "model.safetensors"))
    assert all(torch.equal(load_file(str(run_dir / folder / "model.safetensors"))[k], v)
               for folder in ("best", "last") for k, v in last.items())  # a tie (0.0 success) keeps the later one
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_sft.py"), "--resume", str(run_dir)], cwd=ROOT,
                         env=SFT_ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best policy (step 10," in out.stdout
    exported = load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert all(torch.equal(exported[k], v) for k, v in last.items())


def test_ctrl_c_during_the_auto_sft_phase_of_an_rl_run(tmp_path):
    """The README's first command starts with train_sft.py (init.mode=auto_sft): Ctrl-C there (the terminal sends
    SIGINT to both processes) ends both without a traceback, exit 130, the SFT's progress saved; running the same
    command again continues that SFT run from its checkpoint (same folder, later steps), not a new one."""
    cmd = [sys.executable, os.path.join(ROOT, "train_srpo.py"), "--task-id", "0", "--no-wandb", "init.mode=auto_sft",
           f"init.path={tmp_path}/sft", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots",
           "init.sft_args=[policy.token.hidden_size=32,policy.token.num_layers=1,policy.token.num_heads=2,"
           "sft.num_demos=2,sft.steps=100000,sft.batch_size=8,sft.log_every=5,sft.eval_every=0]"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=SFT_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 300
    sft_run = None
    while time.time() < deadline:  # wait for the SFT's first logged row
        found = [d for d in os.listdir(tmp_path / "runs") if d.startswith("train_sft")] \
            if os.path.isdir(tmp_path / "runs") else []
        metrics = tmp_path / "runs" / found[0] / "metrics.jsonl" if found else None
        if metrics and os.path.isfile(metrics) and metrics.read_text().strip():
            sft_run = tmp_path / "runs" / found[0]
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground process group
    stdout, stderr = proc.communicate(timeout=120)
    assert sft_run is not None and proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"continue with: python train_sft.py --resume {sft_run}" in stdout
    assert len(os.listdir(sft_run / "checkpoints")) == 1
    assert sorted(os.listdir(tmp_path / "runs")) == [sft_run.name]  # the RL run's empty folder is gone

    saved_step = int(os.listdir(sft_run / "checkpoints")[0][len("iter_"):])
    rows_before = len((sft_run / "metrics.jsonl").read_text().splitlines())
    proc = subprocess.Popen(cmd, cwd=ROOT, env=SFT_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline, resumed_rows = time.time() + 300, []
    while time.time() < deadline and not resumed_rows:  # wait for a row the continued SFT logs
        rows = (sft_run / "metrics.jsonl").read_text().splitlines()
        resumed_rows = [json.loads(r) for r in rows[rows_before:] if r.strip()]
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert resumed_rows and proc.returncode == 130, stderr[-3000:]
    assert "continuing the interrupted SFT run" in stdout and f"--resume {sft_run}" in stdout, stdout[-2000:]
    assert min(r["iteration"] for r in resumed_rows) > saved_step  # continued after the saved step, not from step 1
    assert sorted(d for d in os.listdir(tmp_path / "runs") if d.startswith("train_sft")) == [sft_run.name]
