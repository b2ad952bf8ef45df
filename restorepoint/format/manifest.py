"""The manifest: what a restore point says about itself (spec section "The manifest").

On disk the manifest is two canonical JSON documents: the **head**, written first (identity,
position, everything known before the payload is read), and the **index**, written last (the
payload table with every file's size and sha256). ``Manifest`` is the logical union of both; a
Manifest read from a bounded prefix has ``payload is None``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import LimitExceeded, MalformedManifest, UnsupportedFormat
from ._checks import _int, _is_int, _obj, _str, _str_list, _str_map
from .codecs import PLANES_FEATURE, Codec, codec_from_dict
from .delta import DELTA_FEATURE, Base, Chunks, bases_from_list, chunks_from_entry
from .identity import check_operational_key, config_identity
from .layout import FORMAT_VERSION
from .limits import CHUNK_SIZE_MAX, CHUNK_SIZE_MIN, MAX_ENTRIES, MAX_SAFE_INTEGER
from .metrics import check_metrics
from .multipart import (
    MULTIPART_FEATURE,
    PartOf,
    PartRef,
    Parts,
    multipart_members,
)
from .paths import check_paths

__all__ = [
    "ENCRYPTION_FEATURE",
    "ENCRYPTION_SCHEMES",
    "KNOWN_FEATURES",
    "RUN_PATTERN",
    "Entry",
    "Manifest",
    "Position",
    "Producer",
    "Trainer",
]

#: The required feature of encrypted payloads (spec section "Encryption").
ENCRYPTION_FEATURE = "encryption/1"
#: Encryption schemes, with the bytes each adds to a stored chunk (the AEAD tag).
ENCRYPTION_SCHEMES: dict[str, int] = {"x25519-hkdf-aes256gcm-stream/1": 16}
#: Required features this reader implements.
KNOWN_FEATURES: frozenset[str] = frozenset(
    {DELTA_FEATURE, ENCRYPTION_FEATURE, MULTIPART_FEATURE, PLANES_FEATURE}
)

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_ID = re.compile(r"^[0-9a-f]{32}$")
_CREATED = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z$")
#: A run id: safe as one path component of a store on every backend.
RUN_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_VERSION = re.compile(r"^([0-9]{1,5})\.([0-9]{1,5})$")


@dataclass(frozen=True)
class Trainer:
    """The trainer that wrote the payload: its name and version."""

    name: str
    version: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


@dataclass(frozen=True)
class Producer:
    """The program that wrote the restore point."""

    name: str
    version: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


@dataclass(frozen=True)
class Position:
    """Where training stands: the global step, and optionally the epoch and how many effective
    (optimizer) batches of that epoch were fully committed."""

    step: int
    epoch: int | None = None
    batch: int | None = None

    def __post_init__(self) -> None:
        for name in ("step", "epoch", "batch"):
            value = getattr(self, name)
            if value is None and name != "step":
                continue
            if not _is_int(value) or not 0 <= value <= MAX_SAFE_INTEGER:
                raise ValueError(f"position {name} must be an integer from 0 to 2**53-1")
        if self.batch is not None and self.epoch is None:
            raise ValueError("position batch needs an epoch")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step}
        if self.epoch is not None:
            out["epoch"] = self.epoch
        if self.batch is not None:
            out["batch"] = self.batch
        return out


@dataclass(frozen=True)
class Entry:
    """One payload file: its path, plain size and sha256, and where its stored bytes lie."""

    path: str
    size: int
    sha256: str
    codec: Codec
    offset: int
    stored_size: int
    #: The chunks' digests, frame lengths and references of a ``delta/1`` object (section 28).
    delta: Chunks | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "codec": self.codec.to_dict(),
            "offset": self.offset,
            "path": self.path,
            "sha256": self.sha256,
            "size": self.size,
            "stored_size": self.stored_size,
            **(self.delta.to_dict() if self.delta is not None else {}),
        }


@dataclass(frozen=True)
class Manifest:
    """The logical manifest of a restore point (head fields, plus the payload from the index)."""

    id: str
    created: str
    producer: Producer
    position: Position
    chunk_size: int
    trainer: Trainer | None = None
    terms: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    config_identity: str | None = None
    operational_keys: tuple[str, ...] = ()
    cache_keys: Mapping[str, str] = field(default_factory=dict)
    cache_root: str | None = None
    run: str | None = None
    encryption: Mapping[str, Any] | None = None
    required_features: tuple[str, ...] = ()
    format_version: str = FORMAT_VERSION
    #: A commit's parts, or a part's commit (both None for a single-object restore point).
    parts: Parts | None = None
    part: PartOf | None = None
    #: Named finite numbers for retention by metric (spec 4.3); empty: the member is absent.
    metrics: Mapping[str, int | float] = field(default_factory=dict)
    payload: tuple[Entry, ...] | None = None
    #: The bases of a ``delta/1`` object's index (section 28); None for every other object.
    bases: tuple[Base, ...] | None = None

    # -- views -------------------------------------------------------------------------------

    @property
    def total_size(self) -> int:
        """Plain bytes of the whole payload (needs the index)."""
        return sum(e.size for e in self._need_payload())

    @property
    def chunk_overhead(self) -> int:
        """Bytes the encryption adds to every stored chunk (0 when not encrypted)."""
        if self.encryption is None:
            return 0
        return ENCRYPTION_SCHEMES[str(self.encryption["scheme"])]

    @property
    def file_count(self) -> int:
        return len(self._need_payload())

    def _need_payload(self) -> tuple[Entry, ...]:
        if self.payload is None:
            raise ValueError("this manifest was read from the head only; it has no payload table")
        return self.payload

    def head_dict(self) -> dict[str, Any]:
        """The head document, as written before the payload."""
        return {
            "cache_keys": dict(self.cache_keys),
            "cache_root": self.cache_root,
            "chunk_size": self.chunk_size,
            "config": dict(self.config) if self.config is not None else None,
            "config_identity": self.config_identity,
            "created": self.created,
            "encryption": dict(self.encryption) if self.encryption is not None else None,
            "format_version": self.format_version,
            "id": self.id,
            "operational_keys": list(self.operational_keys),
            "position": self.position.to_dict(),
            "producer": self.producer.to_dict(),
            "required_features": list(self.required_features),
            "run": self.run,
            "terms": dict(self.terms),
            "trainer": self.trainer.to_dict() if self.trainer is not None else None,
            **({"parts": self.parts.to_dict()} if self.parts is not None else {}),
            **({"part": self.part.to_dict()} if self.part is not None else {}),
            **({"metrics": dict(self.metrics)} if self.metrics else {}),
        }

    def index_dict(self, head_sha256: str) -> dict[str, Any]:
        """The index document, as written after the payload."""
        return {
            "head_sha256": head_sha256,
            "id": self.id,
            "payload": [e.to_dict() for e in self._need_payload()],
            **({"bases": [b.to_dict() for b in self.bases]} if self.bases is not None else {}),
        }

    def to_dict(self) -> dict[str, Any]:
        """The logical manifest (what ``inspect --json`` prints; the JSON Schema's subject)."""
        out = self.head_dict()
        if self.payload is not None:
            out["payload"] = [e.to_dict() for e in self.payload]
        if self.bases is not None:
            out["bases"] = [b.to_dict() for b in self.bases]
        return out

    def with_payload(self, payload: Iterable[Entry]) -> Manifest:
        return replace(self, payload=tuple(payload))

    # -- reading ----------------------------------------------------------------------------

    @classmethod
    def from_head_dict(cls, data: Any) -> Manifest:  # noqa: PLR0912, PLR0915 - one check per head member, in the order of reader step R4
        """Validate a parsed head document (reader step "check the head")."""
        obj = _obj(data, "head")
        # Features first: a feature may change what the other fields mean.
        features = _str_list(obj.get("required_features", None), "required_features")
        unknown = sorted(set(features) - KNOWN_FEATURES)
        if unknown:
            raise UnsupportedFormat(
                f"unknown required {'feature' if len(unknown) == 1 else 'features'}: "
                f"{', '.join(unknown)}"
            )
        version = _str(obj.get("format_version"), "format_version")
        if not _VERSION.fullmatch(version):
            raise MalformedManifest(f"format_version {version!r} is not MAJOR.MINOR")
        rp_id = _str(obj.get("id"), "id")
        if not _ID.fullmatch(rp_id):
            raise MalformedManifest("id must be 32 lowercase hex digits")
        created = _str(obj.get("created"), "created")
        if not _CREATED.fullmatch(created):
            raise MalformedManifest("created must be an RFC 3339 UTC time ending in Z")
        producer = _obj(obj.get("producer"), "producer")
        trainer_raw = obj.get("trainer", None)
        trainer = None
        if trainer_raw is not None:
            t = _obj(trainer_raw, "trainer")
            trainer = Trainer(
                _str(t.get("name"), "trainer.name"), _str(t.get("version"), "trainer.version")
            )
        position_raw = _obj(obj.get("position"), "position")
        try:
            position = Position(
                step=position_raw.get("step"),  # type: ignore[arg-type]
                epoch=position_raw.get("epoch"),
                batch=position_raw.get("batch"),
            )
        except ValueError as exc:
            raise MalformedManifest(str(exc)) from exc
        chunk_size = _int(obj.get("chunk_size"), "chunk_size")
        if not CHUNK_SIZE_MIN <= chunk_size <= CHUNK_SIZE_MAX:
            raise LimitExceeded(
                f"chunk_size {chunk_size} is outside {CHUNK_SIZE_MIN}..{CHUNK_SIZE_MAX}"
            )
        if chunk_size & (chunk_size - 1):
            raise MalformedManifest(f"chunk_size {chunk_size} is not a power of two")
        operational = _str_list(obj.get("operational_keys"), "operational_keys")
        if operational != sorted(set(operational)):
            raise MalformedManifest("operational_keys must be sorted and unique")
        try:
            for key in operational:
                check_operational_key(key)
        except ValueError as exc:
            raise MalformedManifest(str(exc)) from exc
        config = obj.get("config", None)
        identity = obj.get("config_identity", None)
        if config is None:
            if identity is not None:
                raise MalformedManifest("config_identity without a config")
        else:
            _obj(config, "config")
            identity = _str(identity, "config_identity")
            if not _HEX64.fullmatch(identity):
                raise MalformedManifest("config_identity must be 64 lowercase hex digits")
            recomputed = config_identity(config, operational)
            if recomputed != identity:
                raise MalformedManifest(
                    "config_identity does not match the config and its operational keys",
                    expected=identity,
                    found=recomputed,
                )
        cache_root = obj.get("cache_root", None)
        if cache_root is not None:
            _str(cache_root, "cache_root")
        encryption = obj.get("encryption", None)
        if (encryption is not None) != (ENCRYPTION_FEATURE in features):
            raise MalformedManifest(
                f"encryption and the required feature {ENCRYPTION_FEATURE!r} go together"
            )
        if encryption is not None:
            _check_encryption(encryption)
        _check_delta(obj, features, version)
        parts, part = multipart_members(obj, features, version)
        run = obj.get("run", None)
        if run is not None and not RUN_PATTERN.fullmatch(_str(run, "run")):
            raise MalformedManifest(
                "run must be 1 to 64 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        # Absent means none; present, it is checked whole (hostile data, spec 4.3).
        metrics = check_metrics(obj["metrics"]) if "metrics" in obj else {}
        return cls(
            id=rp_id,
            created=created,
            producer=Producer(
                _str(producer.get("name"), "producer.name"),
                _str(producer.get("version"), "producer.version"),
            ),
            position=position,
            chunk_size=chunk_size,
            trainer=trainer,
            terms=_str_map(obj.get("terms"), "terms"),
            config=config,
            config_identity=identity,
            operational_keys=tuple(operational),
            cache_keys=_str_map(obj.get("cache_keys"), "cache_keys"),
            cache_root=cache_root,
            run=run,
            encryption=encryption,
            required_features=tuple(features),
            format_version=version,
            parts=parts,
            part=part,
            metrics=metrics,
        )

    def payload_from_index_dict(self, data: Any, head_sha256: str) -> Manifest:
        """Validate a parsed index document against this head; return the full manifest.
        Offsets and stored sizes are checked by the reader, which knows the object's layout."""
        obj = _obj(data, "index")
        if _str(obj.get("head_sha256"), "index.head_sha256") != head_sha256:
            raise MalformedManifest(
                "the index belongs to another head (head_sha256 differs)",
                expected=head_sha256,
                found=obj.get("head_sha256"),
            )
        if obj.get("id") != self.id:
            raise MalformedManifest(
                "the index names another restore point id", expected=self.id, found=obj.get("id")
            )
        raw = obj.get("payload")
        if not isinstance(raw, list):
            raise MalformedManifest("index.payload must be an array")
        if len(raw) > MAX_ENTRIES:
            raise LimitExceeded(f"{len(raw)} payload entries; the limit is {MAX_ENTRIES}")
        delta = DELTA_FEATURE in self.required_features
        entries = []
        for i, item in enumerate(raw):
            e = _obj(item, f"payload[{i}]")
            path = e.get("path")
            if not isinstance(path, str):
                raise MalformedManifest(f"payload[{i}].path must be a string")
            digest = _str(e.get("sha256"), f"payload[{i}].sha256")
            if not _HEX64.fullmatch(digest):
                raise MalformedManifest(f"payload[{i}].sha256 must be 64 lowercase hex digits")
            size = _int(e.get("size"), f"payload[{i}].size")
            entries.append(
                Entry(
                    path=path,
                    size=size,
                    sha256=digest,
                    codec=codec_from_dict(e.get("codec")),
                    offset=_int(e.get("offset"), f"payload[{i}].offset"),
                    stored_size=_int(e.get("stored_size"), f"payload[{i}].stored_size"),
                    delta=(
                        chunks_from_entry(e, f"payload[{i}]", size, self.chunk_size)
                        if delta
                        else None
                    ),
                )
            )
        if self.parts is not None and entries:
            raise MalformedManifest("a commit has no payload of its own: its parts hold it")
        check_paths(entry.path for entry in entries)
        _check_codec_features(entries, self.required_features)
        total = 0
        for entry in entries:
            total += entry.size
            if total > MAX_SAFE_INTEGER:
                raise LimitExceeded("the payload's total size exceeds 2**53-1")
        if not delta:
            return self.with_payload(entries)
        own = PartRef.name_for(self.part.rank) if self.part is not None else None
        bases = bases_from_list(obj.get("bases"), self.run, own)
        used = {r.base for e in entries if e.delta is not None for r in e.delta.refs}
        if any(b >= len(bases) for b in used) or len(used) != len(bases):
            raise MalformedManifest(
                "every reference must name one of index.bases, and every base be referenced"
            )
        return replace(self, payload=tuple(entries), bases=bases)


def _check_delta(obj: dict[str, Any], features: list[str], version: str) -> None:
    """``delta/1`` (section 28): from format 1.2, in an object of a run, not encrypted (sealed
    chunks are bound to their own object), and not a commit (whose payload is empty): a part
    may be incremental, its bases parts of its rank (section 28.7)."""
    if DELTA_FEATURE not in features:
        return
    if tuple(int(n) for n in version.split(".")) < (1, 2):
        raise MalformedManifest(f"{DELTA_FEATURE!r} needs format_version 1.2 or later")
    if ENCRYPTION_FEATURE in features:
        raise MalformedManifest(f"{DELTA_FEATURE!r} does not go with {ENCRYPTION_FEATURE!r}")
    if "parts" in obj:
        raise MalformedManifest(
            f"a commit is never {DELTA_FEATURE!r}: its parts may be, each on its own"
        )
    if obj.get("run") is None:
        raise MalformedManifest(f"{DELTA_FEATURE!r} needs a run: bases are of the same run")


def _check_codec_features(entries: Iterable[Entry], features: tuple[str, ...]) -> None:
    """A codec that needs a required feature is used only where the head lists it: a reader
    that lacks the feature has then refused the object at R4, before the gate passed it."""
    for entry in entries:
        feature = getattr(entry.codec, "feature", None)
        if feature is not None and feature not in features:
            raise MalformedManifest(
                f"codec {entry.codec.name!r} needs the required feature {feature!r}, "
                "which the head does not list",
                member=entry.path,
            )


def _check_encryption(value: Any) -> None:
    """The head's encryption object: its structure only (opening it needs a key)."""
    obj = _obj(value, "encryption")
    if obj.get("scheme") not in ENCRYPTION_SCHEMES:
        raise UnsupportedFormat(f"unknown encryption scheme {obj.get('scheme')!r}")
    stanzas = obj.get("recipients")
    if not isinstance(stanzas, list) or not stanzas:
        raise MalformedManifest("encryption.recipients must be a non-empty array")
    for i, stanza in enumerate(stanzas):
        item = _obj(stanza, f"encryption.recipients[{i}]")
        if item.get("type") != "X25519":
            raise MalformedManifest(f"encryption.recipients[{i}].type must be X25519")
        for name in ("ephemeral", "keyid", "wrapped_key"):
            _str(item.get(name), f"encryption.recipients[{i}].{name}")
