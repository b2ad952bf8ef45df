"""Byte layout of format v1: the fixed-width binary structures (spec section "Byte layout").
All integers are unsigned little-endian."""

from __future__ import annotations

import struct

MAGIC = b"\x89RPT\r\n\x1a\n"
END_MAGIC = b"\x1aRPTEND\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"

#: magic, major, minor, head_length
PREAMBLE = struct.Struct("<8sHHI")
DIGEST_SIZE = 32
#: index_offset, index_length, index_sha256, signature_length (0: unsigned), end magic
FOOTER = struct.Struct("<QQ32sQ8s")
#: stored length of one chunk, before its stored bytes
CHUNK_HEADER = struct.Struct("<I")

assert PREAMBLE.size == 16
assert FOOTER.size == 64
