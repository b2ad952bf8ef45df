"""The public API is exactly what docs/api.md documents."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

import restorepoint
from restorepoint import errors

ROOT = Path(__file__).resolve().parent.parent


def test_all_is_sorted_and_importable() -> None:
    names = restorepoint.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(restorepoint, name), name


def test_exported_names_are_the_documented_ones() -> None:
    doc = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(?:rp\.)?([A-Za-z_][A-Za-z0-9_]*)(?:\(|`)", doc))
    exported = set(restorepoint.__all__) - {"__version__"}
    missing = sorted(n for n in exported if n not in documented)
    assert not missing, f"exported but not documented in docs/api.md: {missing}"


def test_every_error_class_is_exported_and_has_an_exit_code() -> None:
    classes = [
        getattr(errors, n)
        for n in errors.__all__
        if isinstance(getattr(errors, n), type) and issubclass(getattr(errors, n), Exception)
    ]
    assert len(classes) > 15
    for cls in classes:
        assert cls.__name__ in restorepoint.__all__, cls
        assert cls.exit_code in (1, 2, 3, 4), cls


def test_version_is_the_package_version() -> None:
    from importlib.metadata import version

    assert restorepoint.__version__ == version("restorepoint")


def test_every_lazy_package_lists_and_refuses_names_like_a_module() -> None:
    # The root, ops, trust and the transformers adapter resolve their public names on first
    # use (restorepoint._lazy): dir() shows every public name whether loaded or not, every
    # table entry resolves to its own module's object, and an unknown name is the
    # AttributeError any module raises.
    import restorepoint.adapters.transformers
    import restorepoint.ops
    import restorepoint.trust

    packages: list[Any] = [restorepoint, restorepoint.ops, restorepoint.trust]
    if importlib.util.find_spec("transformers") is not None:
        packages.append(restorepoint.adapters.transformers)
    for package in packages:
        assert set(package.__all__) <= set(dir(package)), package.__name__
        for name, module in package._LAZY.items():
            value = getattr(package, name)
            assert value is getattr(sys.modules[f"{package.__name__}.{module}"], name)
        message = f"module {package.__name__!r} has no attribute 'no_such_name'"
        with pytest.raises(AttributeError, match=f"^{re.escape(message)}$"):
            package.no_such_name  # noqa: B018
