"""An episode's video sampled at n frames spread uniformly over it: the frames the trajectory encoders read
(models/trajectory_encoders.py) and the only agent views a LIBERO worker renders for SRPO's reward
(`LiberoEnv.step_chunk(..., video_frames=n)`)."""
from __future__ import annotations

import numpy as np


def sample_frame_indices(length: int, num_frames: int) -> np.ndarray:
    """`num_frames` indices spread uniformly over [0, length - 1] (repeats when the episode is shorter). Sampling a
    sampled video again keeps it: sample_frame_indices(n, n) is 0..n-1."""
    return np.linspace(0, length - 1, num_frames).round().astype(np.int64)
