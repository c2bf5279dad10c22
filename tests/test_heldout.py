"""common/heldout.py and evaluate.py --heldout-set/--paired: the bootstrap intervals on hand-computed data, the held-out
set's determinism and its own stream of starts (tabletop), the outcomes JSON, a paired evaluate.py run on two tiny
tabletop policies, and the same on real LIBERO (slow)."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

import evaluate
from common import heldout
from envs import EnvConfig, tabletop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEAK = os.path.join(ROOT, "tests", "fixtures", "tabletop_t0_weak")
TINY = dict(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)


# ------------------------------------------------------------------------------------------------- bootstrap

def test_paired_bootstrap_on_hand_data():
    # b - a = [1, 1, 1, 0]: a resample's mean is X/4 with X ~ Binomial(4, 3/4); P(X <= 0) = 1/256 = 0.004 and
    # P(X <= 1) = 13/256 = 0.051 put the 2.5% point at X = 1 (0.25); P(X = 4) = 81/256 = 0.32 puts the 97.5% at 1.0
    p = heldout.paired_bootstrap([0, 0, 0, 0], [1, 1, 1, 0])
    assert (p["diff"], p["low"], p["high"]) == (0.75, 0.25, 1.0)
    assert (p["mean_a"], p["mean_b"], p["states"], p["resamples"], p["level"]) == (0.0, 0.75, 4, 10_000, 0.95)
    # five of ten states won, five lost: X ~ Binomial(10, 1/2); P(X <= 1) = 11/1024 = 0.011, P(X <= 2) = 56/1024 =
    # 0.055: the interval is [2/10, 8/10] (symmetric)
    p = heldout.paired_bootstrap([0] * 10, [1] * 5 + [0] * 5)
    assert (p["diff"], p["low"], p["high"]) == (0.5, 0.2, 0.8)
    # the pairing is what counts: b wins where a wins plus one state, so b - a = [0, 1, 0, 0, 0, 0, 0, 0] and a
    # resample's difference is X/8, X ~ Binomial(8, 1/8): P(X = 0) = 0.344 (low 0); P(X <= 2) = 0.933 and
    # P(X <= 3) = 0.989 put the 97.5% point at 3/8 (unpaired, a's own spread would widen it)
    a, b = [1, 0, 1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 1, 0, 0]
    p = heldout.paired_bootstrap(a, b)
    assert (p["diff"], p["low"], p["high"]) == (0.125, 0.0, 0.375)
    back = heldout.paired_bootstrap(b, a)
    assert (p["up"], p["down"]) == (1, 0) and (back["up"], back["down"]) == (0, 1)  # the states above / below
    assert heldout.paired_bootstrap(b, b)["low"] == heldout.paired_bootstrap(b, b)["high"] == 0.0
    assert heldout.paired_bootstrap(b, a)["diff"] == -0.125  # b - a, not |b - a|
    assert heldout.bootstrap_interval([1, 0]) == (0.5, 0.0, 1.0)  # means 0, 1/2, 1 with probability 1/4, 1/2, 1/4
    assert heldout.bootstrap_interval([1, 1, 1]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="equal-length"):
        heldout.paired_bootstrap([0, 1], [0, 1, 1])


def test_seeds_and_states_bootstrap_covers_the_choice_of_seeds():
    # two seeds from a start 0 0 0 0: one ends 1 1 1 1 (+1 on every state), the other 0 0 0 0 (0). Resampling the
    # states alone sees +0.5 on every state (interval [0.5, 0.5]); resampling the seeds too draws seed 1 twice, once or
    # never with probability 1/4, 1/2, 1/4: the interval [0, 1]
    a, ends = [0, 0, 0, 0], [[1, 1, 1, 1], [0, 0, 0, 0]]
    p = heldout.paired_bootstrap(a, np.mean(ends, axis=0))
    assert (p["diff"], p["low"], p["high"]) == (0.5, 0.5, 0.5)
    s = heldout.seeds_and_states_bootstrap(a, ends)
    assert (s["diff"], s["low"], s["high"], s["seeds"], s["states"]) == (0.5, 0.0, 1.0, 2, 4)
    # one seed: the states' bootstrap of paired_bootstrap (b - a = 1 1 1 0: [0.25, 1.0], as above)
    s = heldout.seeds_and_states_bootstrap(a, [[1, 1, 1, 0]])
    assert (s["diff"], s["low"], s["high"]) == (0.75, 0.25, 1.0)
    with pytest.raises(ValueError, match=r"\(seeds, states\) end"):
        heldout.seeds_and_states_bootstrap(a, [1, 1, 1, 0])


# ------------------------------------------------------------------------------------------------- the set

def test_tabletop_heldout_set_is_deterministic_and_never_a_trial_or_demo_start(tmp_path):
    cfg = EnvConfig(suite="tabletop", task_ids=[0, 4])
    hset = heldout.build_set(cfg, [0, 4], [47, 48, 49], 7, seed=0)
    assert hset == heldout.build_set(cfg, [0, 4], [47, 48, 49], 7, seed=0)  # a pure function of its arguments
    states = hset["states"]
    assert len(states) == 14 and [s["trial_id"] for s in states[:3]] == [47, 48, 49]  # task 0: trials, then 4 drawn
    drawn = [s for s in states if s["placement_seed"] is not None]
    assert len(drawn) == 8 and {s["task_id"] for s in drawn} == {0, 4}
    assert all(2**31 <= s["placement_seed"] < 2**32 and s["trial_id"] is None for s in drawn)
    assert hset["name"] == "tabletop_task0-4_trials47-49_n7_seed0" and hset["official_trials"] == [47, 48, 49]
    other = heldout.build_set(cfg, [0, 4], [47, 48, 49], 7, seed=1)
    assert other["states"][:3] == states[:3] and other["sha256"] != hset["sha256"]  # other draws, same trials
    for s in drawn:  # objects within JITTER of their layout's nominal spots, gripper at START_Z: the same distribution
        x = np.asarray(s["state"])
        layout = tabletop.LAYOUTS[tabletop.TASKS[s["task_id"]][0]]
        pos = x[:-3].reshape(tabletop.MAX_OBJECTS, 3)
        nominal = np.array([(nx, ny) for _, _, nx, ny in layout])
        assert np.abs(pos[:len(layout), :2] - nominal).max() <= tabletop.JITTER and x[-1] == tabletop.START_Z
        starts = [tabletop.initial_state(s["task_id"], j) for j in range(50)] + \
                 [tabletop.initial_state(s["task_id"], j, demo=True) for j in range(200)]
        assert min(np.abs(np.concatenate([p.ravel(), g]) - x).max() for p, g in starts) > 1e-6

    path = str(tmp_path / "set.json")
    loaded, where, built = heldout.load_or_build(path, cfg, [0, 4], [47, 48, 49], 7, 0)
    assert built and where == path and loaded == hset
    assert heldout.load_or_build(path, cfg, [0, 4], [47, 48, 49], 7, 0)[2] is False  # read back, not redrawn
    with pytest.raises(ValueError, match=r"made with seed 0, not seed 2: pass the arguments"):
        heldout.load_or_build(path, cfg, [0, 4], [47, 48, 49], 7, 2)
    edited = json.loads(open(path).read())
    edited["states"][5]["state"][0] += 0.01
    open(path, "w").write(json.dumps(edited))
    with pytest.raises(ValueError, match="do not match its sha256"):
        heldout.read_set(path)
    with pytest.raises(ValueError, match="smaller than the 3 official held-out trials 47-49"):
        heldout.build_set(cfg, [0], [47, 48, 49], 2, 0)


def test_tabletop_reset_starts_from_a_given_state():
    x = tabletop.drawn_state(0, 2**31 + 5)
    env = tabletop.TabletopVectorEnv(2)
    env.reset(options={"task_ids": [0, 0], "trial_ids": [0, 0], "init_states": [x, None]})
    assert np.array_equal(env.core.pos[0].ravel(), x[:-3]) and np.array_equal(env.core.gripper[0], x[-3:])
    pos, gripper = tabletop.initial_state(0, 0)
    assert np.array_equal(env.core.pos[1], pos) and np.array_equal(env.core.gripper[1], gripper)
    variant = tabletop.TabletopVectorEnv(1, suite="tabletop_swap")
    with pytest.raises(ValueError, match="for the base suite 'tabletop', not the robustness variant"):
        variant.reset(options={"task_ids": [0], "trial_ids": [0], "init_states": [x]})


# ---------------------------------------------------------------------------------------------- outcomes JSON

def fake_set(n_states):
    states = [{"task_id": 0, "trial_id": 40 + i, "placement_seed": None, "state": None} for i in range(n_states)]
    return {"name": "fake", "sha256": heldout.states_sha256(states), "states": states}


def test_outcomes_json_records_every_episode_by_state():
    hset = fake_set(3)
    batch = SimpleNamespace(complete=np.array([1, 0, 1, 1, 0, 0], bool), finish_step=np.array([5, 9, 7, 6, 9, 9]),
                            invalid=np.array([0, 0, 0, 0, 0, 1], bool))  # 2 sampled episodes per state, in order
    out = heldout.outcomes(hset, "s.json", {"sampled": batch}, checkpoint="ck", seed=3)
    assert out["format"] == "vla-rl heldout outcomes 1" and out["checkpoint"] == "ck" and out["seed"] == 3
    assert out["heldout_set"] == {"name": "fake", "path": "s.json", "sha256": hset["sha256"], "states": 3}
    first, last = out["episodes"]["sampled"][0], out["episodes"]["sampled"][-1]
    assert first == {"state": 0, "sample": 0, "task_id": 0, "trial_id": 40, "placement_seed": None, "success": True,
                     "steps": 5, "invalid": False}
    assert (last["state"], last["sample"], last["trial_id"], last["invalid"]) == (2, 1, 42, True)
    assert heldout.per_state(out, "sampled").tolist() == [0.5, 1.0, 0.0]
    assert out["success"]["sampled"] == 0.5 and out["invalid"]["sampled"] == 1
    assert json.loads(json.dumps(out)) == out  # plain JSON
    other = heldout.outcomes(fake_set(4), "t.json", {"sampled": SimpleNamespace(
        complete=np.zeros(4, bool), finish_step=np.zeros(4, int), invalid=np.zeros(4, bool))}, checkpoint="other")
    with pytest.raises(ValueError, match="pair outcomes of one set"):
        heldout.pair(other, out)


# ------------------------------------------------------------------------------------------------ evaluate.py

def bad_input(*argv):
    with pytest.raises(SystemExit) as e:
        evaluate.main(list(argv))
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg, msg
    return msg


def test_heldout_flags_refuse_what_they_cannot_do(tmp_path):
    assert "add --heldout-set N" in bad_input("--checkpoint", WEAK, "--paired", WEAK)
    # the SFT fixture's held-out set starts from the official trials 40-49 (it evaluates 30-49: 10 trials by default)
    assert "smaller than the 10 official held-out trials 40-49" in bad_input(
        "--checkpoint", WEAK, "--heldout-set", "5", "--heldout-file", str(tmp_path / "s.json"),
        "--out-dir", str(tmp_path / "o"))
    assert "must be in [1, 10000]" in bad_input("--checkpoint", WEAK, "--heldout-set", "0")


def test_a_run_that_practised_every_trial_gets_drawn_states_only(tmp_path):
    from tests.test_evaluate import rl_checkpoint

    run_dir = rl_checkpoint(tmp_path, train_trials=50, eval_start=0)  # as under a reference protocol: 0..49 practised
    result = evaluate.main(["--checkpoint", str(run_dir), "--heldout-set", "3", "--max-steps", "4", "--heldout-file",
                            str(tmp_path / "set.json"), "--out-dir", str(tmp_path / "out")])
    assert [r["trial_id"] for r in result["outcomes"]["episodes"]["greedy"]] == [None, None, None]
    assert result["outcomes"]["heldout_set"]["name"] == "tabletop_task0_trialsnone_n3_seed0"
    assert [r["steps"] for r in result["outcomes"]["episodes"]["greedy"]] == [4, 4, 4]


def test_evaluate_pairs_two_tiny_tabletop_policies(tmp_path):
    """The weak SFT fixture against an untrained policy on 8 states (trials 46-49 and 4 drawn), greedy and sampled;
    then the fixture again against the untrained policy's outcomes.json: the same numbers."""
    torch.manual_seed(0)
    from models.token_policy import TokenPolicy, TokenPolicyConfig

    TokenPolicy(TokenPolicyConfig(**TINY)).save(str(tmp_path / "untrained"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    common = ["--heldout-set", "8", "--trial-start", "46", "--sampled", "--heldout-file", str(tmp_path / "set.json")]
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", WEAK, "--paired", str(tmp_path / "untrained"),
                           *common, "--out-dir", str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "out"
    hset = json.loads((out / "heldout_set.json").read_text())
    assert hset["official_trials"] == [46, 47, 48, 49] and len(hset["states"]) == 8
    mine, other = (json.loads((out / f).read_text()) for f in ("outcomes.json", "paired_outcomes.json"))
    for o in (mine, other):
        assert [len(o["episodes"][m]) for m in ("greedy", "sampled")] == [8, 8]
        assert o["heldout_set"]["sha256"] == hset["sha256"] and o["seed"] == 0 and o["temperature"] == 1.0
        assert [r["trial_id"] for r in o["episodes"]["greedy"][:5]] == [46, 47, 48, 49, None]
    assert other["success"] == {"greedy": 0.0, "sampled": 0.0}  # an untrained policy never succeeds by chance
    paired = json.loads((out / "paired.json").read_text())
    assert paired["b"] == WEAK and paired["a"] == str(tmp_path / "untrained") and paired["difference"] == "b - a"
    for m in ("greedy", "sampled"):
        p = paired[m]
        assert p["mean_b"] == mine["success"][m] and p["diff"] == p["mean_b"] - p["mean_a"] == p["mean_b"]
        assert p["low"] <= p["diff"] <= p["high"] and p["states"] == 8
        assert 0.0 <= p["low"] and (p["low"], p["high"]) == tuple(mine["interval"][m])  # a is all zeros
    assert "b - a" in proc.stdout and "greedy" in proc.stdout

    again = evaluate.main(["--checkpoint", WEAK, "--paired", str(out / "paired_outcomes.json"), *common, "--out-dir",
                           str(tmp_path / "again"), "--num-envs", "3"])  # other batches: the same episodes
    assert again["outcomes"]["episodes"] == mine["episodes"]
    assert again["paired"]["greedy"] == paired["greedy"] and again["paired"]["sampled"] == paired["sampled"]

    files = evaluate.main(["--checkpoint", str(out / "outcomes.json"), "--paired", str(out / "paired_outcomes.json")])
    assert files["paired"]["greedy"] == paired["greedy"] and files["paired"]["sampled"] == paired["sampled"]


def test_two_committed_outcomes_files_give_their_comparison_again():
    """docs/results.md's task-3 rows from the outcomes committed under docs/data/ (200 tabletop states, the SFT start
    and the cosine run's end): the printed difference and interval, with nothing run; one file alone is refused in
    one line."""
    data = os.path.join(ROOT, "docs", "data", "tabletop_default", "task3_n200")
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", f"{data}/srpo_cosine_s7_outcomes.json",
                           "--paired", f"{data}/sft_outcomes.json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "greedy   a 0.620  b 0.730  b - a +0.110 [+0.045, +0.175]" in proc.stdout
    assert "sampled  a 0.485  b 0.680  b - a +0.195 [+0.120, +0.270]" in proc.stdout
    assert "outcomes file: compare it with another" in bad_input("--checkpoint", f"{data}/sft_outcomes.json")
    missing = os.path.join(ROOT, "cache", "no_such_outcomes.json")
    assert bad_input("--checkpoint", missing, "--paired", f"{data}/sft_outcomes.json").startswith(
        f"error: --checkpoint {missing}: cannot read it")


@pytest.mark.real_libero
def test_real_libero_paired_heldout_evaluation(tmp_path):
    """libero_spatial task 0: a drawn state is LIBERO's own placement reset (the same state and fixture placement
    again from its seed, whatever the env did before; the saved state pinned in that scene), and evaluate.py pairs two
    tiny policies on trial 49 plus 2 drawn states."""
    from envs.libero import LiberoEnv

    cfg = EnvConfig(suite="libero_spatial", task_ids=[0], fast_render=True, num_envs=1)
    hset = heldout.build_set(cfg, [0], [49], 3, seed=0)
    seed, state = hset["states"][2]["placement_seed"], np.asarray(hset["states"][2]["state"])  # drawn second
    env = LiberoEnv(EnvConfig(suite="libero_spatial", num_steps_wait=0), cameras=False)
    try:
        env.reset(options={"task_id": 0, "trial_id": 7})
        env.reset(options={"task_id": 0, "placement_seed": seed})
        assert np.array_equal(env.raw_env.get_sim_state(), state)  # the draw reproduces
        fixtures = env.raw_env.sim.model.body_pos.copy()  # cabinets are placed in the model, not in the state
        env.reset(options={"task_id": 0, "trial_id": 3})
        assert not np.array_equal(env.raw_env.sim.model.body_pos, fixtures)  # another scene
        env.reset(options={"task_id": 0, "trial_id": 0, "placement_seed": [seed], "init_states": [state]})
        assert np.array_equal(env.raw_env.get_sim_state(), state) and env.trial_id == -1
        assert np.array_equal(env.raw_env.sim.model.body_pos, fixtures)
        official = heldout.build_set(cfg, [0], [49], 1, seed=0)["states"]
        assert official == [{"task_id": 0, "trial_id": 49, "placement_seed": None, "state": None}]
    finally:
        env.close()

    torch.manual_seed(0)
    from models.token_policy import TokenPolicy, TokenPolicyConfig

    for name in ("a", "b"):
        TokenPolicy(TokenPolicyConfig(**TINY, image_size=32)).save(str(tmp_path / name))
        with open(tmp_path / name / "train_config.yaml", "w") as f:
            yaml.safe_dump({"env": {"suite": "libero_spatial", "fast_render": True, "num_envs": 1}}, f)
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", str(tmp_path / "b"), "--paired",
                           str(tmp_path / "a"), "--heldout-set", "3", "--trial-start", "49", "--max-steps", "8",
                           "--heldout-file", str(tmp_path / "set.json"), "--out-dir", str(tmp_path / "out")],
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "set.json").read_text())["sha256"] == hset["sha256"]  # the same draws in a subprocess
    paired = json.loads((tmp_path / "out" / "paired.json").read_text())
    assert paired["greedy"]["states"] == 3 and (paired["greedy"]["diff"], paired["greedy"]["low"]) == (0.0, 0.0)
    mine = json.loads((tmp_path / "out" / "outcomes.json").read_text())
    assert [(r["trial_id"], r["steps"], r["success"]) for r in mine["episodes"]["greedy"]] == \
        [(49, 8, False), (None, 8, False), (None, 8, False)]  # 8 steps, no success: untrained policies


# ------------------------------------------------------------------------------------------------- seed level

def test_seed_permutation_test_on_hand_values():
    # 3 against 2 seeds: C(5, 3) = 10 labellings; b's three values are the three largest, so only the observed
    # labelling reaches the observed difference: p = 1/10
    r = heldout.seed_permutation_test([0.10, -0.03], [0.19, 0.26, 0.24])
    assert r["labellings"] == 10 and r["p_one_sided"] == pytest.approx(0.1) and r["p_min"] == pytest.approx(0.1)
    assert r["diff"] == pytest.approx((0.19 + 0.26 + 0.24) / 3 - (0.10 - 0.03) / 2)
    # a = [0, 3], b = [1, 2]: observed mean difference 0; the 6 labellings of 2 of the 4 values as b give -2, -1, 0,
    # 0, 1, 2, four of them >= 0 -> p = 4/6
    r = heldout.seed_permutation_test([0.0, 3.0], [1.0, 2.0])
    assert r["labellings"] == 6 and r["p_one_sided"] == pytest.approx(4 / 6)
    assert heldout.seed_permutation_test([0.0] * 5, [0.0] * 3)["p_one_sided"] == 1.0  # ties count
    assert heldout.seed_permutation_test([0.0] * 5, [1.0] * 3)["p_one_sided"] == pytest.approx(1 / 56)
    with pytest.raises(ValueError):
        heldout.seed_permutation_test([], [1.0])


def test_arms_seeds_and_states_bootstrap_on_hand_values():
    r = heldout.arms_seeds_and_states_bootstrap(np.zeros((2, 4)), np.ones((3, 4)))
    assert (r["diff"], r["low"], r["high"]) == (1.0, 1.0, 1.0)
    # b's two seeds disagree completely: a resample's b mean is 1, 0.5 or 0 with probability 1/4, 1/2, 1/4 (the
    # states do not matter), so the 95% interval is [0, 1] around the mean 0.5
    r = heldout.arms_seeds_and_states_bootstrap(np.zeros((1, 2)), np.array([[1.0, 1.0], [0.0, 0.0]]))
    assert (r["diff"], r["low"], r["high"]) == (0.5, 0.0, 1.0) and (r["seeds_a"], r["seeds_b"]) == (1, 2)
    with pytest.raises(ValueError, match="same states"):
        heldout.arms_seeds_and_states_bootstrap(np.zeros((1, 2)), np.zeros((1, 3)))


def test_a_flow_policys_sampled_episodes_explore_at_the_recipes_noise(tmp_path, monkeypatch):
    """A flow policy's --sampled episodes run at --flow-noise-level (else its run's rollout.flow_noise_level, else 0.5)
    while greedy stays the deterministic ODE (noise 0); a token policy samples at a temperature (no noise level). The
    level reaches the rollout and the outcomes record it."""
    from models.configs import FlowPolicyConfig
    from models.flow_policy import FlowPolicy

    ns = SimpleNamespace
    assert evaluate.flow_noise_level(ns(flow_noise_level=0.3), WEAK, ns(kind="token")) is None
    assert evaluate.flow_noise_level(ns(flow_noise_level=0.3), WEAK, ns(kind="flow")) == 0.3
    torch.manual_seed(0)
    FlowPolicy(FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32)).save(str(tmp_path / "flow"))
    assert evaluate.flow_noise_level(ns(flow_noise_level=None), str(tmp_path / "flow"), ns(kind="flow")) == 0.5
    seen = []
    real = evaluate.evaluate_policy

    def spy(*args, **kwargs):
        seen.append(kwargs["flow_noise_level"])
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate_policy", spy)
    result = evaluate.main(["--checkpoint", str(tmp_path / "flow"), "--heldout-set", "4", "--trial-start", "46",
                            "--sampled", "--flow-noise-level", "0.7", "--max-steps", "8", "--heldout-file",
                            str(tmp_path / "set.json"), "--out-dir", str(tmp_path / "out"), "--gifs", "0"])
    o = result["outcomes"]
    assert seen == [0.7] and o["flow_noise_level"] == 0.7 and o["temperature"] is None
    assert [len(o["episodes"][m]) for m in ("greedy", "sampled")] == [4, 4]
