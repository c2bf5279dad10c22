"""docs/recipes.md pins every shipped real-LIBERO RL config to its reference: each table row's "ours" cell equals the
value the config runs (the YAML's, else the script's default for the policy family the YAML selects), each row cites
a file:line, each ✗ says why, and every key of every configs/<algo>_libero*.yaml (the SFT ones excepted: they follow
no training reference) has a row in that config's table. A change to a config is then a change to its table too."""
import functools
import importlib
import os
import re

import pytest
import yaml

from tests.test_configs_shipped import leaves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "docs", "recipes.md")
SCRIPTS = ("srpo", "gae_ppo", "flowsar", "luffy")
AUDITED = sorted(n for n in os.listdir(os.path.join(ROOT, "configs"))
                 if n.endswith(".yaml") and "_libero" in n and not n.startswith("sft_"))
FILE_LINE = re.compile(r"[\w./-]+:\d+")


@functools.lru_cache(maxsize=None)
def tables():
    """{config file name: [(key or None, ours cell, source cell, verdict cell)]}: the table under each heading that
    names one config in backticks (`## ` or `### `)."""
    out, current = {}, None
    with open(RECIPES, encoding="utf-8") as f:
        for line in f:
            heading = re.match(r"#{2,3} .*?`configs/([\w.]+\.yaml)`", line)
            if heading and line.count("`configs/") == 1:
                current = heading.group(1)
                out.setdefault(current, [])
                continue
            if line.startswith("#"):
                current = None
            if current is None or not line.startswith("| ") or line.startswith("| key ") or line.startswith("|---"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            assert len(cells) == 5, f"docs/recipes.md: a row of {current}'s table needs 5 cells: {line!r}"
            key = re.fullmatch(r"`([\w.]+)`", cells[0])
            out[current].append((key.group(1) if key else None, cells[1], cells[3], cells[4]))
    return out


def effective(name):
    """The config's values: its YAML's leaves over the script's defaults for the family it selects (plain YAML, so
    that a key the script does not know yet still reads), and the YAML's own keys."""
    from common.config import flatten_config, _with_policy_family

    algo = next(s for s in SCRIPTS if name.startswith(f"{s}_"))
    with open(os.path.join(ROOT, "configs", name)) as f:
        data = yaml.safe_load(f)
    values = dict(flatten_config(_with_policy_family(importlib.import_module(f"train_{algo}").Config(), [data])))
    own = dict(leaves(data))
    values.update(own)
    return values, set(own)


def test_every_audited_config_has_a_table():
    missing = [n for n in AUDITED if n not in tables()]
    assert not missing, f"docs/recipes.md has no table for {missing}: add one (## `configs/<name>`)"


@pytest.mark.parametrize("name", AUDITED)
def test_table_rows_equal_the_config(name):
    rows = tables()[name]
    values, own = effective(name)
    for key, ours, source, verdict in rows:
        assert FILE_LINE.search(source), f"docs/recipes.md, {name}: the row for {key} cites no file:line: {source!r}"
        assert verdict.startswith(("✓", "✗")), f"docs/recipes.md, {name}: {key}: verdict must start with ✓ or ✗"
        if verdict.startswith("✗"):
            assert len(verdict) > 3, f"docs/recipes.md, {name}: {key}: a ✗ needs its reason"
        if key is None:  # a reference behaviour with no config key: documented, not pinned
            assert verdict.startswith("✗") or "(" in verdict, f"{name}: a key-less row must say why"
            continue
        if key not in values:  # a key the scripts do not have yet (issue 57's update keys before they land)
            continue
        cell = re.fullmatch(r"`(.*)`", ours)
        assert cell, f"docs/recipes.md, {name}: {key}: the 'ours' cell must be one `value`: {ours!r}"
        assert yaml.safe_load(cell.group(1)) == values[key], \
            f"docs/recipes.md says {name} runs {key}={cell.group(1)} but the config gives {values[key]!r}: " \
            f"change the table with the config (and its reference cell)"


@pytest.mark.parametrize("name", AUDITED)
def test_every_config_key_has_a_row(name):
    keys = {key for key, *_ in tables()[name]}
    _, own = effective(name)
    missing = sorted(own - keys)
    assert not missing, f"configs/{name}: {missing} have no row in docs/recipes.md's table: add key | ours | " \
                        f"reference | file:line | ✓/✗"


def test_hand_checked_rows():
    """Three values read off the references by hand (siiRL af00a77 script:49-52,144; RLinf ppo_openpi.yaml:123)."""
    rows = {key: ours for key, ours, *_ in tables()["srpo_libero.yaml"]}
    assert rows["rollout.prompts_per_iteration"] == "`64`" and rows["train.mini_batch_size"] == "`32`"
    assert rows["algorithm.clip_ratio_c"] == "`10000.0`"
    assert {key: ours for key, ours, *_ in tables()["gae_ppo_libero_pi0.yaml"]}["train.adam_beta2"] == "`0.95`"
