"""The one evaluation every script and `evaluate.py` use: fixed (task, trial) starts, greedy and optionally sampled
episodes, success rates under one set of metric names.

    val/success_rate, val/success_rate_task{t}                   one greedy episode per trial
    val/sampled_success_rate, val/sampled_success_rate_task{t}   `samples_per_trial` episodes per trial, sampled

Episodes run through `collect_rollouts`, pipelined when the vector env was made with env.pipeline (same results).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from common.rollout import RolloutBatch, collect_rollouts


def _identity(items: List) -> List:
    return items


def evaluate_policy(vec_env, policy, task_ids: Sequence[int], trial_ids: Sequence[int], samples_per_trial: int = 0,
                    temperature: float = 1.0, greedy: bool = True, rank: int = 0, world: int = 1,
                    gather: Callable[[List], List] = _identity, keep_frames: bool = False, progress: bool = False,
                    desc: str = "eval", flow_steps: Optional[int] = None, flow_noise_level: float = 0.0,
                    pairs: Optional[Sequence[Tuple[int, int]]] = None,
                    reset_options: Optional[Dict[str, Sequence[Any]]] = None, pipeline: Optional[bool] = None
                    ) -> Tuple[Dict[str, float], Dict[str, RolloutBatch]]:
    """Success on every (task, trial): one greedy episode each (if `greedy`) and `samples_per_trial` sampled ones.
    `pairs` lists the (task, trial) starts to run instead of every task x trial (a protocol's subset,
    envs.protocols.eval_pairs, or a held-out set's), with `reset_options` one value per pair (e.g. a held-out set's
    "init_states", common/heldout.py); `pipeline` as in `collect_rollouts` (True: each episode samples from its own
    generator). Process `rank` of `world` runs its share of the starts; `gather` (accelerate's gather_object) joins
    the results. Returns (metrics named as in the module docstring, {"greedy"/"sampled": this process's
    RolloutBatch})."""
    if pairs is None:
        pairs = [(t, j) for t in task_ids for j in trial_ids]
    options = {k: list(v)[rank::world] for k, v in (reset_options or {}).items()} or None
    pairs = [(int(t), int(j)) for t, j in pairs][rank::world]
    was_training = policy.training
    policy.eval()
    metrics: Dict[str, float] = {}
    batches: Dict[str, RolloutBatch] = {}
    try:
        for mode, name, n in [("greedy", "success", 1 if greedy else 0), ("sampled", "sampled_success",
                                                                           samples_per_trial)]:
            if n == 0:
                continue
            batch = collect_rollouts(vec_env, policy, [p[0] for p in pairs], [p[1] for p in pairs], n_samples=n,
                                     temperature=temperature, greedy=mode == "greedy", keep_frames=keep_frames,
                                     keep_obs=False, flow_steps=flow_steps,
                                     flow_noise_level=0.0 if mode == "greedy" else flow_noise_level,
                                     progress=progress, desc=f"{desc} {mode}", reset_options=options,
                                     pipeline=pipeline)
            batches[mode] = batch
            results = gather(list(zip(batch.task_ids.tolist(), batch.complete.tolist())))
            metrics[f"val/{name}_rate"] = float(np.mean([c for _, c in results])) if results else float("nan")
            for t in task_ids:
                metrics[f"val/{name}_rate_task{int(t)}"] = float(np.mean([c for tt, c in results if tt == int(t)]))
    finally:
        policy.train(was_training)
    return metrics, batches


def eval_trials(num_trials: int, trials_per_task: int, trial_start: Optional[int], default_start: int) -> List[int]:
    """Trial ids trial_start .. trial_start + trials_per_task - 1 (default_start when None), within the suite (trials
    past the suite's last are refused: ConfigError, one line, rather than scoring fewer in silence)."""
    from base.config_fields import ConfigError

    start = default_start if trial_start is None else trial_start
    if start + trials_per_task > num_trials:
        raise ConfigError(f"eval.trial_start={start}, eval.trials_per_task={trials_per_task}: evaluation trials "
                          f"{start}..{start + trials_per_task - 1}, but the suite has trials 0..{num_trials - 1}; "
                          f"set eval.trials_per_task<={max(num_trials - start, 0)} or a lower eval.trial_start")
    return list(range(start, start + trials_per_task))
