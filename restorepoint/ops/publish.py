"""The one way out: every publish goes through ``publish`` (spec section 19.7).

    snapshot -> pack create-only into the store -> handoff -> prune, the new one protected

The CLI (``pack STORE/``), the PyTorch runtime, the Lightning callback and the supervisor (its
external trainers) all call it; nothing else prunes after a publish. What it guarantees: the
new restore point is complete before anything older is touched (a create-only publish replaces
nothing), everything about it (the handoff) is out before pruning starts, and its own prune
never deletes it, even when an older branch of the run sorts above it (a run resumed from an
older restore point publishes lower steps).

``HeadSpec`` is what the head says (validated once, where it is made); ``PackOptions`` how the
payload is packed and where the bytes go.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import IntegrityError, RestorePointError, UsageError
from ..format import Manifest
from ..storage import Location, resolve
from ._delta import check_bases
from ._increment import Rest
from ._naming import entry_name, is_store_url
from ._source import InMemory
from .handoff import handoff_document, write_handoff
from .pack import PackResult, pack_spec
from .spec import HeadSpec, PackOptions
from .store import KeepBest, PruneReport, _store, prune

__all__ = ["HeadSpec", "PackOptions", "PublishResult", "Rest", "publish"]


@dataclass(frozen=True)
class PublishResult:
    """What publish did: the restore point packed into the store, and the prune after it. A
    prune that failed does not undo the publish: ``prune_error`` says what happened."""

    pack: PackResult
    pruned: PruneReport | None = None
    prune_error: RestorePointError | None = None

    @property
    def manifest(self) -> Manifest:
        return self.pack.manifest

    @property
    def url(self) -> str:
        return self.pack.url

    def to_dict(self) -> dict[str, Any]:
        out = self.pack.to_dict()
        if self.pruned is not None:
            out["pruned"] = self.pruned.deleted
        if self.prune_error is not None:
            out["ok"] = False
            out["error"] = self.prune_error.to_dict()
        return out


def publish(  # noqa: PLR0913 - the one publish: head, options, retention, handoff and progress hooks
    source: str | os.PathLike[str],
    dest: str,
    head: HeadSpec,
    options: PackOptions = PackOptions(),
    *,
    include: Sequence[str] | None = None,
    keep_last: int | None = None,
    keep_best: KeepBest | None = None,
    handoff: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    parts_verified: bool = False,
    memory: Mapping[str, InMemory] | None = None,
    rest: Rest | None = None,
) -> PublishResult:
    """Publish ``source`` (or its files ``include``) as a restore point of ``head``: into the
    store ``dest`` (a URL ending in "/"), create-only under its store name, or at the URL
    ``dest`` itself (replacing what is there, atomically); the commit point is the publish.
    Then write the ``handoff`` file, then, with ``keep_last`` (a store only), prune the run to
    its newest ``keep_last`` with the new restore point protected (kept whatever the rules
    say). A failed pack raises and prunes nothing; a failed prune is returned in
    ``prune_error``. ``parts_verified``: the new restore point is a commit whose ranks read
    back and verified their own parts; the prune checks its parts up to the payload only.
    ``keep_best`` (a store only): the prune also keeps the run's best by a metric (19.5).
    ``memory``: payload files whose bytes are in memory, packed in the place of the source
    directory's files of the same paths (a runtime's snapshot, with no file read back).
    ``rest``: the caller publishes the run's restore points one after another and keeps this
    across its publishes: after one that would reuse too little of its newest, the next ones
    name no chunks for a while (spec 28.4, W4c); a one-shot publish passes none."""
    into_store = is_store_url(dest)
    if keep_last is not None and not into_store:
        raise UsageError("--keep-last needs a store DEST (a URL ending in /)")
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1")
    if keep_best is not None and not into_store:
        raise UsageError("--keep-best needs a store DEST (a URL ending in /)")
    location = (
        _store(dest, options.storage_options)
        if into_store
        else resolve(dest, options.storage_options)
    )
    result = pack_spec(
        source,
        location,
        head,
        options,
        into_store=into_store,
        include=include,
        progress=progress,
        on_start=on_start,
        memory=memory,
        rest=rest,
    )
    if result.manifest.bases:
        result = _verified_or_full(result, source, location, head, options, include, memory)
    # Everything about the published restore point is out before pruning starts: a prune
    # that fails must not hide what was published.
    if handoff is not None:
        write_handoff(Path(handoff), handoff_document(result.manifest, result.url))
    if keep_last is None and keep_best is None:
        return PublishResult(result)
    location = _store(dest, options.storage_options)
    try:
        name = entry_name(result.manifest)
        report = prune(
            location,
            keep_last=keep_last,
            keep_best=keep_best,
            run=result.manifest.run,
            protect=[name],
            parts_verified=[name] if parts_verified else [],
        )
    except RestorePointError as exc:
        return PublishResult(result, prune_error=exc)
    return PublishResult(result, report)


def _verified_or_full(  # noqa: PLR0913, PLR0917 - the publish's source, store, head and options
    result: PackResult,
    source: str | os.PathLike[str],
    location: Location,
    head: HeadSpec,
    options: PackOptions,
    include: Sequence[str] | None,
    memory: Mapping[str, InMemory] | None = None,
) -> PackResult:
    """An incremental restore point's bases are checked before anything is handed off (spec
    section 28.4): each is opened as a reader opens it (R9a) and every reference lies inside
    one, no payload byte read (every frame is checked at each read, R9a). A base that changed
    or vanished since its index was read (a concurrent prune, a corrupted store) makes the new
    one unsound, and a full restore point is published in its place. The unsound one is newer
    than nothing that verifies, so the next prune removes it."""
    try:
        check_bases(location.join(entry_name(result.manifest)), result.manifest)
    except IntegrityError:
        return pack_spec(
            source,
            location,
            head,
            replace(options, incremental=False),
            into_store=True,
            include=include,
            memory=memory,
        )
    return result
