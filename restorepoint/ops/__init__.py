"""Operations: format + storage (+ trust) combined into what the CLI and the API offer."""

from __future__ import annotations

from ._config import load_config
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
from .unpack import ImportResult, import_restore_point
from .verify import VerifyReport, read_head_of, read_manifest, verify

__all__ = [
    "DEFAULT_LEVEL",
    "CheckResult",
    "Expectations",
    "ImportResult",
    "Mismatch",
    "PackResult",
    "VerifyReport",
    "check",
    "describe",
    "handoff_document",
    "import_restore_point",
    "load_config",
    "load_expectations",
    "pack",
    "read_head_of",
    "read_manifest",
    "verify",
    "write_handoff",
]
