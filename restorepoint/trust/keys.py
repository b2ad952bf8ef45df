"""Key files: Ed25519 for signing, X25519 for encryption (spec section "Keys").

A private key is a PKCS #8 PEM file written with mode 0600; its public key is a
SubjectPublicKeyInfo PEM file beside it (``OUT.pub``). A key id is the first 16 hex digits of
the sha256 of the raw 32-byte public key: a hint for finding the right key, never a proof of
anything."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .._posix import read_regular
from ..errors import ConfigError, NotFound, UsageError

__all__ = [
    "KeyKind",
    "PublicKey",
    "generate",
    "key_id",
    "load_identity",
    "load_private",
    "load_public",
    "load_signing_key",
    "raw_public",
]

KeyKind = Literal["signing", "encryption"]
PrivateKey = Ed25519PrivateKey | X25519PrivateKey


@dataclass(frozen=True)
class PublicKey:
    kind: KeyKind
    raw: bytes  # 32 bytes

    @property
    def key_id(self) -> str:
        return key_id(self.raw)


def key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


def raw_public(key: PrivateKey | Ed25519PublicKey | X25519PublicKey) -> bytes:
    public = key.public_key() if isinstance(key, (Ed25519PrivateKey, X25519PrivateKey)) else key
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate(out: str | os.PathLike[str], kind: KeyKind = "signing") -> tuple[Path, Path]:
    """Write a new private key to ``out`` (0600, refusing to overwrite) and its public key to
    ``out.pub``. Returns both paths."""
    _check_kind(kind)
    private: PrivateKey = (
        Ed25519PrivateKey.generate() if kind == "signing" else X25519PrivateKey.generate()
    )
    path = Path(out)
    pub_path = path.with_name(path.name + ".pub")
    for p in (path, pub_path):
        if p.exists() or p.is_symlink():
            raise UsageError(f"{p} exists; not overwriting a key")
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileNotFoundError:
        raise NotFound("the key's directory does not exist", url=str(path.parent)) from None
    except OSError as exc:
        raise UsageError(f"cannot write the key ({exc.strerror})", url=str(path)) from None
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, 0o600)  # whatever the umask
    pub = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    fd = os.open(pub_path, flags, 0o644)
    try:
        os.write(fd, pub)
        os.fsync(fd)
    finally:
        os.close(fd)
    return path, pub_path


def _check_kind(kind: str) -> None:
    # Anything but "signing" would otherwise silently mean an X25519 key.
    if kind not in ("signing", "encryption"):
        raise UsageError(f"a key is for signing or encryption, not {kind!r}")


def _a(kind: KeyKind) -> str:
    return f"an {kind}" if kind == "encryption" else f"a {kind}"


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return read_regular(path)
    except FileNotFoundError:
        raise NotFound("key file not found", url=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the key file ({exc.strerror})", url=str(path)) from None


def load_private(path: str | os.PathLike[str], kind: KeyKind) -> PrivateKey:
    """A private key of the given kind from a PEM file."""
    _check_kind(kind)
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a private key file ({exc})", url=str(path)) from None
    want = Ed25519PrivateKey if kind == "signing" else X25519PrivateKey
    if not isinstance(key, want):
        found = "an encryption (X25519)" if kind == "signing" else "a signing (Ed25519)"
        raise ConfigError(f"this is {found} key, not {_a(kind)} key", url=str(path))
    return key


def load_public(path: str | os.PathLike[str], kind: KeyKind) -> PublicKey:
    """A public key of the given kind from a PEM file (``OUT.pub``)."""
    _check_kind(kind)
    data = _read(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"not a public key file ({exc})", url=str(path)) from None
    want = Ed25519PublicKey if kind == "signing" else X25519PublicKey
    if not isinstance(key, want):
        raise ConfigError(f"this is not {_a(kind)} public key", url=str(path))
    return PublicKey(kind, raw_public(key))


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    key = load_private(path, "signing")
    assert isinstance(key, Ed25519PrivateKey)
    return key


def load_identity(path: str | os.PathLike[str]) -> X25519PrivateKey:
    """The X25519 private key that opens payloads encrypted to its public key."""
    key = load_private(path, "encryption")
    assert isinstance(key, X25519PrivateKey)
    return key
