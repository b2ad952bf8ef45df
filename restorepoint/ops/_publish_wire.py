"""The wire between the parent and the publish process (``publish_process``): frames of a
length and a body, and what a job is as JSON (``job_document``, the parent's; ``job_from``,
the child's). Data only, both ways: no unpickler on either side. One module, so that the two
sides read and write the one document."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

from ..errors import RestorePointError
from ..format import Position, Trainer
from .publish import HeadSpec, PackOptions
from .store import KeepBest

__all__ = [
    "OPTION_FIELDS",
    "Peer",
    "SaveJob",
    "Unavailable",
    "job_document",
    "job_from",
    "receive",
    "send",
]

_LEN = struct.Struct("<Q")


class Unavailable(RestorePointError):
    """The child cannot publish here (it did not start, or cannot read its parent's memory):
    the caller publishes in its own process."""


# -- the wire: frames of a length and a body --------------------------------------------------


def send(out: IO[bytes], body: bytes) -> None:
    out.write(_LEN.pack(len(body)) + body)
    out.flush()


def receive(inp: IO[bytes]) -> bytes | None:
    """One frame's body, or None at the end of the stream (the other side has gone)."""
    head = inp.read(_LEN.size)
    if len(head) < _LEN.size:
        return None
    (length,) = _LEN.unpack(head)
    body = inp.read(length)
    return body if len(body) == length else None


# -- what the parent hands over -----------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """A payload file's bytes in the parent's memory: ``head`` (bytes), then each region
    (address, length) in order. The parent keeps that memory alive and unchanged until the
    job's outcome is back."""

    head: bytes
    regions: tuple[tuple[int, int], ...]

    @property
    def size(self) -> int:
        return len(self.head) + sum(length for _, length in self.regions)


@dataclass
class SaveJob:
    """Beside a publish, the snapshot file the child also writes from the parent's memory:
    the payload file ``name`` of the job's memory (a Peer) to ``target``, through a temporary
    file in ``scratch`` (``_direct.replace_file``), on a thread of the child's at ``nice``
    (None: the child's own). ``pending``: the child is writing it, its answer to come after
    the publish's; ``done`` and ``error`` are that answer: ``done`` False when it gave none
    (a publish made in the parent after all, or a child that died), and the caller writes
    the file itself."""

    name: str
    target: str
    scratch: str
    nice: int | None = None
    pending: bool = False
    done: bool = False
    error: RestorePointError | None = None

    def document(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "scratch": self.scratch,
            "nice": self.nice,
        }


def job_document(  # noqa: PLR0913, PLR0917 - ops.publish's arguments, carried whole
    source: str,
    dest: str,
    head: HeadSpec,
    options: PackOptions,
    memory: Mapping[str, Peer | bytes],
    keep_last: int | None,
    keep_best: KeepBest | None,
) -> dict[str, Any]:
    """A publish as JSON for the child; Unavailable where JSON cannot carry it (the caller
    then publishes on its own thread)."""
    if head.parts is not None or head.part is not None or options.encrypt_to:
        raise Unavailable("a multi-part or encrypted publish is made in the training process")
    trainer = head.trainer
    doc = {
        "kind": "job",
        "source": source,
        "dest": dest,
        "head": {
            "position": head.manifest.position.to_dict(),
            "trainer": [trainer.name, trainer.version] if isinstance(trainer, Trainer) else trainer,
            "terms": dict(head.terms),
            "config": head.config,
            "operational_keys": list(head.operational_keys),
            "cache_keys": dict(head.cache_keys),
            "cache_root": head.cache_root,
            "run": head.run,
            "created": head.created,
            "rp_id": head.rp_id,
            "metrics": dict(head.metrics),
        },
        "options": {
            **{name: getattr(options, name) for name in OPTION_FIELDS},
            "sign": [key.private_bytes_raw().hex() for key in options.sign],
        },
        "memory": {
            name: {"head": item.head.hex(), "regions": [list(r) for r in item.regions]}
            if isinstance(item, Peer)
            else {"bytes": bytes(item).hex()}
            for name, item in memory.items()
        },
        "keep_last": keep_last,
        "keep_best": None
        if keep_best is None
        else {"k": keep_best.k, "metric": keep_best.metric, "mode": keep_best.mode},
    }
    try:
        # Only what JSON carries as it is: a storage option that is an object is refused.
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise Unavailable(f"the publish's options are not JSON ({exc})") from None
    return doc


#: PackOptions' fields carried to the child as they are (the keys travel apart).
OPTION_FIELDS = (
    "level",
    "codec",
    "object_sha256",
    "chunk_size",
    "threads",
    "storage_options",
    "adaptive",
    "deadline_margin",
    "incremental",
)


def job_from(doc: Mapping[str, Any]) -> tuple[HeadSpec, PackOptions, KeepBest | None]:
    """The child's side of ``job_document``: the head, options and retention, validated
    again as they are made."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    head = dict(doc["head"])
    position = Position(**head.pop("position"))
    trainer = head.pop("trainer")
    spec = HeadSpec(
        position=position,
        trainer=tuple(trainer) if trainer is not None else None,
        operational_keys=tuple(head.pop("operational_keys")),
        **head,
    )
    fields = dict(doc["options"])
    keys = tuple(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(k)) for k in fields.pop("sign"))
    options = PackOptions(**fields, sign=keys)
    best = doc["keep_best"]
    return spec, options, KeepBest(**best) if best is not None else None
