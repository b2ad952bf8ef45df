"""Operations: format + storage (+ trust) combined into what the CLI and the API offer."""

from __future__ import annotations

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
