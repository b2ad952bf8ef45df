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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..errors import RestorePointError, UsageError
from ..format import Manifest, Position, Trainer
from ..format.limits import CHUNK_SIZE_DEFAULT
from ..storage import resolve
from ..trust import PublicKey
from ._naming import entry_name, is_store_url
from .gate import UNSET, Expectations, handoff_document, write_handoff
from .pack import DEFAULT_CODEC, DEFAULT_LEVEL, PackResult, describe, pack
from .store import PruneReport, _store, prune

__all__ = ["HeadSpec", "PackOptions", "PublishResult", "publish"]


@dataclass(frozen=True)
class HeadSpec:
    """The identity part and position of a restore point to pack: trainer, version terms,
    config and its operational keys, cache keys, cache root, position, run. Validated once,
    when it is made, by the same checks a reader makes of a head (``describe``): a bad value
    is a UsageError before anything is read or written."""

    position: Position | int
    trainer: Trainer | tuple[str, str] | None = None
    terms: Mapping[str, str] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    operational_keys: tuple[str, ...] = ()
    cache_keys: Mapping[str, str] = field(default_factory=dict)
    cache_root: str | None = None
    run: str | None = None
    #: Fixed only for reproducible objects (golden vectors, crash tests); by default each pack
    #: takes the time and 16 random bytes.
    created: str | None = None
    rp_id: str | None = None

    def __post_init__(self) -> None:
        # The one validation; it also derives the run from the config identity when none is
        # given, as every writer does (spec 19.1).
        head = describe(
            position=self.position,
            trainer=self.trainer,
            terms=self.terms,
            config=self.config,
            operational_keys=self.operational_keys,
            cache_keys=self.cache_keys,
            cache_root=self.cache_root,
            run=self.run,
            created=self.created,
            rp_id=self.rp_id,
        )
        object.__setattr__(self, "position", head.position)
        object.__setattr__(self, "trainer", head.trainer)
        object.__setattr__(self, "operational_keys", head.operational_keys)
        object.__setattr__(self, "run", head.run)

    @classmethod
    def from_view(
        cls,
        view: Expectations,
        position: Position,
        *,
        operational_keys: Sequence[str] = (),
        run: str | None = None,
    ) -> HeadSpec:
        """The head of a restore point made on the machine ``view`` describes (an adapter's
        local view): what the same view elsewhere must meet. A field the view does not know
        is recorded as absent."""
        return cls(
            position=position,
            trainer=view.trainer if isinstance(view.trainer, Trainer) else None,
            terms=dict(view.terms) if isinstance(view.terms, Mapping) else {},
            config=dict(view.config) if isinstance(view.config, Mapping) else None,
            operational_keys=tuple(operational_keys),
            cache_keys=dict(view.cache_keys) if isinstance(view.cache_keys, Mapping) else {},
            cache_root=view.cache_root if view.cache_root is not UNSET else None,
            run=run,
        )

    def at(self, position: Position) -> HeadSpec:
        """The same identity at another position (each snapshot of a run; a fresh id)."""
        return HeadSpec(
            position, self.trainer, self.terms, self.config, self.operational_keys,
            self.cache_keys, self.cache_root, self.run,
        )  # fmt: skip

    def pack_arguments(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "trainer": self.trainer,
            "terms": dict(self.terms),
            "config": self.config,
            "operational_keys": self.operational_keys,
            "cache_keys": dict(self.cache_keys),
            "cache_root": self.cache_root,
            "run": self.run,
            "created": self.created,
            "rp_id": self.rp_id,
        }


@dataclass(frozen=True)
class PackOptions:
    """How the payload is packed and where the bytes go: the codec (auto, zstd, none) and its
    zstd level (0 or None: stored), chunk size, encode threads, whether to hash the whole object
    too, signing keys, recipients, the storage's fsspec options."""

    level: int | None = DEFAULT_LEVEL
    codec: str = DEFAULT_CODEC
    object_sha256: bool = False
    chunk_size: int = CHUNK_SIZE_DEFAULT
    threads: int | None = None
    sign: tuple[Ed25519PrivateKey, ...] = ()
    encrypt_to: tuple[PublicKey, ...] = ()
    storage_options: dict[str, Any] | None = field(default=None, compare=False)

    def pack_arguments(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "codec": self.codec,
            "object_sha256": self.object_sha256,
            "chunk_size": self.chunk_size,
            "threads": self.threads,
            "sign": self.sign,
            "encrypt_to": self.encrypt_to,
            "storage_options": self.storage_options,
        }


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


def publish(
    source: str | os.PathLike[str],
    dest: str,
    head: HeadSpec,
    options: PackOptions = PackOptions(),
    *,
    include: Sequence[str] | None = None,
    keep_last: int | None = None,
    handoff: str | os.PathLike[str] | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> PublishResult:
    """Publish ``source`` (or its files ``include``) as a restore point of ``head``: into the
    store ``dest`` (a URL ending in "/"), create-only under its store name, or at the URL
    ``dest`` itself (replacing what is there, atomically); the commit point is the publish.
    Then write the ``handoff`` file, then, with ``keep_last`` (a store only), prune the run to
    its newest ``keep_last`` with the new restore point protected (kept whatever the rules
    say). A failed pack raises and prunes nothing; a failed prune is returned in
    ``prune_error``."""
    into_store = is_store_url(dest)
    if keep_last is not None and not into_store:
        raise UsageError("--keep-last needs a store DEST (a URL ending in /)")
    if keep_last is not None and keep_last < 1:
        raise UsageError("--keep-last must be at least 1")
    location = (
        _store(dest, options.storage_options)
        if into_store
        else resolve(dest, options.storage_options)
    )
    result = pack(
        source,
        location,
        into_store=into_store,
        include=include,
        progress=progress,
        on_start=on_start,
        **head.pack_arguments(),
        **options.pack_arguments(),
    )
    # Everything about the published restore point is out before pruning starts: a prune
    # that fails must not hide what was published.
    if handoff is not None:
        write_handoff(Path(handoff), handoff_document(result.manifest, result.url))
    if keep_last is None:
        return PublishResult(result)
    location = _store(dest, options.storage_options)
    try:
        report = prune(
            location,
            keep_last=keep_last,
            run=result.manifest.run,
            protect=[entry_name(result.manifest)],
        )
    except RestorePointError as exc:
        return PublishResult(result, prune_error=exc)
    return PublishResult(result, report)
