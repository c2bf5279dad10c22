"""Every shipped YAML loads strictly into the config of the script it is named after (configs/<algo>[_libero].yaml
-> train_<algo>.py): no unknown keys, right types, and the script's own checks pass."""
import importlib
import os

import pytest

from common.config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YAMLS = sorted(n for n in os.listdir(os.path.join(ROOT, "configs")) if n.endswith(".yaml")
               and not n.startswith("accelerate"))
SCRIPTS = ("srpo", "gae_ppo", "flowsar", "luffy", "sft")


@pytest.mark.parametrize("name", YAMLS)
def test_shipped_config_loads(name):
    algo = next((s for s in SCRIPTS if name == f"{s}.yaml" or name.startswith(f"{s}_")), None)
    if algo is None:
        pytest.fail(f"configs/{name}: name it after the script that reads it (configs/<algo>[_variant].yaml)")
    module = importlib.import_module(f"train_{algo}")
    cfg = load_config(module.Config, os.path.join(ROOT, "configs", name))
    check = getattr(module, "check_config", None)
    if check is not None:
        try:
            check(cfg)  # static suite facts only: runs without hf-libero
        except ConfigError as e:  # the one thing a shipped LIBERO config may leave to the user: their data files
            assert "_libero" in name and "demos.paths" in str(e), e
    assert cfg.env.suite in ("tabletop", "libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")


def leaves(data, prefix=""):
    """(dotted key, value) of every leaf of a YAML mapping."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


@pytest.mark.parametrize("name", YAMLS)
def test_defaults_live_in_the_script_and_yaml_files_repeat_or_change_them(name):
    """One source of defaults: the script's dataclass defaults are the embedded recipe, so configs/<algo>.yaml only
    repeats some of them (each key equal to its default: a reader's view, never a second source), and every
    configs/<algo>_<variant>.yaml key changes a default (it lists only what differs, compared against the defaults
    of the policy family it selects)."""
    import yaml

    from common.config import flatten_config, _with_policy_family

    algo = next(s for s in SCRIPTS if name == f"{s}.yaml" or name.startswith(f"{s}_"))
    module = importlib.import_module(f"train_{algo}")
    with open(os.path.join(ROOT, "configs", name)) as f:
        data = yaml.safe_load(f)
    defaults = flatten_config(_with_policy_family(module.Config(), [data]))
    loaded = flatten_config(load_config(module.Config, os.path.join(ROOT, "configs", name)))
    for key, _ in leaves(data):
        if name == f"{algo}.yaml":
            assert loaded[key] == defaults[key], f"configs/{name}: {key}={loaded[key]!r} but train_{algo}.py's " \
                                                 f"default is {defaults[key]!r}: change the default, not the YAML"
        elif key != "policy.type":  # the family a variant selects is listed even though its keys follow it
            assert loaded[key] != defaults[key], f"configs/{name}: {key}={loaded[key]!r} is train_{algo}.py's " \
                                                 f"default: a variant lists only what differs"
