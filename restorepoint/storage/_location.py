"""A URL -> a location: one object in some storage, with the abilities of its backend.

The publish protocol is chosen from declared abilities, not from protocol names scattered
through the code (spec section "Publishing"):

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
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol

from ..errors import NotFound, PermissionDenied, StorageError, StorageUnavailable, UsageError
from ._errors import missing_extra, translate, translating
from ._names import partial_name

__all__ = [
    "Abilities",
    "Location",
    "ObjectInfo",
    "ObjectReader",
    "PendingUpload",
    "Publisher",
    "resolve",
]


@dataclass(frozen=True)
class Abilities:
    """What a backend guarantees; the publish protocol follows from these."""

    atomic_rename: bool = False
    deferred_commit: bool = False
    create_only: bool = False
    listing_cache: bool = False
    #: interrupted uploads can be listed and aborted (S3 multipart uploads)
    pending_uploads: bool = False
    #: every read of one reader names the object version it opened (S3: its VersionId, or
    #: If-Match with its ETag), so that ranges read by name cannot come from two objects
    pinned_reads: bool = False


_ABILITIES: dict[str, Abilities] = {
    "file": Abilities(atomic_rename=True, create_only=True),
    "s3": Abilities(
        deferred_commit=True,
        create_only=True,
        listing_cache=True,
        pending_uploads=True,
        pinned_reads=True,
    ),
    # gcsfs can ask for a create-only upload, but the GCS emulator does not honour it, so
    # nothing here relies on it for safety.
    "gcs": Abilities(deferred_commit=True, listing_cache=True),
}
_ALIASES = {"s3a": "s3", "gs": "gcs", "local": "file"}


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

    def write(self, data: bytes, /) -> None: ...

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
    abilities: Abilities

    def join(self, name: str) -> Location:
        """The location of ``name`` ("/"-separated) under this prefix."""
        raise NotImplementedError

    def list_objects(self) -> list[ObjectInfo]:
        """Every object under this prefix, recursively, partial names included, as the store
        holds them now: listing caches are bypassed, so an object another process published
        is never hidden. A prefix that does not exist holds nothing."""
        raise NotImplementedError

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


# -- local files ----------------------------------------------------------------------------


class _LocalReader:
    def __init__(self, url: str, path: str) -> None:
        self.url = url
        with translating(url):
            # One descriptor for every read: a rename over the path while we read cannot mix
            # two objects. O_NONBLOCK: opening a FIFO for reading otherwise waits for a writer
            # (forever), before fstat could tell that it is not a file; the type is checked on
            # the descriptor itself, so a path swapped after a stat cannot slip through.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise StorageError("not a regular file", url=url)
                os.set_blocking(fd, True)
            except BaseException:
                os.close(fd)
                raise
            self._file = os.fdopen(fd, "rb", buffering=0)
        self._size = st.st_size

    @property
    def size(self) -> int:
        return self._size

    def read_range(self, start: int, end: int) -> bytes:
        # pread allocates the whole count first: an end far past the object must not.
        count = min(end, self._size) - start
        if count <= 0:
            return b""
        with translating(self.url):
            return os.pread(self._file.fileno(), count, start)

    def open_stream(self, start: int) -> BinaryIO:
        with translating(self.url):
            fd = os.dup(self._file.fileno())
            stream = os.fdopen(fd, "rb", buffering=1 << 20)
            stream.seek(start)
            return _TranslatingStream(stream, self.url)  # type: ignore[return-value]

    def close(self) -> None:
        self._file.close()


class _LocalPublisher:
    def __init__(self, url: str, path: str, create_only: bool) -> None:
        self.url = url
        self.path = path
        self.create_only = create_only
        self.directory = os.path.dirname(path) or "."
        with translating(url):
            os.makedirs(self.directory, exist_ok=True)
            self.temp = os.path.join(self.directory, partial_name(os.path.basename(path)))
            self.fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def write(self, data: bytes) -> None:
        with translating(self.url):
            view = memoryview(data)
            while view:
                n = os.write(self.fd, view)
                view = view[n:]

    def commit(self) -> None:
        with translating(self.url):
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = -1
            if self.create_only:
                # link() fails if the name exists: a create-only publish never replaces.
                os.link(self.temp, self.path)
                os.unlink(self.temp)
            else:
                os.replace(self.temp, self.path)
            dfd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def discard(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.temp)


class LocalLocation(Location):
    def __init__(self, url: str, path: str) -> None:
        self.url = url
        self.path = os.path.abspath(path)
        self.abilities = _ABILITIES["file"]

    def reader(self) -> ObjectReader:
        return _LocalReader(self.url, self.path)

    def join(self, name: str) -> Location:
        return LocalLocation(_join_url(self.url, name), os.path.join(self.path, *name.split("/")))

    def list_objects(self) -> list[ObjectInfo]:
        out: list[ObjectInfo] = []
        if not os.path.isdir(self.path):
            return out

        def onerror(exc: OSError) -> None:
            raise translate(exc, self.url)

        with translating(self.url):
            for directory, _dirs, names in os.walk(self.path, onerror=onerror):
                for name in names:
                    full = os.path.join(directory, name)
                    try:
                        st = os.lstat(full)
                    except FileNotFoundError:
                        continue  # removed while we listed
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    rel = os.path.relpath(full, self.path).replace(os.sep, "/")
                    out.append(ObjectInfo(rel, _join_url(self.url, rel), st.st_size, st.st_mtime))
        return sorted(out, key=lambda o: o.name)

    def delete(self) -> None:
        with translating(self.url):
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                return

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        return _LocalPublisher(self.url, self.path, create_only)


# -- fsspec ---------------------------------------------------------------------------------

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
            return bytes(self.fs.cat_file(self.path, start=start, end=end))

    def open_stream(self, start: int) -> BinaryIO:
        with translating(self.url):
            stream = self.fs.open(self.path, "rb", block_size=_STREAM_BLOCK, cache_type="readahead")
            stream.seek(start)
        self._streams.append(stream)
        return _TranslatingStream(stream, self.url)  # type: ignore[return-value]

    def close(self) -> None:
        for s in self._streams:
            with contextlib.suppress(Exception):
                s.close()
        self._streams.clear()


class _PinnedS3Reader(_FsspecReader):
    """An S3 object read as the one version it was when the reader opened it. S3 serves ranges
    by name, so an object replaced between the gate's read and the payload's would otherwise
    be read in parts from two objects. Every range, the payload stream's too, names the
    object's VersionId where the bucket keeps versions (the replaced object is still read
    whole), or else carries If-Match with its ETag (S3 then answers 412, and the read fails as
    StorageUnavailable: a retry reads the new object, whole)."""

    def __init__(self, url: str, fs: Any, path: str) -> None:
        super().__init__(url, fs, path)
        self._bucket, self._key, _ = fs.split_path(path)
        version, etag = self.info.get("VersionId"), self.info.get("ETag")
        self._pin: dict[str, str] = {}
        if version and version != "null":
            self._pin = {"VersionId": str(version)}
        elif etag:
            self._pin = {"IfMatch": str(etag)}

    async def _get(self, start: int, end: int) -> bytes:
        response = await self.fs._call_s3(
            "get_object",
            Bucket=self._bucket,
            Key=self._key,
            Range=f"bytes={start}-{end - 1}",
            **self._pin,
        )
        body = response["Body"]
        try:
            return bytes(await body.read())
        finally:
            body.close()

    def read_range(self, start: int, end: int) -> bytes:
        end = min(end, self._size)
        if end <= start:
            return b""
        from fsspec.asyn import sync

        with translating(self.url):
            try:
                return bytes(sync(self.fs.loop, self._get, start, end))
            except OSError as exc:
                if _precondition_failed(exc):
                    raise StorageUnavailable(
                        "the object was replaced while it was read (its ETag changed); "
                        "read it again",
                        url=self.url,
                    ) from exc
                raise

    def open_stream(self, start: int) -> BinaryIO:
        return _RangeStream(self, start, _STREAM_BLOCK)  # type: ignore[return-value]


def _precondition_failed(exc: BaseException) -> bool:
    """Whether S3 refused a conditional read (If-Match): 412, in whatever s3fs made of it."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "412") or status == 412:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


class _RangeStream:
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

    def __enter__(self) -> _RangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _TranslatingStream:
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

    def __enter__(self) -> _TranslatingStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _DeferredPublisher:
    """Multipart / resumable upload under the final name, completed only by ``commit``."""

    def __init__(self, url: str, fs: Any, path: str, size_hint: int, create_only: bool) -> None:
        self.url = url
        # S3 allows 10,000 parts; 16 MiB parts cover 160 GB, larger objects get larger parts.
        block = max(16 << 20, -(-size_hint // 9000))
        block = -(-block // (1 << 20)) << 20
        with translating(url):
            self.file = fs.open(
                path, "xb" if create_only else "wb", autocommit=False, block_size=block
            )

    def write(self, data: bytes) -> None:
        with translating(self.url):
            self.file.write(data)

    def commit(self) -> None:
        with translating(self.url):
            self.file.close()
            self.file.commit()

    def discard(self) -> None:
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

    def write(self, data: bytes) -> None:
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
    def __init__(self, url: str, fs: Any, path: str, protocol: str) -> None:
        self.url = url
        self.fs = fs
        self.path = path
        self.protocol = protocol
        self.abilities = _ABILITIES.get(protocol, Abilities())

    def reader(self) -> ObjectReader:
        if self.abilities.pinned_reads:
            return _PinnedS3Reader(self.url, self.fs, self.path)
        return _FsspecReader(self.url, self.fs, self.path)

    def join(self, name: str) -> Location:
        return FsspecLocation(
            _join_url(self.url, name), self.fs, f"{self.path.rstrip('/')}/{name}", self.protocol
        )

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
                    rel, _join_url(self.url, rel), int(info.get("size") or 0), _modified(info)
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

    def pending_uploads(self) -> list[PendingUpload]:
        if not self.abilities.pending_uploads:
            return []
        bucket, _, prefix = self.path.partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        out = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        with translating(self.url):
            while True:
                page = self.fs.call_s3("list_multipart_uploads", **kwargs)
                for up in page.get("Uploads", []) or []:
                    rel = up["Key"][len(prefix) :]
                    initiated = up.get("Initiated")
                    out.append(
                        PendingUpload(
                            rel,
                            _join_url(self.url, rel),
                            initiated.timestamp() if hasattr(initiated, "timestamp") else None,
                            up["UploadId"],
                        )
                    )
                if not page.get("IsTruncated"):
                    break
                kwargs["KeyMarker"] = page.get("NextKeyMarker")
                kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")
        return out

    def abort_upload(self, upload: PendingUpload) -> None:
        bucket, _, prefix = self.path.partition("/")
        key = (prefix.rstrip("/") + "/" if prefix else "") + upload.name
        with translating(self.url):
            self.fs.call_s3(
                "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id
            )

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        if self.abilities.deferred_commit:
            return _DeferredPublisher(self.url, self.fs, self.path, size_hint, create_only)
        return _StagedPublisher(self.url, self.fs, self.path, create_only)


def _join_url(url: str, name: str) -> str:
    return f"{url.rstrip('/')}/{name}"


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


#: gcsfs's default scope (its ``access="full_control"``).
_GCS_SCOPE = "https://www.googleapis.com/auth/devstorage."


def _gcs_credentials(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """gcs:// options with the credentials found, or one line saying there are none.

    Given no token, gcsfs tries every source in turn and ends with a GCE VM's metadata
    server, which it asks again and again (15 s where there is none, before it falls back to
    anonymous access; a private bucket then fails after six more tries, logging a traceback).
    google.auth finds the same credentials (the environment, gcloud's, the metadata server,
    whose absence it notices with short timeouts) at once, and none found is refused now, as on
    S3; a public bucket is read with an explicit ``token="anon"`` (``FSSPEC_GCS_TOKEN=anon``).
    A token given in any way, an endpoint of another server, or STORAGE_EMULATOR_HOST (an
    emulator) leave gcsfs to itself."""
    import fsspec.config

    given = {**fsspec.config.conf.get("gs", {}), **fsspec.config.conf.get("gcs", {}), **options}
    if "token" in given or "endpoint_url" in given or os.environ.get("STORAGE_EMULATOR_HOST"):
        return options
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:  # pragma: no cover - gcsfs depends on it; let gcsfs say what is missing
        return options
    scope = _GCS_SCOPE + str(given.get("access", "full_control"))
    try:
        credentials, project = google.auth.default(scopes=[scope])
    except google.auth.exceptions.DefaultCredentialsError:
        raise PermissionDenied(
            "no Google Cloud credentials found (set GOOGLE_APPLICATION_CREDENTIALS, run "
            "`gcloud auth application-default login`, or run on a VM with a service account; "
            "for a public bucket, FSSPEC_GCS_TOKEN=anon)",
            url=url,
        ) from None
    except google.auth.exceptions.GoogleAuthError as exc:
        raise PermissionDenied(f"Google Cloud credentials unusable ({exc})", url=url) from None
    found: dict[str, Any] = {**options, "token": credentials}
    if project and "project" not in given:
        found["project"] = project
    return found


def _protocol_of(url: str) -> str:
    if "://" not in url:
        return "file"
    proto = url.split("://", 1)[0].split("::", maxsplit=1)[0].lower()
    return _ALIASES.get(proto, proto)


def resolve(
    url: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None
) -> Location:
    """The Location for ``url``: a local path, file://, s3://, gs://, memory://, or any URL
    that fsspec knows. ``storage_options`` go to the fsspec filesystem (endpoint,
    credentials); fsspec's own configuration (``FSSPEC_S3_...`` variables) applies too. A
    Location passes through unchanged (tests wrap a backend, say, to count its bytes)."""
    if isinstance(url, Location):
        return url
    if isinstance(url, os.PathLike):
        url = os.fspath(url)
    if not isinstance(url, str) or not url:
        raise UsageError("empty URL")
    protocol = _protocol_of(url)
    if protocol == "file" and "::" not in url:
        path = url[len("file://") :] if url.startswith("file://") else url
        return LocalLocation(url, path)
    try:
        import fsspec.core
    except ImportError as exc:  # pragma: no cover - fsspec is a runtime dependency
        raise missing_extra(protocol, exc) from exc
    options = dict(storage_options or {})
    if protocol == "gcs":
        options = _gcs_credentials(url, options)
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise missing_extra(protocol, exc) from exc
    except ValueError as exc:
        raise UsageError(f"{url}: unsupported URL ({exc})") from exc
    fs_protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return FsspecLocation(url, fs, path, _ALIASES.get(fs_protocol, fs_protocol))
