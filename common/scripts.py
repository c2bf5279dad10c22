"""The training scripts, listed once: their names (a run folder's prefix, the name a config file records) and a
name's file. A leaf module: common/config.py reads it."""

SCRIPTS = ("srpo", "gae_ppo", "luffy", "flowsar", "train_sft")


def script_file(script: str) -> str:
    """train_srpo.py for "srpo"; train_sft.py for "train_sft"."""
    return f"{script}.py" if script.startswith("train_") else f"train_{script}.py"
