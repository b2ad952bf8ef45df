"""Trust options shared by verify, import and check; and `restorepoint keygen`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import UsageError
from ._common import print_json, run, say

if TYPE_CHECKING:
    from ..trust import Trust

TrustOpt = Annotated[
    list[Path] | None,
    typer.Option("--trust", help="A trusted signer's public key (repeatable)."),
]
RequireOpt = Annotated[
    bool,
    typer.Option("--require-signature", help="Refuse unless signed by a --trust key."),
]
IdentityOpt = Annotated[
    Path | None,
    typer.Option("--identity", help="Private X25519 key that opens an encrypted payload."),
]


def build_trust(
    trusted: list[Path] | None, *, require: bool = False, identity: Path | None = None
) -> Trust:
    """The options' trust policy; without --trust, the fleet's (``$RESTOREPOINT_TRUST``), with
    --require-signature added to it."""
    from ..trust import Trust

    key = None
    if identity is not None:
        from ..trust import load_identity  # cryptography: only with a key to load

        key = load_identity(identity)
    if not trusted:
        fleet = Trust.from_environment(identity=key)
        if fleet.trusted:
            return Trust(fleet.trusted, fleet.require_signature or require, key)
    keys: tuple[bytes, ...] = ()
    if trusted:
        from ..trust import load_public

        keys = tuple(load_public(p, "signing").raw for p in trusted)
    return Trust(trusted=keys, require_signature=require, identity=key)


def keygen_command(
    out: Annotated[Path, typer.Argument(help="Private key file to write (and OUT.pub).")],
    kind: Annotated[
        str,
        typer.Option("--for", help="signing (Ed25519, the default) or encryption (X25519)."),
    ] = "signing",
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Write a new key pair: OUT (private, mode 0600) and OUT.pub."""

    def body() -> None:
        from ..trust import generate, key_id, load_public

        if kind not in ("signing", "encryption"):
            raise UsageError(f"--for must be signing or encryption, not {kind!r}")
        _make_parent(out)
        if kind == "signing":
            private, public = generate(out, "signing")
            kid = key_id(load_public(public, "signing").raw)
        else:
            private, public = generate(out, "encryption")
            kid = key_id(load_public(public, "encryption").raw)
        if json_:
            print_json(
                {
                    "key_id": kid,
                    "kind": kind,
                    "ok": True,
                    "private": str(private),
                    "public": str(public),
                }
            )
        else:
            say(f"{kind} key {kid}: {private} (keep it secret), {public}")

    run(json_, body)


def _make_parent(out: Path) -> None:
    """A missing directory for the key is made, as pack makes its destination's; the key's
    own directory with mode 0700 (only its owner may enter it: one of the files is a secret),
    any above it as mkdir -p would."""
    from ..errors import PermissionDenied

    parent = out.parent
    if parent.is_dir():
        return
    try:
        parent.mkdir(mode=0o700, parents=True)
    except PermissionError:
        raise PermissionDenied("cannot make the key's directory", url=str(parent)) from None
    except OSError as exc:  # a file where a directory is needed, a read-only file system
        raise UsageError(
            f"cannot make the key's directory ({exc.strerror})", url=str(parent)
        ) from None
