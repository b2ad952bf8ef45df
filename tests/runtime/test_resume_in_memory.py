"""A ResumableRun resuming from its store loads the restore point straight from the import's
verified bytes in memory (no copy written, synced and read back first), and its copy lands in
the run directory afterwards (from a store that is not a local path; from a local path none is
made): the state is bit for bit the one a resume from that copy on disk loads, a corrupted
chunk is refused before any tensor is loaded (one line, exit 1, under ``restorepoint run``),
and the copy in the run directory is complete and verifies."""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from clirun import cli
from crafted import RUN, clean_env, pack_demo, preempted_checkpoint, trainer_command

import restorepoint
from restorepoint.errors import IntegrityError, UsageError
from restorepoint.format import read_manifest
from restorepoint.ops.unpack import import_restore_point
from restorepoint.runtime.state import load_state
from restorepoint.storage import resolve
from restorepoint.torch import ResumableRun

CONFIG = {"model": "in-memory", "lr": 0.01}
#: The publish at the training thread's priority: on a loaded machine nice +19 waits.
QUICK: dict[str, Any] = {"final_snapshot": False, "background_nice": None}


@pytest.fixture(autouse=True)
def rng_kept() -> Iterator[None]:
    """A resume sets the process's RNGs (Python's and torch's): put them back."""
    python, torch_state = random.getstate(), torch.get_rng_state()
    yield
    random.setstate(python)
    torch.set_rng_state(torch_state)


def model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    generator = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Tanh(), torch.nn.Linear(300, 7))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model, torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])


def state_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def same(a: Any, b: Any) -> bool:
    """Bit for bit: equal tensors of the same dtype and shape, equal everything else."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def published(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """A store holding a snapshot of a trained model and Adam at step 3, and that state."""
    store = f"{tmp_path / 'store'}/"
    model, optimizer = model_and_optimizer(0)
    with ResumableRun(CONFIG, run_dir=tmp_path / "a", store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        for _ in range(3):
            loss = model(torch.randn(16, 64)).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            run.commit()
        run.snapshot(wait=True)
        assert run.uploads[-1]["ok"], run.uploads[-1]
    saved = state_of(model, optimizer)
    return store, {k: _clone(v) for k, v in saved.items()}


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone(v) for v in value]
    return value


def manifest_of(rp: Path) -> Any:
    reader = resolve(str(rp)).reader()
    try:
        return read_manifest(reader)[1]
    finally:
        reader.close()


def the_restore_point(store: str) -> Path:
    (rp,) = Path(store).rglob("*.rp")
    return rp


def remote_copy(store: str, tmp_path: Path) -> str:
    """The same store in fsspec's memory file system: a store that is not a local path, as
    an object store is not (a resume from it keeps a copy in the run directory)."""
    import fsspec

    fs = fsspec.filesystem("memory")
    url = f"memory://{tmp_path.name}-{random.randrange(1 << 30)}/store/"
    for path in Path(store).rglob("*"):
        if path.is_file():
            fs.pipe(url + path.relative_to(store).as_posix(), path.read_bytes())
    return url


def test_in_memory_equals_on_disk_and_the_copy_lands_complete(tmp_path: Path) -> None:
    local, saved = published(tmp_path)
    store = remote_copy(local, tmp_path)
    run_dir = tmp_path / "b"
    # From the store, in memory: the state the snapshot took, bit for bit.
    model, optimizer = model_and_optimizer(1)
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
        assert run.step == 3
        assert run._landing is not None  # it came from memory, and its copy is landing
        in_memory = _clone(state_of(model, optimizer))
    assert same(in_memory, saved)

    # The copy in the run directory: every file of the restore point, each with its sha256,
    # moved into place whole (no staging directory left beside it).
    rp = the_restore_point(local)
    manifest = manifest_of(rp)
    imports = run_dir / "imports"
    (landed,) = [p for p in imports.iterdir()]
    assert landed.name == rp.name.removesuffix(".rp")
    assert sorted(p.name for p in landed.iterdir()) == sorted(
        e.path for e in manifest.payload or ()
    )
    for entry in manifest.payload or ():
        assert hashlib.sha256((landed / entry.path).read_bytes()).hexdigest() == entry.sha256
    assert oct(landed.stat().st_mode & 0o777) != oct(0o700)  # its mode given back (U8)

    # A later resume in the same run directory (after a crash: the run is not done) loads
    # that copy from disk: the same state.
    (run_dir / "run_status.json").unlink()
    model, optimizer = model_and_optimizer(2)
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
        assert run.step == 3
        assert run._landing is None  # read from the run directory's copy
        on_disk = _clone(state_of(model, optimizer))
    assert same(on_disk, in_memory)

    # The loader on its own: the held bytes and the files give the same state.
    result = import_restore_point(str(rp), tmp_path / "c", in_memory=True)
    try:
        assert result.contents is not None
        held = {Path(result.dest) / p: c for p, c in result.contents.items()}
        from_memory = load_state(Path(result.dest) / "last.pt", held=held)
    finally:
        result.finish()
    assert same(from_memory, load_state(tmp_path / "c" / "last.pt"))


def test_from_a_local_store_no_copy_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that is a local path is as near as a copy would be: the resume loads the held
    bytes and writes nothing (no imports/, no staging directory); a later resume in the same
    run directory imports from the store again, to the same state. Where the held bytes
    cannot be loaded as they are (an older release's pickle), the restore point is imported
    to disk then, through the same gate, and loaded from there."""
    store, saved = published(tmp_path)
    run_dir = tmp_path / "b"
    for _ in range(2):
        model, optimizer = model_and_optimizer(1)
        with ResumableRun(CONFIG, run_dir=run_dir, store=store, **QUICK) as run:
            run.track(model=model, optimizer=optimizer)
            run.resume()
            assert run.step == 3
            assert run._landing is not None  # from the store's bytes in memory, each time
        assert same(_clone(state_of(model, optimizer)), saved)
        assert not (run_dir / "imports").exists()
        assert [p.name for p in run_dir.iterdir() if ".rp-import-" in p.name] == []
        (run_dir / "run_status.json").unlink()  # a crash: the run is not done

    # The held bytes refused as they are: the files are made, gated, and loaded.
    from restorepoint.runtime import state as state_module

    monkeypatch.setattr(state_module, "is_snapshot_head", lambda head: False)
    model, optimizer = model_and_optimizer(2)
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        run.resume()
        assert run.step == 3
    assert same(_clone(state_of(model, optimizer)), saved)
    (landed,) = (run_dir / "imports").iterdir()
    assert landed.name == the_restore_point(store).name.removesuffix(".rp")
    assert (landed / "last.pt").is_file()


def test_an_import_kept_in_memory_without_a_copy_writes_nothing(tmp_path: Path) -> None:
    """``copy=False``: the bytes are held and verified as with a copy, and nothing is written;
    DEST is not checked (a file there stays as it is) and ``finish`` does nothing."""
    store, _ = published(tmp_path)
    rp = the_restore_point(store)
    dest = tmp_path / "not-a-directory"
    dest.write_text("left alone")
    result = import_restore_point(str(rp), dest, in_memory=True, copy=False)
    assert result.files == []
    assert result.contents is not None
    held = {Path(result.dest) / p: c for p, c in result.contents.items()}
    from_memory = load_state(Path(result.dest) / "last.pt", held=held)
    result.finish()
    result.discard()
    assert dest.read_text() == "left alone"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "not-a-directory", "store"]
    import_restore_point(str(rp), tmp_path / "c")
    assert same(from_memory, load_state(tmp_path / "c" / "last.pt"))
    # No copy and no bytes kept would be no import at all: refused, nothing read.
    with pytest.raises(UsageError, match="in memory"):
        import_restore_point(str(rp), tmp_path / "e", copy=False)
    # A corrupted chunk: refused as with a copy, and still nothing written.
    corrupt(rp)
    with pytest.raises(IntegrityError):
        import_restore_point(str(rp), tmp_path / "d", in_memory=True, copy=False)
    assert not (tmp_path / "d").exists()


def corrupt(rp: Path) -> None:
    """One byte changed in the middle of last.pt's stored bytes (its frames' data)."""
    manifest = manifest_of(rp)
    (entry,) = [e for e in manifest.payload or () if e.path == "last.pt"]
    with open(rp, "r+b") as f:
        f.seek(entry.offset + entry.stored_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))


def test_a_corrupted_chunk_is_refused_before_any_tensor_is_loaded(tmp_path: Path) -> None:
    store, _ = published(tmp_path)
    corrupt(the_restore_point(store))
    model, optimizer = model_and_optimizer(1)
    before = _clone(state_of(model, optimizer))
    run_dir = tmp_path / "b"
    with ResumableRun(CONFIG, run_dir=run_dir, store=store, **QUICK) as run:
        run.track(model=model, optimizer=optimizer)
        with pytest.raises(IntegrityError):
            run.resume()
    # Nothing of it reached the model or the optimizer, and nothing of it was kept.
    assert same(state_of(model, optimizer), before)
    imports = run_dir / "imports"
    assert not imports.exists() or os.listdir(imports) == []
    # The import in memory on its own: refused, DEST never made, no staging left.
    dest = tmp_path / "c" / "ckpt"
    with pytest.raises(IntegrityError):
        import_restore_point(str(the_restore_point(store)), dest, in_memory=True)
    assert not dest.exists() and os.listdir(dest.parent) == []


def test_under_run_a_corrupted_store_snapshot_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """The demo trainer resuming from its store under ``restorepoint run``: the refusal is
    one line on stderr and exit 1 (IntegrityError), and the trainer never trains."""
    legit = preempted_checkpoint(tmp_path / "legit")
    store = f"{tmp_path / 'store'}/"
    pos = json.loads((legit / "position.json").read_text())
    at = restorepoint.Position(pos["step"], pos["epoch"], pos["batch"])
    rp = Path(pack_demo(legit, store, position=at).url)
    corrupt(rp)
    work = tmp_path / "work"
    trainer = trainer_command(
        work / "runs", work / "final.pt", "--epochs", "1", "--quiet",
        "--marker", str(work / "started"), "--store", store,
    )  # fmt: skip
    proc = cli("run", "--store", f"{tmp_path / 'published'}/", "--", *trainer, env=clean_env())
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("restorepoint: error:")]
    assert len(errors) == 1, proc.stderr
    assert "last.pt" in errors[0] and rp.name in errors[0], errors[0]
    assert not (work / "started").exists()
    imports = work / "runs" / RUN / "imports"
    assert not imports.exists() or os.listdir(imports) == []


@pytest.mark.parametrize(("threads", "numpy_copy"), [(1, False), (2, False), (2, True), (3, True)])
def test_the_held_loader_copies_in_steps_across_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threads: int, numpy_copy: bool
) -> None:
    """The loader copies each tensor a window of steps at a time (the steps on up to
    FILL_THREADS threads, copied by numpy, which releases the GIL, or by slices) and forgets
    each window's bytes: with steps and chunks that cross tensor boundaries everywhere, the
    state is the file's, bit for bit, and every held byte is let go at the end."""
    from restorepoint.ops import _contents
    from restorepoint.runtime import held as held_module

    store, _ = published(tmp_path)
    import_restore_point(str(the_restore_point(store)), tmp_path / "c")
    url = str(tmp_path / "small-chunks.rp")
    restorepoint.pack(tmp_path / "c", url, position=restorepoint.Position(3), chunk_size=65536)
    monkeypatch.setattr(held_module, "FILL_STEP", 777)
    monkeypatch.setattr(held_module, "FILL_THREADS", threads)
    monkeypatch.setattr(_contents, "_NUMPY_COPY", 0 if numpy_copy else 1 << 62)
    if numpy_copy:
        pytest.importorskip("numpy")
    result = import_restore_point(url, tmp_path / "d", in_memory=True)
    try:
        assert result.contents is not None
        assert result.contents["last.pt"].size > 3 * 65536
        held = {Path(result.dest) / p: c for p, c in result.contents.items()}
        from_memory = load_state(Path(result.dest) / "last.pt", held=held)
        with pytest.raises(ValueError, match="forgotten"):
            result.contents["last.pt"].read(0, 1)
    finally:
        result.finish()
    assert same(from_memory, load_state(tmp_path / "d" / "last.pt"))
