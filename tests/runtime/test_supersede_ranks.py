"""A stop while a periodic snapshot's parts are in flight, with a process group (two CPU ranks
over gloo; runtime/_inflight.py, ``agreed``): every rank gives up its part in flight, or none
does. The store is slow (each chunk of a part's pack waits 1 s: rank 0 packs three chunks a
snapshot, its part and the shared one, rank 1 one), so that a publish takes about 3 s; the stop
comes at step 5, just after step 4's snapshot started.

- With ``upload_timeout`` 8 s, the time left holds the stop's publish but not the rest of step
  4's before it: both ranks give step 4 up, the stop's commit lands, and the store holds steps 2
  and 5. Nothing is recorded as failed. A fresh machine resumes from step 5.
- With 40 s, both fit: nothing is given up, and the store holds steps 2, 4 and 5."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="restorepoint.torch needs torch")
if not torch.distributed.is_available():
    pytest.skip("this torch build has no torch.distributed", allow_module_level=True)

from restorepoint.ops import list_store  # noqa: E402

from . import _trainer_variants as tv  # noqa: E402
from ._ranks import launch  # noqa: E402

pytestmark = pytest.mark.slow

SLOW = ("--snapshot-every", "2", "--stop-at", "5", "--chunk-delay", "1.0")


def _stopped(tmp_path: Path, tag: str, timeout: str) -> tuple[Path, str, list[dict[str, object]]]:
    runs, store = tmp_path / f"runs-{tag}", f"{tmp_path / f'store-{tag}'}/"
    ranks = launch(tmp_path, tag, "--root", str(runs), "--store", store, *SLOW,
                   "--upload-timeout", timeout)  # fmt: skip
    assert [r.code for r in ranks] == [42, 42], ranks[0].err + ranks[1].err
    assert [r.out[-1] for r in ranks] == ["exit 42 at step 5"] * 2
    assert "restore point published to" in ranks[0].err
    (run_dir,) = runs.iterdir()
    return run_dir, store, tv.events(run_dir)


def test_every_rank_gives_up_its_part_in_flight_where_only_the_stops_commit_fits(
    tmp_path: Path,
) -> None:
    run_dir, store, events = _stopped(tmp_path, "tight", "8")
    (given_up,) = [e for e in events if e["event"] == "upload_superseded"]
    assert (given_up["step"], given_up["by"]) == (4, 5)
    # The rule held on the figures it names: the stop's publish fits, both do not.
    room = float(given_up["deadline_left_s"]) - 1.0  # type: ignore[arg-type]
    estimate = float(given_up["estimate_s"])  # type: ignore[arg-type]
    assert estimate <= room < 2 * estimate - float(given_up["elapsed_s"])  # type: ignore[arg-type]
    assert [e["step"] for e in events if e["event"] == "uploaded"] == [2, 5]
    assert not [e for e in events if e["event"] in ("upload_failed", "snapshot_failed")]
    assert sorted(e.step for e in list_store(store)) == [2, 5]
    # Every rank gave its part up before it landed: no file of step 4 is in the store (a
    # local store may keep the parts' empty directory, which an object store has not).
    assert not [p for p in Path(store).rglob("*") if p.is_file() and "/0000000000000004-" in str(p)]
    # The snapshot given up was saved in the run directories all the same; the stop's is the
    # newest there too.
    assert tv.events(run_dir)[-1]["event"] == "graceful_shutdown"

    fresh = launch(tmp_path, "fresh", "--root", str(tmp_path / "machine-b"), "--store", store)
    assert [r.code for r in fresh] == [0, 0], fresh[0].err + fresh[1].err
    assert all("resumed 5 0 5" in r.out for r in fresh)


def test_nothing_is_given_up_where_the_time_left_holds_both(tmp_path: Path) -> None:
    _, store, events = _stopped(tmp_path, "roomy", "40")
    assert not [e for e in events if e["event"] == "upload_superseded"]
    assert [e["step"] for e in events if e["event"] == "uploaded"] == [2, 4, 5]
    assert sorted(e.step for e in list_store(store)) == [2, 4, 5]
