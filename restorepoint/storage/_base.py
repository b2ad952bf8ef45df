"""What every storage backend is: a Location (an object, or a prefix that holds objects) with
the abilities its backend declares, a reader (size, ranges, a stream) and a publisher (bytes in,
then commit or discard). One module per backend implements them: ``_local`` (POSIX files),
``_fsspec`` (any fsspec URL), ``_s3`` (S3's own: pinned reads, interrupted uploads) and
``_gcs`` (its credentials); ``resolve`` picks the class for a URL.

The publish protocol is chosen from the declared abilities, not from protocol names scattered
through the code (spec section 15):

- ``atomic_rename`` (POSIX file systems): write a temporary file in the same directory, fsync
  it, rename it over the final name, fsync the directory.
- ``deferred_commit`` (S3, GCS): stream a multipart / resumable upload under the final name and
  complete it only after the last byte; the store replaces the object only when an upload
  completes. On failure the upload is aborted, never completed, and a SIGKILL leaves only an
  incomplete upload that no reader can see.
- neither (memory and other fsspec backends): stage under a temporary name, then move it into
  place; the result is as atomic as the backend's move.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, ClassVar, Protocol

from ._errors import translating

__all__ = [
    "Abilities",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "PendingUpload",
    "Publisher",
    "TranslatingStream",
    "join_url",
]


@dataclass(frozen=True)
class Abilities:
    """What a backend guarantees; the publish protocol follows from these."""

    atomic_rename: bool = False
    deferred_commit: bool = False
    create_only: bool = False
    #: interrupted uploads can be listed and aborted (S3 multipart uploads)
    pending_uploads: bool = False
    #: every read of one reader names the object version it opened (S3: its VersionId, or
    #: If-Match with its ETag), so that ranges read by name cannot come from two objects
    pinned_reads: bool = False


class ObjectReader(Protocol):
    """Read access to one object: its size, byte ranges, and a sequential stream."""

    url: str

    @property
    def size(self) -> int: ...

    def read_range(self, start: int, end: int) -> bytes: ...

    def open_stream(self, start: int) -> BinaryIO: ...

    def close(self) -> None: ...


class Publisher(Protocol):
    """Bytes in, then exactly one of ``commit`` (visible under the final name, atomically) or
    ``discard`` (nothing visible, the previous object untouched)."""

    def write(self, data: bytes | memoryview, /) -> None: ...

    def commit(self) -> None: ...

    def discard(self) -> None: ...


@dataclass(frozen=True)
class ObjectInfo:
    """An object found under a prefix: its name relative to the prefix ("/"-separated)."""

    name: str
    url: str
    size: int
    modified: float | None  # seconds since the epoch, when the backend says


@dataclass(frozen=True)
class PendingUpload:
    """An upload that was started and never completed nor aborted (a killed writer's)."""

    name: str
    url: str
    initiated: float | None
    upload_id: str


class Location:
    """One URL resolved to a backend: an object, or a prefix that holds objects. Construct with
    ``resolve(url)``."""

    url: str
    #: What this backend guarantees (declared on each Location class).
    abilities: ClassVar[Abilities] = Abilities()

    @property
    def protocol(self) -> str:
        """The backend's name ("file", "s3", "gcs", "memory", ...), for messages and tests."""
        return "file"

    def join(self, name: str) -> Location:
        """The location of ``name`` ("/"-separated) under this prefix."""
        raise NotImplementedError

    def beside(self, name: str) -> Location:
        """The location of ``name`` ("/"-separated) beside this object: in the prefix that
        holds it (a commit's parts, spec section 25)."""
        raise NotImplementedError

    def up(self) -> Location:
        """The prefix that holds this object (or prefix), as a location: where a part's base
        lies, beside its commit's parts prefix (spec section 28.7)."""
        raise NotImplementedError

    def list_objects(self) -> list[ObjectInfo]:
        """Every object under this prefix, recursively, partial names included, as the store
        holds them now: listing caches are bypassed, so an object another process published
        is never hidden. A prefix that does not exist holds nothing."""
        raise NotImplementedError

    def iter_objects(self) -> Iterator[ObjectInfo]:
        """The objects of ``list_objects``, one at a time, in an order where the objects under
        each top-level name (a run's prefix) come together, and those in name order: a caller
        that groups them by that name holds one group at a time, never the whole listing. The
        backends that can stream (local paths, S3) do; the others list whole first."""
        yield from self.list_objects()

    def delete(self) -> None:
        """Remove this object; one that is already gone is not an error."""
        raise NotImplementedError

    def pending_uploads(self) -> list[PendingUpload]:
        """Interrupted uploads under this prefix (where ``abilities.pending_uploads``)."""
        return []

    def abort_upload(self, upload: PendingUpload) -> None:
        raise NotImplementedError

    def reader(self) -> ObjectReader:
        raise NotImplementedError

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        raise NotImplementedError

    @contextlib.contextmanager
    def publish(self, *, size_hint: int = 0, create_only: bool = False) -> Iterator[Publisher]:
        """Commit when the block ends normally; discard on any exception (even
        KeyboardInterrupt), so an error can never publish a partial object."""
        pub = self.publisher(size_hint=size_hint, create_only=create_only)
        try:
            yield pub
            # A commit that fails (a create-only refusal, a lost connection) must not leave
            # its temporary file or incomplete upload behind either.
            pub.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                pub.discard()
            raise


class TranslatingStream:
    """A read stream whose storage errors arrive as StorageError."""

    def __init__(self, inner: Any, url: str) -> None:
        self._inner = inner
        self._url = url

    def read(self, n: int = -1) -> bytes:
        with translating(self._url):
            return bytes(self._inner.read(n))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._inner.close()

    def __enter__(self) -> TranslatingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def join_url(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"
