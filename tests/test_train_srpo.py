"""train_srpo.py as a user runs it (CleanRL-style subprocess tests): run folder, metrics, PNG, checkpoint, resume,
and the edge cases (all groups filtered, n = 1, missing SFT checkpoint)."""
import os
import subprocess
import sys

import pytest
from tests.scripts import read_metrics, run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFT_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")  # OpenVLA-OFT in the published layout
# a 64-wide token policy that sometimes succeeds on task 0 (~10% of sampled episodes), 0.7 MB, made by
# `python train_sft.py --task-id 0 policy.token.hidden_size=64 sft.steps=400 sft.augment_shift=0` (OMP_NUM_THREADS=1)
WEAK_START = os.path.join(ROOT, "tests", "fixtures", "tabletop_t0_weak")
FAST = ["init.mode=scratch", "env.num_envs=8", "env.max_steps=16", "rollout.n=4", "rollout.prompts_per_iteration=2",
        "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=2", "reward.encoder.num_frames=4",
        "--no-wandb"]


def run(args, tmp_path, check=True):
    return run_script("train_srpo.py", [*FAST, *args], tmp_path, check, timeout=600)


def only_run(tmp_path):
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1, runs
    return runs[0], str(tmp_path / "runs" / runs[0])


def test_smoke_two_iterations_writes_run_folder_then_resumes(tmp_path):
    warm = "train.lr_warmup_steps=1000"  # and a constant schedule: the warm-up alone sets the lr below
    run(["--task-id", "0", "train.iterations=2", "train.lr_schedule=constant", "log.checkpoint_every=1",
         "algorithm.filter_accuracy=false", warm], tmp_path)
    name, run_dir = only_run(tmp_path)
    assert name.startswith("srpo__tabletop__t0__s1__")
    with open(os.path.join(run_dir, "config.yaml")) as f:
        text = f.read()
    assert "n: 4" in text and "filter_accuracy: false" in text and "suite: tabletop" in text
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # row 0: the start evaluated, at 0 env steps
    assert rows[0]["charts/env_steps"] == 0 and 0.0 <= rows[0]["val/success_rate"] <= 1.0
    for r in rows[1:]:  # filter off: the update ran on every episode, all of which failed from scratch
        assert r["train/skipped_update"] == 0.0 and r["sampling/kept_fraction"] == 1.0
        # all-fail groups: zero advantages, the only learning signal (entropy_coeff 0, no KL), so exactly no gradient:
        # a loss term that leaks in at coefficient 0, or anything but the advantage weighting the log-probs, fails it
        assert r["train/advantage_abs_mean"] == 0.0 and r["train/pg_loss"] == 0.0 and r["train/grad_norm"] == 0.0
        assert r["rollout/success_rate"] == 0.0 and 0.0 <= r["val/success_rate"] <= 1.0
        assert r["rollout/mean_length"] == 16 and r["charts/SPS"] > 0
        # 16 policy steps = one mini-batch of one epoch: the old log-probs are the update's own forward, detached (no
        # separate pass), so the ratio is exactly 1; a separate pass differs in the last bits (batching)
        assert r["train/ppo_kl"] == 0.0 and r["train/pg_clipfrac"] == 0.0 and "time/old_log_prob" in r
    assert os.path.isfile(tmp_path / "plots" / name / "training_curves.png")
    ckpts = sorted(os.listdir(os.path.join(run_dir, "checkpoints")))
    assert ckpts == ["iter_000001", "iter_000002"]
    assert os.path.isfile(os.path.join(run_dir, "checkpoints", "iter_000002", "policy", "model.safetensors"))

    out = run(["--task-id", "0", "train.iterations=3", "algorithm.filter_accuracy=false", warm, "--resume", run_dir],
              tmp_path)
    assert "resumed at iteration 2" in out.stdout
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    lrs = [r["train/lr"] for r in rows[1:]]  # linear warmup, continued (not restarted) after the resume
    steps = lrs[0] / 1e-4 * 1000  # optimizer steps taken in iteration 1 (config lr 1e-4)
    assert 0 < lrs[0] < lrs[1] < lrs[2] < 1e-4 and lrs[2] - lrs[1] == pytest.approx(lrs[1] - lrs[0], rel=0.5)
    assert steps == pytest.approx(round(steps))
    assert "iter_000003" in os.listdir(os.path.join(run_dir, "checkpoints"))


@pytest.mark.slow
def test_update_with_non_zero_advantages_moves_the_policy(tmp_path):
    """From a start that sometimes succeeds: 8 groups of 8 sampled episodes (P(no success at all) ~ 0.1% at ~10%),
    SRPO's rewards (success 1, failures their world-model progress in (0, 1)), groups with mixed outcomes kept,
    normalised advantages, two PPO epochs. The advantages reach the loss and the gradient; the second epoch sees a
    policy the first one moved (PPO KL and ratio off 1); with lr 0 the same run's second epoch sees the old policy."""
    common = ["--task-id", "0", "init.mode=checkpoint", f"init.path={WEAK_START}", "train.iterations=1", "eval.every=0",
              "env.max_steps=null", "env.num_envs=16", "rollout.n=8", "rollout.prompts_per_iteration=8",
              "train.update_epochs=2", "train.lr_warmup_steps=0"]
    rows = {}
    for lr in ("1e-3", "0"):
        out = tmp_path / f"lr{lr}"
        run([*common, f"train.lr={lr}"], out)
        (rows[lr],) = read_metrics(only_run(out)[1])
    r = rows["1e-3"]
    assert 0 < r["rollout/success_rate"] < 1 and r["sampling/kept_groups"] >= 1, r  # some groups have mixed outcomes
    assert 0 < r["reward/failure_mean"] < 1, r  # failures graded by progress, below a success's 1
    assert r["train/advantage_abs_mean"] > 0.1 and r["train/grad_norm"] > 0, r
    assert abs(r["train/ppo_kl"]) > 1e-3, r  # epoch 2's log-probs differ from the rollout's: the update moved them
    zero = rows["0"]  # the same rollouts (seeded before the update), nothing stepped
    for k in ("rollout/success_rate", "sampling/kept_groups", "train/advantage_abs_mean"):
        assert zero[k] == r[k], k
    assert zero["train/grad_norm"] > 0 and abs(zero["train/ppo_kl"]) < 1e-6, zero


@pytest.mark.slow
def test_cosine_lr_schedule_decays_over_the_run(tmp_path):
    run(["--task-id", "0", "train.iterations=3", "algorithm.filter_accuracy=false", "train.lr_warmup_steps=0",
         "train.lr_schedule=cosine", "train.lr=1e-3"], tmp_path)
    _, run_dir = only_run(tmp_path)
    lrs = [r["train/lr"] for r in read_metrics(run_dir)[1:]]
    # every step of iteration i at 1e-3 * (1 + cos(pi * i / 3)) / 2, i = 0, 1, 2 (common/train.py optimizer_step)
    assert lrs == pytest.approx([1e-3, 0.75e-3, 0.25e-3], rel=1e-9)
    out = run(["--task-id", "0", "train.lr_schedule=linear"], tmp_path, check=False)
    assert out.returncode != 0 and "train.lr_schedule='linear': use constant or cosine" in out.stderr


def test_every_group_filtered_out_skips_the_update(tmp_path):
    run(["--task-id", "1", "train.iterations=1", "eval.every=0", "reward.encoder.kind=pixels"], tmp_path)
    _, run_dir = only_run(tmp_path)
    (row,) = read_metrics(run_dir)
    assert row["sampling/kept_groups"] == 0 and row["train/skipped_update"] == 1.0
    assert "train/pg_loss" not in row


def test_refill_to_the_cap_then_trajectory_mini_batches(tmp_path):
    """rollout.refill: from scratch every episode fails, the filter drops every group, so the iteration rolls out
    rollout.max_rounds = 3 rounds of 2 prompts x 4 (6 groups seen, 3 x 8 x 16 = 384 env steps counted) and skips the
    update. Filter off: the quota (2 groups) is kept in round 1, and train.mini_batch_unit=trajectory with 2 episodes
    per mini-batch gives 8 / 2 = 4 optimizer steps (warm-up lr = 1e-4 x (4 + 1) / 1000), traj-token-mean aggregated."""
    refill = ["--task-id", "0", "train.iterations=1", "eval.every=0", "rollout.refill=true", "rollout.max_rounds=3",
              "train.mini_batch_unit=trajectory", "train.mini_batch_size=2", "train.micro_batch_size=3",
              "algorithm.loss_agg_mode=traj-token-mean", "train.lr_warmup_steps=1000", "reward.encoder.kind=pixels"]
    run(refill, tmp_path / "cap")
    _, run_dir = only_run(tmp_path / "cap")
    (row,) = read_metrics(run_dir)
    assert row["sampling/rounds"] == 3 and row["sampling/groups"] == 6 and row["rollout/env_steps"] == 384
    assert row["sampling/kept_groups"] == 0 and row["sampling/trained_groups"] == 0
    assert row["train/skipped_update"] == 1.0 and "train/pg_loss" not in row
    run([*refill, "algorithm.filter_accuracy=false"], tmp_path / "quota")
    _, run_dir = only_run(tmp_path / "quota")
    (row,) = read_metrics(run_dir)
    assert row["sampling/rounds"] == 1 and row["sampling/trained_groups"] == 2 and row["rollout/env_steps"] == 128
    assert row["train/skipped_update"] == 0.0 and row["train/lr"] == pytest.approx(1e-4 * 5 / 1000)


def test_logged_entropy_and_loss_mean_the_same_under_every_loss_agg_mode(tmp_path):
    """One mini-batch of all 16 episodes (one optimizer step, on-policy: ratio 1, so pg_loss = -agg(advantages)) in
    micro-batches of 3 steps: train/entropy is the executed tokens' mean entropy, the same forwards under token-mean
    and traj-token-mean; under traj-token-mean pg_loss = -(mean over episodes of each one's constant advantage) = 0,
    since GRPO's advantages sum to 0 over each group's episodes; under token-mean it is minus the executed tokens'
    mean advantage, != 0 (long failures weigh more)."""
    common = ["--task-id", "0", "train.iterations=1", "eval.every=0", "algorithm.filter_accuracy=false",
              "reward.encoder.kind=pixels", "train.mini_batch_unit=trajectory", "train.mini_batch_size=16",
              "train.micro_batch_size=3", "init.mode=checkpoint", f"init.path={WEAK_START}", "env.max_steps=null",
              "rollout.prompts_per_iteration=4"]
    rows = {}
    for mode in ("token-mean", "traj-token-mean"):
        run([*common, f"algorithm.loss_agg_mode={mode}"], tmp_path / mode)
        (rows[mode],) = read_metrics(only_run(tmp_path / mode)[1])
    token, traj = rows["token-mean"], rows["traj-token-mean"]
    assert token["train/optimizer_steps"] == traj["train/optimizer_steps"] == 1
    assert token["reward/mean"] == traj["reward/mean"] and token["train/advantage_abs_mean"] > 0.1
    assert traj["train/entropy"] == pytest.approx(token["train/entropy"], rel=1e-6) and token["train/entropy"] > 0.01
    assert abs(traj["train/pg_loss"]) < 1e-6 < abs(token["train/pg_loss"])
    # token-mean's on-policy loss is minus the executed tokens' mean advantage (the logged signed mean)
    assert token["train/pg_loss"] == pytest.approx(-token["train/advantage_token_mean"], rel=1e-5)


@pytest.mark.slow
def test_refill_is_deterministic_and_resumes_exactly(tmp_path):
    """From a start that sometimes succeeds, refill rounds depend on the outcomes: two iterations straight, and one
    then --resume to two, log the same second iteration (rounds, kept groups, env steps of all rounds, losses): the
    prompt RNG and the rollouts' torch RNG are saved with the checkpoint."""
    common = ["--task-id", "0", "init.mode=checkpoint", f"init.path={WEAK_START}", "env.max_steps=null",
              "eval.every=0", "reward.encoder.kind=pixels", "rollout.refill=true", "rollout.max_rounds=4",
              "train.mini_batch_unit=trajectory", "train.mini_batch_size=2",
              "algorithm.loss_agg_mode=traj-token-mean", "log.checkpoint_every=1"]
    run([*common, "train.iterations=2"], tmp_path / "straight")
    run([*common, "train.iterations=1"], tmp_path / "resumed")
    _, run_dir = only_run(tmp_path / "resumed")
    run([*common, "train.iterations=2", "--resume", run_dir], tmp_path / "resumed")
    keys = ("sampling/rounds", "sampling/kept_groups", "rollout/env_steps", "train/pg_loss", "train/grad_norm")
    rows = [read_metrics(only_run(tmp_path / name)[1])[-1] for name in ("straight", "resumed")]
    assert rows[0]["iteration"] == rows[1]["iteration"] == 2 and "train/pg_loss" in rows[0]
    assert [rows[0].get(k) for k in keys] == [rows[1].get(k) for k in keys]


@pytest.mark.slow
def test_shuffled_scores_resume_exactly_and_the_env_step_budget_stops_the_run(tmp_path):
    """reward.shuffle: the first iteration's rollouts are the unshuffled run's (the permutations have their own stream),
    so its success and logged reward mean agree (the permutation itself: the test above); one iteration then --resume to two logs the
    straight run's second iteration (its generator is saved with the checkpoint). train.total_timesteps=1 stops a
    10-iteration run after its first iteration, evaluated and saved."""
    common = ["--task-id", "0", "init.mode=checkpoint", f"init.path={WEAK_START}", "env.max_steps=null",
              "eval.every=0", "reward.encoder.kind=pixels", "rollout.refill=true", "rollout.max_rounds=4",
              "train.mini_batch_unit=trajectory", "train.mini_batch_size=2",
              "algorithm.loss_agg_mode=traj-token-mean", "log.checkpoint_every=1"]
    out = run([*common, "train.iterations=2", "reward.shuffle=true"], tmp_path / "straight")
    assert "shuffled within groups (control)" in out.stdout
    run([*common, "train.iterations=1", "reward.shuffle=true"], tmp_path / "resumed")
    _, run_dir = only_run(tmp_path / "resumed")
    run([*common, "train.iterations=2", "--resume", run_dir], tmp_path / "resumed")
    run([*common, "train.iterations=1"], tmp_path / "true")
    keys = ("sampling/rounds", "rollout/env_steps", "reward/mean", "train/pg_loss", "train/grad_norm")
    straight, resumed, true = (read_metrics(only_run(tmp_path / name)[1]) for name in ("straight", "resumed", "true"))
    assert [straight[-1].get(k) for k in keys] == [resumed[-1].get(k) for k in keys] and straight[-1]["iteration"] == 2
    first = straight[0]
    assert first["rollout/success_rate"] == true[0]["rollout/success_rate"]
    assert first["reward/mean"] == true[0]["reward/mean"] and first["rollout/env_steps"] == true[0]["rollout/env_steps"]
    out = run([*common, "train.iterations=10", "train.total_timesteps=1", "eval.every=5", "eval.trials_per_task=1",
               "eval.samples_per_trial=0"], tmp_path / "budget")
    assert "stops at 1 env steps" in out.stdout
    rows = read_metrics(only_run(tmp_path / "budget")[1])
    assert [r["iteration"] for r in rows] == [0, 1] and "val/success_rate" in rows[1]  # evaluated at its end
    assert sorted(os.listdir(os.path.join(only_run(tmp_path / "budget")[1], "checkpoints"))) == ["iter_000001"]


def test_group_of_one_is_refused_with_the_reason():
    from common.config import ConfigError, load_config
    from train_srpo import Config, check_config

    with pytest.raises(ConfigError, match=r"rollout.n=1: GRPO needs n >= 2 samples per prompt"):
        check_config(load_config(Config, os.path.join(ROOT, "configs/srpo.yaml"), ["rollout.n=1"]))
    with pytest.raises(ConfigError, match=r"use_kl_loss needs policy.lora_rank > 0"):
        check_config(load_config(Config, None, ["algorithm.use_kl_loss=true"]))


def test_bad_task_id_and_unknown_key(tmp_path):
    out = run(["--task-id", "12"], tmp_path, check=False)
    assert out.returncode != 0 and "task id 12 is out of range: suite 'tabletop' has task ids 0..9" in out.stderr
    out = run(["--task-id", "0", "algorithm.clip_ratio_hihg=0.3"], tmp_path, check=False)
    assert out.returncode != 0 and "did you mean 'algorithm.clip_ratio_high'" in out.stderr


@pytest.mark.real_libero
def test_libero_config_end_to_end_one_short_iteration(tmp_path):
    """configs/srpo_libero.yaml on the real simulator with the tiny OpenVLA-OFT folder in the published layout (the
    config's policy family) and its observation protocol (256 px render, JPEG round trip, Lanczos, centre crop, no
    wrist camera): 2 workers, 16 steps, one iteration."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_SILENT="true")
    out = subprocess.run(
        [sys.executable, "train_srpo.py", "--config", "configs/srpo_libero.yaml", "--task-id", "0", "--no-wandb",
         "init.mode=checkpoint", f"init.path={OFT_TINY}", "policy.lora_rank=4", "policy.bf16_weights=false",
         "policy.unnorm_key=libero_10", "env.num_envs=2", "env.max_steps=16", "env.fast_render=true",
         "eval.protocol=heldout",  # a 16-step smoke run is not siiRL's protocol
         "rollout.n=2", "rollout.prompts_per_iteration=1", "reward.encoder.kind=pixels",
         "algorithm.filter_accuracy=false", "train.iterations=1", "eval.every=0", "train.mini_batch_size=4",
         "train.micro_batch_size=4", f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    name, run_dir = only_run(tmp_path)
    assert name.startswith("srpo__libero_spatial__t0__s1__")
    (row,) = read_metrics(run_dir)
    assert row["rollout/env_steps"] == 32 and row["rollout/mean_length"] == 16 and "train/pg_loss" in row
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", "iter_000001", "policy"))
    with open(os.path.join(run_dir, "config.yaml")) as f:
        text = f.read()
    assert "type: openvla_oft" in text and "image_pipeline: libero" in text and "image_size: 256" in text
    assert "wrist_camera: false" in text and "unnorm_key: libero_10" in text


def test_auto_sft_trains_the_missing_warm_start_first(tmp_path):
    """init.mode=auto_sft (the README's main command): train_sft.py runs first and writes the checkpoint RL loads."""
    sft = tmp_path / "sft"
    out = run(["--task-id", "0", "init.mode=auto_sft", f"init.path={sft}", "train.iterations=1", "eval.every=0",
               "init.sft_args=[sft.steps=5,sft.eval_trials=2,sft.num_demos=2]"], tmp_path)
    assert f"no SFT checkpoint at {sft}; running: python train_sft.py --task-ids 0" in out.stdout
    assert os.path.isfile(sft / "model.safetensors") and os.path.isfile(sft / "train_config.yaml")
    runs = sorted(os.listdir(tmp_path / "runs"))  # the SFT run sits beside the RL run
    assert [r.split("__")[0] for r in runs] == ["srpo", "train_sft"], runs
    assert [r["iteration"] for r in read_metrics(str(tmp_path / "runs" / runs[0]))] == [1]


@pytest.mark.slow
def test_lora_with_kl_to_the_adapter_free_reference(tmp_path):
    """policy.lora_rank > 0 and algorithm.use_kl_loss: reference log-probs come from the same model with adapters off.
    Fresh LoRA (B = 0) starts equal to the reference: KL ~0 in iteration 1. The entropy bonus moves the adapters, so in
    iteration 2 the policy is away from the reference: the KL grows. Were the reference the current policy (adapters
    left on), iteration 2's KL would stay ~0 as well."""
    run(["--task-id", "0", "train.iterations=2", "eval.every=0", "policy.lora_rank=4", "algorithm.use_kl_loss=true",
         "algorithm.kl_loss_coef=0.1", "algorithm.filter_accuracy=false", "reward.encoder.kind=pixels",
         "algorithm.entropy_coeff=0.1", "train.lr=1e-2", "train.lr_warmup_steps=0"], tmp_path)
    _, run_dir = only_run(tmp_path)
    first, second = read_metrics(run_dir)
    assert 0.0 <= first["train/kl_loss"] < 1e-6 and first["train/grad_norm"] > 0.0
    assert second["train/kl_loss"] > 1e-4


def test_reward_shuffle_permutes_scores_within_groups_so_advantages_are_a_permutation_of_the_true_ones():
    """The control arm (reward.shuffle): group 3 scores [1, 0, 0, 0] (GRPO advantages 1.5, -0.5, -0.5, -0.5: mean 0.25,
    std 0.5), group 7 [0.2, 1, 1, 0.2] (advantages -+0.866: mean 0.6, std 0.462). After the shuffle each group holds
    the same scores, so the logged reward mean (0.425) and each group's advantages as a set are unchanged, while
    which episode gets the success is uniform over the group; the same generator state gives the same permutation
    (what a resume restores)."""
    import numpy as np
    import torch

    from common.advantages import compute_advantage
    from common.advantages import shuffle_within_groups

    scores = np.array([1.0, 0.0, 0.0, 0.0, 0.2, 1.0, 1.0, 0.2])
    groups = np.array([3, 3, 3, 3, 7, 7, 7, 7])

    def advantages(x):
        adv, _ = compute_advantage("grpo", torch.as_tensor(x, dtype=torch.float32), torch.ones(8, 2), groups.tolist())
        return adv[:, 0].numpy()

    true = advantages(scores)
    assert true[:4] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert true[4:] == pytest.approx([-0.866, 0.866, 0.866, -0.866], abs=1e-3)
    rng = np.random.default_rng([1, 0, 1])
    where = np.zeros(4)
    for _ in range(200):
        state = rng.bit_generator.state
        shuffled = shuffle_within_groups(scores, groups, rng)
        again = np.random.default_rng(0)
        again.bit_generator.state = state  # a resumed run's generator
        assert (shuffle_within_groups(scores, groups, again) == shuffled).all()
        assert sorted(shuffled[:4]) == [0, 0, 0, 1] and sorted(shuffled[4:]) == [0.2, 0.2, 1, 1]
        assert shuffled.mean() == pytest.approx(0.425)
        assert sorted(advantages(shuffled)) == pytest.approx(sorted(true), abs=1e-6)
        where += shuffled[:4]
    assert (scores == [1.0, 0.0, 0.0, 0.0, 0.2, 1.0, 1.0, 0.2]).all()  # the input is not modified
    assert where.sum() == 200 and where.min() >= 25 and where.max() <= 80  # ~50 each: uniform over the group


def test_reward_shuffle_and_env_step_budget_keys_have_defaults_help_and_ranges():
    from common.config import ConfigError, check_ranges, field_comments, load_config
    from train_srpo import Config, RewardConfig, TrainConfig

    cfg = load_config(Config, None, [])
    assert cfg.reward.shuffle is False and cfg.train.total_timesteps is None
    assert field_comments(RewardConfig)["shuffle"].startswith("control arm")
    assert "env steps" in field_comments(TrainConfig)["total_timesteps"]
    with pytest.raises(ConfigError, match="train.total_timesteps"):
        check_ranges(load_config(Config, None, ["train.total_timesteps=0"]))


def test_a_cosine_run_resumed_with_a_new_length_says_its_step_follows_the_new_curve(tmp_path):
    from train_srpo import cosine_resume_note
    (tmp_path / "config.yaml").write_text("train:\n  iterations: 2\n  lr_schedule: cosine\n")
    assert cosine_resume_note(str(tmp_path), 2) is None  # same length: the same curve, nothing to say
    note = cosine_resume_note(str(tmp_path), 4)
    assert note.startswith("note: train.lr_schedule=cosine") and "resumed with 4 instead of 2" in note
