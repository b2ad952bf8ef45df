"""Config files: JSON, YAML or TOML, read with real parsers, checked to be JSON data.

Bounded before anything is built (docs/cli.md, `--config`): the file at most
``MAX_CONFIG_BYTES`` (a config must fit a restore point's head anyway); a YAML file at most
``MAX_YAML_ALIASES`` aliases, and at most ``MAX_CONFIG_VALUES`` values once its aliases are
expanded, counted on the parsed nodes before a value is constructed ("billion laughs": nine
levels of ten aliases are 10**9 values from a file of a kilobyte); a recursive alias is
refused. Each refusal is a ConfigError (exit 2)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._posix import read_regular
from ..errors import ConfigError, NotFound
from ..format.limits import MAX_HEAD_BYTES, MAX_JSON_DEPTH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_VALUES",
    "MAX_YAML_ALIASES",
    "check_json_data",
    "load_config",
]

#: A config file's size at most: the head it is packed into holds at most this.
MAX_CONFIG_BYTES = MAX_HEAD_BYTES
#: Values in a config at most, aliases expanded (a mapping's key and value count one each).
MAX_CONFIG_VALUES = 1 << 18
#: Aliases (``*name``) in a YAML config at most.
MAX_YAML_ALIASES = 1000


def load_config(path: str | Path) -> dict[str, Any]:
    """Parse a config file by its suffix (.json, .yaml/.yml, .toml; anything else is tried as
    JSON, then YAML). The top level must be a mapping of JSON-representable values."""
    import yaml  # here: a verb without --config does not pay for it

    p = Path(path)
    text = _read_text(p, path)
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = _load_yaml(text)
        elif suffix == ".json":
            data = json.loads(text, parse_constant=_reject_constant)
        else:
            try:
                data = json.loads(text, parse_constant=_reject_constant)
            except json.JSONDecodeError:
                data = _load_yaml(text)
    except RecursionError:
        # A nesting bomb: the parsers recurse, and the depth limit is far below theirs anyway.
        raise ConfigError(
            f"the config is nested deeper than {_MAX_CONFIG_DEPTH}", url=str(path)
        ) from None
    except ConfigError as exc:
        raise ConfigError(exc.message, url=str(path)) from None
    except (json.JSONDecodeError, yaml.YAMLError, tomllib.TOMLDecodeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"not a valid config file ({first})", url=str(path)) from None
    if not isinstance(data, Mapping):
        raise ConfigError("the config's top level must be a mapping", url=str(path))
    try:
        checked: dict[str, Any] = check_json_data(data)
        return checked
    except ConfigError as exc:
        raise ConfigError(exc.message, url=str(path)) from None


def _read_text(p: Path, path: str | Path) -> str:
    """The file's text, refused beyond MAX_CONFIG_BYTES before it is read whole."""
    try:
        if p.is_file() and p.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"the config file is larger than {MAX_CONFIG_BYTES} bytes", url=str(path)
            )
        raw = read_regular(p)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"the config file is larger than {MAX_CONFIG_BYTES} bytes", url=str(path)
            )
        return raw.decode("utf-8")
    except FileNotFoundError:
        raise NotFound("config file not found", url=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the config file ({exc.strerror})", url=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read the config file ({exc})", url=str(path)) from None


def _load_yaml(text: str) -> Any:
    """yaml.safe_load, with the aliases counted and the expanded size measured on the nodes
    before any value is constructed."""
    import yaml

    class Bounded(yaml.SafeLoader):
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > MAX_YAML_ALIASES:
                    raise ConfigError(f"the config has more than {MAX_YAML_ALIASES} YAML aliases")
            return super().compose_node(parent, index)

        def get_single_data(self) -> Any:
            node = self.get_single_node()
            if node is None:
                return None
            _expanded_size(node)
            return self.construct_document(node)

    loader = Bounded(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def _expanded_size(root: Any) -> int:
    """How many values ``root`` stands for with its aliases expanded (a node an alias names
    is counted each time it is named), refused beyond MAX_CONFIG_VALUES; iterative, with
    each node's size computed once."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > MAX_CONFIG_VALUES:
                raise ConfigError(
                    f"the config expands to more than {MAX_CONFIG_VALUES} values "
                    "(YAML aliases are counted each time they are used)"
                )
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise ConfigError("the config has a recursive YAML alias")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _children(node: Any) -> list[Any]:
    value = node.value
    if isinstance(value, list):
        return [c for item in value for c in (item if isinstance(item, tuple) else (item,))]
    return []


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON data")


#: The config sits one level below the top of the head, whose depth readers limit.
_MAX_CONFIG_DEPTH = MAX_JSON_DEPTH - 1


def check_json_data(value: Any, where: str = "", level: int = 0) -> Any:
    """Return ``value`` as plain JSON data (dict/list/str/int/float/bool/None), or raise
    ConfigError naming the dotted path of the first value JSON cannot represent exactly, or
    of the first mapping or list nested deeper than a restore point's head allows."""
    label = where or "(root)"
    if isinstance(value, (Mapping, list, tuple)) and level >= _MAX_CONFIG_DEPTH:
        raise ConfigError(f"config value at {label} is nested deeper than {_MAX_CONFIG_DEPTH}")
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"config key {key!r} at {label} is not a string")
            out[key] = check_json_data(item, f"{where}.{key}" if where else key, level + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [check_json_data(item, f"{where}[{i}]", level + 1) for i, item in enumerate(value)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        if abs(value) > (1 << 53) - 1:
            raise ConfigError(f"config value at {label} is an integer beyond 2**53-1")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"config value at {label} is not a finite number")
        return value
    raise ConfigError(f"config value at {label} is a {type(value).__name__}, not JSON data")
