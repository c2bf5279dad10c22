"""The env-step token mask: tokens of actions the env never executed (a success or truncation in the middle of an
action chunk) get no advantage and no loss, as SimpleVLA-RL (dp_rob.py:435-438) and siiRL's actor loss
(embodied_actor.py:411-415) mask them (finish_step x 7 tokens); the flow policies' chunk-level densities and
FlowSAR's energies drop those actions too."""
import numpy as np
import pytest
import torch

from common.advantages import compute_advantage, executed_actions, make_action_mask, make_response_mask
from common.rollout import collect_rollouts
from models.policy import PolicyFamily
from train_flowsar import compute_flow_sar_loss


def test_mask_by_hand_for_a_success_in_the_middle_of_a_chunk():
    """Chunks of 2 actions x 3 dims, 3 policy steps (18 tokens). Episode 0 succeeds at env step 3 (inside its second
    chunk), episode 1 runs all 6 steps, episode 2 is truncated at step 5 (max_steps 5, inside its third chunk)."""
    mask = make_action_mask([3, 6, 5], num_steps=3, chunk=2, action_dim=3).int().tolist()
    assert mask == [[1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    [1] * 18,
                    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]]
    # the policy-step mask it replaces kept every token of the last chunk (valid_steps = ceil(finish_step / chunk))
    assert make_response_mask([2, 3, 3], 3, 6).int().sum(1).tolist() == [12, 18, 18]
    assert executed_actions([3, 6, 5], 3, 2).tolist() == [[2, 1, 0], [2, 2, 2], [2, 2, 1]]
    # GRPO puts the group's advantage on the executed tokens only
    adv, _ = compute_advantage("grpo", torch.tensor([1.0, 0.0, 0.0]), make_action_mask([3, 6, 5], 3, 2, 3), [0, 0, 0])
    assert (adv[0, 9:] == 0).all() and (adv[0, :9] > 0).all() and (adv[2, 15:] == 0).all() and (adv[2, :15] < 0).all()
    with pytest.raises(ValueError, match=r"finish_step must lie in \[0, 6\]"):
        make_action_mask([7], 3, 2, 3)


class StubEnv:
    """A vector env whose episode i succeeds at env step succeed_at[i] (0 = never; truncated at max_steps)."""

    pipeline = False

    def __init__(self, num_envs, succeed_at, max_steps):
        self.num_envs, self.succeed_at, self.max_steps = num_envs, succeed_at, max_steps
        self.obs = {"agentview": np.zeros((num_envs, 8, 8, 3), np.uint8), "wrist": np.zeros((num_envs, 8, 8, 3),
                                                                                                np.uint8),
                    "state": np.zeros((num_envs, 8), np.float32)}

    def reset_envs_async(self, env_ids, options):  # the vector envs' per-env reset (envs/tabletop.py)
        self.trials, self.steps, self.ran = list(options["trial_ids"]), np.zeros(self.num_envs, int), {}

    def reset_envs_wait(self, env_ids):
        k = len(env_ids)
        return {key: v[env_ids].copy() for key, v in self.obs.items()}, {
            "task_description": ["do it"] * k, "task_name": ["do_it"] * k, "reset_s": [0.0] * k, "build_s": [0.0] * k}

    def step_chunk_async(self, env_ids, actions, keep_frames=False):
        self.ran = {int(i): len(a) for i, a in zip(env_ids, actions)}

    def step_chunk_wait(self, env_ids):
        out = {k: [] for k in ("steps", "terminated", "truncated", "success", "reward")}
        for i in env_ids:
            goal = self.succeed_at[self.trials[i]]
            n = 0
            for _ in range(self.ran[int(i)]):
                self.steps[i] += 1
                n += 1
                if self.steps[i] == goal or self.steps[i] == self.max_steps:
                    break
            success = bool(self.steps[i] == goal)
            out["steps"].append(n)
            out["success"].append(success)
            out["terminated"].append(success)
            out["truncated"].append(not success and self.steps[i] == self.max_steps)
            out["reward"].append(float(success))
        res = {k: np.array(v) for k, v in out.items()}
        res["invalid"] = np.zeros(len(env_ids), bool)
        res["busy_s"] = np.zeros(len(env_ids))  # the workers' stepping seconds (envs/tabletop.py step_chunk)
        res["obs"] = {k: v[env_ids] for k, v in self.obs.items()}
        return res


def test_rollout_success_at_env_step_5_with_chunks_of_4_masks_the_tokens_of_actions_6_to_8():
    class Policy(PolicyFamily):  # a token family: PolicyFamily.rollout_step calls act
        action_chunk = 4
        kind, model_space_samples = "token", False  # the policy interface (models/policy.py)

        def __init__(self):
            self.step = 0

        def act(self, obs, instructions, temperature=1.0, greedy=False, return_hidden=False, generators=None):
            b = len(instructions)
            action_ids = 4 * self.step + np.arange(4)  # the episode's action numbers 0.. (both envs act together)
            self.step += 1
            tokens = torch.as_tensor(100 * action_ids[:, None] + np.arange(7)[None, :]).reshape(1, 28).repeat(b, 1)
            return torch.zeros(b, 4, 7), tokens, torch.zeros(b, 28)

    env = StubEnv(2, succeed_at={0: 5, 1: 0}, max_steps=10)  # trial 0 succeeds at step 5, trial 1 is cut at 10
    batch = collect_rollouts(env, Policy(), [0, 0], [0, 1], progress=False)
    assert batch.finish_step.tolist() == [5, 10] and batch.valid_steps.tolist() == [2, 3]
    assert batch.complete.tolist() == [True, False]
    T = batch.num_steps
    mask = make_action_mask(batch.finish_step, T, 4).view(2, T, 28)
    action_of_token = torch.as_tensor(batch.tokens) // 100  # (B, T, 28): the action each token belongs to
    # episode 0: actions 1..5 executed, actions 6..8 (numbers 5..7) of its second chunk never ran
    assert mask[0, 1].view(4, 7).all(1).tolist() == [True, False, False, False]
    assert sorted(set(action_of_token[0][mask[0]].tolist())) == [0, 1, 2, 3, 4]
    assert sorted(set(action_of_token[0, 1][~mask[0, 1]].tolist())) == [5, 6, 7]
    # episode 1: truncated at step 10, inside its third chunk: actions 11 and 12 (numbers 10, 11) masked
    assert mask[1, 2].view(4, 7).all(1).tolist() == [True, True, False, False]
    assert int(mask[1].sum()) == 10 * 7
    assert not mask[0, 2].any()  # no policy step 3 in episode 0


def test_flow_transition_density_leaves_out_the_actions_not_executed():
    """FlowPolicy.transition_log_prob(executed=k) sums the Gaussian density over the first k actions of the chunk: the
    full chunk by default (bitwise the old value), and the later actions' x_next get no gradient."""
    from models.configs import FlowPolicyConfig
    from models.flow_policy import FlowPolicy

    torch.manual_seed(0)
    policy = FlowPolicy(FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, use_wrist=False,
                                         action_chunk=4, num_steps=2, noise_method="flow_sde")).eval()
    obs = {"agentview": np.random.default_rng(0).integers(0, 255, (2, 64, 64, 3), dtype=np.uint8),
           "wrist": np.zeros((2, 64, 64, 3), np.uint8), "state": np.zeros((2, 8), np.float32)}
    sample = policy.sample(obs, ["a", "b"], noise_level=0.5)
    x_next = sample.x_next.clone().requires_grad_(True)
    full = policy.transition_log_prob(obs, ["a", "b"], sample.sde_step, sample.x_t, x_next, 0.5)
    torch.testing.assert_close(full, sample.log_prob, rtol=1e-5, atol=1e-4)
    same = policy.transition_log_prob(obs, ["a", "b"], sample.sde_step, sample.x_t, sample.x_next, 0.5,
                                      executed=torch.tensor([4, 4]))
    assert torch.equal(same.detach(), full.detach())
    part = policy.transition_log_prob(obs, ["a", "b"], sample.sde_step, sample.x_t, x_next, 0.5,
                                      executed=torch.tensor([1, 3]))
    grad, = torch.autograd.grad(part.sum(), x_next)
    assert (grad[0, 1:] == 0).all() and (grad[0, :1, :7] != 0).all()
    assert (grad[1, 3:] == 0).all() and (grad[1, :3, :7] != 0).all()
    none = policy.transition_log_prob(obs, ["a", "b"], sample.sde_step, sample.x_t, sample.x_next, 0.5,
                                      executed=torch.tensor([0, 0]))
    assert none.abs().max() == 0


def test_flow_sar_energies_over_the_executed_actions_only():
    torch.manual_seed(0)
    v_theta = torch.randn(2, 3, 2, requires_grad=True)
    v_old, u = torch.randn(2, 3, 2), torch.randn(2, 3, 2)
    w, y = torch.tensor([0.5, 1.5]), torch.tensor([1.0, -1.0])
    full = torch.ones(2, 3, 1, dtype=torch.bool)
    for variant in ("mse_branch", "softplus_kl"):
        a, _ = compute_flow_sar_loss(v_theta, v_old, u, w, y, 0.5, loss_variant=variant)
        b, _ = compute_flow_sar_loss(v_theta, v_old, u, w, y, 0.5, loss_variant=variant, element_mask=full)
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7)
    ran = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)[:, :, None]  # sample 0: its third action never ran
    loss, m = compute_flow_sar_loss(v_theta, v_old, u, w, y, 0.5, element_mask=ran)
    v_pos = 0.5 * v_old + 0.5 * v_theta
    v_neg = 1.5 * v_old - 0.5 * v_theta
    e_pos0, e_neg1 = (v_pos[0, :2] - u[0, :2]).square().mean(), (v_neg[1] - u[1]).square().mean()
    torch.testing.assert_close(loss, (w[0] * e_pos0 + w[1] * e_neg1) / 2)  # hand: mse_branch over the kept actions
    grad, = torch.autograd.grad(loss, v_theta)
    assert (grad[0, 2] == 0).all() and (grad[0, :2] != 0).all() and (grad[1] != 0).all()


def test_gae_ppo_on_a_flow_policy_with_chunks_cut_by_max_steps_keeps_the_ratio_at_one(tmp_path):
    """train_gae_ppo.py from a tiny pi0 folder (5 actions executed per call) with max_steps 18: every episode's 4th
    chunk runs 3 of its 5 actions. Its log-density (new and old) covers those 3 only: the old one is recomputed over
    them, so the one on-policy epoch sees ratio 1 (a stale whole-chunk old log-prob would not)."""
    from models.text_tokenizer import ByteTokenizer
    from tests.scripts import read_metrics, run_script
    from tests.test_gae_ppo_flow import FAST
    from tests.test_models_pi0_checkpoint import tiny_pi0, write_openpi

    folder = write_openpi(tmp_path / "pi0", tiny_pi0(chunk=10))
    ByteTokenizer().save_pretrained(str(tmp_path / "tok"))
    args = [a for a in FAST if not a.startswith("env.max_steps=")]
    run_script("train_gae_ppo.py", [*args, "env.max_steps=18", "train.iterations=1", f"init.path={folder}",
                                    f"policy.tokenizer_path={tmp_path}/tok"], outputs=tmp_path)
    (row,) = read_metrics(str(next((tmp_path / "runs").iterdir())))
    assert row["rollout/env_steps"] == 4 * 18 and row["rollout/truncated_fraction"] == 1.0
    assert abs(row["train/ppo_kl"]) < 1e-4 and row["train/pg_clipfrac"] == 0.0 and np.isfinite(row["train/pg_loss"])
