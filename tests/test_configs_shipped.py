"""Every shipped YAML loads strictly into its script's config (no unknown keys, right types)."""
import importlib.util
import os

import pytest

from common.config import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(ROOT, "configs"))))
def test_shipped_config_loads(name):
    path = os.path.join(ROOT, "configs", name)
    if name.startswith("srpo"):
        from train_srpo import Config, check_config

        cfg = load_config(Config, path)
        if cfg.env.suite == "tabletop" or importlib.util.find_spec("libero") is not None:
            check_config(cfg)  # needs the suite's trial count (hf-libero for LIBERO suites)
        assert cfg.rollout.n >= 2
    elif name.startswith("sft"):
        from train_sft import Config

        cfg = load_config(Config, path)
        assert cfg.sft.steps > 0
    else:
        pytest.fail(f"configs/{name}: add it to this test with the schema of the script that reads it")
    assert cfg.env.suite in ("tabletop", "libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
