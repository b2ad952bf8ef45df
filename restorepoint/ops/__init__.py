"""Operations: format + storage (+ trust) combined into what the CLI and the API offer.

The names below load their module on first use: ``from restorepoint.ops import verify`` (the
CLI's verify) then costs the verify path's modules only, not pack's, publish's, prune's or the
gate's (tests/cli/test_imports.py pins what a verify loads)."""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from .._lazy import load as _load
from .._lazy import names as _names

if TYPE_CHECKING:
    from ._config import check_json_data, load_config
    from ._naming import entry_name
    from ._open import open_head, open_manifest
    from .gate import (
        CheckResult,
        Expectations,
        Mismatch,
        check,
    )
    from .handoff import handoff_document, load_expectations, write_handoff
    from .pack import DEFAULT_LEVEL, PackResult, describe, pack, pack_spec
    from .publish import PublishResult, publish
    from .spec import HeadSpec, PackOptions
    from .store import KeepBest, PruneReport, StoreEntry, latest, list_store, prune
    from .unpack import ImportResult, import_restore_point
    from .verify import VerifyReport, read_head_of, read_manifest, verify

#: Where each public name lives.
_LAZY: dict[str, str] = {
    "check_json_data": "_config",
    "load_config": "_config",
    "entry_name": "_naming",
    "open_head": "_open",
    "open_manifest": "_open",
    "CheckResult": "gate",
    "Expectations": "gate",
    "Mismatch": "gate",
    "check": "gate",
    "handoff_document": "handoff",
    "load_expectations": "handoff",
    "write_handoff": "handoff",
    "DEFAULT_LEVEL": "pack",
    "PackResult": "pack",
    "describe": "pack",
    "pack": "pack",
    "pack_spec": "pack",
    "PublishResult": "publish",
    "publish": "publish",
    "HeadSpec": "spec",
    "PackOptions": "spec",
    "KeepBest": "store",
    "PruneReport": "store",
    "StoreEntry": "store",
    "latest": "store",
    "list_store": "store",
    "prune": "store",
    "ImportResult": "unpack",
    "import_restore_point": "unpack",
    "VerifyReport": "verify",
    "read_head_of": "verify",
    "read_manifest": "verify",
    "verify": "verify",
}

__all__ = [
    "DEFAULT_LEVEL",
    "CheckResult",
    "Expectations",
    "HeadSpec",
    "ImportResult",
    "KeepBest",
    "Mismatch",
    "PackOptions",
    "PackResult",
    "PruneReport",
    "PublishResult",
    "StoreEntry",
    "VerifyReport",
    "check",
    "check_json_data",
    "describe",
    "entry_name",
    "handoff_document",
    "import_restore_point",
    "latest",
    "list_store",
    "load_config",
    "load_expectations",
    "open_head",
    "open_manifest",
    "pack",
    "pack_spec",
    "prune",
    "publish",
    "read_head_of",
    "read_manifest",
    "verify",
    "write_handoff",
]


def __getattr__(name: str) -> Any:
    return _load(name, _LAZY, globals())


def __dir__() -> list[str]:
    return _names(globals())


#: Public functions named after the module that holds them.
_SHADOWED = frozenset(name for name, module in _LAZY.items() if name == module)


class _Ops(types.ModuleType):
    """The import system binds a submodule to its package's attribute when it loads
    (``restorepoint.ops.pack``, the module); the public name is the function, as it was when
    this package imported every module eagerly, whichever of the two loads first."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Ops
