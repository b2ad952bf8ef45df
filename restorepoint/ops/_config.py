"""Config files: JSON, YAML or TOML, read with real parsers, checked to be JSON data."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._posix import read_regular
from ..errors import ConfigError, NotFound
from ..format.limits import MAX_JSON_DEPTH

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["check_json_data", "load_config"]


def load_config(path: str | Path) -> dict[str, Any]:
    """Parse a config file by its suffix (.json, .yaml/.yml, .toml; anything else is tried as
    JSON, then YAML). The top level must be a mapping of JSON-representable values."""
    import yaml  # here: a verb without --config does not pay for it

    p = Path(path)
    try:
        text = read_regular(p).decode("utf-8")
    except FileNotFoundError:
        raise NotFound("config file not found", url=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the config file ({exc.strerror})", url=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read the config file ({exc})", url=str(path)) from None
    suffix = p.suffix.lower()
    try:
        if suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            data = yaml.safe_load(text)
        elif suffix == ".json":
            data = json.loads(text, parse_constant=_reject_constant)
        else:
            try:
                data = json.loads(text, parse_constant=_reject_constant)
            except json.JSONDecodeError:
                data = yaml.safe_load(text)
    except RecursionError:
        # A nesting bomb: the parsers recurse, and the depth limit is far below theirs anyway.
        raise ConfigError(
            f"the config is nested deeper than {_MAX_CONFIG_DEPTH}", url=str(path)
        ) from None
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
