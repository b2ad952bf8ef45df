"""Small checks of parsed JSON values, shared by the head's and the index's validation
(manifest.py): each raises MalformedManifest naming the member."""

from __future__ import annotations

from typing import Any

from ..errors import MalformedManifest
from .limits import MAX_SAFE_INTEGER


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedManifest(f"{name} must be an object")
    return value


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise MalformedManifest(f"{name} must be a string")
    return value


def _int(value: Any, name: str) -> int:
    if not _is_int(value) or not 0 <= value <= MAX_SAFE_INTEGER:
        raise MalformedManifest(f"{name} must be an integer from 0 to 2**53-1")
    assert isinstance(value, int)
    return value


def _str_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MalformedManifest(f"{name} must be an array of strings")
    return list(value)


def _str_map(value: Any, name: str) -> dict[str, str]:
    obj = _obj(value, name)
    for key, item in obj.items():
        if key == "" or not isinstance(item, str):
            raise MalformedManifest(f"{name} must map non-empty names to strings")
    return dict(obj)
