"""The embedded-suite comparisons' arms (benchmarks/compare_algorithms.py and its presets; benchmarks/robustness.py
evaluates the same runs): which script each arm runs from its SFT start with which overrides, each preset's arms and
settings, and what the env-step budget's first segment is sized with (the episodes an iteration rolls out, a task's
longest episode). Pinned by tests/test_compare_algorithms.py; the real-LIBERO recipe's arms are common/cpu_recipe.py."""
from __future__ import annotations

import os

import yaml

from common.config import ROOT

ARMS = {  # key -> (label, script, overrides, policy type)
    "srpo": ("SRPO", "train_srpo.py", [], "token"),
    "grpo": ("GRPO", "train_srpo.py", ["reward.mode=binary"], "token"),
    "drgrpo": ("Dr.GRPO", "train_srpo.py", ["reward.mode=binary", "algorithm.norm_adv_by_std_in_grpo=false",
               "algorithm.loss_agg_mode=seq-mean-token-sum-norm"], "token"),
    "adv_grpo": ("Advanced GRPO", "train_srpo.py", ["reward.mode=binary", "algorithm.adv_estimator=advanced_grpo"],
                 "token"),
    "gae_ppo": ("GAE-PPO", "train_gae_ppo.py", [], "token"),
    "flowsar": ("FlowSAR", "train_flowsar.py", [], "flow"),
    "luffy": ("LUFFY", "train_luffy.py", [], "token"),
    # --preset luffy-vs-grpo: GRPO on-policy, RL with an SFT loss, and more SFT (train_sft.py from the start, on the
    # scripted expert's demos of the practice trials 0..9, the demos the RL arms see; no env steps)
    "grpo_unfiltered": ("GRPO, no filter", "train_srpo.py", ["reward.mode=binary", "algorithm.filter_accuracy=false",
                                                             "algorithm.entropy_coeff=0.001"], "token"),
    "rl_sft": ("RL w/ SFT loss", "train_luffy.py", ["algorithm.use_sft_multitask_loss=true",
                                                    "algorithm.adv_estimator=grpo_split"], "token"),
    "sft": ("SFT", "train_sft.py", ["sft.demo_starts=false", "sft.num_demos=10", "sft.steps=300", "sft.eval_every=0",
                                    "sft.eval_trial_start=30", "sft.eval_trials=20"], "token"),
    # --preset flowsar-ablation: every arm sets all three keys (not configs/flowsar.yaml's choices)
    **{f"flowsar_{name}": (f"FlowSAR {name}", "train_flowsar.py", [f"algorithm.loss_variant={loss}",
                                                                    f"algorithm.energy_type={energy}",
                                                                    f"algorithm.ema_schedule={ema}"], "flow")
       for name, loss, energy, ema in (("base", "softplus_kl", "mse", "linear"), ("mse_branch", "mse_branch", "mse",
                                       "linear"), ("sde", "softplus_kl", "sde", "linear"),
                                       ("fixed_ema", "softplus_kl", "mse", "fixed"),
                                       ("shipped", "mse_branch", "mse", "fixed"))},
}
PRESETS = {  # --preset -> (title, the flags' defaults; rl_overrides: before the command's overrides, every RL arm)
    "all": ("All algorithms", {"arms": ["srpo", "grpo", "drgrpo", "adv_grpo", "gae_ppo", "flowsar", "luffy"]}),
    "srpo-vs-grpo": ("SRPO vs GRPO", {"arms": ["srpo", "grpo"], "seeds": [1], "iterations": 60, "eval_every": 5,
                                      "eval_samples": 8, "metric": "val/sampled_success_rate"}),
    "luffy-vs-grpo": ("LUFFY vs GRPO vs SFT vs RL w/ SFT loss", {
        "arms": ["luffy", "grpo_unfiltered", "sft", "rl_sft"], "seeds": [1, 2], "iterations": 30, "eval_every": 5,
        "eval_samples": 4, "sft_overrides": ["sft.num_demos=1", "sft.steps=300", "sft.eval_every=0",
                                             "sft.eval_trial_start=30", "sft.eval_trials=20"],
        "rl_overrides": ["rollout.train_trials=10", "rollout.prompts_per_iteration=8", "rollout.n=8",
                         "env.max_steps=60"]}),
    "flowsar-ablation": ("FlowSAR ablations", {
        "arms": [a for a in ARMS if a.startswith("flowsar_")], "seeds": [1], "iterations": 40, "eval_every": 5,
        "sft_overrides": ["sft.num_demos=20", "sft.augment_shift=0"]}),  # configs/flowsar.yaml's init.sft_args
}


def episodes_per_iteration(script: str) -> int:
    """Episodes one iteration rolls out, from the script's shipped config (LUFFY's demos count: they are executed)."""
    with open(os.path.join(ROOT, "configs", script[len("train_"):-len(".py")] + ".yaml")) as f:
        r = yaml.safe_load(f)["rollout"]
    return int(r["prompts_per_iteration"] * r.get("n", 1))  # GAE-PPO: one episode per start


def max_episode_steps(task: int) -> int:
    from envs.tabletop import TASKS

    return int(TASKS[task][3])
