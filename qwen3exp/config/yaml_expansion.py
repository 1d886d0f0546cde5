"""The size of a YAML text once its aliases are expanded, counted without expanding them: OmegaConf
copies each use of a YAML alias, so a 1 kB "billion laughs" file (anchors of anchors) never ends
(`qwen3exp.config.sources.file_problems` refuses a config file beyond MAX_VALUES)."""

from __future__ import annotations

import yaml

MAX_VALUES = 100_000
"""Values of a config file once its YAML aliases are expanded (OmegaConf makes a node of each)."""


def expanded_values(text: str) -> int:
    """How many values the YAML text gives once every alias is expanded (MAX_VALUES + 1 for more,
    or for an alias of a node that holds itself); raises yaml.YAMLError when it is not YAML."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    root = yaml.compose(text, Loader=loader)
    if root is None:
        return 0
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

    stack_limit = _nested_too_deep(root)
    return too_many if stack_limit else size(root)


def _nested_too_deep(root, limit: int = 200) -> bool:
    """Whether the YAML nests deeper than `limit` levels (counting it would exhaust the stack)."""
    level, frontier, seen = 0, [root], set()
    while frontier and level <= limit:
        nxt = []
        for node in frontier:
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.MappingNode):
                nxt += [x for kv in node.value for x in kv]
            elif isinstance(node, yaml.SequenceNode):
                nxt += node.value
        frontier, level = nxt, level + 1
    return bool(frontier)
