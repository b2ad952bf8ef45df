"""pack -> verify -> read_manifest: what goes in comes back, byte for byte and field for field."""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
from pathlib import Path

import fsspec
import pytest

import restorepoint
import restorepoint.format
from restorepoint import Position, Trainer
from restorepoint.format import config_identity

CHUNK = 65536

HEAD_FIELDS = {
    "trainer": ("fake-trainer", "1.2.3"),
    "terms": {"torch": "2.13.0", "cuda": "12.4", "python": "3.11"},
    "config": {
        "lr": 0.0003,
        "model": {"width": 64, "layers": [1, 2, 3], "name": "tiny-ünï"},
        "train": {"checkpoint_every": 500, "seed": 7},
        "log": {"every": 10},
    },
    # given unsorted and with a repeat: the manifest holds them sorted and unique
    "operational_keys": ["train.checkpoint_every", "log.every", "train.checkpoint_every"],
    "cache_keys": {"dataset": "sha256:" + "ab" * 32, "tokenizer": "v2"},
    "cache_root": "/scratch/cache",
}


def write_tree(root: Path, files: dict[str, bytes]) -> dict[str, bytes]:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def nested_files() -> dict[str, bytes]:
    return {
        "model.pt": os.urandom(3 * CHUNK + 17),
        "optimizer/state.pt": bytes(range(256)) * 700,
        "optimizer/deeper/moments.bin": b"m" * 5000,
        "trainer_state.json": b'{"step": 1500}',
        "empty.bin": b"",
    }


def pack(source: Path | str, dest: str, **options: object) -> restorepoint.PackResult:
    options.setdefault("position", Position(step=1500, epoch=2, batch=30))
    options.setdefault("chunk_size", CHUNK)
    options.setdefault("threads", 2)
    return restorepoint.pack(source, dest, **options)  # type: ignore[arg-type]


def object_bytes(url: str) -> bytes:
    if url.startswith("memory://"):
        return bytes(fsspec.filesystem("memory").cat_file(url[len("memory://") :]))
    return Path(url.removeprefix("file://")).read_bytes()


def assert_payload_matches(manifest: restorepoint.Manifest, files: dict[str, bytes]) -> None:
    assert manifest.payload is not None
    assert [e.path for e in manifest.payload] == sorted(files, key=str.encode)
    for entry in manifest.payload:
        assert entry.size == len(files[entry.path])
        assert entry.sha256 == hashlib.sha256(files[entry.path]).hexdigest()


def assert_no_partials(directory: Path) -> None:
    left = [p.name for p in directory.iterdir() if ".rp-partial-" in p.name]
    assert left == []


def test_nested_directory_round_trip(tmp_path: Path) -> None:
    files = write_tree(tmp_path / "src", nested_files())
    dest = tmp_path / "out" / "rp.rpt"
    result = pack(tmp_path / "src", str(dest), object_sha256=True, **HEAD_FIELDS)

    data = dest.read_bytes()
    assert result.size == len(data)
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.files == len(files)
    assert result.bytes == sum(len(v) for v in files.values())
    assert_payload_matches(result.manifest, files)

    report = restorepoint.verify(str(dest))
    assert report.files == len(files)
    assert report.bytes == result.bytes
    assert report.size == len(data)
    assert report.manifest == result.manifest
    assert report.digest == result.digest
    assert_no_partials(dest.parent)


def test_the_digest_binds_head_and_index_and_costs_no_second_pass(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", nested_files())
    dest = tmp_path / "rp.rpt"
    result = pack(tmp_path / "src", str(dest))
    assert result.sha256 is None  # the whole object's sha256 only on request
    data = dest.read_bytes()
    (head_length,) = struct.unpack_from("<I", data, 12)
    index_offset, index_length = struct.unpack_from("<QQ", data, len(data) - 64)
    head_sha = hashlib.sha256(data[16 : 16 + head_length]).hexdigest()
    index_sha = hashlib.sha256(data[index_offset : index_offset + index_length]).hexdigest()
    statement = restorepoint.format.statement(result.id, head_sha, index_sha)
    assert result.digest == hashlib.sha256(statement).hexdigest()
    assert restorepoint.verify(str(dest)).digest == result.digest
    # Another pack of the same files is another restore point (id, time): another digest.
    assert pack(tmp_path / "src", str(tmp_path / "again.rpt")).digest != result.digest


@pytest.mark.parametrize("head_only", [True, False])
def test_every_head_field_comes_back(tmp_path: Path, head_only: bool) -> None:
    files = write_tree(tmp_path / "src", {"a.bin": b"a" * 100, "b/c.bin": b"c"})
    dest = str(tmp_path / "rp.rpt")
    result = pack(tmp_path / "src", dest, **HEAD_FIELDS)
    m = restorepoint.read_manifest(dest, head_only=head_only)

    assert m.trainer == Trainer("fake-trainer", "1.2.3")
    assert dict(m.terms) == HEAD_FIELDS["terms"]
    assert m.config == HEAD_FIELDS["config"]
    assert m.operational_keys == ("log.every", "train.checkpoint_every")
    assert m.config_identity == config_identity(HEAD_FIELDS["config"], m.operational_keys)
    assert dict(m.cache_keys) == HEAD_FIELDS["cache_keys"]
    assert m.cache_root == "/scratch/cache"
    assert m.position == Position(step=1500, epoch=2, batch=30)
    assert m.chunk_size == CHUNK
    assert m.format_version == "1.0"
    assert m.producer.name == "restorepoint"
    assert m.producer.version == restorepoint.__version__
    assert m.id == result.id
    assert m.created == result.manifest.created
    if head_only:
        assert m.payload is None
        assert m.to_dict() == result.manifest.head_dict()
    else:
        assert m == result.manifest
        assert m.to_dict() == result.manifest.to_dict()
        assert_payload_matches(m, files)


def test_minimal_head_has_empty_optional_fields(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"x": b"x"})
    dest = str(tmp_path / "rp.rpt")
    pack(tmp_path / "src", dest, position=0)
    m = restorepoint.read_manifest(dest)
    assert (m.trainer, m.config, m.config_identity, m.cache_root) == (None, None, None, None)
    assert (dict(m.terms), dict(m.cache_keys), m.operational_keys) == ({}, {}, ())
    assert m.position == Position(step=0)


def test_fixed_id_and_created_are_kept(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"x": b"x"})
    dest = str(tmp_path / "rp.rpt")
    rp_id = secrets.token_hex(16)
    pack(tmp_path / "src", dest, rp_id=rp_id, created="2026-01-02T03:04:05.678Z")
    m = restorepoint.read_manifest(dest, head_only=True)
    assert (m.id, m.created) == (rp_id, "2026-01-02T03:04:05.678Z")


def test_single_file_source(tmp_path: Path) -> None:
    data = os.urandom(CHUNK + 5)
    (tmp_path / "weights.safetensors").write_bytes(data)
    dest = str(tmp_path / "rp.rpt")
    result = pack(tmp_path / "weights.safetensors", dest)
    assert result.files == 1
    manifest = restorepoint.verify(dest).manifest
    assert_payload_matches(manifest, {"weights.safetensors": data})


def test_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "src" / "only" / "dirs").mkdir(parents=True)
    dest = str(tmp_path / "rp.rpt")
    result = pack(tmp_path / "src", dest)
    assert (result.files, result.bytes) == (0, 0)
    report = restorepoint.verify(dest)
    assert report.manifest.payload == ()
    assert (report.files, report.bytes) == (0, 0)


@pytest.mark.parametrize("level", [None, 0, 1])
def test_zero_length_files(tmp_path: Path, level: int | None) -> None:
    files = write_tree(tmp_path / "src", {"a": b"", "b/c": b"", "d": b"d"})
    dest = str(tmp_path / "rp.rpt")
    pack(tmp_path / "src", dest, level=level)
    manifest = restorepoint.verify(dest).manifest
    assert_payload_matches(manifest, files)
    assert manifest.payload is not None
    for entry in manifest.payload:
        if entry.size == 0:
            assert entry.stored_size == 0


@pytest.mark.parametrize(
    ("size", "chunks"), [(CHUNK - 1, 1), (CHUNK, 1), (CHUNK + 1, 2), (2 * CHUNK, 2)]
)
@pytest.mark.parametrize("level", [None, 3])
def test_chunk_boundaries(tmp_path: Path, size: int, chunks: int, level: int | None) -> None:
    data = os.urandom(size)
    files = write_tree(tmp_path / "src", {"f.bin": data})
    dest = str(tmp_path / "rp.rpt")
    pack(tmp_path / "src", dest, level=level)
    manifest = restorepoint.verify(dest).manifest
    assert_payload_matches(manifest, files)
    assert manifest.payload is not None
    (entry,) = manifest.payload
    if level is None:
        # store-only: one 4-byte frame header per chunk, the plain bytes as they are
        assert entry.stored_size == size + 4 * chunks
    else:
        assert entry.stored_size >= size + 4 * chunks  # random bytes do not compress


@pytest.mark.parametrize(
    ("option", "level", "codec"),
    [
        ("auto", 1, {"level": 1, "name": "planes"}),
        ("auto", 3, {"level": 3, "name": "planes"}),
        ("zstd", -1, {"level": -1, "name": "zstd"}),
        ("zstd", 1, {"level": 1, "name": "zstd"}),
        ("zstd", 3, {"level": 3, "name": "zstd"}),
        ("auto", None, {"name": "none"}),
        ("zstd", 0, {"name": "none"}),
        ("none", 1, {"name": "none"}),
    ],
)
def test_codecs_levels_and_store_only(
    tmp_path: Path, option: str, level: int | None, codec: dict[str, object]
) -> None:
    files = write_tree(tmp_path / "src", nested_files())
    dest = str(tmp_path / "rp.rpt")
    result = pack(tmp_path / "src", dest, codec=option, level=level, object_sha256=True)
    manifest = restorepoint.verify(dest).manifest
    assert manifest.payload is not None
    assert {e.path: e.codec.to_dict() for e in manifest.payload} == dict.fromkeys(files, codec)
    assert manifest.required_features == (("planes/1",) if codec["name"] == "planes" else ())
    assert_payload_matches(manifest, files)
    data = Path(dest).read_bytes()
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.size == len(data)


def test_an_unknown_codec_option_is_a_usage_error(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"a": b"a"})
    with pytest.raises(restorepoint.UsageError, match="codec must be one of"):
        pack(tmp_path / "src", str(tmp_path / "rp.rpt"), codec="brotli")
    assert not (tmp_path / "rp.rpt").exists()


def test_zstd_makes_compressible_data_smaller(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", {"text.log": b"loss 0.25 at step 10\n" * 20000})
    store = pack(tmp_path / "src", str(tmp_path / "store.rpt"), level=None)
    zstd = pack(tmp_path / "src", str(tmp_path / "zstd.rpt"), level=3)
    assert zstd.size < store.size // 10
    assert zstd.bytes == store.bytes
    restorepoint.verify(str(tmp_path / "zstd.rpt"))


def test_memory_destination_round_trip(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", nested_files())
    url = f"memory://rp-tests/{secrets.token_hex(8)}/rp.rpt"
    result = pack(tmp_path / "src", url, object_sha256=True, **HEAD_FIELDS)
    data = object_bytes(url)
    assert result.url == url
    assert (result.size, result.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    report = restorepoint.verify(url)
    assert report.manifest == result.manifest
    assert restorepoint.read_manifest(url, head_only=True).to_dict() == (
        result.manifest.head_dict()
    )
    fs = fsspec.filesystem("memory")
    parent = url[len("memory://") :].rsplit("/", 1)[0]
    assert [p for p in fs.ls(parent, detail=False) if ".rp-partial-" in p] == []
    fs.rm(parent, recursive=True)


def test_file_url(tmp_path: Path) -> None:
    files = write_tree(tmp_path / "src", {"a/b.bin": b"b" * 70000, "c.bin": b"c"})
    url = f"file://{tmp_path}/out/rp.rpt"
    result = pack(tmp_path / "src", url, object_sha256=True)
    assert result.url == url
    data = (tmp_path / "out" / "rp.rpt").read_bytes()
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert_payload_matches(restorepoint.verify(url).manifest, files)
    assert restorepoint.read_manifest(url) == result.manifest


def test_replacing_an_existing_restore_point(tmp_path: Path) -> None:
    dest = tmp_path / "rp.rpt"
    write_tree(tmp_path / "one", {"a": b"first"})
    write_tree(tmp_path / "two", {"b": b"second" * 1000})
    first = pack(tmp_path / "one", str(dest), position=1)
    second = pack(tmp_path / "two", str(dest), position=2, object_sha256=True)
    assert first.id != second.id
    data = dest.read_bytes()
    assert second.sha256 == hashlib.sha256(data).hexdigest()
    manifest = restorepoint.verify(str(dest)).manifest
    assert manifest.id == second.id
    assert manifest.position.step == 2
    assert [e.path for e in manifest.payload or ()] == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "rp.rpt", "two"]


def test_published_file_has_no_partial_files_beside_it(tmp_path: Path) -> None:
    write_tree(tmp_path / "src", nested_files())
    out = tmp_path / "out"
    for i in range(3):
        pack(tmp_path / "src", str(out / f"rp-{i}.rpt"), level=1 if i % 2 else None)
    assert sorted(p.name for p in out.iterdir()) == ["rp-0.rpt", "rp-1.rpt", "rp-2.rpt"]
    assert_no_partials(out)


def test_packing_twice_gives_the_same_payload(tmp_path: Path) -> None:
    files = write_tree(tmp_path / "src", nested_files())
    a = pack(tmp_path / "src", str(tmp_path / "a.rpt"), level=3)
    b = pack(tmp_path / "src", str(tmp_path / "b.rpt"), level=3, threads=1)
    assert a.manifest.payload is not None
    assert b.manifest.payload is not None
    # ids and times differ; payload entries (digests, codecs, stored sizes) do not, whatever
    # the number of threads
    assert [e.to_dict() for e in a.manifest.payload] == [e.to_dict() for e in b.manifest.payload]
    assert_payload_matches(a.manifest, files)
