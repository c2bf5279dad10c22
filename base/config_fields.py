"""What every config dataclass (models/, envs/, common/, the scripts) needs to declare its fields, and the error a
bad key or value raises. It imports nothing of this project, so models/ and envs/ both import it without importing
each other."""
from __future__ import annotations

from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A bad key or value in a YAML file or a command-line override; the message is one line and says how to fix it.
    (`common.config` re-exports it.)"""


def ranged(default: Any, interval: str, why: str = "") -> Any:
    """A numeric config field with its range beside it, e.g. `n: int = ranged(8, "[1, 1024]")  # help`: intervals as
    in mathematics ([a, b] inclusive, (a, b) exclusive, inf unbounded), `why` when the range alone does not say it.
    `common.config.check_ranges` reads them before anything loads (None, a key's "unset", is not checked)."""
    return field(default=default, metadata={"range": interval, "why": why})
