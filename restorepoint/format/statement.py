"""The statement of a restore point (spec section "Signing") and its digest.

The statement names an object exactly: the format, its id and the sha256 of its head and of its
index, and the index holds every payload file's sha256. What a signature signs is the statement;
the **restore point digest** is the statement's sha256, which pack reports and verify checks: two
objects with one digest hold the same head and the same index, so the same payload byte for byte
once each has verified. It costs nothing to compute, unlike a sha256 of the whole object (a second
pass over every stored byte), which pack makes only on request."""

from __future__ import annotations

import hashlib

from ._json import canonical_dumps

__all__ = ["STATEMENT_FORMAT", "restore_point_digest", "statement"]

STATEMENT_FORMAT = "restorepoint/1"


def statement(rp_id: str, head_sha256: str, index_sha256: str) -> bytes:
    """The statement's canonical bytes (section 21)."""
    return canonical_dumps(
        {
            "format": STATEMENT_FORMAT,
            "head_sha256": head_sha256,
            "id": rp_id,
            "index_sha256": index_sha256,
        }
    )


def restore_point_digest(rp_id: str, head_sha256: str, index_sha256: str) -> str:
    """The restore point digest: the sha256 of the statement, 64 lowercase hex digits."""
    return hashlib.sha256(statement(rp_id, head_sha256, index_sha256)).hexdigest()
