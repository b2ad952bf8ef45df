"""Operations: format + storage (+ trust) combined into what the CLI and the API offer."""

from __future__ import annotations

from ._config import check_json_data, load_config
from .gate import (
    CheckResult,
    Expectations,
    Mismatch,
    check,
    handoff_document,
    load_expectations,
    write_handoff,
)
from .pack import DEFAULT_LEVEL, PackResult, describe, pack
from .store import PruneReport, StoreEntry, latest, list_store, prune
from .unpack import ImportResult, import_restore_point
from .verify import VerifyReport, read_head_of, read_manifest, verify

__all__ = [
    "DEFAULT_LEVEL",
    "CheckResult",
    "Expectations",
    "ImportResult",
    "Mismatch",
    "PackResult",
    "PruneReport",
    "StoreEntry",
    "VerifyReport",
    "check",
    "check_json_data",
    "describe",
    "handoff_document",
    "import_restore_point",
    "latest",
    "list_store",
    "load_config",
    "load_expectations",
    "pack",
    "prune",
    "read_head_of",
    "read_manifest",
    "verify",
    "write_handoff",
]
