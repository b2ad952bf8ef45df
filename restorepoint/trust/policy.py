"""The trust policy: what a reader demands of signatures, and the key that opens encrypted
payloads (spec sections 21 and 24).

A fleet sets one policy for every resume path with ``RESTOREPOINT_TRUST=PUB[,PUB...]``: the
public signing keys whose signatures it trusts. With it set, a restore point that no trusted
key signed is refused (a signature can be stripped, so a trusted key without a required
signature would protect nothing); ``RESTOREPOINT_REQUIRE_SIGNATURE=0`` relaxes that to
"signed by a trusted key, if signed at all" for a migration.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import UsageError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

__all__ = ["NO_TRUST", "REQUIRE_ENV", "TRUST_ENV", "Trust", "trust_policy"]

TRUST_ENV = "RESTOREPOINT_TRUST"
REQUIRE_ENV = "RESTOREPOINT_REQUIRE_SIGNATURE"


@dataclass(frozen=True)
class Trust:
    """What a reader demands: ``trusted`` Ed25519 public keys (raw 32 bytes; with any, a signed
    restore point must carry a signature by one of them), ``require_signature`` (an unsigned
    one is refused; needs trusted keys), ``identity`` (an X25519 key that opens encrypted
    payloads)."""

    trusted: tuple[bytes, ...] = ()
    require_signature: bool = False
    identity: X25519PrivateKey | None = None

    def __post_init__(self) -> None:
        if self.require_signature and not self.trusted:
            raise UsageError("--require-signature needs --trust PUB: whose signature?")

    @property
    def checks_signatures(self) -> bool:
        return bool(self.trusted) or self.require_signature

    @classmethod
    def from_environment(cls, identity: X25519PrivateKey | None = None) -> Trust:
        """The fleet's policy: ``$RESTOREPOINT_TRUST`` (comma-separated public key files), a
        signature by one of them required unless ``$RESTOREPOINT_REQUIRE_SIGNATURE=0``; no
        policy when unset."""
        value = os.environ.get(TRUST_ENV, "").strip()
        if not value:
            return cls(identity=identity)
        from .keys import load_public  # with cryptography: only when a fleet policy is set

        paths = [p.strip() for p in value.split(",") if p.strip()]
        keys = tuple(load_public(p, "signing").raw for p in paths)
        require = os.environ.get(REQUIRE_ENV, "1").strip().lower() not in ("0", "false", "no")
        return cls(trusted=keys, require_signature=require, identity=identity)


NO_TRUST = Trust()


def trust_policy(trust: Trust | None) -> Trust:
    """The policy a resume path applies: the one given, else the environment's."""
    return trust if trust is not None else Trust.from_environment()
