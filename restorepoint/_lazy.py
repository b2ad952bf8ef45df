"""Public names that load their module on first use, for a package's ``__getattr__``.

A package lists where each public name lives (name -> submodule) and hands its module
``__getattr__`` and ``__dir__`` to :func:`load` and :func:`names`: ``import restorepoint`` and
the CLI's start then cost only what they use (tests/cli/test_imports.py pins it). This module
is imported by the package root, so it imports nothing but ``importlib``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any


def load(name: str, table: Mapping[str, str], namespace: MutableMapping[str, Any]) -> Any:
    """The public ``name`` of the package whose ``globals()`` is ``namespace``, imported from
    the submodule ``table`` names for it, and cached in ``namespace`` so that later lookups do
    not come back here. A name not in ``table`` is an ``AttributeError``, as for any module."""
    package = namespace["__name__"]
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", package), name)
    # Into the namespace itself, not through setattr: a package whose module class guards
    # its attributes (restorepoint.ops) guards them against the import system, not this.
    namespace[name] = value
    return value


def names(namespace: Mapping[str, Any]) -> list[str]:
    """The package's ``dir()``: what it holds now and every public name, loaded or not."""
    return sorted(set(namespace) | set(namespace["__all__"]))
