"""train_gae_ppo.py: the script's pure pieces with hand-computed values (truncation bootstrap, values per policy step,
two optimizers), then the script as a user runs it (CleanRL-style subprocess tests): run folder, metric and PNG names,
exact resume, freeze_vla_for_critic, the env-step budget, the value-free baseline, bad input, 2 processes, LIBERO."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common.config import load_config
from common.rollout import collect_rollouts
from envs import EnvConfig, make_vector_env
from models import TokenPolicy, TokenPolicyConfig, ValueHead, ValueHeadConfig
from models.policy import PolicyFamily
from tests.scripts import read_metrics, run_script
from train_gae_ppo import (Config, check_config, chunk_mean, explained_variance, gae_advantages, make_optimizers,
                           per_action, record_values, TrainConfig)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", WANDB_MODE="offline", WANDB_SILENT="true")
OFT_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")  # OpenVLA-OFT in the published layout
OFT_L1_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft_l1")  # the official L1 layout
FAST = ["init.mode=scratch", "env.num_envs=8", "env.max_steps=16", "rollout.prompts_per_iteration=8",
        "eval.every=1", "eval.trials_per_task=2", "eval.samples_per_trial=2", "train.lr_warmup_steps=1",
        "--no-wandb"]
SEED_METRICS = ["train/pg_loss", "train/value_loss", "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm",
                "train/critic_grad_norm", "rollout/success_rate", "rollout/mean_length", "val/success_rate",
                "train/explained_variance", "charts/env_steps"]


# ---- pure pieces, hand-computed values --------------------------------------------------------------------------
def test_truncation_bootstraps_from_the_last_value_termination_does_not():
    """Two 2-step episodes, rewards 0, V = [0.5, 0.6], gamma 0.9, lambda 0.8; V(s_last) = 1.0.
    terminated: d1 = 0 - 0.6 = -0.6 -> A1 = -0.6; d0 = 0.9*0.6 - 0.5 = 0.04 -> A0 = 0.04 + 0.72*(-0.6) = -0.392.
    truncated:  d1 = 0.9*1.0 - 0.6 = 0.3 -> A1 = 0.3; A0 = 0.04 + 0.72*0.3 = 0.256. returns = A + V."""
    rewards, values = np.zeros((2, 3)), np.array([[0.5, 0.6, 0.0], [0.5, 0.6, 0.0]])
    dones = np.array([[False, True, False]] * 2)
    mask = np.array([[True, True, False]] * 2)
    adv, ret = gae_advantages(rewards, values, dones, mask, np.array([False, True]), np.array([7.0, 1.0]),
                              gamma=0.9, gae_lambda=0.8, normalize=False)
    np.testing.assert_allclose(adv, [[-0.392, -0.6, 0.0], [0.256, 0.3, 0.0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.108, 0.0, 0.0], [0.756, 0.9, 0.0]], atol=1e-6)
    # the terminated episode ignored its last_value (7.0); episodes do not leak into each other: the second alone
    alone, _ = gae_advantages(rewards[1:], values[1:], dones[1:], mask[1:], np.array([True]), np.array([1.0]),
                              0.9, 0.8, False)
    np.testing.assert_allclose(alone, adv[1:], atol=1e-7)
    # normalised over the 4 valid steps only (the padded step stays 0)
    norm, _ = gae_advantages(rewards, values, dones, mask, np.array([False, True]), np.array([7.0, 1.0]), 0.9, 0.8,
                             True)
    valid = np.array([-0.392, -0.6, 0.256, 0.3])
    np.testing.assert_allclose(norm[mask], (valid - valid.mean()) / valid.std(), atol=1e-5)
    assert norm[0, 2] == 0.0 and norm[1, 2] == 0.0


def test_value_free_baseline_is_discounted_reward_to_go():
    """V = 0, lambda = 1: A_t = sum_k gamma^k r_{t+k} within the episode; success at the 3rd step, gamma 0.5:
    [0.25, 0.5, 1.0]; a failed (truncated) episode gets zeros (no value to bootstrap from)."""
    rewards = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    dones = np.array([[False, False, True]] * 2)
    adv, ret = gae_advantages(rewards, np.zeros((2, 3)), dones, np.ones((2, 3), bool), np.array([False, True]),
                              np.zeros(2), gamma=0.5, gae_lambda=1.0, normalize=False)
    np.testing.assert_allclose(adv, [[0.25, 0.5, 1.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(ret, adv)


def test_explained_variance_hand_values():
    assert explained_variance(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0])) == 1.0
    # residual [1, -1, 0] has var 2/3, y var 2/3 -> 0; a constant target -> NaN
    assert explained_variance(np.array([0.0, 3.0, 3.0]), np.array([1.0, 2.0, 3.0])) == pytest.approx(0.0)
    assert np.isnan(explained_variance(np.array([1.0, 2.0]), np.array([5.0, 5.0])))


class ExpertWithHidden(PolicyFamily):  # a token family: PolicyFamily.rollout_step calls act
    """The scripted expert behind the token-policy API (chunk 1), whose 'hidden state' is the observation's 8-D
    robot state, so a recorded value can be traced to the observation it was computed from."""

    action_chunk = 1
    kind, model_space_samples = "token", False  # the policy interface (models/policy.py)

    def __init__(self, env, fail_tasks=()):
        self.env, self.fail_tasks = env, set(fail_tasks)

    def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
        core = self.env.core  # the rollout calls the policy for a subset of the envs: find them by their view
        active = [int(np.flatnonzero(~core.done & (core.agentview == view).all((1, 2, 3)))[0])
                  for view in obs["agentview"]]
        a = self.env.expert_action()[active]
        fail = np.isin(self.env.core.task_id[active], list(self.fail_tasks))
        a[fail] = 0.0  # sway left and right: never succeeds, runs to max_steps
        a[fail, 0] = 0.5 * (-1.0) ** self.env.core.steps[active][fail]
        b = len(instructions)
        out = (a[:, None, :], torch.zeros(b, 7, dtype=torch.long), torch.zeros(b, 7))
        return out + (self.hidden(obs, instructions),) if return_hidden else out

    def hidden(self, obs, instructions):
        return torch.as_tensor(obs["state"], dtype=torch.float32)


def test_values_recorded_per_policy_step_align_with_rewards_and_dones():
    env = make_vector_env(EnvConfig(num_envs=4, max_steps=40), seed=0)
    policy = ExpertWithHidden(env, fail_tasks={1})
    batch = collect_rollouts(env, policy, [0, 1], [0, 1], n_samples=2, keep_hidden=True, progress=False)
    assert batch.complete.tolist() == [True, True, False, False] and batch.truncated.tolist() == [False, False,
                                                                                                   True, True]
    torch.manual_seed(0)
    head = ValueHead(8, ValueHeadConfig(hidden_dims=[16]))
    values, last_values = record_values(policy, head, batch, "cpu", chunk_size=3)
    mask = batch.step_mask
    with torch.no_grad():
        expected = head(torch.as_tensor(batch.obs["state"][mask])).numpy()  # V of the observation each step acted in
    np.testing.assert_allclose(values[mask], expected, rtol=1e-6)
    assert (values[~mask] == 0).all() and (values[mask] != 0).all()
    for b in range(4):
        last = batch.valid_steps[b] - 1
        assert np.flatnonzero(batch.dones[b]).tolist() == [last]  # one done, at the last valid step
        assert batch.rewards[b].sum() == batch.rewards[b, last] == float(batch.complete[b])  # reward there only
    with torch.no_grad():  # V(s_last) of the truncated ones: the observation *after* the last step, not the last one
        v_after = head(torch.as_tensor(batch.last_obs["state"][2:])).numpy()
    np.testing.assert_allclose(last_values, [0.0, 0.0, *v_after], rtol=1e-6)
    assert not np.allclose(batch.last_obs["state"][2], batch.obs["state"][2, batch.valid_steps[2] - 1])
    adv, ret = gae_advantages(batch.rewards, values, batch.dones, mask, batch.truncated, last_values, 0.99, 0.95, False)
    for b in range(4):  # last step: success -> 1 - V; truncated -> 0.99 V(s_last) - V
        last = batch.valid_steps[b] - 1
        target = 1.0 if b < 2 else 0.99 * last_values[b]
        assert adv[b, last] == pytest.approx(target - values[b, last], abs=1e-6)
        np.testing.assert_allclose(ret[b][mask[b]], (adv + values)[b][mask[b]], atol=1e-6)


TINY = dict(hidden_size=32, num_layers=1, num_heads=2)


def tiny_update_inputs(seed=0):
    from tests.test_models_token_policy import INSTR, make_obs

    torch.manual_seed(seed)
    policy = TokenPolicy(TokenPolicyConfig(**TINY))
    head = ValueHead(policy.hidden_size, ValueHeadConfig(hidden_dims=[16, 8]))
    obs, instr = make_obs(4, 64, seed=seed), [INSTR[0]] * 4
    tokens = torch.randint(0, 256, (4, policy.action_chunk * 7))
    return policy, head, obs, instr, tokens


def test_two_optimizers_step_their_own_parameters_only():
    policy, head, obs, instr, tokens = tiny_update_inputs()
    actor_params, critic_params, actor, critic, _ = make_optimizers(policy, head, TrainConfig(lr=1e-2,
                                                                                           critic_lr=1e-2,
                                                                                           lr_warmup_steps=0))
    assert {id(p) for g in actor.param_groups for p in g["params"]} == {id(p) for p in actor_params}
    assert {id(p) for g in critic.param_groups for p in g["params"]} == {id(p) for p in head.parameters()}
    assert not {id(p) for p in actor_params} & {id(p) for p in critic_params}
    assert actor.param_groups[0]["lr"] == 1e-2 and critic.param_groups[0]["lr"] == 1e-2
    log_prob, _, hidden = policy.log_prob(obs, instr, tokens, return_hidden=True)
    (-log_prob.mean() + head(hidden).pow(2).mean()).backward()  # gradients on both sides
    before = [p.detach().clone() for p in actor_params + critic_params]
    critic.step()
    after = [p.detach() for p in actor_params + critic_params]
    n = len(actor_params)
    assert all(torch.equal(a, b) for a, b in zip(before[:n], after[:n]))  # the policy did not move
    assert all(not torch.equal(a, b) for a, b in zip(before[n:], after[n:]))  # every value-head tensor did
    mid = [p.detach().clone() for p in actor_params + critic_params]
    actor.step()
    assert all(torch.equal(a, b) for a, b in zip(mid[n:], [p.detach() for p in critic_params]))
    assert any(not torch.equal(a, b.detach()) for a, b in zip(mid[:n], actor_params))
    # without GAE there is no critic at all
    _, no_params, _, no_critic, _ = make_optimizers(policy, None, TrainConfig())
    assert no_params == [] and no_critic is None


def test_gae_unit_action_discounts_per_env_action_with_the_chunks_value():
    """One episode of 5 env actions in chunks of 3 (executed 3, then 2), success reward 1 at the end, V = 0.5 for the
    first chunk's state, 0.8 for the second's; gamma 0.9, lambda 1 (A = discounted return - V).
    gae_unit=action: actions' rewards 0 0 0 0 1, returns 0.9^4 .. 1 = 0.6561 0.729 0.81 0.9 1, advantages minus each
    action's chunk value: 0.1561 0.229 0.31 0.1 0.2; the value target of a step = the mean of its actions' returns:
    0.7317, 0.95. gae_unit=step: returns 0.9, 1 -> advantages 0.4, 0.2."""
    step_mask, executed = np.array([[True, True]]), np.array([[3, 2]])
    values, rewards, dones = np.array([[0.5, 0.8]], np.float32), np.array([[0.0, 1.0]], np.float32), \
        np.array([[False, True]])
    a_rewards, a_values, a_dones, mask = per_action(rewards, values, dones, step_mask, executed, 3)
    assert a_rewards.tolist() == [[0, 0, 0, 0, 1, 0]] and a_dones.tolist() == [[0, 0, 0, 0, 1, 0]]
    assert a_values[0].tolist() == pytest.approx([0.5, 0.5, 0.5, 0.8, 0.8, 0]) and mask.sum() == 5
    none = np.array([False])
    adv, ret = gae_advantages(a_rewards, a_values, a_dones, mask, none, np.zeros(1), 0.9, 1.0, normalize=False)
    assert adv[0].tolist() == pytest.approx([0.1561, 0.229, 0.31, 0.1, 0.2, 0], abs=1e-6)
    per_step = ret.reshape(1, 2, 3).sum(-1) / executed
    assert per_step[0].tolist() == pytest.approx([(0.6561 + 0.729 + 0.81) / 3, 0.95], abs=1e-6)
    adv, _ = gae_advantages(rewards, values, dones, step_mask, none, np.zeros(1), 0.9, 1.0, normalize=False)
    assert adv[0].tolist() == pytest.approx([0.4, 0.2], abs=1e-6)
    shaped = per_action(rewards, values, dones, step_mask, executed, 3, step_penalty=0.5)[0]  # -0.5 per action
    assert shaped[0].tolist() == pytest.approx([-0.5, -0.5, -0.5, -0.5, 0.5, 0])


def test_ratio_unit_step_is_one_ratio_per_policy_step_from_the_chunks_mean_log_prob():
    """Two policy steps of 2 tokens, advantage 1, clip 0.2. Per token (ratio_unit=token): ratios e^1 (clipped: -1.2),
    e^-1 (-0.368), 1, 1 -> token mean (-1.2 - 0.3679 - 1 - 1) / 4 = -0.8920. Per step: the chunk means -2 vs -2 and
    -2 vs -2 give ratio 1 on every token -> -1, and ppo_kl 0."""
    from common.losses import compute_policy_loss_vanilla

    log_prob = torch.tensor([[-1.0, -3.0], [-2.0, -2.0]])
    old = torch.full((2, 2), -2.0)
    adv, mask = torch.ones(2, 2), torch.ones(2, 2)
    token = compute_policy_loss_vanilla(old, log_prob, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert token[0].item() == pytest.approx((-1.2 - math.exp(-1) - 2) / 4, abs=1e-6)
    assert chunk_mean(log_prob).tolist() == [[-2.0, -2.0], [-2.0, -2.0]]
    step = compute_policy_loss_vanilla(chunk_mean(old), chunk_mean(log_prob), adv, mask, clip_ratio_low=0.2,
                                       clip_ratio_high=0.2)
    assert step[0].item() == pytest.approx(-1.0) and step[2].item() == 0.0


@pytest.mark.parametrize("override, message", [
    ("train.total_timesteps=0", "train.total_timesteps=0 (--timesteps): must be >= 1 env step"),
    ("train.lr=-1e-5", "train.lr=-1e-05: must be in [0, inf)"),
    ("train.critic_lr=-0.1", "train.critic_lr=-0.1: must be in [0, inf)"),
    ("value_head.hidden_dims=[0,128]", "value_head.hidden_dims=[0, 128]: algorithm.use_gae needs a value head"),
    ("value_head.hidden_dims=[]", "value_head.hidden_dims=[]: algorithm.use_gae needs a value head"),
    ("train.critic_warmup_iterations=2", None),
    ("algorithm.negative_clip_band=flipped", "algorithm.negative_clip_band='flipped': use one of same, swapped"),
    ("algorithm.log_ratio_clamp=0", "algorithm.log_ratio_clamp=0.0: must be in (0, inf)"),
    ("algorithm.advantage_clamp=-1", "algorithm.advantage_clamp=-1.0: must be in (0, inf)"),
])
def test_bad_input_is_one_line(override, message):
    from common.config import ConfigError

    cfg = load_config(Config, os.path.join(ROOT, "configs/gae_ppo.yaml"), [override])
    if message is None:  # a critic warm-up is fine with GAE, refused without a critic
        check_config(cfg)
        cfg.algorithm.use_gae = False
        message = "critic_warmup_iterations=2 needs a critic"
    with pytest.raises(ConfigError) as e:
        check_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)
    if "hidden_dims" in override:  # the value-free baseline needs no value head
        cfg.algorithm.use_gae = False
        check_config(cfg)


# ---- the script as a user runs it -----------------------------------------------------------------------------------
def run(args, tmp_path, check=True, script="train_gae_ppo.py"):
    return run_script(script, [*FAST, *args], tmp_path, check, timeout=600)


def runs_in(folder):
    return sorted(os.listdir(folder))


@pytest.mark.slow
def test_freeze_vla_for_critic_keeps_the_value_loss_out_of_the_policy_gradient(tmp_path):
    """The script's first update three ways, from the same start and rollouts: the actor's gradient norm with the VLA
    frozen for the critic equals the one without any value loss (value_loss_coef=0), and differs from the one where
    the value loss reaches the policy through the shared hidden state."""
    def actor_grad_norm(name, override):
        run(["--task-id", "0", "train.iterations=1", "eval.every=0", override], tmp_path / name)
        (run_name,) = runs_in(tmp_path / name / "runs")
        (row,) = read_metrics(str(tmp_path / name / "runs" / run_name))
        return row["train/grad_norm"]

    frozen = actor_grad_norm("frozen", "algorithm.freeze_vla_for_critic=true")
    assert frozen == actor_grad_norm("no_value_loss", "algorithm.value_loss_coef=0")
    assert frozen != actor_grad_norm("shared", "algorithm.freeze_vla_for_critic=false")


def test_bc_warmup_phase_then_ppo(tmp_path):
    """train.bc_warmup_env_steps=200 (the GAE-PPO reference's warm-up as its start runs it: cross-entropy on the
    rollout's own tokens, the critic untouched): iteration 1 has collected 128 env steps (< 200): a warm-up update
    (bc_loss, actor steps, no PPO loss, no value loss, no critic step); iteration 2 (256 >= 200) is PPO with its critic.
    A flow policy is refused in one line."""
    run(["--task-id", "0", "train.iterations=2", "eval.every=0", "train.bc_warmup_env_steps=200"], tmp_path)
    (name,) = runs_in(tmp_path / "runs")
    first, second = read_metrics(str(tmp_path / "runs" / name))
    assert first["train/bc_phase"] == 1.0 and second["train/bc_phase"] == 0.0
    assert 0 < first["train/bc_loss"] < 10 and first["train/grad_norm"] > 0 and first["train/optimizer_steps"] > 0
    assert not any(k in first for k in ("train/pg_loss", "train/value_loss", "train/critic_grad_norm"))
    assert "train/bc_loss" not in second and second["train/value_loss"] > 0 and second["train/critic_grad_norm"] > 0
    from common.config import ConfigError

    cfg = load_config(Config, os.path.join(ROOT, "configs/gae_ppo_libero_pi0.yaml"), ["train.bc_warmup_env_steps=5"])
    with pytest.raises(ConfigError, match="train.bc_warmup_env_steps=5: the behaviour-cloning warm-up"):
        check_config(cfg)


def test_smoke_two_updates_then_resume_is_exact(tmp_path):
    run(["--task-id", "0", "train.iterations=2", "log.checkpoint_every=1"], tmp_path / "a")
    (name,) = runs_in(tmp_path / "a" / "runs")
    run_dir = str(tmp_path / "a" / "runs" / name)
    assert name.startswith("gae_ppo__tabletop__t0__s1__")
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2]  # row 0: the start evaluated
    for r in rows[1:]:
        assert all(k in r for k in SEED_METRICS), sorted(set(SEED_METRICS) - set(r))
        assert r["rollout/mean_length"] == 16 and r["rollout/truncated_fraction"] == 1.0  # all cut at max_steps
        assert r["rollout/env_steps"] == 8 * 16 and r["train/grad_norm"] > 0 and r["train/critic_grad_norm"] > 0
    assert rows[0]["charts/env_steps"] == 0 and rows[2]["charts/env_steps"] == 2 * 8 * 16
    plots = tmp_path / "a" / "plots" / name
    assert runs_in(plots) == ["training_curves.png", "training_curves_update00001.png",
                              "training_curves_update00002.png"]
    ckpt = os.path.join(run_dir, "checkpoints", "iter_000002")
    assert os.path.isfile(os.path.join(ckpt, "modules", "value_head.safetensors"))
    assert sorted(torch.load(os.path.join(ckpt, "optimizers.pt"), weights_only=True)) == ["actor", "critic"]

    out = run(["--task-id", "0", "train.iterations=3", "--resume", run_dir], tmp_path / "a")
    assert "resumed at iteration 2" in out.stdout
    resumed = read_metrics(run_dir)
    assert [r["iteration"] for r in resumed] == [0, 1, 2, 3] and resumed[:3] == rows
    assert "training_curves_update00003.png" in runs_in(plots)

    run(["--task-id", "0", "train.iterations=3", "log.checkpoint_every=1"], tmp_path / "b")  # never interrupted
    (straight_name,) = runs_in(tmp_path / "b" / "runs")
    straight = read_metrics(str(tmp_path / "b" / "runs" / straight_name))
    timing = ("time/", "charts/SPS")
    for a, b in zip(resumed, straight):  # same policy, value head, optimizers and random streams: the same numbers
        assert {k: v for k, v in a.items() if not k.startswith(timing)} == \
               {k: v for k, v in b.items() if not k.startswith(timing)}


@pytest.mark.slow
def test_timesteps_budget_stops_evaluates_and_checkpoints_value_free_baseline(tmp_path):
    """--timesteps 200 with 128 env steps per iteration: stops after iteration 2 of 10 with an evaluation and a
    checkpoint there (eval every 5, checkpoint every 5). use_gae=false: no value head, no value or critic metrics (the
    actor's gradient norm is logged as in every script)."""
    out = run(["--task-id", "0", "--timesteps", "200", "train.iterations=10", "eval.every=5", "log.checkpoint_every=5",
               "algorithm.use_gae=false"], tmp_path)
    assert "reward-to-go, no value head | stops at 10 iterations or 200 env steps" in out.stdout
    (name,) = runs_in(tmp_path / "runs")
    run_dir = str(tmp_path / "runs" / name)
    rows = read_metrics(run_dir)
    assert [r["iteration"] for r in rows] == [0, 1, 2] and rows[-1]["charts/env_steps"] == 256
    assert "val/success_rate" in rows[-1] and runs_in(os.path.join(run_dir, "checkpoints")) == ["iter_000002"]
    ckpt = os.path.join(run_dir, "checkpoints", "iter_000002")
    assert not os.path.isdir(os.path.join(ckpt, "modules"))
    assert sorted(torch.load(os.path.join(ckpt, "optimizers.pt"), weights_only=True)) == ["actor"]
    keys = set().union(*rows)
    assert {"train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm"} <= keys  # the actor's norm
    assert not {k for k in keys if k.startswith("train/") and ("value" in k or "critic" in k or "explained" in k)}
    plot = tmp_path / "plots" / name
    assert runs_in(plot) == ["training_curves.png", "training_curves_update00001.png",
                             "training_curves_update00002.png"]
    # a value-free checkpoint cannot continue as GAE-PPO: one line
    with open(os.path.join(run_dir, "config.yaml")) as f:
        text = f.read()
    with open(os.path.join(run_dir, "config.yaml"), "w") as f:
        f.write(text.replace("use_gae: false", "use_gae: true"))
    out = run(["--task-id", "0", "--resume", run_dir], tmp_path, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [f"error: --resume: checkpoint {ckpt} has no value head (modules/"
                                               f"value_head.safetensors) but algorithm.use_gae is true: resume a "
                                               f"GAE-PPO run, or start a new one"]


def test_bad_command_line_exits_with_one_line(tmp_path):
    """The seed's flags reach the checks (the other bad inputs are in test_bad_input_is_one_line)."""
    out = run(["--task-id", "0", "--timesteps", "0"], tmp_path, check=False)
    assert out.returncode != 0 and out.stderr.strip().splitlines() == [
        "error: train.total_timesteps=0 (--timesteps): must be >= 1 env step (leave it null to stop on "
        "train.iterations only)"]


@pytest.mark.slow
def test_two_processes_with_a_critic_warmup(tmp_path):
    """2 accelerate processes on CPU; train.critic_warmup_iterations=1: iteration 1 moves the value head only. At
    interpreter exit neither process has a gloo thread left (tests/fixtures/exit_threads.py): one alive then could
    abort the process during finalization (#47: 'terminate called without an active exception', exit -6)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "29523",
           os.path.join(ROOT, "tests", "fixtures", "exit_threads.py"), "train_gae_ppo.py", *FAST, "--task-id", "0",
           "train.iterations=2", "rollout.prompts_per_iteration=4", "train.critic_warmup_iterations=1",
           f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"]
    out = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert " x2 | " in out.stdout and "policy and value_head weights identical on all 2 processes" in out.stdout
    exits = dict(line[len("[exit threads] process "):].split(": ") for line in out.stdout.splitlines()
                 if line.startswith("[exit threads]"))
    # gloo names its threads (pt_gloo_runloop, gloo_tcp_loop); a thread named after the process ('python') is not
    # gloo's: the full tier once saw a second one at exit in process 1 on a loaded machine (not ours: the scripts
    # start no thread; torch starts some lazily), so the check is on gloo's names
    assert sorted(exits) == ["0", "1"] and all("gloo" not in t for t in exits.values()), exits
    assert all("python" in t.split() for t in exits.values()), exits  # the main thread was reported
    (name,) = runs_in(tmp_path / "runs")
    rows = read_metrics(str(tmp_path / "runs" / name))
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    rows = rows[1:]  # the training iterations
    assert all(r["rollout/env_steps"] == 2 * 4 * 16 for r in rows)  # both processes' episodes counted
    assert all(r["train/critic_grad_norm"] > 0 for r in rows)
    assert "train/grad_norm" not in rows[0] and rows[1]["train/grad_norm"] > 0  # the actor waited


@pytest.mark.real_libero
def test_libero_config_end_to_end_one_short_iteration(tmp_path):
    """configs/gae_ppo_libero.yaml on the real simulator with the tiny OpenVLA-OFT folder in the official L1 layout
    (the config's start: its token head, agent view + wrist, the proprio token; the value head reads its hidden
    state), 64 px, 2 workers, 16 steps: one iteration."""
    out = subprocess.run(
        [sys.executable, "train_gae_ppo.py", "--config", "configs/gae_ppo_libero.yaml", "--task-id", "0", "--no-wandb",
         "init.mode=checkpoint", f"init.path={OFT_L1_TINY}", "policy.lora_rank=4", "policy.bf16_weights=false",
         "policy.unnorm_key=libero_10", "env.image_size=64", "env.num_envs=2",
         "env.max_steps=16", "env.fast_render=true", "eval.protocol=heldout", "rollout.prompts_per_iteration=2",
         "train.iterations=1",
         "eval.every=0", "train.mini_batch_size=4", "train.micro_batch_size=4",
         f"log.output_dir={tmp_path}/runs", f"log.plots_dir={tmp_path}/plots"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (name,) = runs_in(tmp_path / "runs")
    assert name.startswith("gae_ppo__libero_spatial__t0__s1__")
    (row,) = read_metrics(str(tmp_path / "runs" / name))
    assert row["rollout/env_steps"] == 32 and row["rollout/truncated_fraction"] == 1.0
    assert "train/explained_variance" in row  # the critic's values recorded
    assert row["train/bc_phase"] == 1.0 and "train/bc_loss" in row  # the config's warm-up: 32 < 25000 env steps
    assert os.path.isfile(os.path.join(tmp_path, "runs", name, "checkpoints", "iter_000001", "modules",
                                       "value_head.safetensors"))
    policy = os.path.join(tmp_path, "runs", name, "checkpoints", "iter_000001", "policy")
    assert "proprio_projector--150000_checkpoint.pt" in os.listdir(policy)  # trained beside the LoRA, saved
    with open(os.path.join(tmp_path, "runs", name, "config.yaml")) as f:
        text = f.read()
    assert "num_images: 2" in text and "use_proprio: true" in text and "wrist_camera: true" in text
