"""The runtime's snapshot file (spec section 26): tensors in safetensors, the rest canonical
JSON, read back bit for bit with no unpickler; what a snapshot cannot store is refused when the
snapshot is taken, naming where; an older snapshot (torch.save) still loads through the legacy
loader. The faults a reader must refuse are the golden vectors (spec/vectors/snapshot)."""

from __future__ import annotations

import ctypes
import io
import json
import math
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors
import torch

import restorepoint
from restorepoint.runtime.snapshot_file import SNAPSHOT_FORMAT, is_snapshot_file
from restorepoint.runtime.state import rng_state, save_state, set_rng, to_cpu
from restorepoint.torch import ResumableRun, load_snapshot


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )
    model[2].weight.data = model[2].weight.data.t().contiguous().t()  # a non-contiguous one
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=10)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        scheduler.step()
    return model, optimizer, scheduler, scaler


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, float):
        return isinstance(b, float) and repr(a) == repr(b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_a_real_state_round_trips_bit_for_bit_with_no_pickle(tmp_path: Path) -> None:
    model, optimizer, scheduler, scaler = _trained()
    state = {
        "objects": {name: to_cpu(obj.state_dict()) for name, obj in
                    {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                     "scaler": scaler}.items()},
        "rng": to_cpu(rng_state()),
        "extra": {"nan": math.nan, "inf": -math.inf, "big": 2**64 + 1, 7: (None, True, "ü")},
    }  # fmt: skip
    save_state(state, tmp_path / "last.pt", tmp_path)
    path = tmp_path / "last.pt"
    assert is_snapshot_file(path)
    # Any safetensors reader opens it, and its structure is JSON.
    with safetensors.safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == SNAPSHOT_FORMAT
    json.loads(meta["structure"])
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    back = load_snapshot(path)
    assert _same(state, back)
    assert back["objects"]["model"]._metadata == model.state_dict()._metadata
    # The state loads where it came from, and the RNG streams go on where they were.
    fresh, fresh_opt, _, _ = _trained()
    fresh.load_state_dict(back["objects"]["model"])
    fresh_opt.load_state_dict(back["objects"]["optimizer"])
    assert _same(fresh_opt.state_dict(), optimizer.state_dict())
    expected = (random.random(), np.random.rand(), torch.rand(2))
    set_rng(back["rng"])
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert expected[:2] == got[:2] and torch.equal(expected[2], got[2])


def test_the_image_in_memory_reads_the_file_s_bytes_from_any_position(tmp_path: Path) -> None:
    """An incremental publish reads a sample of chunks of the snapshot where they lie (spec
    28.4, W4c): a seek into the image in memory gives the bytes the file has there."""
    from restorepoint.runtime.snapshot_file import SnapshotImage

    model, optimizer, _, _ = _trained()
    state = {"model": to_cpu(model.state_dict()), "opt": to_cpu(optimizer.state_dict())}
    image = SnapshotImage(state)
    with open(tmp_path / "f", "wb") as f:
        image.write(f)
    data = (tmp_path / "f").read_bytes()
    stream = image.open()
    assert stream.seekable() and len(data) == image.size
    rng = random.Random(0)
    for start in [0, len(image.head), len(data) - 1, len(data), *rng.sample(range(len(data)), 20)]:
        length = rng.randrange(1, 200)
        assert stream.seek(start) == start == stream.tell()
        assert stream.read(length) == data[start : start + length]
    assert stream.seek(-3, 2) == len(data) - 3 and stream.read() == data[-3:]


def test_a_read_of_the_image_is_a_read_only_buffer_of_its_own() -> None:
    """A read is one copy out of the tensors' memory into a buffer of its own (made without
    holding the GIL for a zero fill), read-only, and it outlives the image and its tensors."""
    import gc

    from restorepoint.runtime.snapshot_file import SnapshotImage

    first = torch.arange(100, dtype=torch.int64)  # widest first: it lies first in the file
    state = {"a": torch.arange(1 << 16, dtype=torch.float32), "b": first}
    image = SnapshotImage(state)
    whole = io.BytesIO()
    image.write(whole)
    expected = whole.getvalue()
    stream = image.open()
    reads = [stream.read(n) for n in (len(image.head) + 3, 512, len(expected))]
    for data in reads:
        assert isinstance(data, memoryview) and data.readonly
        with pytest.raises(TypeError):
            data[0] = 1  # type: ignore[index]
    assert ctypes.addressof(reads[1].obj) != first.data_ptr()  # type: ignore[arg-type]
    del image, stream, state, first
    gc.collect()
    garbage = [torch.full((1 << 16,), 7.0) for _ in range(8)]
    assert b"".join(reads) == expected
    del garbage


@pytest.mark.parametrize(
    ("value", "where", "kind"),
    [
        ({"step": np.int64(3)}, "['step']", "numpy.int64"),
        ({"buf": [b"raw"]}, "['buf'][0]", "bytes"),
        ({"obj": {"x": object()}}, "['obj']['x']", "object"),
        ({"sparse": torch.eye(2).to_sparse()}, "['sparse']", "sparse_coo"),
        ({(1, 2): 0}, "(root)", "tuple"),
    ],
)
def test_what_a_snapshot_cannot_store_is_refused_when_it_is_taken(
    value: Any, where: str, kind: str
) -> None:
    with pytest.raises(restorepoint.UsageError) as info:
        to_cpu(value)
    said = str(info.value)
    assert where in said and kind in said and "\n" not in said
    assert info.value.exit_code == 2


def test_a_tracked_object_with_unstorable_state_is_refused_by_snapshot(tmp_path: Path) -> None:
    class Counter:
        def state_dict(self) -> dict[str, Any]:
            return {"seen": {1, 2}}

        def load_state_dict(self, state: Any) -> None:
            pass

    with ResumableRun({"seed": 1}, root=tmp_path, background_nice=None) as run:
        run.track(counter=Counter())
        named = r"objects\['counter'\]\['seen'\] is a set"
        with pytest.raises(restorepoint.UsageError, match=named):
            run.snapshot(wait=True)
        assert not (run.run_dir / "checkpoints" / "last.pt").exists()


def test_an_older_snapshot_loads_through_the_legacy_loader(tmp_path: Path) -> None:
    """What releases before the snapshot file wrote: torch.save, numpy's RNG as its legacy
    tuple (a uint32 array)."""
    np.random.seed(5)
    old = {
        "format": "restorepoint.torch/1",
        "objects": {"model": torch.nn.Linear(2, 2).state_dict()},
        "position": {"batch": 1, "epoch": 0, "step": 1},
        "rng": {"python": random.getstate(), "torch": torch.get_rng_state(),
                "numpy": np.random.get_state()},
    }  # fmt: skip
    torch.save(old, tmp_path / "last.pt")
    assert not is_snapshot_file(tmp_path / "last.pt")
    back = load_snapshot(tmp_path / "last.pt")
    assert back["position"] == old["position"]
    expected = np.random.rand(3)
    set_rng(back["rng"])
    assert np.array_equal(np.random.rand(3), expected)
