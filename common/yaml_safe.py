"""The one YAML reader of configs, command-line overrides and the config.yaml saved in run folders and checkpoints:
yaml.SafeLoader (plain values only, never `!!python/...`) that also refuses what a handed-over file can use to hang
or mislead the loader, each in one line naming the file and line:
  - a key given twice in one mapping (PyYAML keeps the last in silence: two `train:` sections drop the first);
  - more than ALIAS_BUDGET aliases (`*name`), or aliases that expand to more than MAX_NODES values (a "billion laughs"
    file of nested aliases is 2.7 KB and 10^5+ values once expanded: every walk over the config would hang).
Shipped configs use no aliases; a few are allowed for hand-written ones.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from base.config_fields import ConfigError

ALIAS_BUDGET = 32  # aliases per document
MAX_NODES = 100_000  # values in a document with every alias expanded


def _where(source: str, node_or_mark: Any) -> str:
    mark = getattr(node_or_mark, "start_mark", node_or_mark)
    return f"{source}:{mark.line + 1}" if mark is not None else source


def _expanded_size(node: Node, memo: Dict[int, int]) -> int:
    """The number of values `node` stands for with every alias expanded (aliased nodes are shared objects, so a memo
    keeps this linear in the file)."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = 1  # a recursive alias (a node inside itself) counts once here; SafeLoader refuses nothing of it
    if isinstance(node, SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[key] = size
    return size


def _loader(source: str) -> type:
    class Loader(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent, index):
            if self.check_event(AliasEvent):
                self.aliases += 1
                if self.aliases > ALIAS_BUDGET:
                    raise ConfigError(f"{_where(source, self.peek_event().start_mark)}: more than {ALIAS_BUDGET} "
                                      f"YAML aliases (*name); write the values out (a config needs none)")
            return super().compose_node(parent, index)

        def compose_document(self):
            node = super().compose_document()
            if node is not None and self.aliases:
                size = _expanded_size(node, {})
                if size > MAX_NODES:
                    raise ConfigError(f"{source}: its YAML aliases expand to {size:,} values (more than "
                                      f"{MAX_NODES:,}); write the values out (a config needs no aliases)")
            return node

        def construct_mapping(self, node, deep=False):
            if isinstance(node, MappingNode):
                seen: Dict[Any, Node] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.get(key)
                    except TypeError:  # an unhashable key: SafeLoader refuses it below
                        continue
                    if first is not None:
                        raise ConfigError(f"{_where(source, key_node)}: key {key!r} is given twice (first at line "
                                          f"{first.start_mark.line + 1}); YAML would keep only the last: merge them "
                                          f"into one")
                    seen[key] = key_node
            return super().construct_mapping(node, deep)

    return Loader


def load(text_or_stream: Any, source: str) -> Any:
    """The YAML document in `text_or_stream` (a string or an open file) as plain python values; ConfigError in one
    line naming `source` (a file, or "command line: key=...") and the line for invalid YAML, a duplicate key or too
    many aliases."""
    try:
        return yaml.load(text_or_stream, Loader=_loader(source))  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ConfigError(f"{_where(source, mark)}: not valid YAML: {e.problem or e.context or 'unreadable'}; fix that "
                          f"line") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: not valid YAML: {' '.join(str(e).split())[:200]}") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply; a config is a few levels of sections") from None


def load_file(path: str, source: Optional[str] = None) -> Any:
    """The YAML file at `path` (see `load`); OSError when it cannot be read."""
    with open(path) as f:
        return load(f, source or path)
