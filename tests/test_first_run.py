"""What a new user meets first (issue 70): the README's first command never reuses an SFT start made otherwise in
silence, `--gpu N` without that GPU stops in one line, and every script's --help gives every key a meaning."""
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.scripts import ENV, ROOT, run_script

SFT_SMALL = ["sft.num_demos=2", "sft.eval_trials=2", "env.num_envs=2"]
RL_SMALL = ["env.num_envs=4", "env.max_steps=8", "rollout.n=2", "rollout.prompts_per_iteration=2", "eval.every=0",
            "train.iterations=1", "reward.encoder.kind=pixels", "--no-wandb"]


def test_auto_sft_does_not_reuse_a_start_made_with_other_arguments(tmp_path):
    """A 2-step start at the default folder (checkpoints/sft_tabletop_task0, what `train_sft.py --task-id 0 ...`
    writes); then the README's command with init.sft_args asking for 3 steps: it says the folder was made with
    sft.steps=2, trains its own start into the keyed folder beside it, and its [init] line names that start and what
    made it. A second run with the same arguments reuses the keyed start without training."""
    made = run_script(os.path.join(ROOT, "train_sft.py"), ["--task-id", "0", "sft.steps=2", "--no-wandb",
                                                           *SFT_SMALL], outputs=tmp_path, cwd=str(tmp_path))
    default = os.path.join("checkpoints", "sft_tabletop_task0")
    with open(tmp_path / default / "made_by.yaml") as f:
        record = yaml.safe_load(f)
    assert record["command"].startswith("python train_sft.py --task-id 0 sft.steps=2"), record
    assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]) and isinstance(record["dirty"], bool)
    assert record["step"] == 2
    assert 0.0 <= record["heldout_success"] <= 1.0, made.stdout[-500:]

    sft_args = "init.sft_args=[sft.steps=3,sft.num_demos=2,sft.eval_trials=2,env.num_envs=2]"
    first = run_script(os.path.join(ROOT, "train_srpo.py"), ["--task-id", "0", sft_args, *RL_SMALL],
                       outputs=tmp_path, cwd=str(tmp_path))
    lines = first.stdout.splitlines()
    keyed = [d for d in os.listdir(tmp_path / "checkpoints") if d.startswith("sft_tabletop_task0__")]
    assert len(keyed) == 1 and re.fullmatch(r"sft_tabletop_task0__[0-9a-f]{8}", keyed[0]), keyed
    keyed_path = os.path.join("checkpoints", keyed[0])
    refused = [ln for ln in lines if ln.startswith(f"[init] {default} was made with")]
    assert len(refused) == 1 and "sft.steps=2 (auto_sft: 3)" in refused[0] and "not reusing it" in refused[0]
    assert f"this run's SFT start is {keyed_path}" in refused[0]
    assert any(ln.startswith(f"[init] no SFT checkpoint at {keyed_path}; running: python ") and
               "train_sft.py --task-ids 0 policy.type=token " in ln for ln in lines), first.stdout[-3000:]
    start = [ln for ln in lines if ln.startswith("[init] start: ")]
    assert len(start) == 1 and start[0].startswith(f"[init] start: {keyed_path}, made by `python train_sft.py "
                                                   f"--task-ids 0 ")
    assert "sft.steps=3" in start[0] and "held-out success" in start[0] and "at step 3" in start[0]
    with open(tmp_path / keyed_path / "made_by.yaml") as f:
        assert yaml.safe_load(f)["step"] == 3
    with open(tmp_path / default / "made_by.yaml") as f:  # the other start is left as it was
        assert yaml.safe_load(f)["step"] == 2

    again = run_script(os.path.join(ROOT, "train_srpo.py"), ["--task-id", "0", sft_args, *RL_SMALL],
                       outputs=tmp_path, cwd=str(tmp_path))
    assert "running: python train_sft.py" not in again.stdout
    assert f"[init] start: {keyed_path}, made by" in again.stdout


def test_a_named_init_path_made_otherwise_is_used_with_a_warning(tmp_path):
    """init.path given (the user named the folder) and made with other arguments: used, never in silence."""
    from common import sft_record

    folder = tmp_path / "start"
    folder.mkdir()
    saved = sft_record.sft_config(["--task-ids", "0", "sft.steps=2", f"sft.output_path={folder}"])
    from common.config import save_config
    save_config(saved, str(folder / "train_config.yaml"), script="train_sft")
    assert sft_record.differences(sft_record.sft_config(["--task-ids", "0", "sft.steps=2"]), str(folder)) == []
    assert sft_record.differences(sft_record.sft_config(["--task-ids", "0", "sft.steps=1000"]), str(folder)) == \
        ["sft.steps=2 (auto_sft: 1000)"]
    # a key given or left at its default is the same start; where it was written and logged is not what made it
    assert sft_record.differences(sft_record.sft_config(["--task-ids", "0", "log.output_dir=elsewhere"]),
                                  str(folder)) == ["sft.steps=2 (auto_sft: 1000)"]
    assert sft_record.differences(sft_record.sft_config(["--task-ids", "1", "sft.steps=2"]), str(folder)) == \
        ["env.task_ids=[0] (auto_sft: [1])"]
    assert sft_record.differences(sft_record.sft_config([]), str(tmp_path)) is None  # no record there
    one = sft_record.keyed_path("checkpoints/sft_tabletop_task0", sft_record.sft_config(["sft.steps=3"]))
    assert one == sft_record.keyed_path("checkpoints/sft_tabletop_task0",
                                        sft_record.sft_config(["sft.steps=3", "log.output_dir=x"]))
    assert one != sft_record.keyed_path("checkpoints/sft_tabletop_task0", sft_record.sft_config(["sft.steps=4"]))
    assert sft_record.describe(str(tmp_path)).startswith("no record of what made it")
    # the committed start (made before made_by.yaml): the commit its provenance.json records
    committed = os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0", "sft_start_2026-12-07")
    assert sft_record.describe(committed).startswith("trained at commit f86f9e838c (its provenance.json;")


@pytest.mark.parametrize("script,gpu", [("train_srpo.py", "0"), ("train_sft.py", "3"), ("evaluate.py", "0")])
def test_gpu_flag_without_that_gpu_stops_in_one_line(script, gpu):
    """`--gpu N` on a machine where torch sees no CUDA device N: one line, exit 1, never a silent CPU run."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    args = ["--checkpoint", "checkpoints/none"] if script == "evaluate.py" else ["--task-id", "0"]
    out = subprocess.run([sys.executable, os.path.join(ROOT, script), *args, "--gpu", gpu], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == f"error: --gpu {gpu}: no CUDA device on this machine; drop --gpu to run on the CPU\n"


def test_gpu_flag_with_dry_run_plans_without_a_gpu():
    """--dry-run plans a GPU machine's memory from any machine: --gpu is not checked there."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "train_srpo.py"), "--task-id", "0", "--gpu", "0",
                          "--dry-run"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def key_meanings(help_text: str):
    """(key=value, meaning) of every hyper-parameter line of a script's --help (a key too long for its column has its
    meaning on the next line, indented 45 columns)."""
    lines = help_text.split("hyper-parameters:", 1)[1].splitlines()[1:]
    out = []
    for i, line in enumerate(lines):
        if re.match(r"  \S+=", line):
            key, _, meaning = line.strip().partition(" ")
            if not meaning.strip() and i + 1 < len(lines) and lines[i + 1].startswith(" " * 44):
                meaning = lines[i + 1]
            out.append((key, meaning.strip()))
    return out


@pytest.mark.parametrize("script", ["train_srpo.py", "train_gae_ppo.py", "train_luffy.py", "train_flowsar.py",
                                    "train_sft.py"])
def test_every_key_in_help_has_a_meaning(script):
    """`python <script> --help` lists every key with its value and a meaning (README); a section comment in the
    dataclass source is not glued onto the key above it (env.expert_noise's once ended in 'real LIBERO only')."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    keys = key_meanings(out.stdout)
    assert len(keys) > 40 and any(k.startswith("env.task_ids=") for k, _ in keys)
    assert [k for k, meaning in keys if not meaning] == []
    expert = [m for k, m in keys if k.startswith("env.expert_noise=")]
    assert expert == ["tabletop: std of Gaussian noise added to the scripted expert's actions"]


def script_error(script, *args, cwd=ROOT):
    out = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, env=ENV, capture_output=True,
                         text=True, timeout=300)
    # stdout may hold only the lines saying which keys eval.protocol set (printed before the run starts)
    printed = [line for line in out.stdout.splitlines() if not line.startswith(("eval.protocol=", "  "))]
    assert out.returncode != 0 and printed == [] and len(out.stderr.splitlines()) == 1, out.stderr[-2000:]
    return out.stderr.strip()


@pytest.mark.parametrize("typo,meant", [("--task_id", "--task-id"), ("--gpus", "--gpu"), ("--no_wandb", "--no-wandb")])
def test_a_mistyped_flag_gets_one_line_with_did_you_mean(typo, meant):
    line = script_error("train_srpo.py", typo, "0")
    assert line.startswith(f"error: command line: unknown flag {typo}; did you mean {meant}")
    assert "usage:" not in line


def test_unknown_keys_say_whose_config_and_where_the_shipped_file_is(tmp_path):
    line = script_error("train_srpo.py", "--config", "configs/sft.yaml")
    assert line.startswith("error: configs/sft.yaml: unknown key 'policy.token' for train_srpo.py (configs/sft.yaml "
                           "is a config of train_sft.py: python train_sft.py --config configs/sft.yaml); did you mean "
                           "'policy.use_wrist', 'policy.hidden_size'?")
    line = script_error("train_srpo.py", "--config", "srpo.yaml", cwd=str(tmp_path))  # not here, but shipped
    assert line == ("error: config file not found: srpo.yaml (did you mean --config configs/srpo.yaml? the configs/ "
                    "folder lists the shipped ones)")
    # the policy's width is policy.token.hidden_size in train_sft.py, policy.hidden_size in the RL scripts
    line = script_error("train_sft.py", "--task-id", "0", "policy.hidden_size=128")
    assert line.startswith("error: command line: unknown key 'policy.hidden_size' for train_sft.py; did you mean "
                           "'policy.token.hidden_size', 'policy.flow.hidden_size'?")


def test_a_libero_run_without_an_sft_start_names_the_commands_that_make_one():
    line = script_error("train_srpo.py", "--config", "configs/srpo_libero_cpu.yaml", "--task-id", "0",
                        "init.path=checkpoints/none_here", "--no-wandb", "log.output_dir=/nonexistent/runs")
    assert "no SFT checkpoint at checkpoints/none_here, and libero_spatial has no demos" in line
    assert "python record_demos.py --record 50 --suite libero_spatial --task-ids 0" in line
    assert "python benchmarks/libero_learning.py --suite libero_spatial --task-id 0 --sft-only --out D" in line


def test_test_all_and_evaluate_help_read_right():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "test_all.py"), "--help"], env=ENV, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and len(out.stdout.splitlines()) < 20 and "--all" in out.stdout
    assert "pytest" in out.stdout and "file_or_dir" not in out.stdout
    out = subprocess.run([sys.executable, os.path.join(ROOT, "evaluate.py"), "--help"], env=ENV, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    assert "side by side. options:" in text  # the description is the docstring's whole first sentence
    assert "(default: None)" not in text and "(default: False)" not in text
    for option in re.split(r"\s(?=--[a-z-]+ )", text.split("options:", 1)[1]):  # one default per option
        assert option.count("default") <= 1, option
    assert "--gifs GIFS successful and failed episodes each in the GIF (0 = none) (default 2)" in text


LOGGED = re.compile(r"[\"']((?:charts|rollout|val|sampling|reward|demos|train|sft|time|eval|perf)/[A-Za-z0-9_]+)[\"']")


def documented_metrics():
    """Regexes of the metric keys docs/metrics.md's table names: `a/x`, `y` (y inherits a/), `{a,b}` alternatives,
    `{t}` a task id, `*` any ending."""
    with open(os.path.join(ROOT, "docs", "metrics.md")) as f:
        rows = [line for line in f if line.startswith("| `")]
    patterns = []
    for row in rows:
        prefix = ""
        for name in re.findall(r"`([^`]+)`", row.split(" | ")[0]):
            if "/" in name:
                prefix = name.split("/", 1)[0] + "/"
            else:
                name = prefix + name
            regex = re.escape(name).replace(r"\{t\}", r"\d+").replace(r"\*", r"\w+")
            regex = re.sub(r"\\\{([\w,]+)\\\}", lambda m: "(" + m.group(1).replace(",", "|") + ")", regex)
            patterns.append(re.compile(regex + r"\Z"))
    return patterns


def test_every_metric_the_scripts_log_is_documented():
    """Every `section/key` string the scripts and their shared code write (train_*.py, common/, models/) is a row of
    docs/metrics.md (time/rollout_build_s and SFT's charts/step once were not)."""
    files = [os.path.join(ROOT, f) for f in os.listdir(ROOT) if f.startswith("train_") and f.endswith(".py")]
    for folder in ("common", "models"):
        files += [os.path.join(ROOT, folder, f) for f in os.listdir(os.path.join(ROOT, folder)) if f.endswith(".py")]
    logged = set()
    for path in files:
        with open(path) as f:
            logged |= {k for k in LOGGED.findall(f.read()) if not k.endswith("_")}  # (a "reward/failure_" is a
            # panel's prefix)
    assert {"charts/step", "time/rollout_build_s", "train/pg_loss", "val/success_rate"} <= logged
    patterns = documented_metrics()
    assert len(patterns) > 60
    assert sorted(k for k in logged if not any(p.match(k) for p in patterns)) == []


def _sources():
    """(path, text) of the code and docs a user reads: the scripts, common/, models/, envs/, benchmarks/, configs/,
    README.md and docs/."""
    out = []
    for folder, _, names in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        if rel != "." and rel.split(os.sep)[0] not in ("common", "models", "envs", "benchmarks", "configs", "docs"):
            continue
        for name in names:
            if name.endswith((".py", ".md", ".yaml")) and (rel != "." or name.startswith(("train_", "README")) or
                                                            name in ("evaluate.py", "test_all.py")):
                with open(os.path.join(folder, name)) as f:
                    out.append((os.path.relpath(os.path.join(folder, name), ROOT), f.read()))
    return out


def _headings(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return [re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", h).strip()
                for h in re.findall(r"^#+\s+(.+?)\s*$", f.read(), re.M)]


def test_every_pointer_to_a_doc_resolves():
    """Every docs/*.md path the code, configs and docs name exists; every `docs/x.md, "Heading"` (and README's
    `README: Heading`) names a heading there (error messages once sent users to README sections that had moved);
    every ../shared/specs/*.md the code cites is one of the shared specs (when they are beside the checkout); no doc
    cites a specs/ file as if it were in this repository."""
    sources = _sources()
    assert len(sources) > 100
    missing = []
    for path, text in sources:
        if path.startswith("docs/notebook/"):  # the dated history: its pointers are as they were that day
            continue
        for doc in set(re.findall(r"\bdocs/[A-Za-z0-9_/.-]+?\.md\b", text)):
            if not os.path.isfile(os.path.join(ROOT, doc)):
                missing.append(f"{path}: {doc}")
        for doc, title in re.findall(r"\b(docs/[a-z_/]+\.md|README)[,:]? \(?\"([A-Z][^\"]{2,70})\"", text):
            doc, title = ("README.md" if doc == "README" else doc), " ".join(title.split())
            if not any(h.startswith(title.rstrip("?")) for h in _headings(doc)):
                missing.append(f"{path}: {doc} has no heading {title!r}")
        for title in re.findall(r"\(README: ([A-Z][^)]{2,60})\)", text):
            if not any(h.startswith(title) for h in _headings("README.md")):
                missing.append(f"{path}: README.md has no heading {title!r}")
        if path.endswith(".md"):
            missing += [f"{path}: {m} is not in this repository" for m in re.findall(r"(?<![./\w])specs/\w+\.md", text)]
    assert missing == [], missing
    beside = [os.path.join(ROOT, *[".."] * up, "shared", "specs") for up in (1, 2)]
    shared = next((d for d in beside if os.path.isdir(d)), None)
    if shared is not None:
        cited = {name for _, text in sources for name in re.findall(r"shared/specs/(\w+\.md)", text)}
        assert cited and cited <= set(os.listdir(shared)), cited - set(os.listdir(shared))


def test_the_error_messages_point_at_docs_that_exist():
    """The one-line errors' pointers: README sections the code names (`README: ...`) were replaced by the docs that
    hold them; an error naming docs/checkpoints.md names a file there is."""
    with open(os.path.join(ROOT, "common", "policy_start.py")) as f:
        text = f.read()
    assert "(README:" not in text and text.count("(docs/checkpoints.md)") == 2
    assert os.path.isfile(os.path.join(ROOT, "docs", "checkpoints.md"))


def test_the_headline_figure_is_generated_from_committed_data(tmp_path):
    """docs/headline_libero_spatial_t0.png is what tests/headline_figure.py makes from the committed outcomes
    (same size, the same pixels up to rendering noise), small, and README shows it beside its table."""
    import matplotlib.image

    from tests import headline_figure as figure

    committed = os.path.join(ROOT, "docs", "headline_libero_spatial_t0.png")
    assert os.path.getsize(committed) < 100_000
    made = figure.figure(str(tmp_path / "fig.png"))
    a, b = matplotlib.image.imread(committed), matplotlib.image.imread(made)
    assert a.shape == b.shape and abs(a - b).mean() < 0.01
    ends = figure.runs()  # what it plots: every seed's end, read from the outcomes files
    assert {arm: [s for s, _ in seeds] for arm, seeds in ends.items()} == {"control": [1, 2], "grpo": [1, 2, 3],
                                                                           "srpo": [1, 2, 3]}
    assert ends["srpo"][1][1][0] == 0.83 and figure.read(os.path.join(figure.DATA, "sft_outcomes.json"))[0] == 0.5
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "](docs/headline_libero_spatial_t0.png)" in readme
    for row in ("| GRPO (binary reward) | 3 | 0.50 -> 0.73 | +0.23 [+0.14, +0.32] |",
                "| SRPO (progress reward) | 3 | 0.50 -> 0.79 | +0.29 [+0.20, +0.38] |",
                "| control (shuffled reward, no signal) | 2 | 0.50 -> 0.54 | +0.04 [−0.07, +0.14] |"):
        assert row in readme
    with open(os.path.join(ROOT, "docs", "data", "libero_learning", "libero_spatial_t0", "table.md")) as f:
        table = f.read()  # README's rows are the committed table's pooled rows
    for pooled in ("**0.50 -> 0.73, +0.23 [+0.14, +0.32]**", "**0.50 -> 0.79, +0.29 [+0.20, +0.38]**",
                   "**0.50 -> 0.54, +0.04 [-0.07, +0.14]**"):
        assert pooled in table


def test_readme_says_what_has_run_and_dates_its_timing():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = " ".join(f.read().split())
    assert "no published checkpoint has been trained or evaluated with this code yet" in readme
    # the first command's timing and start -> end, dated with the commit it was measured at (issue 70)
    measured = re.search(r"From a fresh clone on an idle 2-core machine \((\d{4}-\d\d-\d\d), commit ([0-9a-f]{7,})\) "
                         r"it took [\d.]+ minutes \(install [\d.]+, SFT [\d.]+, SRPO [\d.]+\) and read: SFT start "
                         r"[\d.]+ held-out greedy", readme)
    assert measured, "README's first command: its measured minutes and start -> end, dated with a commit"
    assert "download.pytorch.org" not in readme
    assert "Every training script (`train_*.py`) takes `--config FILE`" in readme
