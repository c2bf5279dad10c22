"""Each arm issue 66 added (LUFFY, GAE-PPO, FlowSAR, the flow control, FlowSAR with the tiny policy's update) launched
by benchmarks/libero_learning.py --arms exactly as the real-LIBERO table's runs are, then run for one iteration on
the real simulator: the command the benchmark builds (the arm's config and extras, the benchmark's env settings,
the start) is what runs, with only the scale cut (one update of a few short episodes, an in-run evaluation of 2
states). The held-out scoring is replaced by the committed start's outcomes (evaluate.py --heldout-set on real
LIBERO: tests/test_heldout.py), LUFFY's practice demos by two no-op demos (record_demos.py's scripted expert:
tests/test_libero_demos.py)."""
import json
import os
import sys

import pytest
import yaml

from common import heldout
from common.cpu_recipe import ARMS
from common.metrics_log import read_rows
from tests.scripts import ROOT, load_benchmark
from tests.test_libero_recipes import tiny_flow
from tests.test_train_luffy import write_noop_libero_demos

DATA = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0")
# one iteration of a few short episodes (the table's runs: 32 episodes of 200 steps, to 300,000 env steps)
SCALE = ["train.iterations=1", "eval.trials_per_task=2", "log.checkpoint_every=1"]
PER_ARM = {"luffy": ["rollout.n=3", "rollout.prompts_per_iteration=2", "train.mini_batch_size=2"],
           "gae_ppo": [],  # 2 episodes per update already
           "flowsar": ["rollout.prompts_per_iteration=2", "train.mini_batch_size=4", "train.micro_batch_size=4"]}
PER_ARM["flow_control"] = PER_ARM["flowsar_tiny"] = PER_ARM["flowsar"]


@pytest.mark.real_libero
@pytest.mark.parametrize("family,arm", [("token", "luffy"), ("token", "gae_ppo"), ("flow", "flowsar"),
                                        ("flow", "flow_control"), ("flow", "flowsar_tiny")])
def test_each_new_arm_runs_one_update_on_real_libero_as_the_benchmark_launches_it(family, arm, monkeypatch, tmp_path):
    m = load_benchmark("libero_learning")
    if family == "token":
        start = os.path.join(DATA, "sft_start_2026-12-07")  # the committed start the table's runs use
    else:
        tiny_flow(tmp_path)  # an untrained tiny flow policy as --family flow's SFT saves one
        start = str(tmp_path / "flow")
    stub = heldout.read_outcomes(os.path.join(DATA, "sft_start_2026-12-07_outcomes.json"))
    launched = []
    real_run = m.run

    def run(cmd, log):  # the benchmark's command, cut to one small update
        launched.append(cmd)
        real_run(cmd + SCALE + PER_ARM[arm], log)

    monkeypatch.setattr(m, "run", run)
    monkeypatch.setattr(m, "score", lambda *a, **k: stub)
    monkeypatch.setattr(m, "practice_demos", lambda py, out, args: write_noop_libero_demos(tmp_path))
    out = tmp_path / "out"
    seeds = ["--control-seeds", "1", "--seeds"] if arm.endswith("control") else ["--seeds"]
    monkeypatch.setattr(sys, "argv", ["libero_learning.py", "--family", family, "--suite", "libero_spatial",
                                      "--demos", "100", "--sft-steps", "1500", "--sft-from", start, "--out", str(out),
                                      "--arms", arm, *seeds, "1", "--env-steps", "1", "--max-steps", "32"])
    m.main()

    (cmd,) = launched
    script, config, extras = ARMS[arm]
    assert cmd[1:4] == [script, "--config", config] and f"init.path={out / 'sft'}" in cmd
    assert all(x in cmd for x in [*extras, "env.max_steps=32", "env.pipeline=true", "env.num_envs=2"])
    (run_dir,) = [os.path.join(out, f"cpu_{arm}_s1", d) for d in os.listdir(out / f"cpu_{arm}_s1")]
    rows = read_rows(run_dir)
    assert max(r["iteration"] for r in rows) == 1 and "val/success_rate" in rows[0]
    update = rows[-1]
    assert update["rollout/env_steps"] > 0 and update["train/optimizer_steps"] > 0
    shipped = yaml.safe_load(open(os.path.join(ROOT, config)))
    ran = yaml.safe_load(open(os.path.join(run_dir, "config.yaml")))
    assert ran["train"]["lr"] == shipped["train"]["lr"]  # the recipe's step, not a scale override
    assert ran.get("reward", {}).get("shuffle", False) is arm.endswith("control")
    if arm == "flowsar_tiny":  # the recipe with the tiny policy's two measured keys
        assert (ran["algorithm"]["loss_variant"], ran["algorithm"]["ema_schedule"]) == ("mse_branch", "fixed")
    (row,) = json.loads((out / "results_arms_n100.json").read_text())["arms"][arm]["summaries"].values()
    assert row["total_env_steps"] == update["charts/env_steps"] and row["eval_iterations"][0] == 0
    signal = {"luffy": "train/demo_step_fraction", "gae_ppo": "train/explained_variance",
              "flowsar": "train/flow_sar_weight_std", "flow_control": "train/flow_sar_weight_std",
              "flowsar_tiny": "train/flow_sar_weight_std"}[arm]
    assert signal in update
