"""pack: a trainer's checkpoint -> one restore point, published atomically at a URL.

The writer's algorithm of the spec, step by step: list the source, describe the head, open an
atomic publisher, stream every file once through the writer, write the index and footer,
commit. Any failure before the commit discards what was written; the previous object under the
name is untouched.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .._version import __version__
from ..errors import ConfigError, IntegrityError, SourceError, UsageError, at_url
from ..format import (
    CanonicalizationError,
    Codec,
    Manifest,
    NoneCodec,
    PlanesCodec,
    Position,
    Producer,
    Trainer,
    Writer,
    Written,
    ZstdCodec,
    canonical_dumps,
    config_identity,
    strict_loads,
)
from ..format.identity import check_operational_key
from ..format.limits import CHUNK_SIZE_DEFAULT, CHUNK_SIZE_MAX, CHUNK_SIZE_MIN
from ..format.manifest import ENCRYPTION_FEATURE, RUN_PATTERN
from ..storage import Location, resolve
from ..trust import PublicKey, StreamCipher, recipients_for, signature_block, statement
from ._config import check_json_data
from ._naming import entry_name, is_store_url
from ._source import SourceFile, list_source

__all__ = ["CODECS", "DEFAULT_CODEC", "DEFAULT_LEVEL", "PackResult", "describe", "pack"]

#: zstd level 1: ~1 GB/s per core on float32 tensors; higher levels buy almost nothing on
#: weights (which are close to random) at a large cost in time.
DEFAULT_LEVEL = 1
#: What ``codec=`` accepts: ``auto`` chooses chunk by chunk (codec planes: as is, zstd, or byte
#: planes), ``zstd`` compresses every chunk whole, ``none`` stores the payload as it is.
CODECS = ("auto", "zstd", "none")
DEFAULT_CODEC = "auto"


@dataclass(frozen=True)
class PackResult:
    """What pack did: where the restore point is, what it holds, how long it took.
    ``digest`` is the restore point digest (what ``verify`` reports for the same restore point,
    wherever it is copied); ``sha256`` is the whole object's, only when it was asked for."""

    url: str
    id: str
    size: int
    digest: str
    files: int
    bytes: int
    seconds: float
    manifest: Manifest
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "digest": self.digest,
            "files": self.files,
            "id": self.id,
            "ok": True,
            "position": self.manifest.position.to_dict(),
            "seconds": round(self.seconds, 6),
            "sha256": self.sha256,
            "size": self.size,
            "url": self.url,
        }


def choose_codec(codec: str = DEFAULT_CODEC, level: int | None = DEFAULT_LEVEL) -> Codec:
    """The codec of ``codec=`` and ``level=`` (spec section 13, P2): ``none`` when the level is
    None or 0, whatever the codec."""
    if codec not in CODECS:
        raise UsageError(f"codec must be one of {', '.join(CODECS)}, not {codec!r}")
    if codec == "none" or not level:
        return NoneCodec()
    try:
        return PlanesCodec(level) if codec == "auto" else ZstdCodec(level)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def default_threads() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def default_run(identity: str) -> str:
    """The run id of a config: what is trained, so a resubmitted job finds its own run."""
    return f"cfg-{identity[:16]}"


def describe(
    *,
    position: Position | int,
    trainer: Trainer | Sequence[str] | None = None,
    terms: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    operational_keys: Iterable[str] = (),
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    chunk_size: int = CHUNK_SIZE_DEFAULT,
    created: str | None = None,
    rp_id: str | None = None,
    run: str | None = None,
) -> Manifest:
    """The head of a new restore point, validated exactly as a reader would validate it:
    whatever the caller passes, a bad value is a UsageError here, before anything is written."""
    try:
        if not isinstance(position, Position):
            position = Position(step=position)
        if trainer is not None and not isinstance(trainer, Trainer):
            name, version = trainer
            trainer = Trainer(name, version)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"bad position or trainer ({exc})") from None
    operational = sorted(set(operational_keys))
    try:
        for key in operational:
            check_operational_key(key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    identity = None
    if config is not None:
        if not isinstance(config, Mapping):
            raise ConfigError("the config must be a mapping")
        config = check_json_data(config)
        try:
            identity = config_identity(config, operational)
        except CanonicalizationError as exc:
            raise ConfigError(f"config is not JSON data ({exc})") from None
    for name, mapping in (("version term", terms or {}), ("cache key", cache_keys or {})):
        for key, value in mapping.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise UsageError(f"a {name} needs a non-empty name and a string value")
    if trainer is not None and not (
        isinstance(trainer.name, str) and trainer.name and isinstance(trainer.version, str)
    ):
        raise UsageError("a trainer needs a name and a version, both strings")
    if cache_root is not None and not isinstance(cache_root, str):
        raise UsageError("the cache root must be a string")
    if run is None and identity is not None:
        run = default_run(identity)
    if run is not None and (not isinstance(run, str) or not RUN_PATTERN.fullmatch(run)):
        raise UsageError(
            f"run {run!r} must be 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if (
        not isinstance(chunk_size, int)
        or isinstance(chunk_size, bool)
        or not CHUNK_SIZE_MIN <= chunk_size <= CHUNK_SIZE_MAX
        or chunk_size & (chunk_size - 1)
    ):
        raise UsageError("chunk size must be a power of two from 64 KiB to 64 MiB")
    if created is None:
        now = datetime.now(timezone.utc)
        created = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    head = Manifest(
        id=rp_id or secrets.token_hex(16),
        created=created,
        producer=Producer("restorepoint", __version__),
        position=position,
        chunk_size=chunk_size,
        trainer=trainer,
        terms=dict(terms or {}),
        config=config,
        config_identity=identity,
        operational_keys=tuple(operational),
        cache_keys=dict(cache_keys or {}),
        cache_root=cache_root,
        run=run,
    )
    # The reader's own checks (id and time formats, depth, number domain) on the exact bytes.
    try:
        Manifest.from_head_dict(strict_loads(canonical_dumps(head.head_dict()), "head"))
    except (IntegrityError, CanonicalizationError) as exc:
        raise UsageError(f"the restore point would not be readable: {exc}") from None
    return head


def pack(
    source: str | os.PathLike[str],
    dest: str | Location,
    *,
    position: Position | int,
    trainer: Trainer | Sequence[str] | None = None,
    terms: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    operational_keys: Iterable[str] = (),
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    level: int | None = DEFAULT_LEVEL,
    codec: str = DEFAULT_CODEC,
    chunk_size: int = CHUNK_SIZE_DEFAULT,
    threads: int | None = None,
    storage_options: dict[str, Any] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    created: str | None = None,
    rp_id: str | None = None,
    run: str | None = None,
    into_store: bool | None = None,
    sign: Sequence[Ed25519PrivateKey] = (),
    encrypt_to: Sequence[PublicKey] = (),
    include: Sequence[str] | None = None,
    object_sha256: bool = False,
) -> PackResult:
    """Pack ``source`` (a directory or one file) into a restore point published at ``dest``.

    A ``dest`` that ends in "/" (or ``into_store=True``) is a store: the restore point is
    published create-only under its store name, ``RUN/STEP-CREATED-ID.rp`` (a run is then
    required: ``run=``, or a config to derive it from).

    ``sign`` keys sign the whole manifest (every payload digest included); ``encrypt_to``
    X25519 public keys each get the payload's key, and the payload is encrypted (the head, with
    identity and position, stays readable for the import gate).

    ``codec`` is ``auto`` (the default: each chunk stored as is, as zstd, or as byte planes,
    whichever a probe finds smallest; the restore point then requires the feature planes/1),
    ``zstd`` or ``none``. ``level`` is the zstd level of what is compressed whole (``None`` or 0
    store the payload uncompressed). ``object_sha256`` also hashes the whole object (a second
    pass over its bytes) for ``PackResult.sha256``. ``progress`` is called with each number of
    source bytes read; ``on_start`` once with the total."""
    started = time.perf_counter()
    head = describe(
        position=position,
        trainer=trainer,
        terms=terms,
        config=config,
        operational_keys=operational_keys,
        cache_keys=cache_keys,
        cache_root=cache_root,
        chunk_size=chunk_size,
        created=created,
        rp_id=rp_id,
        run=run,
    )
    chosen = choose_codec(codec, level)
    if chosen.feature is not None:
        head = replace(
            head, required_features=tuple(sorted({*head.required_features, chosen.feature}))
        )
    files = list_source(os.fspath(source), include)
    total = sum(f.size for f in files)
    if on_start is not None:
        on_start(total)
    cipher = None
    if encrypt_to:
        if any(k.kind != "encryption" for k in encrypt_to):
            raise UsageError("--encrypt-to needs X25519 public keys (keygen --for encryption)")
        file_key, encryption = recipients_for(encrypt_to)
        head = replace(
            head,
            encryption=encryption,
            required_features=tuple(sorted({*head.required_features, ENCRYPTION_FEATURE})),
        )
        cipher = StreamCipher(file_key, head.id)
    signer = None
    if sign:
        keys = list(sign)
        rp_id = head.id

        def signer(head_sha256: str, index_sha256: str) -> bytes:
            return signature_block(statement(rp_id, head_sha256, index_sha256), keys)

    store = is_store_url(dest) if into_store is None else into_store
    location = resolve(dest, storage_options)
    if store:
        location = location.join(entry_name(head))
    with at_url(location.url):
        written = _publish(
            location,
            head,
            chosen,
            files,
            total,
            threads,
            progress,
            create_only=store,
            cipher=cipher,
            signer=signer,
            object_sha256=object_sha256,
        )
    return PackResult(
        url=location.url,
        id=written.manifest.id,
        size=written.size,
        digest=written.digest,
        files=len(files),
        bytes=total,
        seconds=time.perf_counter() - started,
        manifest=written.manifest,
        sha256=written.object_sha256,
    )


def _publish(
    location: Location,
    head: Manifest,
    codec: Codec,
    files: list[SourceFile],
    total: int,
    threads: int | None,
    progress: Callable[[int], None] | None,
    *,
    create_only: bool = False,
    cipher: StreamCipher | None = None,
    signer: Callable[[str, str], bytes] | None = None,
    object_sha256: bool = False,
) -> Written:
    """Writer steps 1-6 into an atomic publisher; the commit is the last step."""
    with location.publish(size_hint=total, create_only=create_only) as publisher:
        writer = Writer(
            publisher,
            head,
            codec,
            threads or default_threads(),
            progress,
            cipher=cipher,
            entries=len(files) if cipher is not None else None,
            signer=signer,
            object_sha256=object_sha256,
        )
        try:
            writer.begin()
            for item in files:
                _add(writer, item.path, item.location, item.size)
            written = writer.finish()
        except BaseException:
            writer.abort()
            raise
    return written


def _add(writer: Writer, path: str, location: str, size: int) -> None:
    """One source file into the writer; its read errors are the source's, not the store's."""
    try:
        stream = open(location, "rb", buffering=0)  # noqa: SIM115
    except OSError as exc:
        raise SourceError(f"cannot open ({exc.strerror})", url=location) from None
    with stream:
        try:
            with at_url(location):
                writer.add(path, stream, size)
        except OSError as exc:
            raise SourceError(f"cannot read ({exc.strerror})", url=location) from None
