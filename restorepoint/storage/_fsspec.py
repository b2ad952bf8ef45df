"""Any fsspec URL: reads through the filesystem, publishes by a deferred commit where the
backend declares one (S3, GCS; spec 15.2), else by a staged move (15.3). ``_s3`` and ``_gcs``
subclass it with what is theirs alone."""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Any, BinaryIO, ClassVar

from ..errors import NotFound, StorageError, StorageUnavailable
from ._base import (
    Abilities,
    Location,
    ObjectInfo,
    ObjectReader,
    Publisher,
    TranslatingStream,
    join_url,
)
from ._errors import translating
from ._names import partial_name

__all__ = ["FsspecLocation", "RangeStream", "whole"]

_STREAM_BLOCK = 8 << 20


class _FsspecReader:
    def __init__(self, url: str, fs: Any, path: str) -> None:
        self.url = url
        self.fs = fs
        self.path = path
        self._streams: list[Any] = []
        with translating(url):
            # Listing caches (s3fs, gcsfs) may hold an older size: ask the store itself.
            fs.invalidate_cache(path)
            info = fs.info(path)
        if info.get("type") not in (None, "file"):
            raise StorageError(f"not an object ({info.get('type')})", url=url)
        self.info = info
        self._size = int(info["size"])

    @property
    def size(self) -> int:
        return self._size

    def read_range(self, start: int, end: int) -> bytes:
        # data[start:end] as for a local file: S3 refuses a range that starts at or past the
        # end (416) where a file read just returns nothing.
        end = min(end, self._size)
        if end <= start:
            return b""
        with translating(self.url):
            return whole(
                bytes(self.fs.cat_file(self.path, start=start, end=end)), end - start, self.url
            )

    def open_stream(self, start: int) -> BinaryIO:
        with translating(self.url):
            stream = self.fs.open(self.path, "rb", block_size=_STREAM_BLOCK, cache_type="readahead")
            stream.seek(start)
        self._streams.append(stream)
        return TranslatingStream(stream, self.url)  # type: ignore[return-value]

    def close(self) -> None:
        for s in self._streams:
            with contextlib.suppress(Exception):
                s.close()
        self._streams.clear()


def whole(data: bytes, asked: int, url: str) -> bytes:
    """``data`` when it holds the ``asked`` bytes of a range: a body cut short (under a length
    that says so or not) is never taken for the range."""
    if len(data) != asked:
        raise StorageUnavailable(
            f"storage failing: asked for {asked} bytes, the store sent {len(data)}", url=url
        )
    return data


class RangeStream:
    """A sequential stream made of one reader's range reads, a block at a time: what the
    reader pins, the stream reads too."""

    def __init__(self, reader: ObjectReader, start: int, block: int) -> None:
        self._reader = reader
        self._block = block
        self._buffer = b""
        self._offset = 0
        self._next = start  # the object offset just after the buffer

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = max(0, self._reader.size - self._next) + len(self._buffer) - self._offset
        parts = []
        while n > 0:
            if self._offset == len(self._buffer):
                self._buffer = self._reader.read_range(self._next, self._next + max(n, self._block))
                self._offset = 0
                self._next += len(self._buffer)
                if not self._buffer:
                    break  # the end of the object
            piece = self._buffer[self._offset : self._offset + n]
            self._offset += len(piece)
            n -= len(piece)
            parts.append(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        self._buffer = b""

    def __enter__(self) -> RangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DeferredPublisher:
    """Multipart / resumable upload under the final name, completed only by ``commit``.

    The parts go up on a thread of their own (``rp-upload``): ``write`` hands its bytes over
    and returns while up to ``AHEAD_BLOCKS`` parts' worth wait, so that the pack compresses the
    next part while the store takes this one (measured in benchmarks/bench_resume.py). An
    upload that fails is raised by the next ``write`` or by ``commit``; nothing is completed."""

    #: Parts' worth of bytes handed over and not yet uploaded, at most.
    AHEAD_BLOCKS = 2

    def __init__(self, url: str, fs: Any, path: str, size_hint: int, create_only: bool) -> None:
        self.url = url
        # S3 allows 10,000 parts; 16 MiB parts cover 160 GB, larger objects get larger parts.
        block = max(16 << 20, -(-size_hint // 9000))
        block = -(-block // (1 << 20)) << 20
        with translating(url):
            self.file = fs.open(
                path, "xb" if create_only else "wb", autocommit=False, block_size=block
            )
        self._limit = self.AHEAD_BLOCKS * block
        self._pieces: collections.deque[bytes | None] = collections.deque()
        self._waiting = 0
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _upload(self) -> None:
        while True:
            with self._cond:
                while not self._pieces:
                    self._cond.wait()
                piece = self._pieces.popleft()
            if piece is None:
                return
            try:
                if self._error is None:
                    with translating(self.url):
                        self.file.write(piece)
            except BaseException as exc:  # raised by the next write or by commit
                self._error = exc
            finally:
                with self._cond:
                    self._waiting -= len(piece)
                    self._cond.notify_all()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes | memoryview) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._upload, name="rp-upload", daemon=True)
            self._thread.start()
        with self._cond:
            while self._waiting and self._waiting + len(data) > self._limit:
                if self._error is not None:
                    break
                self._cond.wait(0.2)
            self._waiting += len(data)
            self._pieces.append(bytes(data))
            self._cond.notify_all()
        self._raise()

    def drain(self) -> None:
        """Wait until every byte handed over has gone to the store's file object (whole parts
        uploaded; what is short of a part waits in its buffer for the next write or commit)."""
        with self._cond:
            while self._waiting and self._error is None:
                self._cond.wait(0.2)
        self._raise()

    def _join(self) -> None:
        if self._thread is None:
            return
        with self._cond:
            self._pieces.append(None)
            self._cond.notify_all()
        self._thread.join()
        self._thread = None

    def commit(self) -> None:
        self._join()
        self._raise()
        with translating(self.url):
            self.file.close()
            self.file.commit()

    def discard(self) -> None:
        self._error = self._error or RuntimeError("discarded")
        with contextlib.suppress(Exception):
            self._join()
        with contextlib.suppress(Exception):
            self.file.discard()
        # Never let close() (or garbage collection calling it) upload or commit anything.
        self.file.closed = True


class _StagedPublisher:
    """Write under a temporary name, then move into place."""

    def __init__(self, url: str, fs: Any, path: str, create_only: bool) -> None:
        self.url = url
        self.fs = fs
        self.path = path
        self.create_only = create_only
        parent, _, name = path.rpartition("/")
        self.temp = f"{parent}/{partial_name(name)}" if parent else partial_name(name)
        with translating(url):
            if parent:
                fs.makedirs(parent, exist_ok=True)
            self.file = fs.open(self.temp, "wb")

    def write(self, data: bytes | memoryview) -> None:
        with translating(self.url):
            self.file.write(data)

    def commit(self) -> None:
        with translating(self.url):
            self.file.close()
            if self.create_only and self.fs.exists(self.path):
                self.fs.rm(self.temp)
                raise FileExistsError(self.path)
            self.fs.mv(self.temp, self.path)

    def discard(self) -> None:
        with contextlib.suppress(Exception):
            self.file.close()
        with contextlib.suppress(Exception):
            self.fs.rm(self.temp)


class FsspecLocation(Location):
    """Any fsspec backend, as generic as fsspec: no ability declared (``memory://`` and the
    like are published by a staged move, as atomic as the backend's move)."""

    abilities: ClassVar[Abilities] = Abilities()

    def __init__(self, url: str, fs: Any, path: str) -> None:
        self.url = url
        self.fs = fs
        self.path = path

    @property
    def protocol(self) -> str:
        names = self.fs.protocol
        return str(names if isinstance(names, str) else names[0])

    def reader(self) -> ObjectReader:
        return _FsspecReader(self.url, self.fs, self.path)

    def join(self, name: str) -> Location:
        return type(self)(join_url(self.url, name), self.fs, f"{self.path.rstrip('/')}/{name}")

    def beside(self, name: str) -> Location:
        url, path = self.url.rstrip("/"), self.path.rstrip("/")
        return type(self)(
            f"{url.rsplit('/', 1)[0]}/{name}", self.fs, f"{path.rsplit('/', 1)[0]}/{name}"
        )

    def up(self) -> Location:
        url, path = self.url.rstrip("/"), self.path.rstrip("/")
        return type(self)(url.rsplit("/", 1)[0], self.fs, path.rsplit("/", 1)[0])

    def list_objects(self) -> list[ObjectInfo]:
        root = self.path.rstrip("/")
        with translating(self.url):
            self.fs.invalidate_cache(root)
            try:
                found = self.fs.find(root, detail=True, withdirs=False)
            except FileNotFoundError:
                found = {}
            if not found and self.abilities.deferred_commit:
                # An empty prefix is an empty store; a missing bucket is a typo to report.
                bucket = root.split("/", 1)[0]
                self.fs.invalidate_cache(bucket)
                if not self.fs.exists(bucket):
                    raise NotFound(f"bucket {bucket!r} not found", url=self.url)
        out = []
        for key, info in found.items():
            if info.get("type", "file") != "file":
                continue
            name = key.rstrip("/")
            if not name.startswith(root + "/"):
                continue
            rel = name[len(root) + 1 :]
            out.append(
                ObjectInfo(
                    rel, join_url(self.url, rel), int(info.get("size") or 0), _modified(info)
                )
            )
        return sorted(out, key=lambda o: o.name)

    def delete(self) -> None:
        with translating(self.url):
            try:
                self.fs.rm_file(self.path)
            except FileNotFoundError:
                return
            finally:
                self.fs.invalidate_cache(self.path)

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        if self.abilities.deferred_commit:
            return _DeferredPublisher(self.url, self.fs, self.path, size_hint, create_only)
        return _StagedPublisher(self.url, self.fs, self.path, create_only)


def _modified(info: dict[str, Any]) -> float | None:
    """An fsspec info dict's modification time: each backend names it its own way."""
    for key in ("mtime", "LastModified", "updated", "created", "timeCreated"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            from datetime import datetime

            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None
