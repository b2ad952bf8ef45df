"""Operations: format + storage (+ trust) combined into what the CLI and the API offer."""

from __future__ import annotations

from ._config import load_config
from .pack import DEFAULT_LEVEL, PackResult, describe, pack
from .verify import VerifyReport, read_head_of, read_manifest, verify

__all__ = [
    "DEFAULT_LEVEL",
    "PackResult",
    "VerifyReport",
    "describe",
    "load_config",
    "pack",
    "read_head_of",
    "read_manifest",
    "verify",
]
