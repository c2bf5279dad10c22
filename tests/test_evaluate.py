"""evaluate.py as a subprocess: per-task table, results.json, bar chart PNG and episode GIF; policy type detection."""
import json
import os
import subprocess
import sys

import imageio.v2 as imageio
import pytest
import torch

import evaluate
from common.checkpoint import save_checkpoint
from common.checkpoint import load_saved_policy, resolve_policy_dir
from models.policy import family_of_folder as policy_type
from models.saved import PolicyLoadError
from models.token_policy import TokenPolicy, TokenPolicyConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)


def test_evaluate_subprocess_writes_table_json_png_gif(tmp_path):
    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(tmp_path / "policy"))
    out = tmp_path / "eval"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(tmp_path / "policy"), "--task-ids", "0",
                           "3", "--trials", "2", "--trial-start", "40", "--sampled", "--max-steps", "16",
                           "--out-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert "evaluate: torch threads 1 (OMP_NUM_THREADS=1; OMP_WAIT_POLICY=PASSIVE)" in lines  # common/threads.py
    assert any(l.split()[:1] == ["0"] and "put the red block on the blue plate" in l for l in lines)
    assert any(l.startswith("mean") and l.count("%") == 2 for l in lines)  # greedy and sampled columns
    results = json.loads((out / "results.json").read_text())
    assert results["policy_type"] == "token" and results["task_ids"] == [0, 3] and results["trial_ids"] == [40, 41]
    assert results["mean_greedy"] == 0.0  # an untrained policy never solves a task by chance
    row = results["per_task"][1]
    assert row["task_id"] == 3 and row["greedy_episodes"]["steps"] == [16, 16]
    assert (out / "success.png").stat().st_size > 5_000
    frames = imageio.mimread(out / "episodes.gif")
    assert frames[0].shape[0] == 128 and len(frames) > 1  # 64 px upscaled x2, an animation of failures
    from PIL import Image

    with Image.open(out / "episodes.gif") as gif:  # 10 fps: 100 ms per frame (imageio 2.38 reads `duration` as ms)
        assert gif.info["duration"] == 100


def test_load_policy_finds_the_policy_in_every_layout(tmp_path):
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    policy.save(str(tmp_path / "sft_run" / "best"))
    assert resolve_policy_dir(str(tmp_path / "sft_run")).endswith("best")
    assert policy_type(str(tmp_path / "sft_run" / "best")) == "token"
    opt = torch.optim.AdamW(policy.parameters())
    for it in (1, 2):  # an RL run folder: the newest complete checkpoint's policy
        save_checkpoint(str(tmp_path / "rl_run"), it, policy, {"actor": opt})
    assert resolve_policy_dir(str(tmp_path / "rl_run")).endswith(os.path.join("iter_000002", "policy"))
    loaded = load_saved_policy(str(tmp_path / "rl_run"))
    assert isinstance(loaded, TokenPolicy) and not loaded.training


def bad_input(*argv):
    """evaluate.main's one-line error for a bad --checkpoint."""
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", *argv, "--trials", "1"])
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def test_bad_checkpoints_stop_with_one_line(tmp_path):
    assert "no such file" in bad_input(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "no saved policy" in bad_input(str(tmp_path / "empty"))
    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    ckpt = save_checkpoint(str(tmp_path / "run"), 1, policy, {"actor": torch.optim.AdamW(policy.parameters())})
    weights = os.path.join(ckpt, "policy", "model.safetensors")
    with open(weights, "r+b") as f:  # truncated: the manifest says otherwise
        f.truncate(100)
    assert "truncated" in bad_input(ckpt)
    policy.save(str(tmp_path / "garbage"))
    with open(tmp_path / "garbage" / "model.safetensors", "wb") as f:
        f.write(b"not a safetensors file at all" * 10)
    assert "could not load the token policy" in bad_input(str(tmp_path / "garbage"))
    with pytest.raises(PolicyLoadError):
        load_saved_policy(str(tmp_path / "garbage"))


def rl_checkpoint(tmp_path, train_trials=10, eval_start=30):
    """An RL run folder as train_srpo.py leaves it: config.yaml (practice trials 0..train_trials-1) + iter_000007."""
    from common.config import save_config
    from train_srpo import Config

    torch.manual_seed(0)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    cfg = Config()
    cfg.rollout.train_trials, cfg.eval.trial_start = train_trials, eval_start
    run_dir = tmp_path / "run"
    save_config(cfg, str(run_dir / "config.yaml"), script="srpo")
    save_checkpoint(str(run_dir), 7, policy, {"actor": torch.optim.AdamW(policy.parameters())}, config=cfg)
    return run_dir


def test_an_rl_checkpoint_is_evaluated_on_its_held_out_trials(tmp_path):
    run_dir = rl_checkpoint(tmp_path)
    results = evaluate.main(["--checkpoint", str(run_dir), "--trials", "2", "--max-steps", "4", "--gifs", "0",
                             "--out-dir", str(tmp_path / "out")])
    assert results["trial_ids"] == [30, 31] and results["trial_range"] == "30-31"  # the run's own val/ trials
    assert results["iteration"] == 7 and results["practice_trials"] == "0-9" and results["held_out"]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["iteration"] == 7 and saved["trial_range"] == "30-31"
    results = evaluate.main(["--checkpoint", str(rl_checkpoint(tmp_path / "b", eval_start=None)), "--max-steps", "4",
                             "--gifs", "0", "--out-dir", str(tmp_path / "out")])
    assert results["trial_ids"] == list(range(10, 50))  # no eval.trial_start: every trial not practised
    msg = bad_input(str(run_dir), "--trial-start", "0")
    assert "trials 0 overlap the trials 0-9 this checkpoint's training practised on" in msg
    assert "--allow-practice-trials" in msg
    results = evaluate.main(["--checkpoint", str(run_dir), "--trial-start", "0", "--trials", "1", "--max-steps", "4",
                             "--gifs", "0", "--allow-practice-trials", "--out-dir", str(tmp_path / "out")])
    assert results["trial_ids"] == [0] and not results["held_out"]


def test_an_sft_policy_is_evaluated_on_the_trials_train_sft_evaluated(tmp_path):
    """An SFT policy folder (train_sft.py's output, its config saved beside it): the default trials are the ones
    train_sft.py scored, the suite's last sft.eval_trials (50 - 20 = 30 on), or its sft.eval_trial_start."""
    from common.config import save_config
    from models.saved import TRAIN_CONFIG
    from train_sft import Config

    torch.manual_seed(0)
    folder = tmp_path / "sft_tabletop_task0"
    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(folder))
    cfg = Config()
    save_config(cfg, str(folder / TRAIN_CONFIG), script="train_sft")
    run = ["--checkpoint", str(folder), "--trials", "2", "--max-steps", "4", "--gifs", "0", "--out-dir",
           str(tmp_path / "out")]
    results = evaluate.main(run)
    assert results["trial_ids"] == [30, 31] and results["held_out"]
    cfg.sft.eval_trial_start = 10
    save_config(cfg, str(folder / TRAIN_CONFIG), script="train_sft")
    assert evaluate.main(run)["trial_ids"] == [10, 11]


@pytest.mark.parametrize("flag, value, message", [
    ("--num-envs", "0", "--num-envs 0: must be >= 1"), ("--max-steps", "0", "--max-steps 0: must be >= 1"),
    ("--trials", "-1", "--trials -1: must be >= 1"), ("--trial-start", "-3", "--trial-start -3: must be >= 0"),
    ("--gifs", "-1", "--gifs -1: must be >= 0"), ("--temperature", "0", "--temperature 0.0: must be > 0"),
    ("--threads", "-1", "--threads -1: must be >= 0"),
])
def test_nonsense_values_stop_with_one_line(tmp_path, flag, value, message):
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", str(tmp_path / "missing"), flag, value])
    assert str(e.value) == f"error: {message}"


def test_an_unwritable_out_dir_is_refused_before_evaluating(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("x")
    monkeypatch.setattr(evaluate, "load_saved_policy", lambda *a, **k: pytest.fail("evaluated before the check"))
    with pytest.raises(SystemExit) as e:
        evaluate.main(["--checkpoint", str(tmp_path), "--out-dir", str(tmp_path / "a_file" / "out")])
    assert str(e.value).startswith(f"error: --out-dir {tmp_path}/a_file/out: cannot create it (")
    assert "choose a writable folder" in str(e.value) and "\n" not in str(e.value)


def test_the_chart_title_names_checkpoint_iteration_and_trials_uncut(tmp_path):
    results = {"checkpoint": "runs/srpo__tabletop__t0-1-2-3-4-5-6-7-8-9__s1__20260101-000000/checkpoints/iter_000120",
               "iteration": 120, "trial_range": "30-49", "trials": 20, "mean_greedy": 0.65,
               "per_task": [{"task_id": 0, "greedy": 0.65}]}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real_savefig, seen = plt.Figure.savefig, {}

    def savefig(fig, *args, **kwargs):  # the title's box must lie inside the figure
        fig.canvas.draw()
        title = fig.axes[0].title
        box = title.get_window_extent(fig.canvas.get_renderer())
        seen["text"], seen["inside"] = title.get_text(), box.x0 >= 0 and box.x1 <= fig.bbox.width
        return real_savefig(fig, *args, **kwargs)

    plt.Figure.savefig = savefig
    try:
        evaluate.write_bar_chart(results, str(tmp_path / "success.png"))
    finally:
        plt.Figure.savefig = real_savefig
    assert "(iteration 120)" in seen["text"] and "trials 30-49 (20 per task)" in seen["text"]
    assert "greedy 65.0%" in seen["text"] and seen["inside"]
