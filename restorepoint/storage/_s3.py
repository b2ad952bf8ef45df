"""S3: what is S3's own beside fsspec's generic backend: reads pinned to the object version
they opened (a replace between the gate's read and the payload's is never read as one object),
a multipart commit whose answer was lost (the retry finds the upload gone), and the
interrupted multipart uploads a killed writer leaves, listed and aborted by prune."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any, BinaryIO, ClassVar

from ..errors import NotFound, StorageUnavailable
from ._base import Abilities, ObjectInfo, ObjectReader, PendingUpload, Publisher, join_url
from ._errors import translating
from ._fsspec import (
    FsspecLocation,
    _DeferredPublisher,
    _FsspecReader,
    _modified,
)
from ._retry import retriable, retry_async

__all__ = ["S3Location"]

#: What one read of a streamed body asks for at most.
_STREAM_PIECE = 1 << 20


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
        # The request and its body as one try of the retry policy (a reset or a stall mid-body
        # is retried from the request), not the policy around the request alone.
        return await retry_async(lambda: self._get_once(start, end), "S3 ranged read")

    async def _get_once(self, start: int, end: int) -> bytes:
        call = getattr(self.fs, "_restorepoint_raw_call_s3", self.fs._call_s3)
        response = await call(
            "get_object",
            Bucket=self._bucket,
            Key=self._key,
            Range=f"bytes={start}-{end - 1}",
            **self._pin,
        )
        body = response["Body"]
        try:
            data = bytes(await body.read())
        finally:
            body.close()
        if len(data) != end - start:
            # A body cut short under a Content-Length that matches it (a broken proxy) is
            # never taken for the range: the length asked for is the check.
            raise _ShortRead(f"asked for {end - start} bytes, the store sent {len(data)}")
        return data

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
        stream = _PinnedStream(self, start)
        self._streams.append(stream)
        return stream  # type: ignore[return-value]


class _PinnedStream:
    """A sequential read of the pinned object from ``start``: one GET of the rest of it,
    its body read as it comes, rather than a GET per block (a request's latency each, and a
    server that reads the object whole for each range, as moto's does, pays per block). A
    failure mid-body is tried again from the first byte not yet returned, by a new GET of the
    same pinned version, under the retry policy; bytes read in a failed try are dropped."""

    def __init__(self, reader: _PinnedS3Reader, start: int) -> None:
        self._reader = reader
        self._next = start
        self._body: Any = None

    async def _read_once(self, n: int) -> bytes:
        r = self._reader
        if self._body is None:
            call = getattr(r.fs, "_restorepoint_raw_call_s3", r.fs._call_s3)
            response = await call(
                "get_object",
                Bucket=r._bucket,
                Key=r._key,
                Range=f"bytes={self._next}-{r.size - 1}",
                **r._pin,
            )
            self._body = response["Body"]
        pieces, got = [], 0
        try:
            while got < n:
                piece = await self._body.read(min(n - got, _STREAM_PIECE))
                if not piece:
                    raise ConnectionError("the object's body ended early")
                pieces.append(piece)
                got += len(piece)
        except BaseException:
            self._close_body()
            raise
        return b"".join(pieces)

    def _close_body(self) -> None:
        if self._body is not None:
            with contextlib.suppress(Exception):
                self._body.close()
            self._body = None

    def read(self, n: int = -1) -> bytes:
        left = self._reader.size - self._next
        n = left if n < 0 else min(n, left)
        if n <= 0:
            return b""
        from fsspec.asyn import sync

        r = self._reader
        with translating(r.url):
            try:
                data = sync(r.fs.loop, retry_async, lambda: self._read_once(n), "S3 stream read")
            except OSError as exc:
                if _precondition_failed(exc):
                    raise StorageUnavailable(
                        "the object was replaced while it was read (its ETag changed); "
                        "read it again",
                        url=r.url,
                    ) from exc
                raise
        self._next += len(data)
        return bytes(data)

    def close(self) -> None:
        if self._body is not None:
            from fsspec.asyn import sync

            with contextlib.suppress(Exception):
                sync(self._reader.fs.loop, self._aclose)
        self._body = None

    async def _aclose(self) -> None:
        self._close_body()

    def __enter__(self) -> _PinnedStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ShortRead(ConnectionError):
    """A ranged read answered with fewer bytes than it asked for: transient (retried)."""


class _S3Publisher(_DeferredPublisher):
    """The multipart commit of 15.2, with the one request that is not idempotent answered:
    a ``CompleteMultipartUpload`` whose answer was lost after S3 acted on it. Its retry finds
    the upload gone (404 ``NoSuchUpload``, or 412 for a create-only commit once the object
    exists); the publish is then done exactly when the object under the name is this upload:
    its size and its multipart ETag (the MD5 of its parts' MD5s, ``-N``) are the upload's."""

    def __init__(self, url: str, fs: Any, path: str, size_hint: int, create_only: bool) -> None:
        super().__init__(url, fs, path, size_hint, create_only)
        self.fs = fs
        self.create_only = create_only
        self.written = 0

    def write(self, data: bytes | memoryview) -> None:
        super().write(data)
        self.written += len(data)

    def commit(self) -> None:
        # Every part handed to the upload thread is up (or its failure raised) first.
        self._join()
        self._raise()
        f = self.file
        with translating(self.url):
            f.close()  # uploads the last part; autocommit is off, so nothing completes
            if not f.parts or f.mpu is None:
                f.commit()  # an empty object: s3fs aborts the upload and writes it at once
                return
            self._complete(f)
            f.buffer = None
            self.fs.invalidate_cache(f.path)

    def _complete(self, f: Any) -> None:
        from fsspec.asyn import sync

        raw = getattr(self.fs, "_restorepoint_raw_call_s3", self.fs._call_s3)
        tries = 0
        match = {"IfNoneMatch": "*"} if self.create_only else {}

        async def complete() -> Any:
            nonlocal tries
            tries += 1
            return await raw(
                "complete_multipart_upload",
                Bucket=f.bucket,
                Key=f.key,
                UploadId=f.mpu["UploadId"],
                MultipartUpload={"Parts": f.parts},
                **match,
            )

        try:
            sync(self.fs.loop, retry_async, complete, "S3 complete_multipart_upload")
        except Exception as exc:
            gone = _error_code(exc) == "NoSuchUpload" or (
                self.create_only and _precondition_failed(exc)
            )
            if gone and tries > 1:  # a retry, after a try that may have landed
                if not self._landed(f):
                    raise StorageUnavailable(
                        "the commit's answer was lost and the upload is gone, but the object "
                        "under the name is not this upload: nothing was published",
                        url=self.url,
                    ) from exc
                return
            # Tries spent on a complete whose answers were lost: S3 may have acted on one.
            if retriable(exc) and self._landed(f, quiet=True):
                return
            raise

    def _landed(self, f: Any, *, quiet: bool = False) -> bool:
        """Whether the object under the name now is this upload, by size and multipart ETag
        (``quiet``: a store that cannot answer says no)."""
        from fsspec.asyn import sync

        try:
            head = sync(self.fs.loop, self.fs._call_s3, "head_object", Bucket=f.bucket, Key=f.key)
        except FileNotFoundError:
            return False
        except Exception:
            if quiet:
                return False
            raise
        digests = b"".join(bytes.fromhex(str(p["ETag"]).strip('"')) for p in f.parts)
        expected = f"{hashlib.md5(digests).hexdigest()}-{len(f.parts)}"  # noqa: S324 - S3's ETag
        return (
            int(head.get("ContentLength", -1)) == self.written
            and str(head.get("ETag", "")).strip('"') == expected
        )


def _error_code(exc: BaseException) -> str | None:
    """S3's error code (``NoSuchUpload``, ...) in whatever s3fs made of the answer."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = (response.get("Error", {}) or {}).get("Code")
            if code:
                return str(code)
        seen = seen.__cause__ or seen.__context__
    return None


def _call(fs: Any, method: str, **kwargs: Any) -> Any:
    """One S3 call through the filesystem's ``_call_s3`` (the retry policy's; s3fs's
    ``call_s3`` would bypass it)."""
    from fsspec.asyn import sync

    return sync(fs.loop, fs._call_s3, method, **kwargs)


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


class S3Location(FsspecLocation):
    """s3:// (and s3a://) through s3fs: a multipart upload completed only at the end, a
    create-only completion (If-None-Match), reads pinned to the version opened, interrupted
    uploads listed and aborted."""

    abilities: ClassVar[Abilities] = Abilities(
        deferred_commit=True, create_only=True, pending_uploads=True, pinned_reads=True
    )

    @property
    def protocol(self) -> str:
        return "s3"

    def reader(self) -> ObjectReader:
        return _PinnedS3Reader(self.url, self.fs, self.path)

    def publisher(self, *, size_hint: int = 0, create_only: bool = False) -> Publisher:
        return _S3Publisher(self.url, self.fs, self.path, size_hint, create_only)

    def iter_objects(self) -> Iterator[ObjectInfo]:
        # S3 lists keys in order, a page (1,000 keys) at a time: one page is held, not the
        # store (fsck on a store of 100k objects). Keys sharing a prefix come together.
        bucket, _, prefix = self.path.partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        with translating(self.url):
            while True:
                try:
                    page = _call(self.fs, "list_objects_v2", **kwargs)
                except FileNotFoundError:
                    raise NotFound(f"bucket {bucket!r} not found", url=self.url) from None
                for obj in page.get("Contents", []) or []:
                    key = str(obj["Key"])
                    if key.endswith("/"):
                        continue  # a "directory" marker, no object
                    rel = key[len(prefix) :]
                    yield ObjectInfo(
                        rel, join_url(self.url, rel), int(obj.get("Size") or 0), _modified(obj)
                    )
                if not page.get("IsTruncated"):
                    return
                kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def pending_uploads(self) -> list[PendingUpload]:
        bucket, _, prefix = self.path.partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        out = []
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        with translating(self.url):
            while True:
                page = _call(self.fs, "list_multipart_uploads", **kwargs)
                for up in page.get("Uploads", []) or []:
                    rel = up["Key"][len(prefix) :]
                    initiated = up.get("Initiated")
                    out.append(
                        PendingUpload(
                            rel,
                            join_url(self.url, rel),
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
            _call(
                self.fs, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id
            )
