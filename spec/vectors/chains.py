"""Golden vectors for incremental restore points (spec section 28), made and checked by
generate.py: one run's prefix of a store, ``chains/r1/``, holding a full ``delta/1`` restore
point (the base), valid incremental ones that reference it (one through another, flattened), and
incremental ones with one fault each in their references. Every object is written by the
reference writer with the generator's own zstd frames (RLE blocks: a few bytes a chunk), so the
bytes do not depend on a zstd library. ``chains/index.json`` records, for each vector, the
object verify reads, the error class it must raise (none: it must verify), and for a valid one
its position and every file's sha256."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

from restorepoint.format import (
    Manifest,
    PartOf,
    PartRef,
    Parts,
    Position,
    Producer,
    Writer,
    Written,
    canonical_dumps,
)
from restorepoint.format.delta import DELTA_FEATURE, DELTA_VERSION
from restorepoint.format.layout import END_MAGIC, FOOTER
from restorepoint.format.limits import zstd_bound
from restorepoint.format.multipart import MULTIPART_FEATURE, MULTIPART_VERSION
from restorepoint.ops._increment import plan_from

CHAINS = "chains"
CHAINS_INDEX = f"{CHAINS}/index.json"
RUN = "r1"
CHUNK = 1 << 16
STAMP = "20261201T090000000Z"
#: A store name of the run that no object has.
MISSING = f"{RUN}/{0:016d}-{STAMP}-{0:012x}.rp"


class _Frames:
    """Codec zstd level 1 as the index names it, encoding with the generator's own frames."""

    name: ClassVar[str] = "zstd"
    feature: ClassVar[str | None] = None

    def __init__(self, frame: Callable[[bytes], bytes]) -> None:
        self.frame = frame

    def to_dict(self) -> dict[str, Any]:
        return {"level": 1, "name": "zstd"}

    def encode(self, plain: bytes) -> bytes:
        return self.frame(plain)

    def max_stored(self, plain: int) -> int:
        return zstd_bound(plain)

    def decode(self, stored: bytes, plain: int) -> bytes:
        raise NotImplementedError


@dataclass(frozen=True)
class ChainVector:
    name: str
    target: str  # the object verify reads, relative to this directory
    fault: str
    expected_error: str | None
    position: dict[str, int] | None = None
    files: dict[str, str] | None = None

    def record(self, outcome: Callable[[str | None, str], dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": "chain",
            "file": self.target,
            **outcome(self.expected_error, self.fault),
        }
        if self.expected_error is None:
            out["position"] = self.position
            out["files"] = self.files
        return out


def _id(what: str) -> str:
    return hashlib.sha256(f"restorepoint test vectors: chain {what}".encode()).hexdigest()[:32]


def _head(what: str, step: int) -> Manifest:
    return Manifest(
        id=_id(what),
        created=f"2026-12-01T09:{step // 100:02d}:00.000Z",
        producer=Producer("restorepoint-vectors", "1"),
        position=Position(step),
        chunk_size=CHUNK,
        run=RUN,
        required_features=(DELTA_FEATURE,),
        format_version=DELTA_VERSION,
    )


def _name(head: Manifest) -> str:
    created = head.created.replace("-", "").replace(":", "").replace(".", "")
    return f"{RUN}/{head.position.step:016d}-{created}-{head.id[:12]}.rp"


def _files(step: int, last: int) -> dict[str, bytes]:
    """Two chunks that never change, and one that does; a state file of the step."""
    return {
        "model.pt": bytes([1]) * CHUNK + bytes([2]) * CHUNK + bytes([last]) * 100,
        "state.json": f'{{"step": {step}}}'.encode(),
    }


def _write(
    head: Manifest, files: dict[str, bytes], codec: _Frames, plan: Any = None
) -> tuple[bytes, Written]:
    out = io.BytesIO()
    writer = Writer(out, head, codec, threads=1, delta=plan)  # type: ignore[arg-type]
    writer.begin()
    for path in sorted(files, key=lambda p: p.encode()):
        writer.add(path, io.BytesIO(files[path]), len(files[path]))
    written = writer.finish()
    return out.getvalue(), written


def _rewrite(data: bytes, change: Callable[[dict[str, Any]], None]) -> bytes:
    """The object with its index changed (digest and footer recomputed): one fault."""
    index_offset, index_length, _, _, _ = FOOTER.unpack(data[-FOOTER.size :])
    index = json.loads(data[index_offset : index_offset + index_length])
    change(index)
    new = canonical_dumps(index)
    digest = hashlib.sha256(new).digest()
    return data[:index_offset] + new + FOOTER.pack(index_offset, len(new), digest, 0, END_MAGIC)


def _model(index: dict[str, Any]) -> dict[str, Any]:
    (entry,) = [e for e in index["payload"] if e["path"] == "model.pt"]
    return entry


def build(frame: Callable[[bytes], bytes]) -> tuple[dict[str, bytes], list[ChainVector]]:
    """Every file under ``chains/`` (but the index), and the vectors."""
    codec = _Frames(frame)
    out: dict[str, bytes] = {}
    vectors: list[ChainVector] = []
    base_head = _head("base", 100)
    base, base_written = _write(base_head, _files(100, 3), codec)
    base_name = _name(base_head)
    out[f"{CHAINS}/{base_name}"] = base
    plan = plan_from(base_name, base_written.digest, base_written.manifest, codec)  # type: ignore[arg-type]

    def incremental(what: str, step: int, via: Any = plan) -> tuple[str, bytes, Written]:
        head = _head(what, step)
        data, written = _write(head, _files(step, 4 + step // 100), codec, via)
        return _name(head), data, written

    def add(name: str, fault: str, error: str | None, data: bytes, obj: str, files: Any) -> None:
        out[f"{CHAINS}/{obj}"] = data
        position = {"step": int(obj.split("/")[1][:16])}
        digests = {p: hashlib.sha256(v).hexdigest() for p, v in sorted(files.items())}
        vectors.append(
            ChainVector(
                name,
                f"{CHAINS}/{obj}",
                fault,
                error,
                position if error is None else None,
                digests if error is None else None,
            )
        )

    name, data, written = incremental("valid", 200)
    add(
        "chain-valid",
        "An incremental restore point whose two unchanged chunks are frames of the base.",
        None,
        data,
        name,
        _files(200, 6),
    )
    # Through the valid one: its frames lie in the base, and the third names the base only.
    flattened = plan_from(name, written.digest, written.manifest, codec)  # type: ignore[arg-type]
    third, data3, written3 = incremental("flattened", 300, flattened)
    assert [b.name for b in written3.manifest.bases or ()] == [base_name]
    add(
        "chain-valid-flattened",
        "Made from chain-valid: its references name the frames where they lie, in the base.",
        None,
        data3,
        third,
        _files(300, 7),
    )
    faults: list[tuple[str, str, str, Callable[[dict[str, Any]], None]]] = [
        (
            "chain-base-missing",
            "The base is named by a store name that the run's prefix does not hold.",
            "IntegrityError",
            lambda i: i["bases"][0].update(name=MISSING),
        ),
        (
            "chain-base-changed",
            "The base is named with another restore point digest than its own.",
            "IntegrityError",
            lambda i: i["bases"][0].update(digest="0" * 64),
        ),
        (
            "chain-other-run",
            "The base is named in another run's prefix.",
            "MalformedManifest",
            lambda i: i["bases"][0].update(name="r2/" + i["bases"][0]["name"].split("/")[1]),
        ),
        (
            "chain-into-head",
            "A reference starts at byte 0 of the base: its preamble and head.",
            "FramingError",
            lambda i: _model(i)["refs"][0].__setitem__(3, 0),
        ),
        (
            "chain-past-end",
            "A reference lies past the end of the base's data region (into its index).",
            "FramingError",
            lambda i: _model(i)["refs"][0].__setitem__(3, len(base) - 100),
        ),
        (
            "chain-wrong-length",
            "A reference is one byte longer than the frames it names.",
            "FramingError",
            lambda i: _model(i)["refs"][0].__setitem__(4, _model(i)["refs"][0][4] + 1),
        ),
        (
            "chain-chunk-digest",
            "A referenced chunk's sha256 in chunks differs from its frame's plain bytes.",
            "DigestMismatch",
            lambda i: _model(i).update(chunks="0" * 64 + _model(i)["chunks"][64:]),
        ),
        (
            "chain-too-many-bases",
            "17 bases, one more than MAX_DELTA_BASES.",
            "LimitExceeded",
            lambda i: i["bases"].extend(
                {"digest": f"{n:064x}", "name": f"{RUN}/{n:016d}-{STAMP}-{n:012x}.rp"}
                for n in range(1, 17)
            ),
        ),
    ]
    for vector, fault, error, change in faults:
        name, data, _ = incremental(vector, 200 + len(vectors))
        add(vector, fault, error, _rewrite(data, change), name, {})

    def itself(i: dict[str, Any]) -> None:
        i["bases"][0]["name"] = self_name

    self_name, data, _ = incremental("chain-itself", 200 + len(vectors))
    add(
        "chain-itself",
        "The base named is the restore point itself.",
        "IntegrityError",
        _rewrite(data, itself),
        self_name,
        {},
    )
    _parts(codec, out, add)
    return out, vectors


def _rank_files(step: int, rank: int) -> dict[str, bytes]:
    """A rank's own files: two chunks of its own that never change, and one that does."""
    still = bytes([10 + rank]) * CHUNK + bytes([20 + rank]) * CHUNK
    return {f"model.rank{rank}.pt": still + bytes([step // 100]) * 100}


def _commit(
    what: str,
    step: int,
    codec: _Frames,
    out: dict[str, bytes],
    plans: dict[int, Any] | None = None,
) -> tuple[str, dict[int, tuple[str, Written]]]:
    """A commit of two ranks and its parts (section 25), each part ``delta/1``, planned from
    ``plans[rank]`` (none: a full part): the commit's store name, and each part's."""
    head = _head(what, step)
    commit_name = _name(head)
    parts: dict[int, tuple[str, Written]] = {}
    for rank in (0, 1):
        part_head = replace(
            head,
            id=_id(f"{what}-rank{rank}"),
            required_features=(DELTA_FEATURE, MULTIPART_FEATURE),
            part=PartOf(head.id, rank, 2),
        )
        data, written = _write(part_head, _rank_files(step, rank), codec, (plans or {}).get(rank))
        name = f"{commit_name.removesuffix('.rp')}.parts/{PartRef.name_for(rank)}"
        out[f"{CHAINS}/{name}"] = data
        parts[rank] = (name, written)
    refs = tuple(
        PartRef(PartRef.name_for(r), r, w.manifest.id, w.digest, w.size)
        for r, (_, w) in sorted(parts.items())
    )
    commit_head = replace(
        head,
        required_features=(MULTIPART_FEATURE,),
        format_version=MULTIPART_VERSION,
        parts=Parts(2, False, refs),
    )
    out[f"{CHAINS}/{commit_name}"] = _write(commit_head, {}, codec)[0]
    return commit_name, parts


def _parts(codec: _Frames, out: dict[str, bytes], add: Callable[..., None]) -> None:
    """Incremental parts (section 28.7): a commit whose parts each reference their rank's
    part of an earlier commit, and parts with one fault each in what their base is."""
    _, first = _commit("parts-base", 400, codec, out)

    def plan(rank: int) -> Any:
        name, written = first[rank]
        return plan_from(name, written.digest, written.manifest, codec)  # type: ignore[arg-type]

    plans = {r: plan(r) for r in (0, 1)}
    name, parts = _commit("parts-valid", 500, codec, out, plans)
    for rank in (0, 1):
        bases = parts[rank][1].manifest.bases or ()
        assert [b.name for b in bases] == [first[rank][0]]
    files = {**_rank_files(500, 0), **_rank_files(500, 1)}
    add(
        "chain-parts-valid",
        "A commit whose parts each reference the part of their rank of an earlier commit.",
        None,
        out[f"{CHAINS}/{name}"],
        name,
        files,
    )
    other = first[1]
    swapped = f"{RUN}/{0:016d}-{STAMP}-{1:012x}.parts/rank-00000.rp"
    out[f"{CHAINS}/{swapped}"] = out[f"{CHAINS}/{other[0]}"]
    faults: list[tuple[str, str, str, Callable[[dict[str, Any]], None]]] = [
        (
            "chain-part-other-rank",
            "A part of rank 0 names its base rank 1's part of the earlier commit.",
            "MalformedManifest",
            lambda i: i["bases"][0].update(name=other[0], digest=other[1].digest),
        ),
        (
            "chain-part-swapped",
            "A part of rank 0 names as its base an object laid under a rank 0 name that is "
            "rank 1's part.",
            "IntegrityError",
            lambda i: i["bases"][0].update(name=swapped, digest=other[1].digest),
        ),
        (
            "chain-part-other-run",
            "A part names its base in another run's prefix.",
            "MalformedManifest",
            lambda i: i["bases"][0].update(name="r2/" + i["bases"][0]["name"].split("/", 1)[1]),
        ),
    ]
    for n, (vector, fault, error, change) in enumerate(faults):
        commit_name, made = _commit(vector, 600 + n, codec, out, plans)
        # Only the faulty part is kept: it is verified on its own (section 25.4).
        del out[f"{CHAINS}/{commit_name}"], out[f"{CHAINS}/{made[1][0]}"]
        part_name = made[0][0]
        add(vector, fault, error, _rewrite(out[f"{CHAINS}/{part_name}"], change), part_name, {})


def index_bytes(
    vectors: list[ChainVector], outcome: Callable[[str | None, str], dict[str, Any]]
) -> bytes:
    text = json.dumps([v.record(outcome) for v in vectors], indent=2, ensure_ascii=False)
    return (text + "\n").encode()


def check_outcome(here: Path, v: ChainVector, read: Callable[[str], Any]) -> list[str]:
    """Problems with what verify makes of the vector's object (none if it behaves as
    recorded); ``read`` is generate.checked_read bound to verify."""
    problems, report = read(str(here / v.target))
    if problems or report is None:
        return problems
    position = report.manifest.position.to_dict()
    # A commit's files are its parts'.
    manifests = [report.manifest, *(p.manifest for p in report.parts)]
    files = {e.path: e.sha256 for m in manifests for e in m.payload or ()}
    if position != v.position:
        problems.append(f"{v.name}: position {position}, expected {v.position}")
    if files != v.files:
        problems.append(f"{v.name}: files {files}, expected {v.files}")
    return problems
