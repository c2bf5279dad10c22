"""The docs run: every shell command in README.md and docs/*.md that starts one of the project's scripts (train_*.py,
evaluate.py, record_demos.py, test_all.py, benchmarks/*.py) parses: a training script's command through the script's
own config parser and value checks (--dry-run's plan is not computed: it would load checkpoints the docs only name),
any other script's through its argparse parser; and every relative link in them resolves (the file, and the heading
an #anchor names). A placeholder (`<SFT start>`, `...`, `$OFT`, T / S / N for a number) stands for a value of the
reader's: it is replaced by one of the right type (an existing folder, 0)."""
import argparse
import glob
import os
import re
import runpy
import shlex
import subprocess
import sys

import pytest

from tests.scripts import ROOT

DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
SCRIPT = re.compile(r"^(train_\w+\.py|evaluate\.py|record_demos\.py|test_all\.py|benchmarks/\w+\.py)$")
FOLDER = os.path.join(ROOT, "tests", "fixtures", "tabletop_t0_weak")  # a placeholder path: a real policy folder


def _read(doc):
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def shell_commands(text):
    """(command, the output the doc shows for it or None) for every command line of the fenced code blocks and of the
    inline code spans that start a program: backslash continuations joined, `$ ` prompts and trailing comments
    dropped, && / ; / | split. In a block of `$ ` prompts, the lines under a prompt are its output."""
    lines = []
    fences = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
    for block in fences.findall(text):
        block = block.replace("\\\n", " ").splitlines()
        prompts = any(line.startswith("$ ") for line in block)
        for i, line in enumerate(block):
            if prompts and not line.startswith("$ "):
                continue  # output
            shown = block[i + 1] if prompts and i + 1 < len(block) and not block[i + 1].startswith("$ ") else None
            lines.append((line, shown))
    for span in re.findall(r"`([^`]+)`", fences.sub("", text)):
        span = " ".join(span.split())
        if re.match(r"(\w+=\S+ )*(nice -n \d+ )?(python|accelerate launch) ", span):
            lines.append((span, None))
    out = []
    for line, shown in lines:
        line = re.sub(r"^\s*\$ ", "", line)
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()
        out += [(part.strip(), shown) for part in re.split(r"&&|;|\|", line) if part.strip()]
    return out


def script_invocation(command):
    """(script, its arguments) when `command` runs one of the project's scripts, else None."""
    command = re.sub(r"<[^<>]*>", "PLACEHOLDER", command)
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and (re.match(r"^\w+=", words[0]) or words[0] in ("nice", "-n", "10", "timeout")):
        words = words[1:]
    if words[:2] == ["accelerate", "launch"]:
        words = words[2:]
        while words and not words[0].endswith(".py"):
            valued = ("--config_file", "--num_processes", "--num_machines", "--mixed_precision", "--dynamo_backend",
                      "--machine_rank", "--main_process_ip", "--main_process_port")
            words = words[2:] if words[0] in valued else words[1:]
        words = ["python"] + words
    if len(words) < 2 or words[0] not in ("python", "python3") or not SCRIPT.match(words[1]):
        return None
    return words[1], words[2:]


def commands():
    found = []
    for doc in DOCS:
        for command, shown in shell_commands(_read(doc)):
            invocation = script_invocation(command)
            if invocation:
                found.append((doc, command, *invocation, shown))
    return found


class Parsed(Exception):
    """The command line parsed and its values passed the script's checks: stop before anything runs."""


def _placeholders(args):
    """A reader's values: a path for PLACEHOLDER / ... / a folder under /models, 0 for a one-letter number; a
    placeholder standing for more arguments (`<overrides>`, a trailing `...`, `$OFT`: its own command shows it) and
    `--resume RUN` (a run folder of the reader's) are left out."""
    out = []
    for i, a in enumerate(args):
        before = args[i - 1] if i else ""
        if re.fullmatch(r"\$\w+", a) or (a in ("PLACEHOLDER", "...") and not before.startswith("-")):
            continue
        if before == "--resume" and a == "RUN" or a == "--resume" and args[i + 1:i + 2] == ["RUN"]:
            continue
        a = re.sub(r"PLACEHOLDER|^\.\.\.$|/models/[\w.-]+", FOLDER, a)
        out.append("0" if re.fullmatch(r"[A-Z]", a) else a)
    return out


def parse_only(script, args, monkeypatch):
    """Run `script` with `args` until its command line is parsed and checked (Parsed), in this process."""
    import common.config
    from common import memory_plan

    monkeypatch.setattr(sys, "argv", [script, *args])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the scripts put their folders on it: undone
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    monkeypatch.setattr(memory_plan, "dry_run", lambda cfg: None)
    monkeypatch.setattr(memory_plan, "CLI", dict(memory_plan.CLI))  # --dry-run / --device-memory-gib: undone
    import common.distributed  # a documented GPU command (--gpu 0) parses on any machine: whether this one has that
    monkeypatch.setattr(common.distributed, "select_gpu", lambda index: None)  # GPU is the machine's, not the line's
    if script.startswith("train_"):
        def checked(check, cfg):
            try:
                check(cfg)
            except ValueError as e:
                raise SystemExit(f"error: {e}") from None
            raise Parsed()

        monkeypatch.setattr(common.config, "exit_on_bad_config", checked)
    elif script == "test_all.py":
        def stop(*a, **k):
            raise Parsed()

        monkeypatch.setattr(subprocess, "call", stop)
        monkeypatch.setattr(subprocess, "Popen", stop)
    else:
        plain = argparse.ArgumentParser.parse_args

        def parsed(self, args=None, namespace=None):
            plain(self, args, namespace)
            raise Parsed()

        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    with pytest.raises(Parsed):
        runpy.run_path(os.path.join(ROOT, script), run_name="__main__")


COMMANDS = commands()


def test_the_docs_hold_commands_of_every_kind():
    scripts = {script for _, _, script, _, _ in COMMANDS}
    assert {"train_srpo.py", "train_sft.py", "train_flowsar.py", "evaluate.py", "test_all.py"} <= scripts
    assert any(s.startswith("benchmarks/") for s in scripts) and len(COMMANDS) > 50
    assert _placeholders(["--task-id", "T", "--seed", "S", "PLACEHOLDER", "init.path=PLACEHOLDER", "$OFT"]) == \
        ["--task-id", "0", "--seed", "0", f"init.path={FOLDER}"]


@pytest.mark.parametrize("doc,command,script,args,shown", COMMANDS,
                         ids=[f"{d}:{c[:60]}" for d, c, _, _, _ in COMMANDS])
def test_every_documented_command_parses(doc, command, script, args, shown, monkeypatch, capsys):
    """It parses (or, --help, answers); a command the doc shows failing prints the doc's error line."""
    import torch

    environ, threads = dict(os.environ), torch.get_num_threads()
    try:
        parse_only(script, _placeholders(args), monkeypatch)
    except SystemExit as e:
        if e.code in (0, None):  # --help
            return
        said = str(e.code)
        if shown and shown.startswith("error: "):
            assert said.startswith(shown.rstrip(".").rstrip()), f"{doc} shows `{shown}`; the script says `{said}`"
            return
        raise AssertionError(f"{doc}: `{command}` exits: {said} {capsys.readouterr().err[-500:]}") from None
    finally:  # --gpu sets CUDA_VISIBLE_DEVICES; nothing a parse changes outlives it
        os.environ.clear()
        os.environ.update(environ)
        torch.set_num_threads(threads)
    assert not (shown or "").startswith("error: "), f"{doc} shows `{shown}`, but `{command}` parses"


def test_every_benchmark_is_linked_from_the_docs():
    """Each script in benchmarks/ reproduces an answer of README.md or docs/*.md, which names it (its commands are
    parsed above; tests/test_benchmarks_help.py runs every one's --help)."""
    text = "".join(_read(doc) for doc in DOCS)
    scripts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
    assert scripts and [s for s in scripts if f"benchmarks/{s}" not in text] == []


def test_the_programs_the_docs_start_are_installed():
    """hf (huggingface_hub's CLI: the pinned version ships no huggingface-cli), accelerate and pip are on PATH."""
    import shutil

    programs = {command.split()[0] for doc in DOCS for command, _ in shell_commands(_read(doc))}
    assert "huggingface-cli" not in programs and {"hf", "accelerate", "pip", "python"} <= programs
    assert all(shutil.which(p) for p in ("hf", "accelerate", "pip"))


def anchors(doc):
    """GitHub's anchors of a markdown file: its headings' (lower case, punctuation but - and _ dropped, spaces -> -)
    and its `<a id="...">` tags."""
    text = re.sub(r"^```.*?^```", "", _read(doc), flags=re.S | re.M)
    out = set(re.findall(r'<a id="([^"]+)">', text))
    for heading in re.findall(r"^#+\s+(.+?)\s*$", text, re.M):
        heading = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
        out.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return out


def test_every_relative_link_resolves():
    """README.md and docs/*.md: a relative link names a file of the repository (and a heading, when it has #...)."""
    broken = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", _read(doc), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            if not os.path.exists(os.path.join(ROOT, resolved)):
                broken.append(f"{doc}: {target} (no {resolved})")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{doc}: {target} (no heading #{anchor} in {resolved})")
    assert not broken, "\n".join(broken)
