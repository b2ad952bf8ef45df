"""The manifest JSON Schema against real restore points and planted faults, and the spec's tables
(error classes, limits) against the code."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

import restorepoint
from restorepoint import Position, errors
from restorepoint.format import Manifest, config_identity, limits
from restorepoint.testing.forge import Parts, assemble, sample_head

SPEC_DIR = Path(__file__).resolve().parents[2] / "spec"
SCHEMA_NAME = "manifest.schema.json"
CHUNK = 65536


def load_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SPEC_DIR / SCHEMA_NAME).read_text(encoding="utf-8"))
    return schema


def spec_text() -> str:
    return (SPEC_DIR / "restorepoint-v1.md").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return load_schema()


@pytest.fixture(scope="module")
def validators(schema: dict[str, Any]) -> dict[str, Draft202012Validator]:
    """One validator per document kind. The head and index are reached by reference, as a user
    of the schema would reach them, so the $defs must stand on their own."""
    registry: Registry[Any] = Registry().with_resource(SCHEMA_NAME, Resource.from_contents(schema))
    out = {"manifest": Draft202012Validator(schema, registry=registry)}
    for kind in ("head", "index"):
        wrapper = {"$ref": f"{SCHEMA_NAME}#/$defs/{kind}"}
        out[kind] = Draft202012Validator(wrapper, registry=registry)
    return out


def errors_of(validator: Draft202012Validator, doc: Any) -> list[str]:
    return [e.message for e in validator.iter_errors(doc)]


# -- real restore points ---------------------------------------------------------------------


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _plain(tmp: Path) -> tuple[Path, dict[str, Any]]:
    write_tree(tmp / "src", {"model.pt": bytes(range(256)) * 700, "opt.pt": b"\x01" * 10})
    return tmp / "src", {"position": 7, "level": None}


def _full(tmp: Path) -> tuple[Path, dict[str, Any]]:
    write_tree(tmp / "src", {"model.pt": bytes(range(256)) * 700, "state.json": b"{}"})
    return tmp / "src", {
        "position": Position(step=1500, epoch=2, batch=31),
        "trainer": ("fake-trainer", "1.0.0"),
        "terms": {"torch": "2.13.0", "cuda": "12.4"},
        "config": {"lr": 0.001, "model": {"width": 64}, "train": {"checkpoint_every": 500}},
        "operational_keys": ["train.checkpoint_every"],
        "cache_keys": {"dataset": "sha256:" + "ab" * 32},
        "cache_root": "/scratch/cache",
        "level": 3,
    }


def _nested(tmp: Path) -> tuple[Path, dict[str, Any]]:
    write_tree(
        tmp / "src",
        {
            "a/b/c/deep.bin": b"x" * (CHUNK + 1),
            "a/empty.bin": b"",
            "données/é.txt": "naïve".encode(),
            "z.txt": b"z",
        },
    )
    (tmp / "src" / "a" / "b" / "no-files-here").mkdir()
    return tmp / "src", {"position": Position(step=3, epoch=0), "level": 1}


def _empty_dir(tmp: Path) -> tuple[Path, dict[str, Any]]:
    (tmp / "src" / "only" / "directories").mkdir(parents=True)
    return tmp / "src", {"position": 0, "config": {}, "level": 1}


def _one_file(tmp: Path) -> tuple[Path, dict[str, Any]]:
    write_tree(tmp, {"weights.safetensors": b"\x00\x01" * 40_000})
    return tmp / "weights.safetensors", {"position": 99, "level": 0, "trainer": ("t", "")}


SOURCES: dict[str, Callable[[Path], tuple[Path, dict[str, Any]]]] = {
    "plain-store-only": _plain,
    "config-trainer-epoch-batch-zstd": _full,
    "nested-paths-empty-file": _nested,
    "empty-directory": _empty_dir,
    "single-file": _one_file,
}


def raw_documents(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head and index documents, sliced out of an object by the spec's byte layout."""
    magic, major, _minor, head_length = struct.unpack_from("<8sHHI", data, 0)
    assert magic == b"\x89RPT\r\n\x1a\n"
    assert major == 1
    head_bytes = data[16 : 16 + head_length]
    assert data[16 + head_length : 48 + head_length] == hashlib.sha256(head_bytes).digest()
    index_offset, index_length, index_sha, reserved, end = struct.unpack("<QQ32sQ8s", data[-64:])
    assert (reserved, end) == (0, b"\x1aRPTEND\n")
    assert index_offset + index_length == len(data) - 64
    index_bytes = data[index_offset : index_offset + index_length]
    assert hashlib.sha256(index_bytes).digest() == index_sha
    return json.loads(head_bytes), json.loads(index_bytes)


@pytest.fixture(params=sorted(SOURCES))
def packed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Manifest, Path]:
    source, options = SOURCES[request.param](tmp_path)
    dest = tmp_path / "out" / "rp.rpt"
    result = restorepoint.pack(source, str(dest), chunk_size=CHUNK, threads=1, **options)
    return result.manifest, dest


def test_schema_is_a_valid_draft_2020_12_schema(schema: dict[str, Any]) -> None:
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert {"head", "index", "entry", "codec", "position"} <= set(schema["$defs"])


def test_packed_manifests_validate(
    packed: tuple[Manifest, Path], validators: dict[str, Draft202012Validator]
) -> None:
    manifest, dest = packed
    assert errors_of(validators["manifest"], manifest.to_dict()) == []
    # What a reader returns is the same document, and it validates too.
    read = restorepoint.read_manifest(str(dest))
    assert read.to_dict() == manifest.to_dict()
    assert errors_of(validators["manifest"], read.to_dict()) == []


def test_raw_head_and_index_validate_alone(
    packed: tuple[Manifest, Path], validators: dict[str, Draft202012Validator]
) -> None:
    manifest, dest = packed
    head, index = raw_documents(dest.read_bytes())
    assert head == manifest.head_dict()
    assert index["payload"] == manifest.to_dict()["payload"]
    assert errors_of(validators["head"], head) == []
    assert errors_of(validators["index"], index) == []
    # Each document is only one half: neither passes for the other or for the whole.
    assert errors_of(validators["index"], head)
    assert errors_of(validators["head"], index)
    assert errors_of(validators["manifest"], head)


def test_packed_sources_cover_what_they_claim(packed: tuple[Manifest, Path]) -> None:
    """The parametrisation is only worth something if the cases differ as named."""
    manifest, _ = packed
    payload = manifest.to_dict()["payload"]
    codecs = {e["codec"]["name"] for e in payload}
    assert codecs <= {"none", "zstd"}
    if manifest.config is not None:
        assert manifest.config_identity == config_identity(
            manifest.config, manifest.operational_keys
        )
    if manifest.position.batch is not None:
        assert manifest.position.epoch is not None
    for entry in payload:
        if entry["size"] == 0:
            assert entry["stored_size"] == 0


def test_forge_sample_head_validates(validators: dict[str, Draft202012Validator]) -> None:
    head = sample_head()
    assert errors_of(validators["head"], head) == []
    # An unknown optional member is allowed (readers ignore it), in the head and in an entry.
    assert errors_of(validators["head"], {**head, "comment": "from the future"}) == []
    Manifest.from_head_dict({**head, "comment": "from the future"})


# -- the schema is not vacuous: planted faults fail it, and the reader agrees -----------------


def _head(**changes: Any) -> dict[str, Any]:
    return sample_head(**changes)


def _without(path: tuple[str, ...]) -> dict[str, Any]:
    head = sample_head()
    node = head
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]
    return head


HEAD_FAULTS: dict[str, dict[str, Any]] = {
    "missing step": _head(position={"epoch": 1}),
    "negative step": _head(position={"step": -1}),
    "step beyond 2**53-1": _head(position={"step": 2**53}),
    "batch without epoch": _head(position={"step": 1, "batch": 2}),
    "bad id": _head(id="0123456789ABCDEF0123456789ABCDEF"),
    "short id": _head(id="abc"),
    "created without Z": _head(created="2026-01-01T00:00:00+00:00"),
    "chunk size not a power of two": _head(chunk_size=100_000),
    "chunk size too small": _head(chunk_size=32768),
    "identity without config": _head(config=None),
    "bad config identity": _head(config_identity="AB" * 32),
    "unknown required feature": _head(required_features=["encryption"]),
    "empty term name": _head(terms={"": "1"}),
    "term not a string": _head(terms={"torch": 2}),
    "empty operational segment": _head(operational_keys=["train..every"]),
    "repeated operational key": _head(operational_keys=["a", "a"]),
    "missing producer": _without(("producer",)),
}


@pytest.mark.parametrize("name", sorted(HEAD_FAULTS))
def test_head_faults_fail_the_schema_and_the_reader(
    name: str, validators: dict[str, Draft202012Validator]
) -> None:
    head = HEAD_FAULTS[name]
    assert errors_of(validators["head"], head), name
    with pytest.raises(errors.IntegrityError):
        Manifest.from_head_dict(head)


def _index(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    entry = {
        "codec": {"level": 1, "name": "zstd"},
        "offset": 700,
        "path": "model.pt",
        "sha256": "ab" * 32,
        "size": 10,
        "stored_size": 25,
    }
    index = {"head_sha256": "cd" * 32, "id": sample_head()["id"], "payload": [entry]}
    mutate(index)
    return index


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(index: dict[str, Any]) -> None:
        index["payload"][0][key] = value

    return mutate


INDEX_FAULTS: dict[str, dict[str, Any]] = {
    "bad sha256": _index(_set("sha256", "ab" * 31)),
    "uppercase sha256": _index(_set("sha256", "AB" * 32)),
    "negative size": _index(_set("size", -1)),
    "fractional offset": _index(_set("offset", 700.5)),
    "unknown zstd parameter": _index(_set("codec", {"level": 1, "name": "zstd", "window": 20})),
    "parameter on none": _index(_set("codec", {"level": 1, "name": "none"})),
    "zstd level out of range": _index(_set("codec", {"level": 23, "name": "zstd"})),
    "unknown codec": _index(_set("codec", {"name": "lz4"})),
    "codec without name": _index(_set("codec", {"level": 1})),
    "traversal": _index(_set("path", "../etc/passwd")),
    "absolute": _index(_set("path", "/etc/passwd")),
    "double slash": _index(_set("path", "a//b")),
    "trailing slash": _index(_set("path", "a/")),
    "backslash": _index(_set("path", "a\\b")),
    "drive": _index(_set("path", "C:model.pt")),
    "control character": _index(_set("path", "a\nb")),
    "long component": _index(_set("path", "x" * 256)),
    "missing stored size": _index(lambda i: i["payload"][0].pop("stored_size")),
    "payload not an array": _index(lambda i: i.update(payload={})),
}


@pytest.mark.parametrize("name", sorted(INDEX_FAULTS))
def test_index_faults_fail_the_schema_and_the_reader(
    name: str, validators: dict[str, Draft202012Validator]
) -> None:
    index = INDEX_FAULTS[name]
    assert errors_of(validators["index"], index), name
    head = Manifest.from_head_dict(sample_head())
    with pytest.raises(errors.IntegrityError):
        head.payload_from_index_dict(index, index["head_sha256"])


def test_format_version_beyond_major_1_fails_the_schema_and_the_reader(
    tmp_path: Path, validators: dict[str, Draft202012Validator]
) -> None:
    """The head's version is checked against the preamble's, so the reader needs an object."""
    parts = Parts.sample(format_version="2.0")
    assert errors_of(validators["head"], parts.head)
    path = tmp_path / "v2.rpt"
    path.write_bytes(assemble(parts))
    with pytest.raises(errors.MalformedManifest):
        restorepoint.read_manifest(str(path))


def test_a_valid_index_passes_both(validators: dict[str, Draft202012Validator]) -> None:
    """The baseline of the faults above is itself valid, so each fault is the only one."""
    index = _index(lambda i: None)
    assert errors_of(validators["index"], index) == []
    head = Manifest.from_head_dict(sample_head())
    assert head.payload_from_index_dict(index, index["head_sha256"]).file_count == 1
    manifest = head.head_dict() | {"payload": index["payload"]}
    assert errors_of(validators["manifest"], manifest) == []
    assert errors_of(validators["manifest"], head.head_dict())  # the payload is required


def test_full_manifest_faults_fail(validators: dict[str, Draft202012Validator]) -> None:
    good = sample_head() | {"payload": _index(lambda i: None)["payload"]}
    assert errors_of(validators["manifest"], good) == []
    for mutate in (
        lambda m: m["position"].pop("step"),
        lambda m: m["payload"][0].update(sha256="00"),
        lambda m: m["payload"][0]["codec"].update(extra=1),
        lambda m: m.update(id="not-hex"),
    ):
        bad = copy.deepcopy(good)
        mutate(bad)
        assert errors_of(validators["manifest"], bad)


# -- the spec's tables against the code -------------------------------------------------------


def section(text: str, title: str) -> str:
    """A top-level section by its title (numbers move as sections are added)."""
    match = re.search(rf"^## \d+ {re.escape(title)}\n.*?(?=^## \d+ |\Z)", text, flags=re.M | re.S)
    assert match, f"section {title!r} not found"
    return match.group(0)


def table_rows(text: str) -> list[list[str]]:
    """Cells of every markdown table row whose first cell is a `code` name."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| `"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_error_table_lists_every_class_with_its_exit_code() -> None:
    rows = table_rows(section(spec_text(), "Error classes and exit codes"))
    table = {row[0].strip("`"): row for row in rows}
    helpers = {"EXIT_CODES", "at_url", "error_class"}
    classes = [name for name in errors.__all__ if name not in helpers]
    assert len(classes) == 23
    assert sorted(table) == sorted(classes)
    for name in classes:
        cls = getattr(errors, name)
        _, parents, exit_code, _meaning = table[name]
        assert int(exit_code) == cls.exit_code, name
        assert re.findall(r"`(\w+)`", parents) == [base.__name__ for base in cls.__bases__], name


def test_exit_code_table_matches_the_cli() -> None:
    from restorepoint._cli import _common

    rows = re.finditer(
        r"^\| (\d+) \|", section(spec_text(), "Error classes and exit codes"), flags=re.M
    )
    codes = {int(m.group(1)) for m in rows}
    expected = set(errors.EXIT_CODES.values()) | {
        _common.EXIT_INTERNAL,
        _common.EXIT_INTERRUPTED,
        128 + 15,
    }
    assert codes == expected


def test_limits_table_equals_the_code() -> None:
    rows = table_rows(section(spec_text(), "Limits"))
    table = {row[0].strip("`"): row[1] for row in rows}
    names = [name for name in limits.__all__ if name != "zstd_bound"]
    assert sorted(table) == sorted(names)
    for name in names:
        value = re.match(r"\d+", table[name])
        assert value, name
        assert int(value.group(0)) == getattr(limits, name), name


def test_schema_constants_equal_the_code(schema: dict[str, Any]) -> None:
    defs = schema["$defs"]
    assert defs["uint"]["maximum"] == limits.MAX_SAFE_INTEGER
    assert defs["payload"]["maxItems"] == limits.MAX_ENTRIES
    chunk_sizes = defs["head"]["properties"]["chunk_size"]["enum"]
    assert chunk_sizes == [
        1 << n for n in range(16, 27) if limits.CHUNK_SIZE_MIN <= 1 << n <= limits.CHUNK_SIZE_MAX
    ]
    assert chunk_sizes[0] == limits.CHUNK_SIZE_MIN
    assert chunk_sizes[-1] == limits.CHUNK_SIZE_MAX
    assert defs["path"]["maxLength"] == limits.MAX_PATH_BYTES


def test_spec_byte_values_and_identity_examples_equal_the_code() -> None:
    from restorepoint.format import _layout

    text = spec_text()
    layout = section(text, "Byte layout")
    assert " ".join(f"{b:02X}" for b in _layout.MAGIC) in layout
    assert " ".join(f"{b:02X}" for b in _layout.END_MAGIC) in layout
    assert limits.zstd_bound(1 << 26) == 67371008
    assert "67371008" in section(text, "Limits")
    identity = section(text, "Config identity")
    base = {"lr": 0.001, "model": {"width": 64}}
    examples = [
        (base, []),
        (base | {"train": {"checkpoint_every": 500}}, ["train.checkpoint_every"]),
        (base | {"log": {}}, ["log.every"]),
        (base | {"train": {"checkpoint_every": 500}}, []),
        (base | {"train": {"checkpoint_every": 500, "epochs": 3}}, ["train.checkpoint_every"]),
        ({"a": {"b": {"c": 1}}, "d": [{"e": 1}]}, ["a.b.c", "d.e"]),
        ({}, []),
    ]
    for config, keys in examples:
        assert config_identity(config, keys) in identity, (config, keys)


# -- the golden vectors: the schema agrees with the reader wherever it can express the fault ----

VECTORS = SPEC_DIR / "vectors"

#: Vectors whose one fault lies in what JSON Schema can express (patterns, ranges, enums).
SCHEMA_VISIBLE_FAULTS = {
    "batch-without-epoch": "head",
    "chunk-size-below-minimum": "head",
    "chunk-size-not-power-of-two": "head",
    "codec-unknown-parameter": "index",
    "config-identity-without-config": "head",
    "created-not-utc": "head",
    "id-not-hex": "head",
    "major-version-2": "head",
    "path-absolute": "index",
    "path-backslash": "index",
    "path-component-too-long": "index",
    "path-control": "index",
    "path-dot-component": "index",
    "path-dotdot": "index",
    "path-drive": "index",
    "path-empty": "index",
    "path-empty-component": "index",
    "path-nul": "index",
    "path-too-long": "index",
    "step-negative": "head",
    "step-not-integer": "head",
    "unknown-codec": "index",
    "unknown-required-feature": "head",
}


def vector_index() -> list[dict[str, Any]]:
    if not (VECTORS / "index.json").is_file():
        pytest.skip("spec/vectors/index.json is not there")
    vectors: list[dict[str, Any]] = json.loads((VECTORS / "index.json").read_text("utf-8"))
    return vectors


def test_valid_vectors_validate(validators: dict[str, Draft202012Validator]) -> None:
    valid = [v for v in vector_index() if v["valid"]]
    assert valid
    for vector in valid:
        head, index = raw_documents((VECTORS / vector["file"]).read_bytes())
        assert errors_of(validators["head"], head) == [], vector["name"]
        assert errors_of(validators["index"], index) == [], vector["name"]
        assert errors_of(validators["manifest"], head | {"payload": index["payload"]}) == []


def test_schema_visible_vector_faults_fail_the_schema(
    validators: dict[str, Draft202012Validator],
) -> None:
    by_name = {v["name"]: v for v in vector_index()}
    assert set(SCHEMA_VISIBLE_FAULTS) <= set(by_name)
    for name, document in sorted(SCHEMA_VISIBLE_FAULTS.items()):
        assert not by_name[name]["valid"]
        data = (VECTORS / by_name[name]["file"]).read_bytes()
        if document == "head":
            (head_length,) = struct.unpack_from("<I", data, 12)
            doc = json.loads(data[16 : 16 + head_length])
        else:
            index_offset, index_length = struct.unpack_from("<QQ", data, len(data) - 64)
            doc = json.loads(data[index_offset : index_offset + index_length])
        assert errors_of(validators[document], doc), name
