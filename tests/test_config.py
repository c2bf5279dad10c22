"""Strict configs: unknown keys, wrong types and nested overrides fail with one-line messages that say the fix."""
from dataclasses import dataclass, field
from typing import Optional

import pytest

from common.config import ConfigError, LogConfig, check_run_config, load_config, parse_cli, resolve_run_dir
from envs import EnvConfig


@dataclass
class Algo:
    clip_ratio_high: float = 0.28
    n: int = 8


@dataclass
class Cfg:
    seed: int = 1
    resume: Optional[str] = None
    env: EnvConfig = field(default_factory=EnvConfig)
    log: LogConfig = field(default_factory=LogConfig)
    algorithm: Algo = field(default_factory=Algo)


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_and_nested_override_are_merged_into_typed_objects(tmp_path):
    path = write(tmp_path, "seed: 3\nalgorithm:\n  n: 4\n")
    cfg = load_config(Cfg, path, ["algorithm.clip_ratio_high=0.3", "env.task_ids=[1,2]", "env.max_steps=50"])
    assert isinstance(cfg, Cfg) and isinstance(cfg.algorithm, Algo)
    assert (cfg.seed, cfg.algorithm.n, cfg.algorithm.clip_ratio_high) == (3, 4, 0.3)
    assert cfg.env.task_ids == [1, 2] and cfg.env.max_steps == 50 and cfg.env.suite == "tabletop"


def test_unknown_yaml_key_names_key_file_and_closest_keys(tmp_path):
    path = write(tmp_path, "env:\n  num_envz: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, path)
    assert str(e.value) == (
        f"{path}: unknown key 'env.num_envz'; did you mean 'env.num_envs'? valid keys in 'env': action_chunk, "
        "expert_noise, fast_render, fixture_seed, image_size, max_steps, num_envs, num_steps_wait, pipeline, "
        "render_backend, suite, task_ids, wait_action, wrist_camera"
    )


def test_unknown_top_level_section(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'algorithms'; did you mean 'algorithm'\? valid keys in the top level"):
        load_config(Cfg, write(tmp_path, "algorithms:\n  n: 2\n"))


def test_wrong_type_in_yaml_and_on_command_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, write(tmp_path, "env:\n  num_envs: many\n"))
    assert str(e.value).endswith("bad value for 'env.num_envs': 'many' is not a valid int")
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, None, ["algorithm.clip_ratio_high=high"])
    assert str(e.value) == "command line: bad value for 'algorithm.clip_ratio_high': 'high' is not a valid float"


def test_override_errors():
    with pytest.raises(ConfigError) as e:
        load_config(Cfg, None, ["algorithm.clip_ratio_hgh=0.3"])
    assert str(e.value) == ("command line: unknown key 'algorithm.clip_ratio_hgh'; did you mean "
                            "'algorithm.clip_ratio_high'? valid keys in 'algorithm': clip_ratio_high, n")
    with pytest.raises(ConfigError, match="override 'seed' must look like section.key=value"):
        load_config(Cfg, None, ["seed"])
    with pytest.raises(ConfigError, match="'env' is a section; give it keys"):
        load_config(Cfg, None, ["env=3"])
    with pytest.raises(ConfigError, match="config file not found: nope.yaml"):
        load_config(Cfg, "nope.yaml")


def test_cli_flags_map_to_keys():
    cfg = parse_cli(Cfg, None, argv=["--task-ids", "1", "2", "--seed", "7", "--no-wandb", "algorithm.n=2"])
    assert cfg.env.task_ids == [1, 2] and cfg.seed == 7 and cfg.log.wandb is False and cfg.algorithm.n == 2
    cfg = parse_cli(Cfg, None, argv=["--task-ids", "0", "4", "env.suite=tabletop", "--seed", "3", "algorithm.n=6"])
    assert cfg.env.task_ids == [0, 4] and cfg.algorithm.n == 6 and cfg.seed == 3
    with pytest.raises(SystemExit, match="give --task-id or --task-ids, not both"):
        parse_cli(Cfg, None, argv=["--task-id", "3", "--task-ids", "1"])
    flags = {"--timesteps": dict(type=int, key="algorithm.n", help="a script's own flag")}
    assert parse_cli(Cfg, None, argv=["--timesteps", "9"], flags=flags).algorithm.n == 9


def _with_a_checkpoint(run_dir) -> None:
    """A complete (manifest-checked) checkpoint in `run_dir`: what a bare --resume looks for."""
    import torch

    from common.checkpoint import save_checkpoint

    save_checkpoint(str(run_dir), 1, None, {"opt": torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)})


def test_resume_reads_the_saved_config_and_refuses_changes_to_it(tmp_path):
    from common.config import save_config

    run_dir = tmp_path / "runs" / "x__tabletop__t3__s1__20260101-000000"
    save_config(Cfg(algorithm=Algo(n=3), env=EnvConfig(task_ids=[3])), str(run_dir / "config.yaml"))
    _with_a_checkpoint(run_dir)
    # the run's own values, not the defaults, with keys that cannot change the past overridden (log.*, resume)
    cfg = parse_cli(Cfg, None, argv=["--resume", str(run_dir), "--no-wandb"], script="x")
    assert cfg.algorithm.n == 3 and cfg.env.task_ids == [3] and cfg.resume == str(run_dir) and not cfg.log.wandb
    # a bare --resume finds the newest run of this script/suite/tasks/seed
    cfg = parse_cli(Cfg, None, argv=["--task-id", "3", "--resume", f"log.output_dir={tmp_path}/runs"], script="x")
    assert cfg.resume == str(run_dir) and cfg.algorithm.n == 3
    # the same value is fine; a different one names the key and the way out
    assert parse_cli(Cfg, None, argv=["--resume", str(run_dir), "algorithm.n=3"], script="x").algorithm.n == 3
    with pytest.raises(SystemExit, match=r"--resume: algorithm.n was 3 in the run and would become 5"):
        parse_cli(Cfg, None, argv=["--resume", str(run_dir), "algorithm.n=5"], script="x")
    with pytest.raises(SystemExit, match="--config cannot be combined with --resume"):
        parse_cli(Cfg, None, argv=["--resume", str(run_dir), "--config", "c.yaml"], script="x")


def test_resolve_run_dir_new_and_resume(tmp_path):
    log = LogConfig(output_dir=str(tmp_path))
    name, run_dir = resolve_run_dir(log, "srpo__tabletop__t0__s1", None)
    assert name.startswith("srpo__tabletop__t0__s1__") and run_dir == str(tmp_path / name)
    for day in ("01", "02", "03"):
        (tmp_path / f"srpo__tabletop__t0__s1__202601{day}-000000").mkdir()
    for day in ("01", "02"):
        _with_a_checkpoint(tmp_path / f"srpo__tabletop__t0__s1__202601{day}-000000")
    # #47: the newest run (03) stopped before its first checkpoint: a bare --resume takes the newest one it can
    # continue (02), not 03 (which it would then refuse)
    assert resolve_run_dir(log, "srpo__tabletop__t0__s1", "auto")[0] == "srpo__tabletop__t0__s1__20260102-000000"
    (tmp_path / "only__20260101-000000").mkdir()
    with pytest.raises(ConfigError, match="holds a checkpoint .only__20260101-000000 stopped before its first one"):
        resolve_run_dir(log, "only", "auto", must_exist=True)
    with pytest.raises(ConfigError, match="no such run folder"):
        resolve_run_dir(log, "x", str(tmp_path / "missing"))


def test_run_config_refuses_evaluation_trials_that_are_practised():
    """#47: eval.trial_start=0 with rollout.train_trials=30 measured the "held-out" metric on practised trials (a
    warning only); it is refused now, as evaluate.py refuses it."""
    import train_srpo
    cfg = parse_cli(train_srpo.Config, "configs/srpo.yaml", argv=["--task-id", "0"])
    check_run_config(cfg)  # the default: practice 0..29, evaluation 30..49
    cfg = parse_cli(train_srpo.Config, "configs/srpo.yaml", argv=["--task-id", "0", "rollout.train_trials=40"])
    with pytest.raises(ConfigError, match=r"eval.trial_start=30: evaluation trials 30..49 overlap the practice trials "
                                          r"0..39 .*set eval.trial_start>=40"):
        check_run_config(cfg)


@pytest.mark.parametrize("override, message", [
    ("train.mini_batch_size=0", "train.mini_batch_size=0: must be in [1, 1048576]"),
    ("env.max_steps=0", "env.max_steps=0: must be in [1, 10000]"),
    ("env.action_chunk=0", "env.action_chunk=0: must be in [1, 64]"),
    ("env.image_size=-1", "env.image_size=-1: must be in [32, 1024]"),
    ("env.task_ids=[10]", "task id 10 is out of range: suite 'libero_goal' has task ids 0..9"),
])
def test_shared_checks_are_one_line_and_need_no_simulator(override, message, monkeypatch):
    """The checks every RL script shares, on a LIBERO suite with hf-libero and robosuite made unimportable."""
    import sys

    import train_srpo
    monkeypatch.setitem(sys.modules, "libero", None)
    monkeypatch.setitem(sys.modules, "robosuite", None)
    cfg = parse_cli(train_srpo.Config, "configs/srpo_libero.yaml", argv=["env.suite=libero_goal", override])
    with pytest.raises(ConfigError) as e:
        train_srpo.check_config(cfg)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_step_mini_batches_are_a_multiple_of_the_micro_batch():
    """Mini-batches of policy steps split into whole micro-batches (trajectory mini-batches count episodes: no
    multiple to check); each size >= 1 is its range's check."""
    import train_srpo
    cfg = parse_cli(train_srpo.Config, "configs/srpo.yaml", argv=["train.micro_batch_size=48",
                                                                   "train.mini_batch_unit=step",
                                                                   "train.mini_batch_size=64"])
    with pytest.raises(ConfigError, match=r"^train.update_epochs=1, train.mini_batch_size=64, "
                                          r"train.micro_batch_size=48: the mini-batch must be a multiple of the "
                                          r"micro-batch$"):
        check_run_config(cfg)
    cfg = parse_cli(train_srpo.Config, "configs/srpo.yaml", argv=["train.micro_batch_size=48",
                                                                   "train.mini_batch_unit=trajectory"])
    check_run_config(cfg)


HELP_PROBE = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "transformers", "accelerate", "sklearn") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "none", "EXIT", code)
"""


@pytest.mark.parametrize("script,expect", [
    ("train_srpo.py", "reward.dbscan_eps=0.5"), ("train_gae_ppo.py", "value_head.hidden_dims=[256, 128]"),
    ("train_flowsar.py", "algorithm.t_min="), ("train_luffy.py", "rollout.n_off="),
    ("train_sft.py", "sft.steps="), ("evaluate.py", "--checkpoint CHECKPOINT")])
def test_help_and_a_bad_value_answer_before_torch_loads(script, expect):
    """--help lists every hyper-parameter, and a malformed command line is refused, without importing torch,
    transformers, accelerate or scikit-learn (they took 5-35 s before --help could answer)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", HELP_PROBE, script, "--help"], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.rstrip().endswith("HEAVY none EXIT 0"), out.stdout[-500:] + out.stderr[-2000:]
    assert expect in out.stdout and "usage:" in out.stdout
    bad = ["--no-such-flag"] if script == "evaluate.py" else ["nosuch.key=1"]
    out = subprocess.run([sys.executable, "-c", HELP_PROBE, script, *bad], cwd=root, capture_output=True,
                         text=True, timeout=120)
    assert "HEAVY none EXIT" in out.stdout and "EXIT 0" not in out.stdout, out.stdout[-500:] + out.stderr[-2000:]


def test_help_lists_the_keys_of_the_family_the_config_names():
    """`--config configs/srpo_libero.yaml --help` shows the OpenVLA-OFT keys that YAML selects (policy.type), with the
    values it gives, not the token family's defaults."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "train_srpo.py", "--config", "configs/srpo_libero.yaml", "--help"],
                         cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "shown: the value configs/srpo_libero.yaml gives" in out.stdout
    assert "policy.type=openvla_oft" in out.stdout and "policy.image_pipeline=" in out.stdout
    assert "policy.preset=" not in out.stdout  # a token-family key


def test_every_integer_key_has_a_range():
    """#55: every count or size a config can set (an int field: envs, episodes, batch sizes, widths, depths, steps) is
    bounded by a range declared beside its field, in every script's config and every policy family's, so a typo of
    three extra zeros stops in one line before anything is allocated. train.total_timesteps keeps its own check (its
    message names --timesteps)."""
    import importlib
    from dataclasses import fields, is_dataclass

    from models.configs import FAMILIES, config_class

    unranged = set()

    def walk(cfg, prefix):
        for f in fields(cfg):
            value = getattr(cfg, f.name)
            if is_dataclass(value):
                walk(value, f"{prefix}{f.name}.")
            elif f.type in (int, Optional[int], "int", "Optional[int]") and "range" not in f.metadata:
                unranged.add(f"{prefix}{f.name}")

    for script in ("train_srpo", "train_gae_ppo", "train_luffy", "train_flowsar", "train_sft"):
        walk(importlib.import_module(script).Config(), "")
    for family in FAMILIES:
        walk(config_class(family)(), "policy.")
    assert unranged == {"train.total_timesteps"}
