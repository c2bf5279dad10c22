"""SRPO pieces (siiRL's SRPO): world-model progress reward for failures and the dynamic-sampling group filter."""
from __future__ import annotations

from typing import Dict, Sequence, Union

import numpy as np
import torch
from scipy.spatial.distance import cdist
from scipy.special import expit
from sklearn.cluster import DBSCAN
from sklearn.preprocessing import StandardScaler

ArrayOrTensor = Union[np.ndarray, torch.Tensor]


def _to_numpy(x: ArrayOrTensor | Sequence) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def compute_embodied_reward(completes: ArrayOrTensor | Sequence[bool], embeddings: ArrayOrTensor,
                            task_names: Sequence[str], dbscan_eps: float = 0.5, dbscan_min_samples: int = 2,
                            sigmoid_steepness: float = 10.0, sigmoid_offset: float = 0.5,
                            max_failure_reward: float = 0.6) -> np.ndarray:
    """siiRL's compute_embodied_reward: success 1; failure max_failure_reward * expit(k (offset - d_norm)),
    d = distance to the nearest DBSCAN cluster of the task's successes; zero embedding or no success/failure -> 0."""
    completes = _to_numpy(completes).astype(bool)
    embeddings = _to_numpy(embeddings).astype(np.float64)
    batch = completes.shape[0] if completes.ndim == 1 else -1
    if completes.ndim != 1 or embeddings.ndim != 2 or embeddings.shape[0] != batch or len(task_names) != batch:
        raise ValueError(f"need completes (B,), embeddings (B, D), B task_names; got completes {completes.shape}, "
                         f"embeddings {embeddings.shape}, {len(task_names)} task_names")

    rewards = np.zeros(batch, dtype=np.float64)
    valid = ~np.all(embeddings == 0, axis=1)  # an all-zero embedding marks a row whose video failed to embed
    by_task: Dict[str, list] = {}
    for i in np.flatnonzero(valid):
        by_task.setdefault(task_names[i], []).append(i)

    for indices in by_task.values():
        indices = np.asarray(indices)
        success, fail = indices[completes[indices]], indices[~completes[indices]]
        rewards[success] = 1.0
        if len(success) == 0 or len(fail) == 0:
            continue
        # centres of the DBSCAN clusters of the (standardised) success embeddings, in raw embedding space
        succ = embeddings[success]
        scaler = StandardScaler()
        scaled = scaler.fit_transform(succ)
        labels = DBSCAN(eps=dbscan_eps, min_samples=dbscan_min_samples).fit(scaled).labels_
        centres = [scaler.inverse_transform(scaled[labels == c].mean(axis=0, keepdims=True)).ravel()
                   for c in sorted(set(labels) - {-1})]
        if not centres:
            centres = [succ.mean(axis=0)]
        # min-max normalised distance of each failure to its nearest centre -> sigmoid reward
        dists = cdist(embeddings[fail], np.asarray(centres), "euclidean").min(axis=1)
        span = dists.max() - dists.min()
        d_norm = np.full_like(dists, 0.5) if span < 1e-6 else (dists - dists.min()) / span
        rewards[fail] = max_failure_reward * expit(sigmoid_steepness * (sigmoid_offset - d_norm))
    return rewards


def filter_groups(success: ArrayOrTensor | Sequence[bool], finish_step: ArrayOrTensor | Sequence[int], n_samples: int,
                  max_steps: int, filter_accuracy: bool = True, filter_truncated: bool = False,
                  accuracy_lower_bound: float = 0.1, accuracy_upper_bound: float = 0.9) -> torch.Tensor:
    """siiRL's _filter_batch as a row mask: keep a group of n_samples consecutive rows if lower <= mean
    success <= upper (inclusive) and, with filter_truncated, none of its rows has finish_step >= max_steps."""
    device = success.device if isinstance(success, torch.Tensor) else torch.device("cpu")
    success = torch.as_tensor(_to_numpy(success)).to(torch.float64)
    finish_step = torch.as_tensor(_to_numpy(finish_step))
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    if success.ndim != 1 or finish_step.shape != success.shape or success.shape[0] % n_samples != 0:
        raise ValueError(f"need success (B,) and finish_step (B,) with B a multiple of n_samples={n_samples}, got "
                         f"success {tuple(success.shape)}, finish_step {tuple(finish_step.shape)}")
    if not 0.0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1.0:
        raise ValueError(f"need 0 <= accuracy_lower_bound <= accuracy_upper_bound <= 1, got "
                         f"{accuracy_lower_bound}, {accuracy_upper_bound}")
    num_groups = success.shape[0] // n_samples
    keep = torch.ones(num_groups, dtype=torch.bool)
    if filter_accuracy:
        accuracy = success.reshape(num_groups, n_samples).mean(dim=-1)
        keep &= (accuracy >= accuracy_lower_bound) & (accuracy <= accuracy_upper_bound)
    if filter_truncated:
        keep &= ~(finish_step.reshape(num_groups, n_samples) >= max_steps).any(dim=-1)
    return keep.repeat_interleave(n_samples).to(device)


def filter_metrics(success: ArrayOrTensor | Sequence[bool], keep: torch.Tensor, n_samples: int) -> Dict[str, float]:
    """Counts for logging the dynamic-sampling step: groups seen/kept, all-success and all-failure groups."""
    success = torch.as_tensor(_to_numpy(success)).to(torch.float64)
    if success.ndim != 1 or tuple(keep.shape) != tuple(success.shape) or success.shape[0] % max(n_samples, 1) != 0:
        raise ValueError(f"need success (B,) and keep (B,) with B a multiple of n_samples={n_samples}, got "
                         f"success {tuple(success.shape)}, keep {tuple(keep.shape)}")
    accuracy = success.reshape(-1, n_samples).mean(dim=-1)
    num_groups = accuracy.shape[0]
    kept = int(keep.reshape(-1, n_samples)[:, 0].sum()) if num_groups else 0
    return {
        "sampling/groups": float(num_groups),
        "sampling/kept_groups": float(kept),
        "sampling/kept_fraction": kept / num_groups if num_groups else 0.0,
        "sampling/all_success_groups": float((accuracy == 1).sum()),
        "sampling/all_failure_groups": float((accuracy == 0).sum()),
        "sampling/success_rate": float(success.mean()) if success.numel() else 0.0,
    }
