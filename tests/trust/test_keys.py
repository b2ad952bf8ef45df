"""Key files: keygen of both kinds, the private key's mode whatever the umask, no overwriting,
and a clear refusal of a key of the wrong kind, a file that is no key, a key that is not there."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from restorepoint import ConfigError, NotFound, UsageError
from restorepoint.trust import (
    generate,
    key_id,
    load_identity,
    load_private,
    load_public,
    load_signing_key,
    raw_public,
)


@pytest.fixture
def umask_000() -> Iterator[None]:
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("kind", ["signing", "encryption"])
def test_keygen_writes_a_pair_that_loads_back(tmp_path: Path, kind: str) -> None:
    private, public = generate(tmp_path / "k", kind)  # type: ignore[arg-type]
    assert (private, public) == (tmp_path / "k", tmp_path / "k.pub")
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----\n")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----\n")
    key = load_private(private, kind)  # type: ignore[arg-type]
    pub = load_public(public, kind)  # type: ignore[arg-type]
    want = Ed25519PrivateKey if kind == "signing" else X25519PrivateKey
    assert isinstance(key, want)
    assert pub.kind == kind
    assert pub.raw == raw_public(key)
    assert len(pub.raw) == 32
    assert mode(private) == 0o600


def test_two_keygens_give_two_keys(tmp_path: Path) -> None:
    generate(tmp_path / "a")
    generate(tmp_path / "b")
    a = load_public(tmp_path / "a.pub", "signing")
    b = load_public(tmp_path / "b.pub", "signing")
    assert a.raw != b.raw


@pytest.mark.parametrize("kind", ["signing", "encryption"])
def test_private_key_is_0600_even_under_umask_000(
    tmp_path: Path, umask_000: None, kind: str
) -> None:
    private, public = generate(tmp_path / "k", kind)  # type: ignore[arg-type]
    assert mode(private) == 0o600
    # The public key is for sharing; under umask 000 it is what the writer asked for.
    assert mode(public) == 0o644


@pytest.mark.parametrize("existing", ["k", "k.pub"])
def test_keygen_refuses_to_overwrite(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_bytes(b"precious")
    with pytest.raises(UsageError, match="exists; not overwriting a key"):
        generate(tmp_path / "k")
    assert (tmp_path / existing).read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]


@pytest.mark.parametrize("existing", ["k", "k.pub"])
def test_keygen_refuses_a_symlink_even_a_dangling_one(tmp_path: Path, existing: str) -> None:
    target = tmp_path / "elsewhere"
    (tmp_path / existing).symlink_to(target)
    with pytest.raises(UsageError, match="exists; not overwriting a key"):
        generate(tmp_path / "k")
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]


def test_signing_key_loaded_as_identity_is_refused(tmp_path: Path) -> None:
    generate(tmp_path / "sign", "signing")
    with pytest.raises(ConfigError) as info:
        load_identity(tmp_path / "sign")
    assert str(info.value) == (
        f"{tmp_path / 'sign'}: this is a signing (Ed25519) key, not an encryption key"
    )
    with pytest.raises(ConfigError) as info:
        load_public(tmp_path / "sign.pub", "encryption")
    assert str(info.value) == f"{tmp_path / 'sign.pub'}: this is not an encryption public key"


def test_identity_loaded_as_signing_key_is_refused(tmp_path: Path) -> None:
    generate(tmp_path / "enc", "encryption")
    with pytest.raises(ConfigError) as info:
        load_signing_key(tmp_path / "enc")
    assert str(info.value) == (
        f"{tmp_path / 'enc'}: this is an encryption (X25519) key, not a signing key"
    )
    with pytest.raises(ConfigError) as info:
        load_public(tmp_path / "enc.pub", "signing")
    assert str(info.value) == f"{tmp_path / 'enc.pub'}: this is not a signing public key"


def test_public_key_given_where_a_private_key_belongs(tmp_path: Path) -> None:
    generate(tmp_path / "k")
    with pytest.raises(ConfigError, match="not a private key file"):
        load_signing_key(tmp_path / "k.pub")
    with pytest.raises(ConfigError, match="not a public key file"):
        load_public(tmp_path / "k", "signing")


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"garbage\n",
        b"\x00\xff" * 40,
        b"-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n",
    ],
    ids=["empty", "text", "binary", "bad-pem"],
)
def test_garbage_key_file_is_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "garbage"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load_private(path, "signing")
    assert info.value.url == str(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError):
        load_public(path, "encryption")


def test_a_key_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    (tmp_path / "p256").write_bytes(pem)
    with pytest.raises(ConfigError):
        load_signing_key(tmp_path / "p256")
    with pytest.raises(ConfigError):
        load_identity(tmp_path / "p256")


def test_missing_key_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        load_signing_key(tmp_path / "absent")
    assert info.value.url == str(tmp_path / "absent")
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(NotFound):
        load_public(tmp_path / "absent.pub", "encryption")


def test_a_directory_as_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the key file"):
        load_identity(tmp_path)


@pytest.mark.parametrize("kind", ["signing", "encryption"])
def test_key_id_is_the_first_16_hex_digits_of_sha256_of_the_raw_key(
    tmp_path: Path, kind: str
) -> None:
    generate(tmp_path / "k", kind)  # type: ignore[arg-type]
    pub = load_public(tmp_path / "k.pub", kind)  # type: ignore[arg-type]
    # The raw key straight from the PEM's DER: the last 32 bytes of the SubjectPublicKeyInfo.
    der = base64.b64decode(b"".join((tmp_path / "k.pub").read_bytes().splitlines()[1:-1]))
    assert der[-32:] == pub.raw
    assert pub.key_id == key_id(pub.raw) == hashlib.sha256(pub.raw).hexdigest()[:16]
    # Stable: the same key loaded again, from the private side too, has the same id.
    again = load_public(tmp_path / "k.pub", kind)  # type: ignore[arg-type]
    private = load_private(tmp_path / "k", kind)  # type: ignore[arg-type]
    assert again.key_id == pub.key_id == key_id(raw_public(private))


def test_key_id_of_a_fixed_key() -> None:
    raw = bytes(range(32))
    assert key_id(raw) == hashlib.sha256(raw).hexdigest()[:16] == "630dcd2966c43366"


def test_an_unknown_kind_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="for signing or encryption, not 'rsa'"):
        generate(tmp_path / "k", "rsa")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    generate(tmp_path / "k", "encryption")
    with pytest.raises(UsageError):
        load_private(tmp_path / "k", "rsa")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        load_public(tmp_path / "k.pub", "rsa")  # type: ignore[arg-type]
