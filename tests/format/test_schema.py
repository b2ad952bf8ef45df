"""The manifest JSON Schema against real restore points and planted faults, and the spec's tables
(error classes, limits) and byte-exact strings (signing, encryption) against the code."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

import restorepoint
from restorepoint import Position, errors
from restorepoint.format import (
    PLANES_FEATURE,
    Manifest,
    canonical_dumps,
    config_identity,
    limits,
    restore_point_digest,
)
from restorepoint.format.delta import DELTA_FEATURE
from restorepoint.format.manifest import ENCRYPTION_SCHEMES, KNOWN_FEATURES
from restorepoint.format.multipart import MAX_WORLD_SIZE, MULTIPART_FEATURE
from restorepoint.testing.forge import Parts, assemble, sample_head
from restorepoint.trust import (
    FEATURE,
    PAYLOAD_TYPE,
    SCHEME,
    PublicKey,
    StreamCipher,
    check_block,
    generate,
    key_id,
    load_public,
    load_signing_key,
    open_file_key,
    pae,
    raw_public,
    recipients_for,
    signature_block,
    statement,
)

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
    for kind in ("head", "index", "signature_block", "statement"):
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
        "codec": "zstd",
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
    return tmp / "src", {"position": Position(step=3, epoch=0), "codec": "auto", "level": 1}


def _empty_dir(tmp: Path) -> tuple[Path, dict[str, Any]]:
    (tmp / "src" / "only" / "directories").mkdir(parents=True)
    return tmp / "src", {"position": 0, "config": {}, "level": 1}


def _one_file(tmp: Path) -> tuple[Path, dict[str, Any]]:
    write_tree(tmp, {"weights.safetensors": b"\x00\x01" * 40_000})
    return tmp / "weights.safetensors", {"position": 99, "level": 0, "trainer": ("t", "")}


def _keys(tmp: Path) -> tuple[Ed25519PrivateKey, list[PublicKey]]:
    """A signing key and two recipients, generated as `restorepoint keygen` does."""
    (tmp / "keys").mkdir()
    signer, _ = generate(tmp / "keys" / "signer", "signing")
    recipients = [generate(tmp / "keys" / name, "encryption")[1] for name in ("alice", "bob")]
    return load_signing_key(signer), [load_public(p, "encryption") for p in recipients]


def _encrypted_signed(tmp: Path) -> tuple[Path, dict[str, Any]]:
    source, options = _full(tmp)
    (source / "empty.bin").write_bytes(b"")
    signer, recipients = _keys(tmp)
    return source, options | {"sign": [signer], "encrypt_to": recipients}


def _encrypted_store_only(tmp: Path) -> tuple[Path, dict[str, Any]]:
    source, options = _nested(tmp)
    _, recipients = _keys(tmp)
    return source, options | {"level": None, "encrypt_to": recipients[:1]}


SOURCES: dict[str, Callable[[Path], tuple[Path, dict[str, Any]]]] = {
    "plain-store-only": _plain,
    "config-trainer-epoch-batch-zstd": _full,
    "nested-paths-empty-file": _nested,
    "empty-directory": _empty_dir,
    "single-file": _one_file,
    "encrypted-signed-zstd-two-recipients": _encrypted_signed,
    "encrypted-store-only": _encrypted_store_only,
}
#: The sources that pack with codec auto (the default), and so declare planes/1.
PLANES_SOURCES = {"nested-paths-empty-file", "empty-directory"}


def raw_parts(data: bytes) -> tuple[dict[str, Any], dict[str, Any], bytes | None]:
    """The head, the index and the signature block (None: unsigned), sliced out of an object by
    the spec's byte layout: S = I + L + G + 64."""
    magic, major, _minor, head_length = struct.unpack_from("<8sHHI", data, 0)
    assert magic == b"\x89RPT\r\n\x1a\n"
    assert major == 1
    head_bytes = data[16 : 16 + head_length]
    assert data[16 + head_length : 48 + head_length] == hashlib.sha256(head_bytes).digest()
    index_offset, index_length, index_sha, sig_length, end = struct.unpack("<QQ32sQ8s", data[-64:])
    assert end == b"\x1aRPTEND\n"
    assert sig_length <= limits.MAX_SIGNATURE_BYTES
    assert index_offset + index_length + sig_length == len(data) - 64
    index_bytes = data[index_offset : index_offset + index_length]
    assert hashlib.sha256(index_bytes).digest() == index_sha
    block = data[index_offset + index_length : len(data) - 64] if sig_length else None
    return json.loads(head_bytes), json.loads(index_bytes), block


def raw_documents(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """The head and index documents, sliced out of an object by the spec's byte layout."""
    head, index, _ = raw_parts(data)
    return head, index


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


def test_packed_sources_cover_what_they_claim(
    packed: tuple[Manifest, Path], request: pytest.FixtureRequest
) -> None:
    """The parametrisation is only worth something if the cases differ as named."""
    name = request.node.callspec.params["packed"]
    manifest, dest = packed
    payload = manifest.to_dict()["payload"]
    codecs = {e["codec"]["name"] for e in payload}
    planes = name in PLANES_SOURCES
    assert codecs <= ({"planes"} if planes else {"none", "zstd"})
    assert ("zstd" in codecs) == ("-zstd" in name)
    # Encryption and its required feature go together (spec section 4), in what pack writes;
    # codec auto declares planes/1 in the head, before it knows whether a chunk will use it.
    encrypted = manifest.encryption is not None
    assert encrypted == name.startswith("encrypted")
    expected = {"encryption/1"} if encrypted else set()
    if planes:
        expected.add(PLANES_FEATURE)
    assert manifest.required_features == tuple(sorted(expected))
    if encrypted:
        assert manifest.chunk_overhead == 16
        assert manifest.encryption is not None
        assert len(manifest.encryption["recipients"]) in (1, 2)
        for entry in payload:
            n = -(-entry["size"] // manifest.chunk_size)
            if entry["codec"]["name"] == "none":
                # Section 5: a `none` region is exactly size + (4 + E) * n.
                assert entry["stored_size"] == entry["size"] + 20 * n
    _, _, block = raw_parts(dest.read_bytes())
    assert (block is not None) == ("-signed" in name)
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


# The fixed keys of the spec's examples (sections 20 to 22).
SEED_SIGNER = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
RECIPIENT = X25519PrivateKey.from_private_bytes(b"\x22" * 32)
EPHEMERAL = X25519PrivateKey.from_private_bytes(b"\x33" * 32)
FILE_KEY = b"\x44" * 32


def encryption_object() -> dict[str, Any]:
    """The spec's example encryption object: one stanza, deterministic."""
    recipient = PublicKey("encryption", raw_public(RECIPIENT))
    _, encryption = recipients_for([recipient], file_key=FILE_KEY, ephemerals=[EPHEMERAL])
    return encryption


def _encrypted(**stanza_changes: Any) -> dict[str, Any]:
    """A head with the example encryption; ``stanza_changes`` edit its one stanza."""
    encryption = encryption_object()
    encryption["recipients"][0].update(stanza_changes)
    return _head(encryption=encryption, required_features=["encryption/1"])


def _without(path: tuple[str | int, ...]) -> dict[str, Any]:
    head = _encrypted() if path[0] == "encryption" else sample_head()
    node: Any = head
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
    "encryption without its feature": _head(encryption=encryption_object()),
    "feature without encryption": _head(required_features=["encryption/1"]),
    "encryption not an object": _head(encryption="x25519", required_features=["encryption/1"]),
    "unknown encryption scheme": _head(
        encryption=encryption_object() | {"scheme": "rot13/1"}, required_features=["encryption/1"]
    ),
    "no recipients": _head(
        encryption=encryption_object() | {"recipients": []}, required_features=["encryption/1"]
    ),
    "recipient of another type": _encrypted(type="RSA"),
    "recipient without ephemeral": _without(("encryption", "recipients", 0, "ephemeral")),
    "wrapped key not a string": _encrypted(wrapped_key=12),
}


@pytest.mark.parametrize("name", sorted(HEAD_FAULTS))
def test_head_faults_fail_the_schema_and_the_reader(
    name: str, validators: dict[str, Draft202012Validator]
) -> None:
    head = HEAD_FAULTS[name]
    assert errors_of(validators["head"], head), name
    with pytest.raises(errors.IntegrityError):
        Manifest.from_head_dict(head)


def test_an_encrypted_head_passes_both(validators: dict[str, Draft202012Validator]) -> None:
    """The baseline of the encryption faults: valid, and unknown stanza members are ignored."""
    head = _encrypted()
    assert errors_of(validators["head"], head) == []
    assert Manifest.from_head_dict(head).chunk_overhead == ENCRYPTION_SCHEMES[SCHEME] == 16
    extended = _encrypted(comment="from the future")
    assert errors_of(validators["head"], extended) == []
    Manifest.from_head_dict(extended)


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


# -- the signature block and the statement --------------------------------------------------

HEAD_SHA = "e9dc7387202df8f83c3986a1a11bd7ad249d307dd5c1d208190a77c71e77fec4"
INDEX_SHA = "7524046a7b4b15e2b93c993a9b7ed0e1b9cf0fff2bdf1208eab94a2e20218689"
EXAMPLE_ID = "0123456789abcdef0123456789abcdef"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_packed_signature_block_and_its_statement_validate(
    tmp_path: Path, validators: dict[str, Draft202012Validator]
) -> None:
    write_tree(tmp_path / "src", {"model.pt": b"m" * 1000})
    keys = [load_signing_key(generate(tmp_path / name, "signing")[0]) for name in ("a", "b")]
    dest = tmp_path / "signed.rp"
    restorepoint.pack(tmp_path / "src", str(dest), position=1, sign=keys, threads=1)
    data = dest.read_bytes()
    _, _, block = raw_parts(data)
    assert block is not None
    doc = json.loads(block)
    assert errors_of(validators["signature_block"], doc) == []
    assert [s["keyid"] for s in doc["signatures"]] == [key_id(raw_public(k)) for k in keys]
    body = base64.b64decode(doc["statement"])
    assert errors_of(validators["statement"], json.loads(body)) == []
    head_length = struct.unpack_from("<I", data, 12)[0]
    head_sha = hashlib.sha256(data[16 : 16 + head_length]).hexdigest()
    index_sha = struct.unpack_from("<32s", data, len(data) - 48)[0].hex()
    assert body == statement(json.loads(body)["id"], head_sha, index_sha)
    check = check_block(block, head_sha256=head_sha, index_sha256=index_sha)
    assert check.signed_by == tuple(s["keyid"] for s in doc["signatures"])


def _block(mutate: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The example signature block as data, with one change; signatures are not recomputed."""
    doc: dict[str, Any] = json.loads(
        signature_block(statement(EXAMPLE_ID, HEAD_SHA, INDEX_SHA), [SEED_SIGNER])
    )
    mutate(doc)
    return doc


def _resigned(changes: dict[str, Any]) -> dict[str, Any]:
    """A block whose statement is changed and then signed: a valid signature over the wrong
    statement, so that the statement is the one fault."""
    body = canonical_dumps(
        {"format": "restorepoint/1", "head_sha256": HEAD_SHA, "id": EXAMPLE_ID}
        | {"index_sha256": INDEX_SHA}
        | changes
    )
    parsed: dict[str, Any] = json.loads(signature_block(body, [SEED_SIGNER]))
    return parsed


BLOCK_FAULTS: dict[str, dict[str, Any]] = {
    "wrong payload type": _block(lambda d: d.update(payload_type="application/json")),
    "no signatures": _block(lambda d: d.update(signatures=[])),
    "signatures not an array": _block(lambda d: d.update(signatures={})),
    "public key not 32 bytes": _block(
        lambda d: d["signatures"][0].update(public_key=_b64(b"k" * 31))
    ),
    "signature not 64 bytes": _block(lambda d: d["signatures"][0].update(sig=_b64(b"s" * 63))),
    "statement not base64": _block(lambda d: d.update(statement="not base64!")),
    # Padding bits that are not zero: the same bytes, spelt another way (RFC 4648, 3.5).
    "public key not canonical base64": _block(
        lambda d: d["signatures"][0].update(public_key=d["signatures"][0]["public_key"][:42] + "h=")
    ),
    "statement with another format": _resigned({"format": "restorepoint/2"}),
    "statement with an extra member": _resigned({"signed_at": "2026-01-01"}),
}


@pytest.mark.parametrize("name", sorted(BLOCK_FAULTS))
def test_signature_block_faults_fail_the_schema_and_the_reader(
    name: str, validators: dict[str, Draft202012Validator]
) -> None:
    doc = BLOCK_FAULTS[name]
    failed = errors_of(validators["signature_block"], doc)
    if not failed:
        body = json.loads(base64.b64decode(doc["statement"], validate=True))
        failed = errors_of(validators["statement"], body)
    assert failed, name
    block = canonical_dumps(doc)
    with pytest.raises(errors.SignatureError):
        check_block(block, head_sha256=HEAD_SHA, index_sha256=INDEX_SHA)


def test_a_statement_with_a_bad_id_fails_the_schema_and_the_id_check(
    validators: dict[str, Draft202012Validator],
) -> None:
    """The id is compared with the head's only after R4 (spec section 21, step 7): the block
    check reports the id it names, and the reader refuses it there (tests/trust cover that)."""
    doc = _resigned({"id": "not-hex"})
    body = json.loads(base64.b64decode(doc["statement"]))
    assert errors_of(validators["statement"], body)
    check = check_block(canonical_dumps(doc), head_sha256=HEAD_SHA, index_sha256=INDEX_SHA)
    assert check.rp_id == "not-hex" != EXAMPLE_ID


def test_the_baseline_block_passes_both(validators: dict[str, Draft202012Validator]) -> None:
    doc = _block(lambda d: None)
    assert errors_of(validators["signature_block"], doc) == []
    body = base64.b64decode(doc["statement"])
    assert errors_of(validators["statement"], json.loads(body)) == []
    check = check_block(
        canonical_dumps(doc),
        head_sha256=HEAD_SHA,
        index_sha256=INDEX_SHA,
        trusted=[raw_public(SEED_SIGNER)],
        require=True,
    )
    assert check.rp_id == EXAMPLE_ID
    assert check.trusted_by == (key_id(raw_public(SEED_SIGNER)),)


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
    assert len(classes) == 26
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
        _common.EXIT_STDOUT_CLOSED,
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
    assert defs["path"]["pattern"].endswith(f"{{0,{limits.MAX_PATH_DEPTH - 1}}}$")
    features = defs["head"]["properties"]["required_features"]["items"]["enum"]
    assert features == sorted(KNOWN_FEATURES)
    assert features == [DELTA_FEATURE, FEATURE, MULTIPART_FEATURE, PLANES_FEATURE]
    assert defs["bases"]["maxItems"] == limits.MAX_DELTA_BASES
    assert defs["head"]["properties"]["parts"]["properties"]["world_size"]["maximum"] == (
        MAX_WORLD_SIZE
    )
    assert [defs["encryption"]["properties"]["scheme"]["const"]] == sorted(ENCRYPTION_SCHEMES)
    assert defs["encryption"]["properties"]["scheme"]["const"] == SCHEME
    assert defs["signature_block"]["properties"]["payload_type"]["const"] == PAYLOAD_TYPE
    assert defs["statement"]["properties"]["format"]["const"] == "restorepoint/1"


def test_spec_byte_values_and_identity_examples_equal_the_code() -> None:
    from restorepoint.format import layout as _layout

    text = spec_text()
    layout = section(text, "Byte layout")
    assert " ".join(f"{b:02X}" for b in _layout.MAGIC) in layout
    assert " ".join(f"{b:02X}" for b in _layout.END_MAGIC) in layout
    assert "| `S - 16` | 8 | signature_length | u64 LE |" in layout
    assert "`S = I + L + G + 64`" in layout
    assert _layout.FOOTER.format == "<QQ32sQ8s"
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


# -- the byte-exact strings of sections 20 to 22, reproduced from the spec's words ----------


def _spec_hkdf(secret: bytes, salt: bytes | None, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)


def test_spec_signing_reproduces_the_code() -> None:
    text = spec_text()
    keys_section = section(text, "Keys")
    signing = section(text, "Signing")
    raw = raw_public(SEED_SIGNER)
    assert raw.hex() in keys_section
    assert key_id(raw) == hashlib.sha256(raw).hexdigest()[:16]
    assert f"`{key_id(raw)}`" in keys_section
    # The example digests are those of the example object of sections 4.2 and 5.
    assert HEAD_SHA in section(text, "The head")
    assert INDEX_SHA in section(text, "The index")
    body = statement(EXAMPLE_ID, HEAD_SHA, INDEX_SHA)
    assert body == canonical_dumps(
        {"format": "restorepoint/1", "head_sha256": HEAD_SHA, "id": EXAMPLE_ID}
        | {"index_sha256": INDEX_SHA}
    )
    assert f"\n    {body.decode()}\n" in signing
    assert f"of the example object (sections 4.2 and 5), {len(body)} bytes" in signing
    # The restore point digest of the example: the statement's sha256.
    digest = restore_point_digest(EXAMPLE_ID, HEAD_SHA, INDEX_SHA)
    assert digest == hashlib.sha256(body).hexdigest()
    assert f"The digest of the example object is\n`{digest}`." in signing
    assert f"`{PAYLOAD_TYPE}`" in signing
    assert f"the {len(PAYLOAD_TYPE.encode())}-byte string" in signing
    # DSSE's PAE, built from the spec's formula.
    spec_pae = b" ".join(
        [b"DSSEv1", b"%d" % len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), b"%d" % len(body), body]
    )
    assert pae(PAYLOAD_TYPE, body) == spec_pae
    assert f"the {len(spec_pae)} bytes signed are" in signing
    shown = spec_pae[: spec_pae.index(b"{") + len('{"format":"restorepoint/1",')].decode()
    assert f"\n    {shown}...}}\n" in signing
    # The example block, byte for byte (Ed25519 is deterministic).
    block = signature_block(body, [SEED_SIGNER])
    assert f"\n    {block.decode()}\n" in signing
    assert f"`G = {len(block)}`" in signing
    assert f"| `MAX_SIGNATURE_BYTES` | {limits.MAX_SIGNATURE_BYTES} (64 KiB) | signature block" in (
        section(text, "Limits")
    )
    assert f"{len(block)} bytes with one signature" in section(text, "Limits")


def test_spec_encryption_reproduces_the_code() -> None:
    """An independent implementation of section 22, from the strings the spec gives, agrees
    with restorepoint.trust byte for byte."""
    text = section(spec_text(), "Encryption")
    wrap_info = b"restorepoint/1 x25519 file key"
    wrap_aad = b"restorepoint/1 wrapped file key"
    entry_info = b"restorepoint/1 payload key"
    chunk_aad = b"restorepoint/1 chunk"
    assert f'info = "{wrap_info.decode()}"' in text
    assert f'aad = "{wrap_aad.decode()}")` (the aad is those {len(wrap_aad)} ASCII bytes)' in text
    assert f"the info string its {len(wrap_info)} ASCII bytes" in text
    assert f'info = "{entry_info.decode()}" || 0x00 || UTF-8(p)' in text
    assert f"the {len(chunk_aad) + 1} bytes `{chunk_aad.decode()}` and `0x00`" in text
    assert f"`{SCHEME}`" in text
    assert f"`{FEATURE}`" in text

    # The wrap of the example, then unwrapped by the code.
    eph_raw = raw_public(EPHEMERAL)
    recipient_raw = raw_public(RECIPIENT)
    shared = EPHEMERAL.exchange(X25519PublicKey.from_public_bytes(recipient_raw))
    wrap_key = _spec_hkdf(shared, eph_raw + recipient_raw, wrap_info)
    wrapped = AESGCM(wrap_key).encrypt(b"\x00" * 12, FILE_KEY, wrap_aad)
    expected = {
        "recipients": [
            {
                "ephemeral": _b64(eph_raw),
                "keyid": key_id(recipient_raw),
                "type": "X25519",
                "wrapped_key": _b64(wrapped),
            }
        ],
        "scheme": SCHEME,
    }
    assert encryption_object() == expected
    assert f"\n    {canonical_dumps(expected).decode()}\n" in text
    assert recipient_raw.hex() in text
    assert f"`{key_id(recipient_raw)}`" in text
    assert open_file_key(expected, RECIPIENT) == FILE_KEY

    # A chunk sealed by the spec's words equals the code's, and the code opens it.
    cipher = StreamCipher(FILE_KEY, EXAMPLE_ID)
    entry_key = _spec_hkdf(FILE_KEY, None, entry_info + b"\x00" + "données/é.bin".encode())
    for index, last, nonce_text in (
        (0, False, "`00 00 00 00 00 00 00 00 00 00 00 00`"),
        (1, True, "`00 00 00 00 00 00 00 00 00 00 01 01`"),
    ):
        nonce = index.to_bytes(11, "big") + (b"\x01" if last else b"\x00")
        assert nonce_text == "`" + " ".join(f"{b:02x}" for b in nonce) + "`"
        assert nonce_text in text
        aad = (
            chunk_aad
            + b"\x00"
            + canonical_dumps(
                {"entries": 3, "entry": 1, "id": EXAMPLE_ID, "path": "données/é.bin", "size": 70000}
            )
        )
        sealed = AESGCM(entry_key).encrypt(nonce, b"plain chunk", aad)
        assert len(sealed) == len(b"plain chunk") + 16
        assert cipher.seal("données/é.bin", 70000, 1, 3, index, last, b"plain chunk") == sealed
        assert cipher.open("données/é.bin", 70000, 1, 3, index, last, sealed) == b"plain chunk"
    example_aad = canonical_dumps(
        {"entries": 3, "entry": 0, "id": EXAMPLE_ID, "path": "model.pt", "size": 102400}
    )
    assert f"`{chunk_aad.decode()}`, `00`, then\n\n    {example_aad.decode()}\n" in text


def test_trust_vectors_validate(validators: dict[str, Draft202012Validator]) -> None:
    """The signed and encrypted vectors: their faults lie in signatures and ciphertext, never in
    the head or index, which validate; a valid vector's signature block validates too."""
    if not (VECTORS / "trust" / "index.json").is_file():
        pytest.skip("spec/vectors/trust/index.json is not there")
    vectors = json.loads((VECTORS / "trust" / "index.json").read_text("utf-8"))
    assert any(v["valid"] for v in vectors)
    kinds = set()
    for vector in vectors:
        head, index, block = raw_parts((VECTORS / vector["file"]).read_bytes())
        assert errors_of(validators["head"], head) == [], vector["name"]
        assert errors_of(validators["index"], index) == [], vector["name"]
        if head["encryption"] is not None:
            kinds.add("encrypted")
        if vector["valid"] and block is not None:
            kinds.add("signed")
            doc = json.loads(block)
            assert errors_of(validators["signature_block"], doc) == [], vector["name"]
            body = json.loads(base64.b64decode(doc["statement"]))
            assert errors_of(validators["statement"], body) == [], vector["name"]
    assert kinds == {"encrypted", "signed"}
