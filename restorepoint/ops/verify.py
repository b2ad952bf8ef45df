"""verify: read a restore point end to end and check everything the spec lets a reader check.

Reader steps: the head from the prefix, the footer and index from the tail, the layout, then
every payload frame in one sequential stream, each file's sha256 compared with the index.
Nothing is written anywhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..errors import NotFound, at_url
from ..format import Head, Manifest, PayloadDecoder, read_head, restore_point_digest
from ..format import read_manifest as format_read_manifest
from ..storage import Location, resolve
from ._delta import bases_for
from ._multipart import check_part, check_part_paths, missing_part, part_location, part_trust
from ._open import NO_TRUST, Trust, open_manifest
from ._threads import default_threads

__all__ = ["VerifyReport", "inspect_restore_point", "read_head_of", "read_manifest", "verify"]


@dataclass(frozen=True)
class VerifyReport:
    """A restore point that verified: its manifest, how much was checked, how long it took,
    and its restore point digest (the one pack reported, if this is what was packed)."""

    url: str
    manifest: Manifest
    size: int
    files: int
    bytes: int
    seconds: float
    signed_by: tuple[str, ...] = ()
    trusted_by: tuple[str, ...] = ()
    digest: str = ""
    #: A commit's parts, each verified end to end and checked to be the one the commit names.
    parts: tuple[VerifyReport, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.parts:
            extra["parts"] = [
                {
                    "digest": p.digest,
                    "rank": p.manifest.part.rank if p.manifest.part else None,
                    "url": p.url,
                }
                for p in self.parts
            ]
        return extra | {
            "bytes": self.bytes,
            "digest": self.digest,
            "encrypted": self.manifest.encryption is not None,
            "files": self.files,
            "id": self.manifest.id,
            "ok": True,
            "position": self.manifest.position.to_dict(),
            "seconds": round(self.seconds, 6),
            "signed_by": list(self.signed_by),
            "size": self.size,
            "trusted_by": list(self.trusted_by),
            "url": self.url,
        }


def verify(  # noqa: PLR0913 - public API: the reader's keyword options
    url: str | Location,
    *,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    trust: Trust = NO_TRUST,
    part_payloads: bool = True,
    payload: bool = True,
) -> VerifyReport:
    """Verify the restore point at ``url``; raise an IntegrityError subclass naming the first
    fault found, or a StorageError if it cannot be read. Signatures present are always checked
    for validity, and against ``trust`` (trusted keys, a required signature) before anything
    else of the manifest is believed; an encrypted payload needs ``trust.identity``.

    A commit is verified with every part it names. Without ``part_payloads`` each part is
    checked up to its payload only (head, index and tail, and that it is the part named, whose
    digest pins each file's sha256), for a caller whose ranks verified their own parts' bytes
    (the prune after a multi-rank publish, spec 25.5). Without ``payload`` (and
    ``part_payloads``) nothing past any index is read: what ``fsck`` checks without
    ``--read-data``; no key is then needed for an encrypted payload."""
    started = time.perf_counter()
    location = resolve(url, storage_options)
    with at_url(location.url):
        return _verify(
            location, started, threads, progress, on_start, trust, part_payloads, payload=payload
        )


def _verify(  # noqa: PLR0913, PLR0917 - reader steps R1-R10, from verify
    location: Location,
    started: float,
    threads: int | None,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int], None] | None,
    trust: Trust,
    part_payloads: bool = True,
    *,
    payload: bool = True,
) -> VerifyReport:
    report = _verify_object(location, started, threads, progress, on_start, trust, payload=payload)
    commit = report.manifest
    if commit.parts is None:
        return report
    # A commit is sound only with every part it names, each sound and the one named (25.3).
    parts = []
    for ref in commit.parts.objects:
        where = part_location(location, ref)
        with at_url(where.url):
            try:
                part = _verify_object(
                    where,
                    time.perf_counter(),
                    threads,
                    progress,
                    None,
                    part_trust(trust),
                    payload=part_payloads,
                )
            except NotFound:
                raise missing_part(ref, where.url) from None
            check_part(
                commit, ref, part.manifest, digest=part.digest, size=part.size, url=where.url
            )
        parts.append(part)
    # What a whole import would refuse, verify refuses: two parts' files that overlap.
    check_part_paths(p.manifest for p in parts)
    return replace(
        report,
        files=sum(p.files for p in parts),
        bytes=sum(p.bytes for p in parts),
        seconds=time.perf_counter() - started,
        parts=tuple(parts),
    )


def _verify_object(  # noqa: PLR0913, PLR0917 - reader steps R1-R10, from _verify
    location: Location,
    started: float,
    threads: int | None,
    progress: Callable[[int], None] | None,
    on_start: Callable[[int], None] | None,
    trust: Trust,
    *,
    payload: bool = True,
) -> VerifyReport:
    reader = location.reader()
    try:
        opened = open_manifest(reader, trust, need_key=payload)
        head, manifest = opened.head, opened.manifest
        assert manifest is not None
        assert opened.tail is not None
        if on_start is not None:
            on_start(manifest.total_size)
        # Without the payload: up to the index (a part whose bytes its own rank verified).
        checked = (
            _check_payload(reader, head, manifest, opened.cipher, threads, progress, location)
            if payload
            else 0
        )
        size = reader.size
    finally:
        reader.close()
    return VerifyReport(
        url=location.url,
        manifest=manifest,
        size=size,
        files=manifest.file_count,
        bytes=checked,
        seconds=time.perf_counter() - started,
        signed_by=opened.signature.signed_by if opened.signature else (),
        trusted_by=opened.signature.trusted_by if opened.signature else (),
        digest=restore_point_digest(manifest.id, head.head_sha256, opened.tail.index_sha256),
    )


def _check_payload(  # noqa: PLR0913, PLR0917 - reader steps R9-R10, from _verify_object
    reader: Any,
    head: Head,
    manifest: Manifest,
    cipher: Any,
    threads: int | None,
    progress: Callable[[int], None] | None,
    location: Location,
) -> int:
    """Every payload frame, in one sequential stream (and, for an incremental restore point,
    ranged reads of its bases: section 28), each file's sha256 compared."""
    checked = 0
    stream = reader.open_stream(head.data_start)
    bases = bases_for(location, manifest)
    try:
        decoder = PayloadDecoder(
            manifest, stream, threads=threads or default_threads(), cipher=cipher, bases=bases
        )
        for _entry, chunk in decoder.events():
            if chunk is not None:
                checked += len(chunk)
                if progress is not None:
                    progress(len(chunk))
    finally:
        stream.close()
        if bases is not None:
            bases.close()
    return checked


def inspect_restore_point(
    url: str | Location, *, storage_options: dict[str, Any] | None = None
) -> VerifyReport:
    """Everything of the restore point at ``url`` but its payload bytes, as ``verify`` reads
    it: head, index and tail checked, every signature present checked for validity (trust is
    not asked), and for a commit every part's head and index, each checked to be the part
    named, so that ``files`` counts what a verify would (``bytes`` is 0: nothing was read of
    the payload). No key is needed for an encrypted payload."""
    started = time.perf_counter()
    location = resolve(url, storage_options)
    with at_url(location.url):
        return _verify(
            location, started, None, None, None, NO_TRUST, part_payloads=False, payload=False
        )


def read_head_of(url: str | Location, *, storage_options: dict[str, Any] | None = None) -> Head:
    """The identity part of the restore point at ``url``, from a bounded prefix only."""
    location = resolve(url, storage_options)
    with at_url(location.url):
        reader = location.reader()
        try:
            return read_head(reader)
        finally:
            reader.close()


def read_manifest(
    url: str | Location, *, head_only: bool = False, storage_options: dict[str, Any] | None = None
) -> Manifest:
    """The manifest of the restore point at ``url``, checked for structure, without reading
    the payload. ``head_only`` reads just the bounded prefix (the identity part; ``payload``
    is then None), as the import gate does."""
    location = resolve(url, storage_options)
    with at_url(location.url):
        reader = location.reader()
        try:
            if head_only:
                return read_head(reader).manifest
            return format_read_manifest(reader)[1]
        finally:
            reader.close()
