"""Publishing incremental restore points (spec section 28.4, W4c): what the newest restore
point of the run in the store lets a new one reference, from its head and index only (bounded:
no payload byte is read), and the writer's policy for when to publish a full one instead."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from ..errors import NotFound, RestorePointError, SourceError, StorageError
from ..format import (
    Codec,
    Manifest,
    PartOf,
    PartRef,
    read_head,
    restore_point_digest,
)
from ..format.delta import DELTA_FEATURE, Base, chunk_lengths, pack_cuts
from ..format.limits import MAX_DELTA_BASES
from ..format.writer import DeltaPlan
from ..storage import Location
from ._multipart import parts_prefix
from ._open import Opened, open_manifest
from ._source import SourceFile
from .store import list_store

__all__ = [
    "FULL_EVERY",
    "MIN_REUSE",
    "NO_EARLIER",
    "REST",
    "SAMPLE_BYTES",
    "Planned",
    "Rest",
    "enough_reuse",
    "plan_from",
    "plan_increment",
    "plan_part",
    "sample_points",
]

#: A full restore point at least every FULL_EVERY publishes: a restore point names at most
#: FULL_EVERY - 1 bases (its base and that one's bases), so a reader opens that many objects.
FULL_EVERY = 8
#: A full restore point when the new one would reuse less than this fraction of its plain
#: bytes: the state changes too much for references (and their verification) to pay.
MIN_REUSE = 0.25
#: The writer estimates the reuse from the chunks under this many byte positions spread evenly
#: over the state (fewer for large chunks: SAMPLE_BYTES worth, at least MIN_SAMPLE_POINTS), so
#: that deciding costs a bounded read, not a second read of the source; a state of at most
#: SAMPLE_BYTES is hashed whole. Measured: docs/performance.md, "Incremental restore points".
SAMPLE_POINTS = 32
MIN_SAMPLE_POINTS = 8
SAMPLE_BYTES = 32 << 20

assert FULL_EVERY <= MAX_DELTA_BASES


#: Why a publish references nothing when the store holds no restore point of its run.
NO_EARLIER = "no earlier restore point of the run"

#: After a publish that would reuse less than MIN_REUSE of its bytes, a publisher that rests
#: (``Rest``: the runtime's, the integrations') publishes the run's next REST restore points as
#: full ones of the older format, which name no chunks: no sha256 of every chunk, no tensor
#: cuts, no listing and no estimate (spec 28.4, W4c). The one after names its chunks again, so
#: that the next can reference them. A state that changes whole at every step (a full
#: fine-tune) then pays for naming its chunks once every REST + 2 publishes instead of at each
#: one; a run whose state stops changing finds its references again within REST + 2 publishes.
REST = 14


class Rest:
    """The rest of one publisher: a run's restore points published one after another into
    one store (the runtime's publisher, an integration's callback). A one-shot ``pack`` has
    none, so its format never depends on what was published before by the same process.
    Each count belongs to the store and run whose publish started it (a part's: the run's
    prefix and the run with its rank, spec 28.7), so that a publisher of a rank's part and
    of the shared part rests each on its own; a publish of another store or run neither
    takes nor ends it. At most MAX_RESTING counts are kept, the oldest forgotten first.
    Thread-safe."""

    #: Counts kept at once: a publisher publishes one run, or one rank's part and the shared
    #: part of it.
    MAX_RESTING = 8

    def __init__(self, length: int | None = None) -> None:
        self.length = REST if length is None else length
        #: The share of its state the publisher expects its next restore point to reuse of
        #: the one before (``expect``); None: it does not know.
        self.expected: float | None = None
        self._left: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A publisher that holds one may be pickled (a Lightning callback under ddp_spawn):
        # the lock is not, and a copy starts with a lock of its own.
        with self._lock:
            return {
                "length": self.length,
                "left": list(self._left.items()),
                "expected": self.expected,
            }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.length = state["length"]
        self.expected = state.get("expected")
        self._left = OrderedDict((tuple(key), left) for key, left in state["left"])
        self._lock = threading.Lock()

    def expect(self, reuse: float | None) -> None:
        """What the publisher knows of its training: the share of its state (0 to 1) that its
        next restore point would reuse of the one before (the PyTorch runtime's: what no
        tracked optimizer steps), or None. Used only where the store holds no restore point of
        the run to measure the reuse against (spec 28.4): below MIN_REUSE, that publish names
        no chunks and the rest starts, as after a measured one."""
        if reuse is not None and not 0.0 <= reuse <= 1.0:
            raise ValueError(f"an expected reuse is a share from 0 to 1, not {reuse!r}")
        self.expected = reuse

    def expects_little(self) -> bool:
        """Whether the publisher expects its next restore point to reuse less than MIN_REUSE."""
        expected = self.expected
        return expected is not None and expected < MIN_REUSE

    def start(self, where: str, run: str) -> None:
        """The run's last publish would have reused less than MIN_REUSE: rest for the next
        ``length`` publishes of ``run`` into ``where``."""
        with self._lock:
            self._left[(where, run)] = self.length
            self._left.move_to_end((where, run))
            while len(self._left) > self.MAX_RESTING:
                self._left.popitem(last=False)

    def take(self, where: str, run: str) -> int:
        """How many publishes are left to rest, this one counted (0: none), and this one
        taken."""
        key = (where, run)
        with self._lock:
            left = self._left.get(key, 0)
            if left <= 1:
                self._left.pop(key, None)
            else:
                self._left[key] = left - 1
            return left


@dataclass(frozen=True)
class Planned:
    """What a publish may reference (None: it publishes a full one), and why. ``plain``: the
    full one names no chunks (the older format: its state changes too much, REST)."""

    plan: DeltaPlan | None
    reason: str
    plain: bool = False


def plan_increment(store: Location, run: str, chunk_size: int, codec: Codec) -> Planned:
    """The frames of the run's newest restore point that a new one may reference, flattened
    (a frame the newest one references is named where it lies, in that one's base). A full
    restore point when there is none, when it is not sound up to its index, has no chunk
    digests (not ``delta/1``), another chunk size, or already FULL_EVERY - 1 bases. Its
    payload is never read here: the publish checks the bases it names (section 28.4)."""
    newest = _newest(store, run)
    if isinstance(newest, str):
        return Planned(None, newest)
    name, opened = newest
    return _plan_on(name, opened, run, chunk_size, codec)


def plan_part(part: Location, head: Manifest, codec: Codec) -> Planned:
    """W4c for a part (spec section 28.7): what the part at ``part`` (of head ``head``, not yet
    named by a commit) may reference of the part of the same rank (or the shared part) of the
    run's newest commit, read through that commit's head (which must name it) and its own head
    and index. A full part when the newest restore point is no commit or has no such part (a
    first commit, another world size), and for the reasons of ``plan_increment``."""
    assert head.part is not None
    assert head.run is not None
    run_prefix = part.up().up()  # STORE/RUN/STEM.parts/NAME -> STORE/RUN
    store = run_prefix.up()
    own = PartRef.name_for(head.part.rank)
    newest = _newest_name(store, head.run)
    if isinstance(newest, Planned):
        return newest
    reader = store.join(newest).reader()
    try:
        commit = read_head(reader).manifest
    except RestorePointError:
        return Planned(None, f"the newest restore point {newest} cannot be read")
    finally:
        reader.close()
    ref = next((r for r in (commit.parts.objects if commit.parts else ()) if r.name == own), None)
    if ref is None or commit.id == head.part.commit:
        return Planned(None, f"the newest restore point {newest} has no part {own}")
    name = f"{parts_prefix(newest)}/{own}"
    opened = _open(store, name)
    if isinstance(opened, str):
        return Planned(None, opened)
    return _plan_on(name, opened, head.run, head.chunk_size, codec, part=(head.part, ref.digest))


def _plan_on(  # noqa: PLR0913 - the base and what the new object must match
    name: str,
    opened: Opened,
    run: str,
    chunk_size: int,
    codec: Codec,
    *,
    part: tuple[PartOf, str] | None = None,
) -> Planned:
    """What a new object may reference of the object ``name`` (its head and index, ``opened``):
    a part (``part``: the new one's ``part`` member and the digest its commit names) of the
    same rank whose digest is the one named, or a restore point that is none."""
    manifest, tail = opened.manifest, opened.tail
    assert manifest is not None
    assert tail is not None
    if manifest.run != run or DELTA_FEATURE not in manifest.required_features:
        return Planned(None, f"the newest restore point {name} names no chunks")
    if manifest.chunk_size != chunk_size:
        return Planned(None, f"the newest restore point {name} has another chunk size")
    bases = manifest.bases or ()
    if len(bases) + 1 >= FULL_EVERY:
        return Planned(None, f"a full restore point every {FULL_EVERY}")
    digest = restore_point_digest(manifest.id, opened.head.head_sha256, tail.index_sha256)
    if part is not None:
        new, named = part
        found = manifest.part
        if found is None or found.rank != new.rank or digest != named:
            return Planned(None, f"{name} is not the part its commit names")
    elif manifest.part is not None or manifest.parts is not None:
        return Planned(None, f"the newest restore point {name} names no chunks")
    return Planned(plan_from(name, digest, manifest, codec), f"based on {name}")


def _newest_name(store: Location, run: str) -> str | Planned:
    """The store name of the run's newest restore point, or a full publish saying why there
    is none to reference."""
    try:
        entries = list_store(store, run=run)
    except NotFound:
        entries = []
    except StorageError as exc:
        # A store that takes writes but not listings (a write-only credential) still gets its
        # restore point: a full one, which is sound whatever the store holds.
        return Planned(None, f"the run's restore points cannot be listed: {exc.message}")
    if not entries:
        return Planned(None, NO_EARLIER)
    return entries[0].name


def _open(store: Location, name: str) -> Opened | str:
    """The head and index of the object ``name``, read and checked (no payload byte), or why
    it cannot be referenced."""
    try:
        reader = store.join(name).reader()
        try:
            return open_manifest(reader, need_key=False)
        finally:
            reader.close()
    except RestorePointError:
        return f"the newest restore point {name} cannot be read"


def _newest(store: Location, run: str) -> tuple[str, Opened] | str:
    """The store name of the run's newest restore point and its head and index, read and
    checked (no payload byte), or why there is nothing to reference."""
    name = _newest_name(store, run)
    if isinstance(name, Planned):
        return name.reason
    opened = _open(store, name)
    return opened if isinstance(opened, str) else (name, opened)


def plan_from(name: str, digest: str, manifest: Manifest, codec: Codec) -> DeltaPlan:
    """What a new restore point may reference of ``manifest`` (the restore point named
    ``name``, of restore point digest ``digest``): every chunk of an entry of the same codec,
    where its frame lies, flattened."""
    plan_bases = (Base(name, digest), *(manifest.bases or ()))
    frames: dict[str, tuple[int, int, int]] = {}
    wanted = codec.to_dict()
    for entry in manifest.payload or ():
        delta = entry.delta
        # Frames decode with the referencing entry's codec (R9a): only the same codec's.
        if delta is None or entry.codec.to_dict() != wanted:
            continue
        referenced = delta.referenced()
        at = entry.offset
        for i in range(delta.count):
            length = delta.frame_length(i)
            sha = delta.chunk_sha256(i)
            if i in referenced:
                ref, pos = referenced[i]
                frames.setdefault(sha, (ref.base + 1, pos, length))
            else:
                frames.setdefault(sha, (0, at, length))
                at += 4 + length
    return DeltaPlan(plan_bases, frames)


def enough_reuse(
    files: Sequence[SourceFile],
    chunk_size: int,
    cuts: Sequence[list[int] | None],
    plan: DeltaPlan,
) -> bool:
    """Whether a restore point of ``files`` (chunked at ``cuts``) would reuse at least
    MIN_REUSE of its plain bytes from ``plan`` (W4c), decided before any frame is written and
    without a second read of the source: the chunks under ``sample_points`` byte positions
    spread evenly over the state are hashed, and the fraction of those positions that fall in
    a chunk the plan holds is the estimate (each chunk is hit in proportion to its length). A
    state of at most SAMPLE_BYTES is hashed whole, which is exact. The actual reuse is what
    the restore point's index then says (``PackResult.reused``)."""
    chunks = [
        (number, start, length)
        for number, (item, item_cuts) in enumerate(zip(files, cuts, strict=True))
        for start, length in _spans(item.size, chunk_size, item_cuts)
    ]
    total = sum(length for _, _, length in chunks)
    if total == 0:
        return False
    if total <= SAMPLE_BYTES:
        weights = {chunk: chunk[2] for chunk in chunks}
    else:
        weights = _sampled(chunks, total, sample_points(chunk_size))
    hit = sum(w for chunk, w in _held(files, weights, plan))
    return hit >= MIN_REUSE * sum(weights.values())


def sample_points(chunk_size: int) -> int:
    """How many byte positions the estimate samples: SAMPLE_BYTES worth of chunks, at least
    MIN_SAMPLE_POINTS and at most SAMPLE_POINTS."""
    return max(MIN_SAMPLE_POINTS, min(SAMPLE_POINTS, SAMPLE_BYTES // chunk_size))


def _spans(size: int, chunk_size: int, cuts: list[int] | None) -> list[tuple[int, int]]:
    """Each chunk of a file as (where it starts, its length)."""
    out = []
    at = 0
    for length in chunk_lengths(size, chunk_size, pack_cuts(cuts) if cuts else None):
        out.append((at, length))
        at += length
    return out


def _sampled(
    chunks: list[tuple[int, int, int]], total: int, points: int
) -> dict[tuple[int, int, int], int]:
    """The chunks under ``points`` positions spread evenly over ``total`` bytes (the middle of
    each of ``points`` equal slices), each with the number of positions it lies under."""
    weights: dict[tuple[int, int, int], int] = {}
    i = 0
    end = chunks[0][2]
    for k in range(points):
        at = (2 * k + 1) * total // (2 * points)
        while at >= end:
            i += 1
            end += chunks[i][2]
        weights[chunks[i]] = weights.get(chunks[i], 0) + 1
    return weights


def _held(
    files: Sequence[SourceFile], weights: dict[tuple[int, int, int], int], plan: DeltaPlan
) -> Iterator[tuple[tuple[int, int, int], int]]:
    """The chunks of ``weights`` whose sha256 the plan holds, each read once, in file order;
    a stream that cannot seek (none of the pack's sources today) is read up to each one."""
    by_file: dict[int, list[tuple[int, int, int]]] = {}
    for chunk in sorted(weights):
        by_file.setdefault(chunk[0], []).append(chunk)
    for number, wanted in by_file.items():
        item = files[number]
        try:
            stream: BinaryIO = (
                item.opener() if item.opener is not None else open(item.location, "rb")  # noqa: SIM115
            )
            with stream:
                seekable = stream.seekable()
                at = 0
                for chunk in wanted:
                    _, start, length = chunk
                    if seekable:
                        stream.seek(start)
                    else:
                        _skip(stream, start - at, item.location)
                    data = stream.read(length)
                    if len(data) != length:
                        raise SourceError("file shrank while it was packed", url=item.location)
                    at = start + length
                    if hashlib.sha256(data).hexdigest() in plan.frames:
                        yield chunk, weights[chunk]
        except OSError as exc:
            raise SourceError(f"cannot read ({exc.strerror})", url=item.location) from None


def _skip(stream: BinaryIO, n: int, where: str) -> None:
    while n > 0:
        got = stream.read(min(n, 1 << 20))
        if not got:
            raise SourceError("file shrank while it was packed", url=where)
        n -= len(got)
