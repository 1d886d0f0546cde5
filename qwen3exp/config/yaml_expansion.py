"""What a YAML text holds, read without constructing it (`shape`): the number of its values once its
aliases are expanded, counted without expanding them (OmegaConf copies each use of a YAML alias, so a
1 kB "billion laughs" file, anchors of anchors, never ends), and the first value whose tag would
construct a Python object (`!!python/object/apply:os.system [...]`) or is no YAML type at all
(`qwen3exp.config.file_limits.file_problem` refuses such a config file)."""

from __future__ import annotations

from dataclasses import dataclass

import yaml

MAX_VALUES = 100_000
"""Values of a config file once its YAML aliases are expanded (OmegaConf makes a node of each)."""
CORE_TAG = "tag:yaml.org,2002:"
"""The prefix of YAML's own types (str, int, map, ...); `!!python/...` shares it, and is refused."""
PYTHON_TAG = CORE_TAG + "python/"


@dataclass(frozen=True)
class Shape:
    values: int
    """How many values the text gives once every alias is expanded (MAX_VALUES + 1 for more, or for
    an alias of a node that holds itself)."""
    tagged: yaml.Node | None = None
    """The first node whose tag is no plain YAML type (its `tag` and `start_mark`); None: none."""


def foreign(tag: str) -> bool:
    """Whether a tag is no plain YAML value: a Python object (`!!python/...`) or an application's own
    (`!custom`)."""
    return tag.startswith(PYTHON_TAG) or not tag.startswith(CORE_TAG)


def shape(text: str) -> Shape:
    """The text's `Shape`; raises yaml.YAMLError when it is not YAML."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = yaml.compose(text, Loader=loader)
    if root is None:
        return Shape(0)
    too_deep, tagged = _walk(root)
    return Shape(MAX_VALUES + 1 if too_deep else _size(root), tagged)


def expanded_values(text: str) -> int:
    """`shape(text).values`; raises yaml.YAMLError when it is not YAML."""
    return shape(text).values


def _size(root) -> int:
    sizes: dict[int, int] = {}
    too_many = MAX_VALUES + 1

    def size(node) -> int:  # memoized on the node: an alias is the same node object, counted per use
        key = id(node)
        if key in sizes:
            return sizes[key]
        sizes[key] = too_many  # a node met again while it is counted holds itself
        if isinstance(node, yaml.MappingNode):
            n = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            n = 1 + sum(size(v) for v in node.value)
        else:
            n = 1
        sizes[key] = min(n, too_many)
        return sizes[key]

    return size(root)


def _walk(root, limit: int = 200) -> tuple[bool, yaml.Node | None]:
    """Whether the YAML nests deeper than `limit` levels (counting it would exhaust the stack), and
    its first node (breadth first) with a foreign tag; each distinct node is looked at once."""
    level, frontier, seen, tagged = 0, [root], set(), None
    while frontier and level <= limit:
        nxt = []
        for node in frontier:
            if id(node) in seen:
                continue
            seen.add(id(node))
            if tagged is None and foreign(str(node.tag)):
                tagged = node
            if isinstance(node, yaml.MappingNode):
                nxt += [x for kv in node.value for x in kv]
            elif isinstance(node, yaml.SequenceNode):
                nxt += node.value
        frontier, level = nxt, level + 1
    return bool(frontier), tagged
