"""Issue 72, YAML: one loader (common/yaml_safe.py) for configs, overrides and saved configs refuses duplicate keys
and alias bombs in one line naming the file and line (before: a 2.7 KB nested-alias config.yaml hung --resume for
2.5 min and 500 MB; two `train:` sections dropped the first in silence; an override's YAML error was a traceback)."""
import os
import subprocess
import sys
import time

import pytest

from common import yaml_safe
from common.config import ConfigError, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def alias_bomb(levels=12, width=10):
    """`width` aliases of the level below per level: width**levels values once expanded (10^12 here)."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_a_nested_alias_config_is_refused_in_under_a_second(tmp_path):
    from train_srpo import Config

    path = tmp_path / "config.yaml"
    path.write_text(alias_bomb())
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(Config, str(path))
    took = time.perf_counter() - t0
    assert took < 1.0, f"{took:.2f} s"
    assert "\n" not in str(e.value) and f"{path}:5:" in str(e.value)  # the 33rd alias: a4, line 5 and "aliases" in str(e.value)


def test_few_aliases_that_expand_hugely_are_refused_too():
    text = "a0: &a0 [" + ", ".join(["x"] * 1000) + "]\n" + "a1: &a1 [" + ", ".join(["*a0"] * 20) + "]\n" + \
        "a2: [" + ", ".join(["*a1"] * 10) + "]\n"  # 30 aliases (within the budget), 200,000 values
    with pytest.raises(ConfigError, match=r"aliases expand to 2\d\d,\d\d\d values"):
        yaml_safe.load(text, "f.yaml")


def test_a_few_aliases_are_fine():
    assert yaml_safe.load("a: &x [1, 2]\nb: *x\n", "f.yaml") == {"a": [1, 2], "b": [1, 2]}


def test_duplicate_keys_are_refused_naming_file_and_both_lines(tmp_path):
    from train_srpo import Config

    path = tmp_path / "two_trains.yaml"
    path.write_text("train:\n  lr: 0.1\nseed: 3\ntrain:\n  iterations: 4\n")
    with pytest.raises(ConfigError) as e:
        load_config(Config, str(path))
    assert str(e.value) == (f"{path}:4: key 'train' is given twice (first at line 1); YAML would keep only the last: "
                            f"merge them into one")
    path.write_text("train:\n  lr: 0.1\n  lr: 0.2\n")  # nested too
    with pytest.raises(ConfigError, match=r":3: key 'lr' is given twice \(first at line 2\)"):
        load_config(Config, str(path))


def test_a_yaml_error_in_an_override_is_one_line_naming_the_key():
    from train_srpo import Config

    with pytest.raises(ConfigError) as e:
        load_config(Config, None, ["train.lr=[1, 2"])
    assert "\n" not in str(e.value) and str(e.value).startswith("command line: train.lr:1: not valid YAML")


def test_python_tags_are_still_refused():
    with pytest.raises(ConfigError, match="not valid YAML"):
        yaml_safe.load("a: !!python/object/apply:os.system ['true']\n", "f.yaml")


def test_resume_of_a_run_whose_config_yaml_is_an_alias_bomb_is_refused_in_one_line(tmp_path):
    run = tmp_path / "runs" / "bombed"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("# run of script srpo (continue with: python train_srpo.py --resume <this>)\n"
                                     + alias_bomb())
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--resume", str(run)], cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and out.stderr.strip().count("\n") == 0, out.stderr[-2000:]
    assert "aliases" in out.stderr and "config.yaml:6:" in out.stderr
    assert time.perf_counter() - t0 < 60  # the start of python and torch included


def test_shipped_configs_load_with_the_strict_loader():
    folder = os.path.join(ROOT, "configs")
    for root, _, names in os.walk(folder):
        for name in names:
            if name.endswith(".yaml"):
                yaml_safe.load_file(os.path.join(root, name))
