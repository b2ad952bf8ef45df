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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from restorepoint.format import Manifest, Position, Producer, Writer, Written, canonical_dumps
from restorepoint.format.delta import DELTA_FEATURE, DELTA_VERSION
from restorepoint.format.layout import END_MAGIC, FOOTER
from restorepoint.format.limits import zstd_bound
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
    return out, vectors


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
    files = {e.path: e.sha256 for e in report.manifest.payload or ()}
    if position != v.position:
        problems.append(f"{v.name}: position {position}, expected {v.position}")
    if files != v.files:
        problems.append(f"{v.name}: files {files}, expected {v.files}")
    return problems
