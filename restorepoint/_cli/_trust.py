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
    from ..trust import Trust, load_identity, load_public

    key = load_identity(identity) if identity is not None else None
    if not trusted:
        fleet = Trust.from_environment(identity=key)
        if fleet.trusted:
            return Trust(fleet.trusted, fleet.require_signature or require, key)
    return Trust(
        trusted=tuple(load_public(p, "signing").raw for p in trusted or []),
        require_signature=require,
        identity=key,
    )


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

        if kind == "signing":
            private, public = generate(out, "signing")
            kid = key_id(load_public(public, "signing").raw)
        elif kind == "encryption":
            private, public = generate(out, "encryption")
            kid = key_id(load_public(public, "encryption").raw)
        else:
            raise UsageError(f"--for must be signing or encryption, not {kind!r}")
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
