"""The one way in: every resume is gated by what this machine is (spec section 16.7).

Resuming is choosing a restore point and importing it, and both go through the **strict** gate:
every field the restore point records (trainer, version terms, cache root, cache keys, config
identity) is compared with a value this machine knows, from one or more views (an adapter's
local view, the command line, a handoff file); a field no view knows is a refusal ("unknown
here"), never a pass. The trust policy is the caller's, else the fleet's
(``RESTOREPOINT_TRUST``). The runtime, Lightning, the supervisor and ``import --exec`` all
resume through ``choose`` and ``resume_import``; nothing else imports for a resume.

``choose`` picks the run's newest restore point. When that one is refused, it does not fall
back silently: silently resuming an older point would throw away work an operator could still
recover. It names the older ones that would pass, and ``accept_older`` opts in to the newest
of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..errors import IncompatibleRestorePoint, IntegrityError, SignatureError, at_url
from ..format import Manifest, canonical_dumps, strict_loads
from ..storage import resolve
from ..trust import Trust, trust_policy
from .gate import CLI_HINTS, CheckResult, Expectations, decide, refuse
from .store import StoreEntry, _store, entry_head, list_store
from .unpack import ImportResult, import_restore_point

__all__ = ["HEAD_FILE", "choose", "read_head_file", "resume_import", "write_head_file"]

log = logging.getLogger("restorepoint.resume")

#: Written beside an import handed to a trainer that gates itself (a ResumableRun started by
#: ``restorepoint run``): the restore point's head, which that trainer compares with its own
#: local view before it loads anything.
HEAD_FILE = "restore-point-head.json"
#: How many older restore points a refusal looks through for ones that would pass.
_OLDER_SCAN = 32


def choose(  # noqa: PLR0912, PLR0913 - the choice rules of spec 16.7, each a keyword
    store: str,
    *,
    run: str,
    views: Sequence[Expectations],
    defer: Iterable[str] = (),
    accept_older: bool = False,
    trust: Trust | None = None,
    storage_options: dict[str, Any] | None = None,
    hints: Mapping[str, str] = CLI_HINTS,
) -> StoreEntry | None:
    """The restore point of ``run`` to resume from, or None when the run has none in the
    store. The newest whose head is sound and agrees with its name is gated; if it is refused
    (or its signature is, under the trust policy), IncompatibleRestorePoint (or the
    SignatureError) is raised naming the older restore points that would pass, unless
    ``accept_older``: then the newest of those is the answer."""
    policy = trust_policy(trust)
    location = _store(store, storage_options)
    entries = list_store(location, run=run)
    newest: tuple[StoreEntry, BaseException | CheckResult] | None = None
    passing: list[StoreEntry] = []
    for i, entry in enumerate(entries):
        if newest is not None and i > _OLDER_SCAN:
            break
        try:
            head = entry_head(location.join(entry.name), entry, policy)
        except SignatureError as exc:
            failure: BaseException | CheckResult = exc
        except IntegrityError as exc:
            # As ``latest`` does: an object that is not a sound restore point of this run is
            # no candidate (a torn copy, a head that disagrees with its name).
            log.warning("skipping %s: %s", entry.url, exc)
            continue
        else:
            result = decide(entry.url, head, views, strict=True, defer=defer, hints=hints)
            if result.compatible:
                if newest is None:
                    return entry
                passing.append(entry)
                if accept_older:
                    return entry
                if len(passing) >= 3:
                    break
                continue
            failure = result
        if newest is None:
            newest = (entry, failure)
    if newest is None:
        return None
    entry, failure = newest
    if passing:
        older = ", ".join(f"step {e.step} ({e.name})" for e in passing)
        note = (
            f"older restore points of run {run} that would pass here: {older}; "
            "accept one with --accept-older (accept_older=True), or recover what the newest "
            "needs"
        )
    else:
        note = f"no older restore point of run {run} passes here either"
    if isinstance(failure, CheckResult):
        refusal = refuse(failure)
        refusal.message = f"the newest restore point of run {run} is {refusal.message}"
        refusal.details = [*refusal.details, note]
        raise refusal
    assert isinstance(failure, SignatureError)
    failure.url = failure.url or entry.url
    failure.message = f"{failure.message} ({note})"
    raise failure


def resume_import(  # noqa: PLR0913 - the one gated import's keyword options
    url: str,
    dest: str | os.PathLike[str],
    *,
    views: Sequence[Expectations],
    defer: Iterable[str] = (),
    trust: Trust | None = None,
    storage_options: dict[str, Any] | None = None,
    force: bool = False,
    hints: Mapping[str, str] = CLI_HINTS,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    in_memory: bool = False,
    copy: bool = True,
) -> ImportResult:
    """Import ``url`` into ``dest`` for a resume: the strict gate against ``views`` (except
    the ``defer``red fields, which the trainer itself compares), under the trust policy, then
    the import's usual verification; a refusal writes nothing. ``rank`` and ``world_size``:
    a multi-part restore point's shared part and that rank's, on a world it was made by
    (spec 25.4). ``in_memory``: the verified files are held too, and the copy in ``dest``
    lands on ``finish()``, or with ``copy=False`` is not made (``import_restore_point``)."""
    return import_restore_point(
        url,
        dest,
        expect=views,
        strict=True,
        defer=defer,
        hints=hints,
        force=force,
        storage_options=storage_options,
        progress=progress,
        on_start=on_start,
        trust=trust_policy(trust),
        rank=rank,
        world_size=world_size,
        in_memory=in_memory,
        copy=copy,
    )


def write_head_file(manifest: Manifest, path: str | os.PathLike[str]) -> None:
    """The head of an imported restore point, for the trainer that gates itself."""
    location = resolve(os.fspath(path))
    with location.publish() as publisher:
        publisher.write(canonical_dumps(manifest.head_dict()))


def read_head_file(path: str | os.PathLike[str]) -> Manifest:
    """A head written by ``write_head_file``, validated as a reader validates a head."""
    with at_url(os.fspath(path)):
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 20)
        except FileNotFoundError:
            raise IncompatibleRestorePoint(
                "an import handed over without its restore point's head: it cannot be gated",
                url=os.fspath(path),
            ) from None
        return Manifest.from_head_dict(strict_loads(data, "head"))
