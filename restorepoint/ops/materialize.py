"""materialize: an incremental restore point -> a self-contained copy (spec section 28.6).

The copy has the same head (so the same id, position and identity: the gate decides on it as
on the original) and an index that names no base: every chunk is read, through the references
with bounded ranged reads of the bases, checked as verify checks it, and written again. It is
published atomically; anything that fails on the way discards it."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from typing import Any, cast

from ..errors import UsageError, at_url
from ..format import Entry, NoneCodec, PayloadDecoder, Writer
from ..format.codecs import Decoded
from ..format.delta import CUT_DIGITS
from ..storage import Location, resolve
from ._delta import bases_for
from ._naming import entry_name, is_store_url
from ._open import open_manifest
from ._threads import default_threads

__all__ = ["MaterializeResult", "materialize"]


@dataclass(frozen=True)
class MaterializeResult:
    url: str
    dest: str
    size: int
    digest: str
    bytes: int
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "digest": self.digest,
            "dest": self.dest,
            "ok": True,
            "seconds": round(self.seconds, 6),
            "size": self.size,
            "url": self.url,
        }


class _Chunks:
    """One entry's decoded chunks, read by the writer as a file (pulled from the decoder)."""

    def __init__(self, events: Iterator[tuple[Entry, Decoded | None]]) -> None:
        self.events = events
        self.buffer = memoryview(b"")

    def read(self, n: int = -1) -> bytes:
        parts = []
        while n != 0:
            if not self.buffer:
                _entry, chunk = next(self.events)
                if chunk is None:
                    break  # the entry's end, its sha256 checked
                self.buffer = memoryview(chunk)
            take = self.buffer[: n if n >= 0 else len(self.buffer)]
            self.buffer = self.buffer[len(take) :]
            parts.append(bytes(take))
            n -= len(take) if n >= 0 else 0
        return b"".join(parts)


def materialize(
    url: str | Location,
    dest: str | Location,
    *,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> MaterializeResult:
    """Write a self-contained copy of the restore point at ``url`` to ``dest`` (an object URL,
    or a store ending in "/", where it goes under its store name, create-only)."""
    started = time.perf_counter()
    location = resolve(url, storage_options)
    with at_url(location.url):
        reader = location.reader()
        try:
            opened = open_manifest(reader, need_key=False)
            manifest = opened.manifest
            assert manifest is not None
            if manifest.encryption is not None or manifest.parts is not None:
                raise UsageError("only a single, unencrypted restore point can be materialized")
            payload = manifest.payload or ()
            head = replace(manifest, payload=None, bases=None)
            out = resolve(dest, storage_options)
            store = is_store_url(dest)
            if store:
                out = out.join(entry_name(head))
            bases = bases_for(location, manifest)
            stream = reader.open_stream(opened.head.data_start)
            try:
                written = _copy(manifest, payload, head, stream, bases, out, store, threads)
            finally:
                stream.close()
                if bases is not None:
                    bases.close()
        finally:
            reader.close()
    return MaterializeResult(
        url=location.url,
        dest=out.url,
        size=written.size,
        digest=written.digest,
        bytes=manifest.total_size,
        seconds=time.perf_counter() - started,
    )


def _copy(  # noqa: PLR0913, PLR0917 - the source, what it holds, and where the copy goes
    manifest: Any,
    payload: tuple[Entry, ...],
    head: Any,
    stream: Any,
    bases: Any,
    out: Location,
    store: bool,
    threads: int | None,
) -> Any:
    codec = payload[0].codec if payload else None
    if any(e.codec.to_dict() != payload[0].codec.to_dict() for e in payload):
        raise UsageError("the entries use different codecs: materialize copies one codec")
    decoder = PayloadDecoder(manifest, stream, threads=threads or default_threads(), bases=bases)
    events = cast(Generator[tuple[Entry, Decoded | None], None, None], decoder.events())
    with out.publish(size_hint=manifest.total_size, create_only=store) as publisher:
        writer = Writer(publisher, head, codec or NoneCodec())
        try:
            writer.begin()
            for entry in payload:
                source = _Chunks(events)
                cuts = None
                if entry.delta is not None and entry.delta.cuts:
                    text = entry.delta.cuts
                    cuts = [
                        int(text[i : i + CUT_DIGITS], 16) for i in range(0, len(text), CUT_DIGITS)
                    ]
                # The writer's last read of each file takes the entry's end (its sha256
                # checked by the decoder).
                writer.add(entry.path, source, entry.size, cuts)  # type: ignore[arg-type]
            written = writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            events.close()  # the decoder's pool, whatever happened
    return written
