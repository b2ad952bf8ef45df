"""Encrypted payloads (spec section "Encryption").

A random 32-byte file key encrypts every payload chunk; it is wrapped once per recipient with
X25519 (an ephemeral key pair each), HKDF-SHA256 and AES-256-GCM, as age does. Each payload file
gets its own key, derived from the file key and its path with HKDF. Chunks are sealed with
AES-256-GCM in a STREAM construction: the nonce is the chunk's counter and a last-chunk flag, and
the associated data binds the restore-point id, the entry's path, size, position and the number
of entries. So truncation, reordering, duplication, a missing or an extra final chunk, and
splicing between files or restore points all fail authentication.

The head (identity, position, recipients) stays readable: the import gate needs no key. The
index still shows each file's path, size and sha256 (a guessed file could be confirmed); the
payload bytes are confidential.

Only the ``cryptography`` package's primitives are used.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import DecryptionError
from ..format import canonical_dumps
from ..format.manifest import ENCRYPTION_FEATURE, ENCRYPTION_SCHEMES
from .keys import PublicKey, key_id, raw_public

__all__ = ["FEATURE", "SCHEME", "StreamCipher", "open_file_key", "recipients_for"]

SCHEME = "x25519-hkdf-aes256gcm-stream/1"
#: The required feature that names this encryption: a reader that does not know it refuses.
FEATURE = ENCRYPTION_FEATURE
TAG_SIZE = ENCRYPTION_SCHEMES[SCHEME]
_WRAP_INFO = b"restorepoint/1 x25519 file key"
_WRAP_AAD = b"restorepoint/1 wrapped file key"
_ENTRY_INFO = b"restorepoint/1 payload key\x00"
_CHUNK_AAD = b"restorepoint/1 chunk\x00"


def _hkdf(secret: bytes, salt: bytes | None, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def recipients_for(
    recipients: Iterable[PublicKey],
    *,
    file_key: bytes | None = None,
    ephemerals: Iterable[X25519PrivateKey] | None = None,
) -> tuple[bytes, dict[str, Any]]:
    """A new file key and the head's ``encryption`` object wrapping it for each recipient.
    (``file_key`` and ``ephemerals`` are for deterministic test vectors only.)"""
    key = file_key if file_key is not None else os.urandom(32)
    eph_iter = iter(ephemerals) if ephemerals is not None else None
    stanzas = []
    for recipient in recipients:
        eph = next(eph_iter) if eph_iter is not None else X25519PrivateKey.generate()
        eph_raw = raw_public(eph)
        shared = eph.exchange(X25519PublicKey.from_public_bytes(recipient.raw))
        wrap = _hkdf(shared, eph_raw + recipient.raw, _WRAP_INFO)
        wrapped = AESGCM(wrap).encrypt(b"\x00" * 12, key, _WRAP_AAD)
        stanzas.append(
            {
                "ephemeral": _b64(eph_raw),
                "keyid": recipient.key_id,
                "type": "X25519",
                "wrapped_key": _b64(wrapped),
            }
        )
    if not stanzas:
        raise ValueError("encryption needs at least one recipient")
    return key, {"recipients": stanzas, "scheme": SCHEME}


def open_file_key(encryption: dict[str, Any], identity: X25519PrivateKey) -> bytes:
    """Unwrap the file key with ``identity``, or raise DecryptionError. Stanzas whose key id
    matches are tried first, then every other (a key id is only a hint)."""
    own = raw_public(identity)
    stanzas = list(encryption["recipients"])
    stanzas.sort(key=lambda s: s.get("keyid") != key_id(own))
    for stanza in stanzas:
        try:
            eph_raw = base64.b64decode(stanza["ephemeral"], validate=True)
            wrapped = base64.b64decode(stanza["wrapped_key"], validate=True)
            shared = identity.exchange(X25519PublicKey.from_public_bytes(eph_raw))
        except (binascii.Error, ValueError):
            continue
        wrap = _hkdf(shared, eph_raw + own, _WRAP_INFO)
        try:
            key = AESGCM(wrap).decrypt(b"\x00" * 12, wrapped, _WRAP_AAD)
        except InvalidTag:
            continue
        if len(key) == 32:
            return key
    raise DecryptionError(
        f"the identity (key {key_id(own)}) is not a recipient of this restore point"
    )


class StreamCipher:
    """Seals and opens payload chunks of one restore point. Thread-safe: the pack pipeline
    seals on a pool of threads."""

    overhead = TAG_SIZE

    def __init__(self, file_key: bytes, rp_id: str) -> None:
        self._file_key = file_key
        self._id = rp_id
        self._keys: dict[str, AESGCM] = {}
        self._lock = threading.Lock()

    def _aead(self, path: str) -> AESGCM:
        with self._lock:
            aead = self._keys.get(path)
            if aead is None:
                aead = AESGCM(_hkdf(self._file_key, None, _ENTRY_INFO + path.encode()))
                self._keys[path] = aead
            return aead

    def _aad(self, path: str, size: int, entry: int, entries: int) -> bytes:
        return _CHUNK_AAD + canonical_dumps(
            {"entries": entries, "entry": entry, "id": self._id, "path": path, "size": size}
        )

    @staticmethod
    def _nonce(index: int, last: bool) -> bytes:
        return index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")

    def seal(  # noqa: PLR0913, PLR0917 - the AEAD's parameters: key, nonce, chunk position and data
        self, path: str, size: int, entry: int, entries: int, index: int, last: bool, data: bytes
    ) -> bytes:
        return self._aead(path).encrypt(
            self._nonce(index, last), data, self._aad(path, size, entry, entries)
        )

    def open(  # noqa: PLR0913, PLR0917 - the AEAD's parameters: key, nonce, chunk position and data
        self, path: str, size: int, entry: int, entries: int, index: int, last: bool, data: bytes
    ) -> bytes:
        try:
            return self._aead(path).decrypt(
                self._nonce(index, last), data, self._aad(path, size, entry, entries)
            )
        except InvalidTag:
            raise DecryptionError(
                f"chunk {index} does not authenticate (wrong key, or the stream was truncated, "
                "reordered, duplicated, spliced or altered)",
                member=path,
            ) from None
