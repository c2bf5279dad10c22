"""The training scripts, listed once: their names (a run folder's prefix, the name a config file records), a
name's file and the exit code of one stopped by a signal. A leaf module: common/config.py, common/run.py and
common/child_runs.py read it."""

SCRIPTS = ("srpo", "gae_ppo", "luffy", "flowsar", "train_sft")
INTERRUPTED = 130  # exit code of a run stopped by Ctrl-C / SIGTERM (the shell's convention for SIGINT)


def script_file(script: str) -> str:
    """train_srpo.py for "srpo"; train_sft.py for "train_sft"."""
    return f"{script}.py" if script.startswith("train_") else f"train_{script}.py"
