"""The update modes issue 68 adds for RLinf's and the GAE-PPO reference's recipes, with hand-computed values:
per-episode loss normalisation (algorithm.loss_agg_mode=episode-ratio, RLinf's masked_mean_ratio), padded-grid
mini-batches (train.mini_batch_unit=grid: a fixed count of optimizer steps), the Huber and plain-MSE value losses,
no dual clip (clip_ratio_c null) and the joint actor + critic gradient clip; then train_gae_ppo.py and
train_flowsar.py run with them and take the hand-counted optimizer steps."""
import math

import numpy as np
import pytest
import torch

from common.config import load_config
from common.losses import agg_loss, compute_policy_loss_vanilla, compute_value_loss, huber
from common.rollout import PolicySteps
from common.train import grid_minibatches, micro_batches
from tests.scripts import read_metrics, run_script


def rows(episode, t, **data):
    n = len(episode)
    return PolicySteps(np.asarray(episode), np.asarray(t), {"x": np.zeros((n, 1))}, ["go"] * n,
                       {k: np.asarray(v, np.float32) for k, v in data.items()})


def test_episode_ratio_is_rlinfs_masked_mean_ratio_over_the_padded_rows():
    """Episode 0 ran 10 env steps, episode 1 20, limit 40: weights 40/10 = 4 and 40/20 = 2. Six valid rows with
    losses 1..6 (episode 0: rows 1, 2; episode 1: rows 3..6) in a mini-batch of 8 grid rows (2 of them padding):
    RLinf's (loss / ratio * mask).mean() over the 8 = (4 (1 + 2) + 2 (3 + 4 + 5 + 6)) / 8 = 48 / 8 = 6.0, whatever
    the micro-batches (sizes 4 and 2 here)."""
    steps = rows([0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 2, 3], mask=np.ones((6, 1)),
                 episode_weight=[4, 4, 2, 2, 2, 2], loss=np.arange(1, 7)[:, None])
    micro = micro_batches(steps, torch.arange(6), 4, None, "episode-ratio", grid_rows=8)
    total = 0.0
    for part, weight in micro:
        mask = part.tensor("mask") * part.tensor("traj_weight")[:, None]
        total += weight * agg_loss(part.tensor("loss"), mask, "episode-ratio").item()
    assert total == pytest.approx(6.0)
    # RLinf's formula itself on the padded tensor (rlinf/utils/utils.py:352-356@a3816b5)
    loss = torch.tensor([1., 2, 3, 4, 5, 6, 9, 9])
    mask = torch.tensor([1., 1, 1, 1, 1, 1, 0, 0])
    ratio = torch.tensor([10., 10, 20, 20, 20, 20, 20, 20]) / 40
    assert (loss / ratio * mask).mean().item() == pytest.approx(6.0)


def test_episode_ratio_over_tokens_divides_by_the_rows_tokens():
    """Two tokens per row, one row of a 2-row mini-batch, weight 3, token losses 1 and 5: 3 (1 + 5) / (2 x 2) = 4.5."""
    steps = rows([0], [0], mask=np.ones((1, 2)), episode_weight=[3], loss=[[1, 5]])
    ((part, weight),) = list(micro_batches(steps, torch.arange(1), 4, None, "episode-ratio", grid_rows=2))
    mask = part.tensor("mask") * part.tensor("traj_weight")[:, None]
    assert weight * agg_loss(part.tensor("loss"), mask, "episode-ratio").item() == pytest.approx(4.5)


def test_grid_mini_batches_take_a_fixed_count_and_cover_each_valid_row_once_per_epoch():
    """3 episodes x 4 grid rows = 12 positions, 5 valid rows (episode 0: 2 steps, 1: 3 steps, 2: none); mini-batches
    of 5 positions: ceil(12 / 5) = 3 per epoch, 2 epochs = 6, whatever the valid rows; another process's 20-position
    grid makes it ceil(20 / 5) = 4 per epoch."""
    slots = np.array([0 * 4 + 0, 0 * 4 + 1, 1 * 4 + 0, 1 * 4 + 1, 1 * 4 + 2])
    torch.manual_seed(0)
    out = list(grid_minibatches(slots, 12, 5, 2, lambda x: x))
    assert len(out) == 6
    for epoch in (out[:3], out[3:]):
        assert sorted(torch.cat(epoch).tolist()) == [0, 1, 2, 3, 4]
    assert len(list(grid_minibatches(slots, 12, 5, 1, lambda x: [12, 20]))) == 4
    with pytest.raises(ValueError, match="slots must lie in"):
        list(grid_minibatches(np.array([12]), 12, 5, 1, lambda x: x))


def test_value_losses_hand_values():
    """Errors 0.5 and 3 (v - R), mean over both: half-mse (0.125 + 4.5) / 2 = 2.3125; mse (0.25 + 9) / 2 = 4.625;
    huber delta 1: 0.5 * 0.25 = 0.125 and 1 * (3 - 0.5) = 2.5 -> 1.3125. Clipped at 0.2 around v_old = v - 0.5 (the
    second row's clipped prediction v_old + 0.2 = R + 2.7: huber 2.2 < 2.5, so the max keeps 2.5)."""
    v, ret = torch.tensor([1.5, 4.0]), torch.tensor([1.0, 1.0])
    ones = torch.ones(2)
    expected = {"half-mse": 2.3125, "mse": 4.625, "huber": 1.3125}
    for kind, value in expected.items():
        loss, _ = compute_value_loss(v, ret, v, ones, None, kind=kind, huber_delta=1.0)
        assert loss.item() == pytest.approx(value), kind
    assert huber(torch.tensor([3.0]), 10.0).item() == pytest.approx(4.5)  # inside RLinf's delta 10: 0.5 e^2
    clipped, frac = compute_value_loss(v, ret, v - 0.5, ones, 0.2, kind="huber", huber_delta=1.0)
    assert clipped.item() == pytest.approx(1.3125) and frac.item() == 0.0
    with pytest.raises(ValueError, match="unknown value loss"):
        compute_value_loss(v, ret, v, ones, None, kind="l1")


def test_no_dual_clip():
    """A = -1, ratio e^2 = 7.389: clipped loss max(7.389, 1.2) = 7.389; the dual clip c = 3 caps it at 3; None keeps
    7.389 (RLinf's pi0: no clip_ratio_c, embodied_fsdp_actor_worker.py:664-668@a3816b5)."""
    old, new, adv, mask = torch.zeros(1, 1), torch.full((1, 1), 2.0), -torch.ones(1, 1), torch.ones(1, 1)
    dual, *_ , lower = compute_policy_loss_vanilla(old, new, adv, mask, clip_ratio_c=3.0)
    assert dual.item() == pytest.approx(3.0) and lower.item() == 1.0
    none, *_ , lower = compute_policy_loss_vanilla(old, new, adv, mask, clip_ratio_c=None)
    assert none.item() == pytest.approx(math.exp(2.0)) and lower.item() == 0.0


def test_joint_gradient_clip():
    """Actor gradient (3, 0), critic (0, 4): joint norm 5, clipped to 1: (0.6, 0) and (0, 0.8); separate: each to 1:
    (1, 0) and (0, 1)."""
    from train_gae_ppo import TrainConfig, clip_gradients

    def grads(mode):
        a, c = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
        a.grad, c.grad = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])
        norms = clip_gradients([a], [c], TrainConfig(grad_clip_mode=mode))
        return a.grad.tolist(), c.grad.tolist(), [float(n) for n in norms]

    a, c, norms = grads("joint")
    assert a == pytest.approx([0.6, 0.0]) and c == pytest.approx([0.0, 0.8]) and norms == pytest.approx([5.0, 5.0])
    a, c, norms = grads("separate")
    assert a == pytest.approx([1.0, 0.0]) and c == pytest.approx([0.0, 1.0]) and norms == pytest.approx([3.0, 4.0])


def test_grid_is_refused_where_not_implemented():
    from common.config import ConfigError, check_run_config
    from train_srpo import Config

    cfg = load_config(Config, None, ["train.mini_batch_unit=grid"])
    with pytest.raises(ConfigError, match="use step .* or trajectory"):
        check_run_config(cfg)


@pytest.mark.parametrize("script", ["train_gae_ppo.py", "train_flowsar.py"])
def test_scripts_take_the_grid_count_of_optimizer_steps(script, tmp_path):
    """8 episodes cut at 16 env steps; the tiny token policy's 8-action chunks: 2 grid rows per episode, 16 positions,
    mini-batches of 5 positions: ceil(16 / 5) = 4 per epoch x 2 epochs = 8 optimizer steps, however short the
    episodes (FlowSAR: 8 prompts x n 1, its tiny flow policy's chunk of 8 too). GAE-PPO with every RLinf mode on (episode-ratio, Huber, no dual clip, joint clip)."""
    import importlib
    import os

    config = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                          script[len("train_"):-3] + ".yaml")  # the script's default config file's policy
    chunk = load_config(importlib.import_module(script[:-3]).Config, config).policy.action_chunk
    per_episode = math.ceil(16 / chunk)
    expected = math.ceil(8 * per_episode / 5) * 2
    common = ["--task-id", "0", "--no-wandb", "init.mode=scratch", "env.num_envs=8", "env.max_steps=16",
              "train.iterations=1", "eval.every=0", "train.mini_batch_unit=grid"]
    if script == "train_gae_ppo.py":
        args = [*common, "rollout.prompts_per_iteration=8", "train.mini_batch_size=5", "train.update_epochs=2",
                "train.micro_batch_size=2", "algorithm.loss_agg_mode=episode-ratio", "algorithm.value_loss=huber",
                "algorithm.huber_delta=10", "algorithm.clip_ratio_c=null", "train.grad_clip_mode=joint",
                "algorithm.value_loss_coef=1.0"]
    else:
        args = [*common, "rollout.prompts_per_iteration=8", "rollout.n=1", "train.mini_batch_size=5", "train.update_epochs=2",
                "train.micro_batch_size=2"]
    run_script(script, args, tmp_path, timeout=600)
    (row,) = read_metrics(str(next((tmp_path / "runs").iterdir())))
    assert row["train/optimizer_steps"] == expected
    assert math.isfinite(row.get("train/pg_loss", row.get("train/grad_norm", 0.0)))


def test_srpo_reward_scope_round_keeps_each_round_and_process_apart():
    """Task a, prompts per round 2: round 0 (groups 0, 1 -> scope 0) two successes at (1, 0); round 1 (groups 2, 3 ->
    scope 1) two failures at (4, 0) and (6, 0). Pooled: the failures' distances 3 and 5 to the success centre, min-max
    normalised to 0 and 1 -> 0.6 expit(10 (0.5 - 0)) = 0.595984 and 0.6 expit(-5) = 0.004016. Per round (siiRL's):
    round 1 has no success, so its failures get 0."""
    from train_srpo import compute_embodied_reward, reward_scope_names

    complete = np.array([True, True, False, False])
    emb = np.array([[1.0, 0.0], [1.0, 0.0], [4.0, 0.0], [6.0, 0.0]])  # (an all-zero row: no embedding)
    groups = np.array([0, 1, 2, 3])
    assert reward_scope_names(["a"] * 4, groups, 2, "round") == ["a|0", "a|0", "a|1", "a|1"]
    pooled = compute_embodied_reward(complete, emb, reward_scope_names(["a"] * 4, groups, 2, "pooled"))
    assert pooled == pytest.approx([1.0, 1.0, 0.595984, 0.004016], abs=1e-6)
    per_round = compute_embodied_reward(complete, emb, reward_scope_names(["a"] * 4, groups, 2, "round"))
    assert per_round.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_srpo_runs_with_the_round_reward_scope(tmp_path):
    """train_srpo.py with reward.scope=round (the progress reward per (round, process) scope) runs an update with a
    finite loss and logs the reward."""
    run_script("train_srpo.py", ["--task-id", "0", "--no-wandb", "init.mode=scratch", "env.num_envs=8",
                                 "env.max_steps=16", "rollout.n=4", "rollout.prompts_per_iteration=2",
                                 "train.iterations=1", "eval.every=0", "reward.encoder.kind=pixels",
                                 "reward.encoder.num_frames=4", "reward.scope=round",
                                 "algorithm.filter_accuracy=false"], tmp_path, timeout=600)
    (row,) = read_metrics(str(next((tmp_path / "runs").iterdir())))
    assert math.isfinite(row["train/pg_loss"]) and math.isfinite(row["reward/mean"])


def test_crop_lanczos_is_the_gae_ppo_references_image_path():
    """A 256 px frame: the crop is int(256 sqrt(0.9)) = 242 px from (256 - 242) // 2 = 7, so a 7 px white border is
    (rows 0..6) is cut away entirely (all black out) and an 8 px one (row 7 kept) leaves white at the edges; a constant frame stays constant
    (Lanczos of a constant); the batch helper applies it frame by frame."""
    from models.openvla_oft import apply_image_pipeline, crop_lanczos_image

    frame = np.zeros((256, 256, 3), np.uint8)
    frame[:7], frame[-7:], frame[:, :7], frame[:, -7:] = 255, 255, 255, 255
    out = crop_lanczos_image(frame, rotate=False)
    assert out.shape == (224, 224, 3) and out.dtype == np.uint8 and out.max() == 0
    frame = np.zeros((256, 256, 3), np.uint8)
    frame[:8], frame[-8:], frame[:, :8], frame[:, -8:] = 255, 255, 255, 255
    assert crop_lanczos_image(frame, rotate=False)[0].max() > 0
    assert (crop_lanczos_image(np.full((256, 256, 3), 77, np.uint8)) == 77).all()
    board = (np.indices((256, 256)).sum(0) // 8 % 2 * 255).astype(np.uint8)[..., None].repeat(3, -1)
    batch = apply_image_pipeline(board[None], "crop_lanczos")
    assert batch.shape == (1, 224, 224, 3) and (batch == crop_lanczos_image(board, rotate=False)).all()
    assert apply_image_pipeline(board[None], "resize") is not batch  # resize: the frames as they are


def test_crop_lanczos_equals_the_references_code_on_a_random_render():
    """The reference's own steps, as its libero_rl/utils/obs_utils.py:13-45,207-231,175-205,268-273@f82c92f write them
    (copied here line by line: rotate 180 degrees, central int(h sqrt(0.9)) crop at (h - ch) // 2, PIL LANCZOS to
    224 x 224, uint8), on a random 256 px render: the same bytes as crop_lanczos_image, for the agent view and the
    wrist view alike."""
    from PIL import Image

    from models.openvla_oft import crop_lanczos_image

    rng = np.random.default_rng(0)
    for frame in rng.integers(0, 256, (2, 256, 256, 3), dtype=np.uint8):
        img = frame[::-1, ::-1].astype(np.uint8)  # get_image_from_obs(rotate=True)
        h, w = img.shape[:2]  # center_crop_image(crop_scale=0.9)
        crop_h, crop_w = int(h * np.sqrt(0.9)), int(w * np.sqrt(0.9))
        start_h, start_w = (h - crop_h) // 2, (w - crop_w) // 2
        img = img[start_h:start_h + crop_h, start_w:start_w + crop_w]
        ref = np.array(Image.fromarray(img.astype(np.uint8)).resize((224, 224), resample=Image.LANCZOS),
                       dtype=np.uint8)  # preprocess_image(method="lanczos")
        assert (crop_h, start_h) == (242, 7)
        np.testing.assert_array_equal(crop_lanczos_image(frame), ref)
