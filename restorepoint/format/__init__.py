"""The restore-point container, format v1: bytes <-> objects, no storage of its own.

See spec/restorepoint-v1.md. ``Writer`` streams a restore point into any sink;
``read_head``, ``read_manifest`` and ``PayloadDecoder`` read one through a range source and a
stream that the caller supplies."""

from __future__ import annotations

from ._json import CanonicalizationError, canonical_dumps, strict_loads
from .codecs import (
    PLANES_FEATURE,
    Codec,
    NoneCodec,
    PlanesCodec,
    ZstdCodec,
    codec_from_dict,
    register_codec,
)
from .decoder import PayloadDecoder
from .delta import DELTA_FEATURE
from .identity import ConfigDifference, config_identity, diff_configs, identity_view
from .layout import FORMAT_MAJOR, FORMAT_MINOR, FORMAT_VERSION, MAGIC
from .manifest import (
    KNOWN_FEATURES,
    Entry,
    Manifest,
    Position,
    Producer,
    Trainer,
)
from .multipart import MULTIPART_FEATURE, MULTIPART_VERSION, PartOf, PartRef, Parts
from .paths import check_path, check_paths, fold
from .reader import (
    BaseRegion,
    Bases,
    ChunkCipher,
    Head,
    Prefix,
    RangeSource,
    Tail,
    parse_head,
    parse_index,
    read_head,
    read_index,
    read_manifest,
    read_prefix,
    read_tail,
)
from .statement import restore_point_digest, statement
from .writer import Sink, Writer, Written

__all__ = [
    "DELTA_FEATURE",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "FORMAT_VERSION",
    "KNOWN_FEATURES",
    "MAGIC",
    "MULTIPART_FEATURE",
    "MULTIPART_VERSION",
    "PLANES_FEATURE",
    "BaseRegion",
    "Bases",
    "CanonicalizationError",
    "ChunkCipher",
    "Codec",
    "ConfigDifference",
    "Entry",
    "Head",
    "Manifest",
    "NoneCodec",
    "PartOf",
    "PartRef",
    "Parts",
    "PayloadDecoder",
    "PlanesCodec",
    "Position",
    "Prefix",
    "Producer",
    "RangeSource",
    "Sink",
    "Tail",
    "Trainer",
    "Writer",
    "Written",
    "ZstdCodec",
    "canonical_dumps",
    "check_path",
    "check_paths",
    "codec_from_dict",
    "config_identity",
    "diff_configs",
    "fold",
    "identity_view",
    "parse_head",
    "parse_index",
    "read_head",
    "read_index",
    "read_manifest",
    "read_prefix",
    "read_tail",
    "register_codec",
    "restore_point_digest",
    "statement",
    "strict_loads",
]
