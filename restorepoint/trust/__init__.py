"""Trust: signed restore points and encrypted payloads. Leans only on restorepoint.format.

The names below load their module on first use, and the modules load ``cryptography`` where
a key, a signature or a cipher is used: a reader of an unsigned, unencrypted restore point
(``restorepoint verify``) does not pay for it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import load as _load
from .._lazy import names as _names

if TYPE_CHECKING:
    from .encryption import FEATURE, SCHEME, StreamCipher, open_file_key, recipients_for
    from .keys import (
        PublicKey,
        generate,
        key_id,
        load_identity,
        load_private,
        load_public,
        load_signing_key,
        raw_public,
    )
    from .policy import NO_TRUST, Trust, trust_policy
    from .signing import PAYLOAD_TYPE, SignatureCheck, check_block, pae, signature_block, statement

#: Where each public name lives.
_LAZY: dict[str, str] = {
    "FEATURE": "encryption",
    "SCHEME": "encryption",
    "StreamCipher": "encryption",
    "open_file_key": "encryption",
    "recipients_for": "encryption",
    "PublicKey": "keys",
    "generate": "keys",
    "key_id": "keys",
    "load_identity": "keys",
    "load_private": "keys",
    "load_public": "keys",
    "load_signing_key": "keys",
    "raw_public": "keys",
    "NO_TRUST": "policy",
    "Trust": "policy",
    "trust_policy": "policy",
    "PAYLOAD_TYPE": "signing",
    "SignatureCheck": "signing",
    "check_block": "signing",
    "pae": "signing",
    "signature_block": "signing",
    "statement": "signing",
}

__all__ = [
    "FEATURE",
    "NO_TRUST",
    "PAYLOAD_TYPE",
    "SCHEME",
    "PublicKey",
    "SignatureCheck",
    "StreamCipher",
    "Trust",
    "check_block",
    "generate",
    "key_id",
    "load_identity",
    "load_private",
    "load_public",
    "load_signing_key",
    "open_file_key",
    "pae",
    "raw_public",
    "recipients_for",
    "signature_block",
    "statement",
    "trust_policy",
]


def __getattr__(name: str) -> Any:
    return _load(name, _LAZY, globals())


def __dir__() -> list[str]:
    return _names(globals())
