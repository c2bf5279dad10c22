"""Typed, strict YAML configs with `section.key=value` overrides (OmegaConf structured configs).

Every script declares one dataclass tree; `load_config` merges YAML then command-line overrides into it and turns any
unknown key or wrong type into a one-line `ConfigError` naming the key, the file and the closest valid keys.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import inspect
import os
import re
import sys
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar, get_type_hints

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from common.run_folder import default_run_prefix, resolve_run_dir, set_trust_run
from common.scripts import SCRIPTS, script_file  # noqa: F401 - script_file re-exported
from base.config_fields import ConfigError, ranged  # noqa: F401 - re-exported
from envs.suites import EnvConfig, check_env_config, num_trials  # noqa: F401 - re-exported
from common import memory_plan, renamed_keys, yaml_safe
from models.configs import FAMILIES, config_class

T = TypeVar("T")


@dataclass
class LogConfig:
    output_dir: str = "runs"  # run folders (resolved config, metrics.jsonl, checkpoints) go in <output_dir>/<run_name>
    plots_dir: str = "plots"  # PNG panels go in <plots_dir>/<run_name>/
    run_name: Optional[str] = None  # None = "<script>__<suite>__t<tasks>__s<seed>__<timestamp>"
    wandb: bool = True  # --no-wandb switches it off
    wandb_mode: str = "offline"  # offline (no network needed) | online
    wandb_project: str = "vla-rl"  # wandb project the run is logged under
    plot_every: int = ranged(1, "[0, inf)")  # write PNG panels every N updates
    checkpoint_every: int = ranged(5, "[1, inf)")  # save a checkpoint every N updates (and at the end)
    keep_checkpoints: int = ranged(2, "[1, inf)")  # how many recent checkpoints to keep


@dataclass
class EvalConfig:
    every: int = ranged(10, "[0, inf)")  # evaluate every N iterations (and before
                                         # the first and after the last); 0 = never
    trials_per_task: int = ranged(20, "[1, 10000]")  # fixed trials per task: one greedy episode each (val/success_rate)
    trial_start: Optional[int] = ranged(30, "[0, inf)")  # first evaluation trial (tabletop: 30..49 are never
                                                         # practised nor demoed); None = rollout.train_trials
                                                         # (the trials after the practised ones)
    samples_per_trial: int = ranged(8, "[0, 1024]")  # > 0: also this many episodes per trial at the
                                                     # rollout temperature (val/sampled_success_rate:
                                                     # the stochastic policy RL trains); 0 = greedy only
    protocol: str = "heldout"  # heldout (this project's: trials never practised, fixtures seeded by trial id) |
                               # simplevla-rl | siirl | openvla-oft | openpi | openvla-oft-rl | rlinf: that
                               # reference's LIBERO protocol
                               # (episode limit, settling steps, fixture seeding, 256 px, decoding, all 50 trials, RL
                               # practising on them) fills the env/rollout/eval keys left at their defaults and refuses
                               # others (envs/protocols.py, docs/libero.md "Protocols")


@dataclass
class InitConfig:
    mode: str = "auto_sft"  # auto_sft: run train_sft.py first if `path` is missing | checkpoint: load `path` | scratch
    path: Optional[str] = None  # SFT checkpoint; None = checkpoints/sft_<suite>_task<task ids> (sft_flow_... for flow)
    sft_args: List[str] = field(default_factory=list)  # extra train_sft.py arguments for auto_sft, e.g. ["sft.num_demos=5"]


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: shipped configs and scripts
RESUMABLE = ("resume", "train.iterations", "eval.", "log.")  # keys a resumed run may change (nothing run so far)


def _schema_keys(node: Any) -> Dict[str, Any]:
    """Field name -> default value (a dataclass instance for nested sections) of a dataclass instance."""
    return {f.name: getattr(node, f.name) for f in fields(node)}


def _check_keys(data: Any, node: Any, prefix: str, source: str) -> None:
    """Raise ConfigError for the first key in `data` that the dataclass instance `node` does not have."""
    if not isinstance(data, dict) or not is_dataclass(node):
        return
    valid = _schema_keys(node)
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in valid:
            close = [prefix + c for c in difflib.get_close_matches(str(key), list(valid), n=3, cutoff=0.5)]
            # the same key one level up or down: train_sft.py's policy.token.hidden_size is an RL script's
            # policy.hidden_size, and the other way round
            close = close or [f"{prefix}{name}.{key}" for name, sub in valid.items()
                              if is_dataclass(sub) and key in _schema_keys(sub)]
            close = close or ([prefix + k for k in value if k in valid][:3] if isinstance(value, dict) else [])
            hint = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
            section = f"'{prefix[:-1]}'" if prefix else "the top level"
            raise ConfigError(
                f"{source}: unknown key '{full}'; {hint}valid keys in {section}: {', '.join(sorted(valid))}"
            )
        if is_dataclass(valid[key]):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{full}' is a section; give it keys ({', '.join(_schema_keys(valid[key]))})")
            _check_keys(value, valid[key], f"{full}.", source)


def _refuse_interpolation(data: Any, source: str, prefix: str = "") -> None:
    """ConfigError naming the first key whose value holds `${`: OmegaConf would resolve it (`${oc.env:VAR}` reads the
    environment, e.g. an API key, into the run name, config.yaml and wandb), so interpolation is off everywhere."""
    if isinstance(data, dict):
        for key, value in data.items():
            _refuse_interpolation(value, source, f"{prefix}{key}.")
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            _refuse_interpolation(value, source, f"{prefix[:-1]}[{i}].")
    elif isinstance(data, str) and "${" in data:
        raise ConfigError(f"{source}: {prefix[:-1]}={data!r}: interpolation (${{...}}) is not supported in configs "
                          f"(it could read the environment into the run's name, config.yaml and wandb); write the value "
                          f"itself")


def _merge(base: DictConfig, data: Dict[str, Any], schema: Any, source: str) -> DictConfig:
    _check_keys(data, schema, "", source)
    _refuse_interpolation(data, source)
    try:
        return OmegaConf.merge(base, data)
    except (ValidationError, ConfigKeyError) as e:
        key = getattr(e, "full_key", None) or "?"
        value = _lookup(data, key)
        expected = _expected_type(schema, key)
        raise ConfigError(f"{source}: bad value for '{key}': {value!r} is not a valid {expected}") from None


def _lookup(data: Dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return node
    return node


def _expected_type(schema: Any, dotted: str) -> str:
    node = schema
    parts = dotted.split("[")[0].split(".")
    for part in parts[:-1]:
        node = getattr(node, part, None)
    hints = get_type_hints(type(node)) if is_dataclass(node) else {}
    hint = hints.get(parts[-1])
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def load_config(schema: Type[T], path: Optional[str] = None, overrides: Sequence[str] = (), announce: bool = True) -> T:
    """Defaults of `schema` <- YAML file <- `key=value` overrides, strictly checked; returns a `schema` instance. A
    file with keys of the old update vocabulary is read with them renamed (common/renamed_keys.py), said in one
    printed note (`announce`)."""
    data: Dict[str, Any] = {}
    if path is not None:
        if not os.path.isfile(path):
            shipped = os.path.join("configs", os.path.basename(path))
            hint = f"did you mean --config {shipped}? " if os.path.isfile(os.path.join(ROOT, shipped)) else ""
            raise ConfigError(f"config file not found: {path} ({hint}the configs/ folder lists the shipped ones)")
        try:
            data = yaml_safe.load_file(path) or {}
        except OSError as e:
            raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
        data, renamed = renamed_keys.upgrade(data)  # a file of the old vocabulary (an old run's config.yaml)
        if renamed and announce and os.environ.get("RANK", "0") == "0":
            print(renamed_keys.note(path, renamed), flush=True)
    given = []
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"command line: override '{item}' must look like section.key=value")
        key, _, raw = item.partition("=")
        value = yaml_safe.load(raw, f"command line: {key}") if raw != "" else ""
        nested: Dict[str, Any] = {}
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
        given.append(nested)
    default = _with_policy_family(schema(), [data, *given])
    cfg = OmegaConf.structured(default)
    if path is not None:
        cfg = _merge(cfg, data, default, path)
    for nested in given:
        cfg = _merge(cfg, nested, default, "command line")
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def _with_policy_family(default: Any, sources: Sequence[Dict[str, Any]]) -> Any:
    """A script whose `policy` section is a policy family's config (a dataclass with a `type` field, annotated `Any`
    in the script's Config) takes the family that `policy.type` names (the YAML, then the command line; the last
    wins): its keys are that family's config class's keys (models/configs.py FAMILIES). A `policy` section that holds
    one section per family instead (train_sft.py's `policy.token`, `policy.flow`) gets one for the family that
    `policy.type` names when it has none and starts fresh (`policy.<family>.*`, that family's config class's keys)."""
    policy = getattr(default, "policy", None)
    if not is_dataclass(policy) or "type" not in {f.name for f in fields(policy)}:
        return default
    family, folder = policy.type, getattr(policy, "init_path", None)
    for source in sources:
        section = source.get("policy") if isinstance(source, dict) else None
        if isinstance(section, dict) and "type" in section:
            family = section["type"]
        if isinstance(section, dict) and "init_path" in section:
            folder = section["init_path"]
    if get_type_hints(type(default)).get("policy") is not Any:  # a section per family (none for a start from a
        # folder, `policy.init_path`: the folder's own family and config are used)
        if family in FAMILIES and not folder and family not in {f.name for f in fields(policy)} and \
                any(f.name in FAMILIES for f in fields(policy)):
            default.policy = _with_section(policy, family)
        return default
    if family == policy.type:
        return default
    if family not in FAMILIES:
        raise ConfigError(f"policy.type={family!r}: unknown policy family; use one of {', '.join(sorted(FAMILIES))}")
    default.policy = config_class(family)()
    return default


def _with_section(policy: Any, family: str) -> Any:
    """`policy` (a section per family) with a section `family` of its config class's defaults added: an instance of a
    dataclass that extends `policy`'s with that one field."""
    section = config_class(family)
    cls = make_dataclass(type(policy).__name__, [(family, section, field(default_factory=section))],
                         bases=(type(policy),))
    return cls(**{f.name: getattr(policy, f.name) for f in fields(policy)})


def _in_interval(value: float, interval: str) -> bool:
    low, high = (x.strip() for x in interval.strip()[1:-1].split(","))
    low_ok = value > float(low) if interval[0] == "(" else value >= float(low)
    high_ok = value < float(high) if interval[-1] == ")" else value <= float(high)
    return low_ok and high_ok


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """ConfigError (one line) for the first numeric key of the config tree `cfg` outside the range its field declares
    (`ranged(default, interval, why)` beside the field, in the dataclass that declares the key; None is a key's "unset"
    and is not checked). Intervals as in mathematics: [a, b] inclusive, (a, b) exclusive, inf unbounded."""
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if is_dataclass(value):
            check_ranges(value, f"{prefix}{f.name}.")
            continue
        interval, why = f.metadata.get("range"), f.metadata.get("why")
        if interval is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not _in_interval(float(value), interval):
            raise ConfigError(f"{prefix}{f.name}={value}: must be in {interval}" + (f" ({why})" if why else ""))


def check_run_config(cfg: Any) -> None:
    """ConfigError (one line with the fix) for the env/rollout/train/eval/log keys every RL script shares (the one
    update vocabulary: train.update_epochs, mini_batch_size, micro_batch_size, mini_batch_unit, strategy; rollout.
    train_trials), every key's range (declared beside its field), and unknown task ids. Reads the suites' static facts
    (envs/suites.py): no simulator is imported."""
    check_ranges(cfg)
    if cfg.init.mode not in ("checkpoint", "auto_sft", "scratch"):
        raise ConfigError(f"init.mode={cfg.init.mode!r}: use checkpoint (load init.path), auto_sft (train_sft.py "
                          f"first when init.path is missing) or scratch")
    from common.fsdp import check_strategy

    try:
        check_strategy(cfg.train.strategy, cfg.train.fsdp_offload)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        check_env_config(cfg.env)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    protocol = apply_protocol(cfg)
    rollout, train = cfg.rollout, cfg.train
    unit = train.mini_batch_unit
    grid = getattr(type(train), "GRID_MINI_BATCHES", False)  # the scripts that implement mini_batch_unit=grid
    if unit not in ("step", "trajectory") + (("grid",) if grid else ()):
        raise ConfigError(f"train.mini_batch_unit={unit!r}: use step (mini-batches of policy steps) or trajectory "
                          f"(of whole episodes)" + (" or grid (of the padded episode x step grid)" if grid else ""))
    if train.mini_batch_size % train.micro_batch_size and unit == "step":  # (each >= 1: its range) trajectory
        # mini-batches count episodes, micro-batches policy steps: no multiple to check there
        raise ConfigError(f"train.update_epochs={train.update_epochs}, train.mini_batch_size={train.mini_batch_size}, "
                          f"train.micro_batch_size={train.micro_batch_size}: the mini-batch must be a multiple of the "
                          f"micro-batch")
    if protocol["practice_on_eval_trials"]:  # the reference practises on every trial it evaluates: nothing held out
        pass
    elif rollout.train_trials >= num_trials(cfg.env):  # (>= 1: its range)
        raise ConfigError(f"rollout.train_trials={rollout.train_trials} must leave held-out trials: the suite has "
                          f"{num_trials(cfg.env)} trials per task")
    practice, first = rollout.train_trials, cfg.eval.trial_start
    if cfg.eval.every > 0 and first is not None and first < practice and \
            not protocol["practice_on_eval_trials"]:  # a reference protocol evaluates the trials it practises on
        raise ConfigError(f"eval.trial_start={first}: evaluation trials {first}..{first + cfg.eval.trials_per_task - 1} "
                          f"overlap the practice trials 0..{practice - 1} (rollout.train_trials={practice}), so val/ "
                          f"success would not be held out (evaluate.py refuses the same); set eval.trial_start>="
                          f"{practice} (or null: right after the practice trials)")
    if cfg.env.image_size % 16:
        raise ConfigError(f"env.image_size={cfg.env.image_size}: the policies cut images into 16 px patches; use a "
                          f"multiple of 16 (64, 128, 224, 256)")
    policy = getattr(cfg, "policy", None)
    if cfg.init.mode == "scratch" and hasattr(policy, "image_size") and policy.image_size != cfg.env.image_size and \
            policy.image_size != type(policy)().image_size and not getattr(policy, "pretrained_path", None):
        raise ConfigError(f"policy.image_size={policy.image_size} but env.image_size={cfg.env.image_size}: a new policy "
                          f"sees what the env renders, so its size is env.image_size; set env.image_size instead")


def apply_protocol(cfg: Any) -> Dict[str, Any]:
    """eval.protocol applied to an RL config in place (envs/protocols.py apply_to_run_config: keys left at their
    defaults take the protocol's values, others are refused in one line); the resolved protocol."""
    from envs.protocols import apply_to_run_config
    from models.configs import action_kind

    family = getattr(getattr(cfg, "policy", None), "type", "token")
    return apply_to_run_config(cfg, action_kind(family) if family in FAMILIES else "token")


def config_to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (saved next to every run's outputs)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def save_config(cfg: Any, path: str, script: Optional[str] = None, exclusive: bool = False) -> None:
    """The resolved config as YAML at `path`; `script` (e.g. "srpo") goes in a first comment line that --resume reads
    to name the script a run belongs to; `exclusive` never replaces an existing file (a run's config.yaml)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    header = f"# {SCRIPT_MARK} {script} (continue with: python {script_file(script)} --resume <this folder>)\n" \
        if script else ""
    with open(path, "x" if exclusive else "w") as f:
        f.write(header + config_to_yaml(cfg))


SCRIPT_MARK = "run of script"
def saved_script(run_dir: str) -> Optional[str]:
    """The script a run folder belongs to: its config.yaml's first line, else its default name's prefix."""
    try:
        with open(os.path.join(run_dir, "config.yaml")) as f:
            first = f.readline()
    except OSError:
        first = ""
    if first.startswith(f"# {SCRIPT_MARK} "):
        return first.split()[4]
    head = os.path.basename(run_dir.rstrip("/")).split("__")[0]
    return head if head in SCRIPTS else None


def field_comments(cls: type) -> Dict[str, str]:
    """Field name -> its one-line meaning: the comment after the field in the dataclass source (comment-only lines
    right below it, indented deeper than the fields, continue it)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):  # a class made at run time (`_with_section`): its base's comments
        base = cls.__bases__[0] if cls.__bases__ else object
        return field_comments(base) if is_dataclass(base) else {}
    out: Dict[str, str] = {}
    name = None
    for line in lines[1:]:
        field_line = re.match(r"    (\w+)\s*:", line)
        comment = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        if field_line:
            name = field_line.group(1)
            out[name] = comment
        elif name is not None and line.strip().startswith("#") and line.startswith("     "):  # (a comment at the
            # fields' indentation heads the next fields: not this one's)
            out[name] = f"{out[name]} {line.strip()[1:].strip()}".strip()
        else:
            name = None
    return out


def hyperparameter_help(cfg: Any, prefix: str = "") -> List[str]:
    """One line per leaf key of the config tree `cfg`: `section.key=value  meaning`, CleanRL's --help in our syntax."""
    lines: List[str] = []
    comments = field_comments(type(cfg))
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if is_dataclass(value):
            lines += hyperparameter_help(value, f"{prefix}{f.name}.")
            continue
        shown = yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
        shown = shown[:-4] if shown.endswith("\n...") else shown.replace("\n...", "")
        key = f"  {prefix}{f.name}={shown}"
        lines.append(f"{key:<44} {comments.get(f.name, '')}".rstrip() if len(key) < 44 else
                     f"{key}\n{'':44} {comments.get(f.name, '')}".rstrip())
    return lines


def build_arg_parser(description: str, default_config: str,
                     flags: Optional[Dict[str, Dict[str, Any]]] = None,
                     defaults: Any = None, shown: Optional[str] = None, note: str = "") -> argparse.ArgumentParser:
    """The named flags every script takes (+ a script's own `flags`: name -> argparse kwargs with `key`, the config
    key it sets); anything else on the line is a `section.key=value` override. `defaults` (the config the default
    YAML, or `shown`, gives; `note`: what eval.protocol changed in it) lists every hyper-parameter with its value and
    meaning under the flags."""
    epilog = None
    if defaults is not None:
        source = shown or default_config or "the defaults"
        epilog = (f"hyper-parameters: set any with section.key=value (shown: the value {source} gives{note})\n"
                  + "\n".join(hyperparameter_help(defaults)))
    p = _Parser(description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, help=f"YAML config file (default {default_config})")
    p.add_argument("--task-id", type=int, default=None, help="train on one task (sets env.task_ids=[ID])")
    p.add_argument("--task-ids", type=int, nargs="+", default=None, help="train on several tasks")
    p.add_argument("--gpu", type=int, default=None,
                   help="CUDA device index to use (no such GPU: an error; leave it out to run on the CPU)")
    p.add_argument("--seed", type=int, default=None, help="random seed (sets seed=...)")
    p.add_argument("--no-wandb", action="store_true", help="switch wandb off (metrics still go to JSONL and PNG)")
    p.add_argument("--resume", nargs="?", const="auto", default=None,
                   help="continue a run with its saved config.yaml: alone = the latest run of this script/suite/"
                        "tasks/seed; or a run folder")
    p.add_argument("--trust-run", action="store_true",
                   help="with --resume: load an fsdp run folder not written on this machine (torch reads its shards' "
                        ".metadata with pickle, which can run code: trust it like code)")
    for name, spec in (flags or {}).items():
        spec = {k: v for k, v in spec.items() if k != "key"}
        p.add_argument(name, default=None, **spec)
    memory_plan.add_arguments(p)  # --dry-run, --device-memory-gib, --processes (common/memory_plan.py)
    p.add_argument("overrides", nargs="*", help="section.key=value overrides, e.g. algorithm.clip_ratio_high=0.28")
    return p


def resolve_config_path(path: Optional[str], default_config: Optional[str]) -> Optional[str]:
    """A user's --config against the current directory (then the repository); the default against the repository."""
    if path is None:
        return None if default_config is None else os.path.join(ROOT, default_config)
    if os.path.isfile(path) or os.path.isabs(path):
        return path
    shipped = os.path.join(ROOT, path)
    return shipped if os.path.isfile(shipped) else path


def flatten_config(node: Any, prefix: str = "") -> Dict[str, Any]:
    """{dotted key: leaf value} of a dataclass tree."""
    out: Dict[str, Any] = {}
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            out.update(flatten_config(value, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = value
    return out


def check_resume_overrides(saved: Any, resumed: Any, allowed: Sequence[str] = RESUMABLE) -> None:
    """ConfigError naming the first key whose value a resumed run would change but that shapes the run so far."""
    old, new = flatten_config(saved), flatten_config(resumed)
    for key, value in new.items():
        if value != old.get(key) and not any(key == a or (a.endswith(".") and key.startswith(a)) for a in allowed):
            raise ConfigError(f"--resume: {key} was {old.get(key)!r} in the run and would become {value!r}; a resumed "
                              f"run keeps its config.yaml (only {', '.join(a + '*' if a.endswith('.') else a for a in allowed)} "
                              f"may change): drop that override, or start a new run without --resume")


def parse_cli(schema: Type[T], default_config: str, description: str = "", argv: Optional[Sequence[str]] = None,
              script: Optional[str] = None, flags: Optional[Dict[str, Dict[str, Any]]] = None,
              resumable: Sequence[str] = RESUMABLE) -> T:
    """Parse the command line into a `schema` instance: YAML, then overrides, then the named flags (`description`: the
    script's docstring, whose first paragraph --help shows). With --resume the
    YAML is the run's saved config.yaml and only `resumable` keys may change; `cfg.resume` is then the run folder.
    Every mistake exits with one line (`error: ...`) naming the fix."""
    try:
        cfg = _parse_cli(schema, default_config, description, argv, script, flags, resumable)
    except ConfigError as e:  # one line, no traceback: the message already says what to change
        raise SystemExit(f"error: {e}") from None
    return cfg


def exit_on_bad_config(check: Callable[[T], None], cfg: T) -> T:
    """A script's value checks run on a copy of its parsed config, which is returned: the checks resolve eval.protocol
    (apply_protocol: keys left at their defaults take the protocol's values), and every key that changed is printed,
    `key: given -> used` (the main process only); the returned config is the one the run saves and a resume reads. A
    bad value exits with one line (`error: ...`) naming the fix, no traceback."""
    cfg = copy.deepcopy(cfg)
    before = flatten_config(cfg) if is_dataclass(cfg) else {}
    try:
        check(cfg)
    except ValueError as e:  # ConfigError is a ValueError
        raise SystemExit(f"error: {e}") from None
    lines = resolved_lines(before, cfg)
    if lines and os.environ.get("RANK", "0") == "0":
        print("\n".join(lines), flush=True)
    return cfg


def resolved_lines(before: Dict[str, Any], cfg: Any) -> List[str]:
    """What the config check changed, as printed lines: a header naming eval.protocol, then `  key: old -> new`
    for every leaf whose value differs from `before` (flatten_config of the config as parsed); [] when none did."""
    after = flatten_config(cfg) if is_dataclass(cfg) else {}
    changed = [(k, before[k], v) for k, v in after.items() if k in before and before[k] != v]
    if not changed:
        return []
    protocol = getattr(getattr(cfg, "eval", None), "protocol", None)
    head = f"eval.protocol={protocol} set {len(changed)} key(s) left at the script's defaults (config.yaml saves " \
           f"these values):" if protocol else f"the config check set {len(changed)} key(s):"
    show = lambda v: yaml.safe_dump(v, default_flow_style=True, width=1000).strip().replace("\n...", "")  # noqa: E731
    return [head] + [f"  {k}: {show(old)} -> {show(new)}" for k, old, new in changed]


def resolve_for_help(cfg: Any) -> Tuple[Any, str]:
    """--help's config with eval.protocol applied (the values a run uses) and a note for the header: which keys it
    changed, or why it could not apply (the run would stop with that error)."""
    if not (hasattr(cfg, "eval") and hasattr(cfg.eval, "protocol") and hasattr(cfg, "env") and hasattr(cfg, "train")):
        return cfg, ""
    before = flatten_config(cfg)
    try:
        apply_protocol(cfg)
    except ValueError as e:
        return cfg, f"; eval.protocol not applied: {e}"
    changed = resolved_lines(before, cfg)[1:]
    return cfg, (f", after eval.protocol={cfg.eval.protocol} set " + ", ".join(c.strip() for c in changed)
                 if changed else "")


def config_owner(path: str) -> Optional[str]:
    """The script a shipped-style config file is for: configs/sft_libero.yaml -> train_sft, configs/srpo.yaml -> srpo
    (its name's longest script prefix), else None."""
    name = os.path.basename(path).rsplit(".", 1)[0]
    for script in sorted(SCRIPTS, key=len, reverse=True):
        bare = script[len("train_"):] if script.startswith("train_") else script
        if name == bare or name.startswith(bare + "_"):
            return script
    return None


def _whose(error: ConfigError, script: Optional[str], config_path: Optional[str]) -> ConfigError:
    """An unknown-key error that says whose config it is (the script's) and, for a file made for another script, how
    to run that one."""
    text = str(error)
    if not script or "unknown key '" not in text:
        return error
    text = re.sub(r"unknown key '([^']*)'", lambda m: f"{m.group(0)} for {script_file(script)}", text, count=1)
    owner = config_owner(config_path) if config_path else None
    if owner and owner != script and text.startswith(f"{config_path}:"):
        head, _, rest = text.partition("; ")
        text = (f"{head} ({config_path} is a config of {script_file(owner)}: python {script_file(owner)} --config "
                f"{config_path}); {rest}")
    return ConfigError(text)


class _Parser(argparse.ArgumentParser):
    """argparse with one line and a did-you-mean for a mistyped flag (--task_id, --gpus), instead of the usage."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            for token in message.split(":", 1)[1].split():
                if token.startswith("-"):
                    name = token.split("=")[0]
                    close = difflib.get_close_matches(name.replace("_", "-"), flags, n=2, cutoff=0.6)
                    hint = f"did you mean {' or '.join(close)}? " if close else ""
                    raise SystemExit(f"error: command line: unknown flag {name}; {hint}({self.prog} --help lists "
                                     f"the flags; keys are set as section.key=value)")
        super().error(message)


def _parse_cli(schema, default_config, description, argv, script, flags, resumable):
    argv = list(sys.argv[1:] if argv is None else argv)
    # `key=value` tokens are overrides wherever they stand (after --task-ids 0 1, after a bare --resume, ...)
    is_override = [("=" in a and not a.startswith("-")) for a in argv]
    help_asked = any(a in ("-h", "--help") for a in argv)
    defaults, shown, note = None, default_config, ""
    if help_asked:  # list the hyper-parameters as the given --config and overrides set them (its family's keys too)
        given = argparse.ArgumentParser(add_help=False)
        given.add_argument("--config", default=None)
        known, _ = given.parse_known_args([a for a, o in zip(argv, is_override) if not o])
        shown = known.config or default_config
        defaults = load_config(schema, resolve_config_path(known.config, default_config),
                               [a for a, o in zip(argv, is_override) if o])
        defaults, note = resolve_for_help(defaults)  # the values the run uses: eval.protocol applied
    parser = build_arg_parser(description.split("\n\n")[0], default_config, flags, defaults, shown,
                              note if help_asked else "")
    args = parser.parse_args([a for a, o in zip(argv, is_override) if not o])
    memory_plan.set_cli(args.dry_run, args.device_memory_gib, args.processes)
    set_trust_run(args.trust_run)
    overrides = list(args.overrides) + [a for a, o in zip(argv, is_override) if o]
    if args.task_id is not None and args.task_ids is not None:
        raise ConfigError("command line: give --task-id or --task-ids, not both")
    if args.task_id is not None:
        overrides.append(f"env.task_ids=[{args.task_id}]")
    if args.task_ids is not None:
        overrides.append(f"env.task_ids=[{','.join(str(t) for t in args.task_ids)}]")
    if args.seed is not None:
        overrides.append(f"seed={args.seed}")
    if args.no_wandb:
        overrides.append("log.wandb=false")
    for name, spec in (flags or {}).items():
        value = getattr(args, name.lstrip("-").replace("-", "_"))
        if value is not None:
            overrides.append(f"{spec['key']}={value}")
    if args.gpu is not None and not args.dry_run:  # (a --dry-run plans for a GPU machine from any machine)
        from common.distributed import select_gpu

        select_gpu(args.gpu)  # must happen before CUDA is initialised; no such GPU: one line
    config_path = resolve_config_path(args.config, default_config)
    if args.resume is None:
        try:
            return load_config(schema, config_path, overrides)
        except ConfigError as e:
            raise _whose(e, script, args.config or default_config) from None
    if args.config is not None:
        raise ConfigError("--config cannot be combined with --resume: a resumed run reads its own config.yaml")
    cfg = load_config(schema, config_path, overrides)  # only to find the latest run for a bare --resume
    prefix = default_run_prefix(script or "run", cfg.env.suite, cfg.env.task_ids, cfg.seed)
    _, run_dir = resolve_run_dir(cfg.log, prefix, args.resume, must_exist=True)
    saved_path = os.path.join(run_dir, "config.yaml")
    if not os.path.isfile(saved_path):
        raise ConfigError(f"--resume {args.resume}: {run_dir} has no config.yaml, so it is not a run folder of these "
                          f"scripts (runs live in {cfg.log.output_dir}/<run name>/)")
    owner = saved_script(run_dir)
    if script and owner and owner != script:
        raise ConfigError(f"--resume {args.resume}: {run_dir} is a run of {script_file(owner)}, not of "
                          f"{script_file(script)}: continue it with python {script_file(owner)} --resume {run_dir}")
    saved = load_config(schema, saved_path)
    resumed = load_config(schema, saved_path, overrides + [f"resume={run_dir}"], announce=False)
    check_resume_overrides(saved, resumed, resumable)
    return resumed
