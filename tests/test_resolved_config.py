"""The values a run uses are the ones it shows (issue 68): `--help` with `--config` lists every key after
eval.protocol's rewriting, a run's first lines list every key the protocol changed and from what, and the resolved
config.yaml (what a resume reads) resolves to itself (nothing changes a second time)."""
import os

from common.config import check_run_config, config_to_yaml, exit_on_bad_config, load_config, resolved_lines
from tests.scripts import run_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_shows_the_protocols_values():
    out = run_script("train_srpo.py", ["--config", "configs/srpo_libero.yaml", "--help"]).stdout
    lines = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and "=" in line.split()[0]]
    # siiRL's protocol: practise on and evaluate all 50 trials, greedily (train_srpo.py's defaults: 30, 30, 20, 8)
    for key in ("rollout.train_trials=50", "eval.trial_start=0", "eval.trials_per_task=50",
                "eval.samples_per_trial=0", "env.fixture_seed='0'"):
        assert key in lines, f"{key} not in --help's list"
    assert "after eval.protocol=siirl set" in out and "rollout.train_trials: 30 -> 50" in out


def test_run_prints_what_the_protocol_changed_and_the_saved_config_resolves_to_itself(capsys, tmp_path):
    from train_srpo import Config

    cfg = load_config(Config, os.path.join(ROOT, "configs", "srpo_libero.yaml"))
    cfg = exit_on_bad_config(check_run_config, cfg)  # a new config: the one the run uses
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("eval.protocol=siirl set 5 key(s)")
    assert sorted(printed[1:]) == sorted(["  env.fixture_seed: trial -> '0'", "  rollout.train_trials: 30 -> 50",
                                          "  eval.trials_per_task: 20 -> 50", "  eval.trial_start: 30 -> 0",
                                          "  eval.samples_per_trial: 8 -> 0"])
    assert (cfg.rollout.train_trials, cfg.eval.trial_start) == (50, 0)
    saved = tmp_path / "config.yaml"  # what start_run saves and --resume reads
    saved.write_text(config_to_yaml(cfg))
    again = load_config(Config, str(saved))
    again = exit_on_bad_config(check_run_config, again)
    assert capsys.readouterr().out == ""  # resolved already: nothing changes, nothing printed
    assert again == cfg


def test_resolved_lines_names_each_change_once():
    from train_gae_ppo import Config

    cfg = load_config(Config, None, ["env.suite=libero_spatial"])  # heldout on LIBERO: 10 -> 40 practice trials
    from common.config import flatten_config

    before = flatten_config(cfg)
    check_run_config(cfg)
    lines = resolved_lines(before, cfg)
    assert lines[0].startswith("eval.protocol=heldout set")
    assert "  rollout.train_trials: 10 -> 40" in lines and "  eval.trial_start: 30 -> 40" in lines
    assert resolved_lines(flatten_config(cfg), cfg) == []
