"""pack: a trainer's checkpoint -> one restore point, published atomically at a URL.

The writer's algorithm of the spec, step by step: list the source, describe the head, open an
atomic publisher, stream every file once through the writer, write the index and footer,
commit. Any failure before the commit discards what was written; the previous object under the
name is untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..errors import SourceError, UsageError, at_url
from ..format import (
    Codec,
    Manifest,
    NoneCodec,
    PlanesCodec,
    Position,
    Trainer,
    Writer,
    Written,
    ZstdCodec,
)
from ..format.adaptive import Choices, CodecChooser
from ..format.delta import DELTA_FEATURE, DELTA_VERSION, reused_bytes
from ..format.limits import CHUNK_SIZE_DEFAULT
from ..format.manifest import ENCRYPTION_FEATURE
from ..format.writer import DeltaPlan
from ..storage import Location, deadline_left, resolve
from ._cuts import cuts_for
from ._naming import entry_name, is_store_url
from ._source import InMemory, SourceFile, list_source
from ._threads import default_threads
from .spec import (
    CODECS,
    DEFAULT_CODEC,
    DEFAULT_LEVEL,
    HeadSpec,
    PackOptions,
    default_run,
    describe,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..trust import PublicKey, StreamCipher
    from ._increment import Planned, Rest

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "DEFAULT_LEVEL",
    "HeadSpec",
    "PackOptions",
    "PackResult",
    "default_run",
    "describe",
    "pack",
    "pack_spec",
]


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
    #: What the adaptive chooser chose chunk by chunk (``PackOptions(adaptive=...)``).
    choices: Choices | None = None
    #: Incremental (``PackOptions(incremental=)``, into a store by default): plain bytes
    #: referenced in bases rather than stored, and why (the base, or why the restore point is a
    #: full one). None: not incremental (a full restore point of the older format).
    reused: int = 0
    incremental: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
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
        if self.choices is not None:
            out["codec_choices"] = self.choices.to_dict()
        if self.incremental is not None:
            out["incremental"] = {"reason": self.incremental, "reused": self.reused}
        return out


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


def pack(  # noqa: PLR0913 - public API: every head field and pack option as a keyword (pack_spec takes values)
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
    metrics: Mapping[str, float] | None = None,
    incremental: bool | None = None,
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
    source bytes read; ``on_start`` once with the total. ``metrics`` (name to finite number)
    are recorded in the head for retention by metric (spec 4.3, 19.5). ``incremental``: into
    a store, by default (None), the chunks the run's newest restore point there holds are
    referenced rather than stored again (format 1.2, spec section 28) unless the restore point
    is encrypted; False packs a full one of the older format; True refuses what cannot be
    incremental."""
    spec = HeadSpec(
        position=position,
        trainer=trainer,
        terms=dict(terms or {}),
        config=config,
        operational_keys=tuple(operational_keys),
        cache_keys=dict(cache_keys or {}),
        cache_root=cache_root,
        run=run,
        created=created,
        rp_id=rp_id,
        metrics=dict(metrics or {}),
    )
    options = PackOptions(
        level=level,
        codec=codec,
        object_sha256=object_sha256,
        chunk_size=chunk_size,
        threads=threads,
        sign=tuple(sign),
        encrypt_to=tuple(encrypt_to),
        storage_options=storage_options,
        incremental=incremental,
    )
    return pack_spec(
        source,
        dest,
        spec,
        options,
        into_store=into_store,
        include=include,
        progress=progress,
        on_start=on_start,
    )


def pack_spec(  # noqa: PLR0913 - source, destination, head, options, and the caller's progress hooks
    source: str | os.PathLike[str],
    dest: str | Location,
    spec: HeadSpec,
    options: PackOptions = PackOptions(),
    *,
    into_store: bool | None = None,
    create_only: bool | None = None,
    include: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    memory: Mapping[str, InMemory] | None = None,
    rest: Rest | None = None,
) -> PackResult:
    """``pack`` with the head and the options as values (what ``publish`` and every
    integration call): the head was validated when ``spec`` was made; each call writes a
    restore point of its own (a fresh id and time, unless the spec fixes them). ``memory``:
    payload files read from memory in the place of the source directory's (``list_source``).
    ``rest``: the publisher's rest (one that publishes a run's restore points one after
    another): after a publish that would reuse too little, the run's next ones name no chunks
    for a while (spec 28.4, W4c)."""
    started = time.perf_counter()
    head = replace(spec.head(), chunk_size=options.chunk_size)
    codec, level, sign, encrypt_to = options.codec, options.level, options.sign, options.encrypt_to
    chosen = choose_codec(codec, level)
    if chosen.feature is not None:
        head = replace(
            head, required_features=tuple(sorted({*head.required_features, chosen.feature}))
        )
    files = list_source(os.fspath(source), include, memory)
    total = sum(f.size for f in files)
    if on_start is not None:
        on_start(total)
    cipher = None
    if encrypt_to:
        if any(k.kind != "encryption" for k in encrypt_to):
            raise UsageError("--encrypt-to needs X25519 public keys (keygen --for encryption)")
        from ..trust import StreamCipher, recipients_for  # cryptography: only to encrypt

        file_key, encryption = recipients_for(encrypt_to)
        head = replace(
            head,
            encryption=encryption,
            required_features=tuple(sorted({*head.required_features, ENCRYPTION_FEATURE})),
        )
        cipher = StreamCipher(file_key, head.id)
    signer = None
    if sign:
        from ..trust import signature_block, statement  # cryptography: only to sign

        keys = list(sign)
        rp_id = head.id

        def signer(head_sha256: str, index_sha256: str) -> bytes:
            return signature_block(statement(rp_id, head_sha256, index_sha256), keys)

    store = is_store_url(dest) if into_store is None else into_store
    location = resolve(dest, options.storage_options)
    planned = None
    cuts = None
    if options.incremental is not False:
        why_not = _why_full(head, store=store, encrypted=cipher is not None)
        if why_not is None:
            head, planned, cuts = _plan(head, location, chosen, files, rest)
        elif options.incremental:
            raise UsageError(why_not)
    if store:
        location = location.join(entry_name(head))
    with at_url(location.url):
        written = _publish(
            location,
            head,
            chosen,
            files,
            total,
            options.threads,
            progress,
            create_only=store if create_only is None else create_only,
            cipher=cipher,
            signer=signer,
            object_sha256=options.object_sha256,
            chooser=_chooser(options, chosen, total),
            delta=planned.plan if planned is not None else None,
            cuts=cuts,
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
        choices=written.choices,
        reused=reused_bytes(written.manifest) if planned is not None else 0,
        incremental=planned.reason if planned is not None else None,
    )


def _plan(
    head: Manifest, location: Location, codec: Codec, files: list[SourceFile], rest: Rest | None
) -> tuple[Manifest, Planned, list[list[int] | None] | None]:
    """The head of a restore point that may be incremental, what it references and where
    its files are cut (spec 28.4, W4c); a full one that names no chunks (the older format)
    when its publisher rests, or starts to."""
    plain = head
    head, planned = _incremental(head, location, codec, rest)
    cuts = None
    if not planned.plain:
        planned = _expected(planned, rest)
        if not planned.plain:
            # An incremental restore point cuts at tensors (spec 28.4): what moved is found.
            cuts = [cuts_for(f.location, f.size, head.chunk_size, f.opener) for f in files]
            planned = _worth_it(planned, files, head.chunk_size, cuts, resting=rest is not None)
        if planned.plain and rest is not None:
            # Its state changes too much: the publisher rests for its next publishes (W4c).
            rest.start(*_rest_key(location, plain))
    if planned.plain:
        return plain, planned, None
    return head, planned, cuts


def _why_full(head: Manifest, *, store: bool, encrypted: bool) -> str | None:
    """Why a restore point cannot be incremental (``PackOptions(incremental=True)``'s usage
    error; the default then publishes a full one), or None when it can (spec section 28): into
    a store, or a part of a multi-part restore point (each part is planned on its own, 28.7),
    and not encrypted."""
    if not store and head.part is None:
        return "an incremental restore point goes into a store (a DEST ending in /)"
    if encrypted:
        return "an incremental restore point cannot be encrypted (yet)"
    return None


def _incremental(
    head: Manifest, location: Location, codec: Codec, rest: Rest | None = None
) -> tuple[Manifest, Planned]:
    """The head of an incremental restore point (format 1.2, ``delta/1``) and what it may
    reference of the run's newest restore point in the store (spec section 28.4), or, for a
    part at ``location``, of its rank's part of the run's newest commit (28.7)."""
    from ._increment import Planned, plan_increment, plan_part

    if head.parts is not None:
        return head, Planned(None, "a commit holds no payload: each of its parts is planned")
    if rest is not None and head.run is not None:
        left = rest.take(*_rest_key(location, head))
        if left:
            return head, Planned(None, f"{_RESTING} ({left} more)", plain=True)
    head = replace(
        head,
        format_version=DELTA_VERSION,
        required_features=tuple(sorted({*head.required_features, DELTA_FEATURE})),
    )
    entry_name(head)  # a run is needed
    assert head.run is not None
    if head.part is not None:
        return head, plan_part(location, head, codec)
    return head, plan_increment(location, head.run, head.chunk_size, codec)


def _rest_key(location: Location, head: Manifest) -> tuple[str, str]:
    """What a publisher's rest counts (spec 28.4): the store and the run; for a part at
    ``location`` (28.7), the run's prefix and the run with the part's rank, the same at every
    commit, so that each rank's parts rest on their own."""
    assert head.run is not None
    if head.part is None:
        return location.url, head.run
    rank = "shared" if head.part.rank is None else str(head.part.rank)
    return location.up().up().url, f"{head.run} rank {rank}"


def _expected(planned: Planned, rest: Rest | None) -> Planned:
    """``planned``, or a full restore point that names no chunks when the store holds no
    restore point of the run to measure the reuse against and the publisher expects to reuse
    less than MIN_REUSE (``Rest.expect``, spec 28.4): the chunk names would only serve a next
    publish that its training leaves nothing to reference."""
    from ._increment import MIN_REUSE, NO_EARLIER, Planned

    if rest is None or planned.plan is not None or planned.reason != NO_EARLIER:
        return planned
    if not rest.expects_little():
        return planned
    return Planned(
        None,
        f"{NO_EARLIER}, and its publisher expects it to reuse less than {MIN_REUSE:.0%} of "
        "its bytes",
        plain=True,
    )


def _worth_it(
    planned: Planned,
    files: list[SourceFile],
    chunk_size: int,
    cuts: list[list[int] | None],
    *,
    resting: bool,
) -> Planned:
    """``planned``, or a full restore point when it would reuse less than MIN_REUSE of its
    plain bytes (spec 28.4, W4c): then neither references nor their verification pay. With
    ``resting`` (a publisher that rests) the full one names no chunks: the older format."""
    from ._increment import MIN_REUSE, Planned, enough_reuse

    if planned.plan is None or enough_reuse(files, chunk_size, cuts, planned.plan):
        return planned
    return Planned(None, f"it would reuse less than {MIN_REUSE:.0%} of its bytes", plain=resting)


#: The reason of a full restore point published while its publisher rests (``Rest``).
_RESTING = "the run's state changed too much at a recent publish"


def _chooser(options: PackOptions, codec: Codec, total: int) -> CodecChooser | None:
    """The adaptive chooser of ``options.adaptive``, aiming at the store deadline (set under a
    stop or a reclaim notice, storage/_retry.py); None unless the codec is planes, the only one
    whose chunks each name their mode."""
    if options.adaptive == "off" or not isinstance(codec, PlanesCodec):
        return None
    return CodecChooser(
        total,
        threads=options.threads or default_threads(),
        deadline_left=deadline_left,
        margin=options.deadline_margin,
        deadline_only=options.adaptive == "deadline",
    )


def _publish(  # noqa: PLR0913, PLR0917 - writer steps W1-W6 in one place, from pack_spec
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
    chooser: CodecChooser | None = None,
    delta: DeltaPlan | None = None,
    cuts: Sequence[list[int] | None] | None = None,
) -> Written:
    """Writer steps 1-6 into an atomic publisher; the commit is the last step. ``cuts``: each
    file's, when the caller has them (an incremental restore point's)."""
    named = DELTA_FEATURE in head.required_features
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
            chooser=chooser,
            delta=delta,
        )
        try:
            writer.begin()
            for number, item in enumerate(files):
                # An incremental restore point cuts at tensors (spec 28.4): what moved is found.
                if cuts is not None:
                    item_cuts = cuts[number]
                elif named:
                    item_cuts = cuts_for(item.location, item.size, head.chunk_size, item.opener)
                else:
                    item_cuts = None
                _add(writer, item, item_cuts)
            written = writer.finish()
        except BaseException:
            writer.abort()
            raise
    return written


def _add(writer: Writer, item: SourceFile, cuts: list[int] | None = None) -> None:
    """One source file into the writer; its read errors are the source's, not the store's.
    A file in memory is read from there, through the same writer (one pass, one owner)."""
    path, location, size = item.path, item.location, item.size
    try:
        stream = item.opener() if item.opener is not None else open(location, "rb", buffering=0)  # noqa: SIM115
    except OSError as exc:
        raise SourceError(f"cannot open ({exc.strerror})", url=location) from None
    with stream:
        try:
            with at_url(location):
                writer.add(path, stream, size, cuts)
        except OSError as exc:
            raise SourceError(f"cannot read ({exc.strerror})", url=location) from None
