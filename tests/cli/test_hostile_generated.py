"""The hostile-input suite's own generator: restore points built from the spec's parts with
random hostile fields (restorepoint.testing.forge recomputes every digest, offset and length
that a fault does not set, so each planted fault is really met), each verified and imported
through the CLI as a user would, against the invariants of spec section 24:

- the exit code is 0 or 1 (an IntegrityError, named in --json), for verify and import alike:
  what verify accepts, import unpacks, and what it refuses, import refuses; never 70 (a bug),
  never a traceback, one line on stderr;
- nothing is written outside DEST: on a refusal nothing at all (DEST, given or planted with
  links to the outside, is as it was), on success DEST holds exactly the payload, each file
  with the digest its entry records;
- the CLI's own peak memory and CPU time stay within a small bound.

CI runs RESTOREPOINT_HOSTILE_EXAMPLES examples (default 24, about a second each); set it higher
to search longer. The golden vectors (spec/vectors) pin one fault each; this searches their
combinations."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from clirun import Measured, cli_measured
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import restorepoint
from restorepoint.format import canonical_dumps, config_identity
from restorepoint.format.layout import FOOTER
from restorepoint.testing.forge import (
    HOSTILE_PATHS,
    HOSTILE_STRINGS,
    HOSTILE_VALUES,
    ForgedEntry,
    Parts,
    assemble,
    zstd_bomb,
)

EXAMPLES = int(os.environ.get("RESTOREPOINT_HOSTILE_EXAMPLES", "24"))
#: What a CLI run may cost beyond verifying a small sound restore point: every object here is
#: under a few MB, its decoded payload under 2 MB; a bomb that got through would blow this.
MEMORY_BOUND = 96 << 20
CPU_BOUND_S = 15.0

INTEGRITY = {
    name
    for name in dir(restorepoint.errors)
    if isinstance(getattr(restorepoint.errors, name), type)
    and issubclass(getattr(restorepoint.errors, name), restorepoint.IntegrityError)
}

HEAD_MEMBERS = [
    "cache_keys",
    "cache_root",
    "chunk_size",
    "config",
    "config_identity",
    "created",
    "encryption",
    "format_version",
    "id",
    "operational_keys",
    "position",
    "producer",
    "required_features",
    "run",
    "terms",
    "trainer",
]
ENTRY_MEMBERS = ["codec", "offset", "path", "sha256", "size", "stored_size"]
ZSTD = {"level": 3, "name": "zstd"}

strings = st.sampled_from(HOSTILE_STRINGS) | st.text(max_size=20)
values = st.sampled_from(HOSTILE_VALUES) | strings
names = st.sampled_from(HOSTILE_STRINGS[:-1]) | st.text(min_size=1, max_size=8)


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, bytes]:
    """1 to 4 files under hostile or ordinary names, small or a few chunks long."""
    paths = draw(
        st.lists(
            st.sampled_from(HOSTILE_PATHS)
            | st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}", fullmatch=True),
            min_size=1,
            max_size=4,
            unique=True,
        )
    )
    sizes = st.sampled_from([0, 1, 100, 65536, 65537, 200_000])
    return {p: draw(st.binary(min_size=0, max_size=64)) * (draw(sizes) // 64 + 1) for p in paths}


@st.composite
def hostile_objects(draw: st.DrawFn) -> tuple[bytes, str]:
    """A forged object and a word saying what was planted (for the failure report)."""
    files = draw(payloads())
    codec = draw(st.sampled_from([None, ZSTD]))
    parts = Parts.sample(files={}, codec=codec)
    # The forge writes entries in the order given: sorted or not, valid paths or not.
    order = draw(st.sampled_from(["sorted", "as drawn"]))
    paths = sorted(files, key=lambda p: p.encode("utf-8", "surrogatepass"))
    if order == "as drawn":
        paths = list(files)
    parts.entries = [
        ForgedEntry.from_bytes(p, files[p], codec=codec, chunk_size=parts.head["chunk_size"])
        for p in paths
        if _encodable(p)
    ]
    planted = [f"paths {order}"]
    for fault in draw(st.lists(st.sampled_from(FAULTS), min_size=0, max_size=3)):
        planted.append(fault(draw, parts))
    data = assemble(parts)
    for fault in draw(st.lists(st.sampled_from(BYTE_FAULTS), min_size=0, max_size=2)):
        data, what = fault(draw, data)
        planted.append(what)
    return data, "; ".join(planted)


def _encodable(path: str) -> bool:
    try:
        canonical_dumps(path)
    except ValueError:
        return False  # a lone surrogate: not JSON at all (the vectors cover it, by hand)
    return True


# -- faults in the parts: digests, offsets and lengths are recomputed around them -------------


def head_member(draw: st.DrawFn, parts: Parts) -> str:
    name = draw(st.sampled_from(HEAD_MEMBERS))
    parts.head[name] = draw(values)
    return f"head.{name} = {parts.head[name]!a:.40}"


def head_unknown(draw: st.DrawFn, parts: Parts) -> str:
    parts.head[draw(names)] = draw(values)
    return "an unknown head member"


def head_strings(draw: st.DrawFn, parts: Parts) -> str:
    # Sound objects full of hostile strings: what the CLI prints must stay harmless.
    hostile = draw(strings)
    parts.head["terms"] = {draw(names): hostile}
    parts.head["cache_keys"] = {draw(names): hostile}
    parts.head["cache_root"] = hostile
    parts.head["trainer"] = {"name": hostile or "t", "version": hostile}
    return "hostile strings in the head"


def position(draw: st.DrawFn, parts: Parts) -> str:
    parts.head["position"] = draw(
        st.dictionaries(st.sampled_from(["step", "epoch", "batch", "x"]), values, max_size=3)
    )
    return f"position = {parts.head['position']!a:.40}"


def features(draw: st.DrawFn, parts: Parts) -> str:
    parts.head["required_features"] = draw(
        st.lists(st.sampled_from(["encryption/1", *HOSTILE_STRINGS[:4]]), max_size=2)
    )
    if draw(st.booleans()):
        parts.head["encryption"] = draw(
            st.sampled_from(
                [
                    {"scheme": "x25519-hkdf-aes256gcm-stream/1", "recipients": []},
                    {
                        "scheme": "x25519-hkdf-aes256gcm-stream/1",
                        "recipients": [{"type": "X25519"}],
                    },
                    {"scheme": HOSTILE_STRINGS[0], "recipients": [{}]},
                ]
            )
        )
    return "required features / encryption"


def nesting(draw: st.DrawFn, parts: Parts) -> str:
    depth = draw(st.sampled_from([62, 63, 64, 300]))  # the head is one level above its config
    value: Any = 0
    for _ in range(depth):
        value = {"a": value}
    parts.head["config"] = {"deep": value}
    parts.head["config_identity"] = config_identity(parts.head["config"], [])
    parts.head["operational_keys"] = []
    return f"config nested {depth} deep"


def entry_member(draw: st.DrawFn, parts: Parts) -> str:
    if not parts.entries:
        return "no entry to change"
    entry = draw(st.sampled_from(parts.entries))
    name = draw(st.sampled_from(ENTRY_MEMBERS))
    entry.extra[name] = draw(values | st.integers(-(2**64), 2**64).map(lambda n: n % 2**53))
    return f"entry {entry.path!a:.20}.{name}"


def entry_claims(draw: st.DrawFn, parts: Parts) -> str:
    # Unknown members that claim what a payload has no way to say: ignored, never obeyed.
    if not parts.entries:
        return "no entry to dress up"
    entry = draw(st.sampled_from(parts.entries))
    entry.extra.update(
        {"type": "symlink", "target": "/etc/passwd", "mode": 0o4777, "uid": 0, "link": "../x"}
    )
    return "an entry claiming to be a link"


def frames(draw: st.DrawFn, parts: Parts) -> str:
    if not parts.entries or not parts.entries[0].stored_chunks:
        return "no frame to change"
    entry = parts.entries[0]
    kind = draw(st.sampled_from(["length", "bytes", "bomb", "drop", "extra"]))
    if kind == "length":
        lengths = [len(c) for c in entry.stored_chunks]
        lengths[0] = draw(st.integers(0, 2**32 - 1))
        entry.stored_lengths = lengths
    elif kind == "bytes":
        entry.stored_chunks[0] = draw(st.binary(max_size=300))
    elif kind == "bomb":
        size = min(entry.size, 65536) or 1
        entry.stored_chunks[0] = zstd_bomb(size, 32 << 20) if size > 255 else zstd_bomb(size, 200)
    elif kind == "drop":
        entry.stored_chunks.pop()
        if entry.stored_lengths is not None:
            entry.stored_lengths.pop()
    else:
        entry.stored_chunks.append(b"\x00" * draw(st.integers(0, 100)))
        if entry.stored_lengths is not None:
            entry.stored_lengths.append(len(entry.stored_chunks[-1]))
    return f"frames: {kind}"


def index_extra(draw: st.DrawFn, parts: Parts) -> str:
    parts.index_extra[draw(st.sampled_from(["head_sha256", "id", "payload", "x"]))] = draw(values)
    return "an index member"


def footer(draw: st.DrawFn, parts: Parts) -> str:
    name = draw(st.sampled_from(["index_offset", "index_length", "signature_length"]))
    setattr(parts, name, draw(st.sampled_from([0, 1, 2**31, 2**53, 2**64 - 1])))
    return f"footer.{name}"


def signature(draw: st.DrawFn, parts: Parts) -> str:
    parts.signature = draw(st.sampled_from([b"{}", b"garbage", b'{"signatures":[]}', bytes(600)]))
    return "a signature block"


FAULTS = [
    head_member,
    head_unknown,
    head_strings,
    head_strings,
    position,
    features,
    nesting,
    entry_member,
    entry_claims,
    frames,
    index_extra,
    footer,
    signature,
]


# -- faults in the bytes: nothing recomputed --------------------------------------------------


def flip(draw: st.DrawFn, data: bytes) -> tuple[bytes, str]:
    if not data:
        return data, "nothing to flip"
    at = draw(st.integers(0, len(data) - 1))
    out = bytearray(data)
    out[at] ^= draw(st.integers(1, 255))
    return bytes(out), f"byte {at} flipped"


def truncate(draw: st.DrawFn, data: bytes) -> tuple[bytes, str]:
    if not data:
        return data, "nothing to cut"
    at = draw(st.integers(0, len(data) - 1))
    return data[:at], f"cut at {at}"


def append(draw: st.DrawFn, data: bytes) -> tuple[bytes, str]:
    tail = draw(st.sampled_from([b"\x00", data[-FOOTER.size :], data]))
    return data + tail, f"{len(tail)} bytes appended"


BYTE_FAULTS = [flip, truncate, append]


# -- running it -------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, Any]:
    """Every name under ``root`` without following links: kind, and bytes or target."""
    out: dict[str, Any] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                out[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", path.read_bytes())
    return out


def check_run(run: Measured, baseline: Measured, what: str) -> str | None:
    """The invariants every run keeps; the error class, or None when it succeeded."""
    proc = run.proc
    assert proc.returncode in (0, 1), f"{what}: exit {proc.returncode}: {proc.stderr[-500:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, what
    assert proc.stderr.replace("\n", "").isprintable(), what
    assert proc.stdout.replace("\n", "").isprintable(), what
    assert run.max_rss - baseline.max_rss < MEMORY_BOUND, (what, run.max_rss, baseline.max_rss)
    assert run.cpu < baseline.cpu + CPU_BOUND_S, (what, run.cpu)
    # A plain import warns that it checks nothing against this machine: not an error line.
    lines = [x for x in proc.stderr.splitlines() if not x.startswith("restorepoint: warning: ")]
    if proc.returncode == 0:
        assert lines == [], what
        return None
    assert len(lines) == 1, (what, proc.stderr)
    error = json.loads(proc.stdout)["error"]
    assert error["class"] in INTEGRITY and error["exit_code"] == 1, (what, error)
    return str(error["class"])


_BASELINE: list[Measured] = []


def baseline() -> Measured:
    if not _BASELINE:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sound.rp"
            path.write_bytes(assemble(Parts.sample()))
            run = cli_measured("verify", str(path))
            assert run.proc.returncode == 0, run.proc.stderr
            _BASELINE.append(run)
    return _BASELINE[0]


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(forged=hostile_objects(), replace=st.booleans())
def test_hostile_restore_points_through_the_cli(forged: tuple[bytes, str], replace: bool) -> None:
    data, planted = forged
    base = baseline()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "outside").mkdir()
        (root / "outside" / "secret").write_bytes(b"must stay as it is")
        out = root / "out"
        out.mkdir()
        dest = out / "dest"
        if replace:
            # A DEST to be replaced, planted with links that lead outside it.
            dest.mkdir()
            (dest / "old").write_bytes(b"old")
            (dest / "evil").symlink_to(root / "outside")
            (dest / "evil-file").symlink_to(root / "outside" / "secret")
        url = root / "hostile.rp"
        url.write_bytes(data)
        before = snapshot(root)

        verified = check_run(cli_measured("verify", str(url), "--json"), base, planted)
        args = ["import", str(url), str(dest), "--json", *(["--force"] if replace else [])]
        imported = check_run(cli_measured(*args), base, planted)
        # What verify accepts, import unpacks, and what it refuses, import refuses too. (The
        # class may differ: import checks the gate's head first, then the rest.)
        assert (verified is None) == (imported is None), (planted, verified, imported)
        event(f"verify: {verified or 'accepted'}")  # --hypothesis-show-statistics

        after = snapshot(root)
        outside = {k: v for k, v in after.items() if not k.startswith("out/dest")}
        assert outside == {k: v for k, v in before.items() if not k.startswith("out/dest")}
        if imported is not None:
            assert after == before, planted
            return
        manifest = restorepoint.read_manifest(str(url))
        assert manifest.payload is not None
        written = {k[len("out/dest/") :]: v for k, v in after.items() if k.startswith("out/dest/")}
        files = {k: v[1] for k, v in written.items() if v[0] == "file"}
        assert all(v[0] in ("file", "dir") for v in written.values()), planted  # never a link
        assert sorted(files) == sorted(e.path for e in manifest.payload), planted
        for entry in manifest.payload:
            assert hashlib.sha256(files[entry.path]).hexdigest() == entry.sha256, planted
