"""What to pack: the head of a restore point (``HeadSpec``, validated once where it is made)
and how to pack it (``PackOptions``). Every writer of a restore point (``pack``, ``publish``,
the runtime, Lightning, the supervisor) makes a HeadSpec; ``describe`` is the one validation
of a head, by the same checks a reader makes (spec section 13, P1)."""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .._version import __version__
from ..errors import ConfigError, IntegrityError, UsageError
from ..format import (
    MULTIPART_FEATURE,
    MULTIPART_VERSION,
    CanonicalizationError,
    Manifest,
    PartOf,
    Parts,
    Position,
    Producer,
    Trainer,
    canonical_dumps,
    config_identity,
    strict_loads,
)
from ..format.identity import check_operational_key
from ..format.limits import CHUNK_SIZE_DEFAULT, CHUNK_SIZE_MAX, CHUNK_SIZE_MIN
from ..format.manifest import RUN_PATTERN
from ..format.metrics import check_metrics
from ._config import check_json_data
from ._threads import default_threads
from .gate import UNSET, Expectations

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from ..trust import PublicKey

__all__ = [
    "CODECS",
    "DEFAULT_CODEC",
    "DEFAULT_LEVEL",
    "HeadSpec",
    "PackOptions",
    "default_run",
    "describe",
    "fresh",
]

#: zstd level 1: ~1 GB/s per core on float32 tensors; higher levels buy almost nothing on
#: weights (which are close to random) at a large cost in time.
DEFAULT_LEVEL = 1
#: What ``codec=`` accepts: ``auto`` chooses chunk by chunk (codec planes: as is, zstd, or byte
#: planes), ``zstd`` compresses every chunk whole, ``none`` stores the payload as it is.
CODECS = ("auto", "zstd", "none")
DEFAULT_CODEC = "auto"


def default_run(identity: str) -> str:
    """The run id of a config: what is trained, so a resubmitted job finds its own run."""
    return f"cfg-{identity[:16]}"


def describe(  # noqa: PLR0912, PLR0913 - one check per head field, as a reader makes them
    *,
    position: Position | int,
    trainer: Trainer | Sequence[str] | None = None,
    terms: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    operational_keys: Iterable[str] = (),
    cache_keys: Mapping[str, str] | None = None,
    cache_root: str | None = None,
    chunk_size: int = CHUNK_SIZE_DEFAULT,
    created: str | None = None,
    rp_id: str | None = None,
    run: str | None = None,
    metrics: Mapping[str, float] | None = None,
) -> Manifest:
    """The head of a new restore point, validated exactly as a reader would validate it:
    whatever the caller passes, a bad value is a UsageError here, before anything is written."""
    try:
        if not isinstance(position, Position):
            position = Position(step=position)
        if trainer is not None and not isinstance(trainer, Trainer):
            name, version = trainer
            trainer = Trainer(name, version)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"bad position or trainer ({exc})") from None
    operational = sorted(set(operational_keys))
    try:
        for key in operational:
            check_operational_key(key)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    identity = None
    if config is not None:
        if not isinstance(config, Mapping):
            raise ConfigError("the config must be a mapping")
        config = check_json_data(config)
        try:
            identity = config_identity(config, operational)
        except CanonicalizationError as exc:
            raise ConfigError(f"config is not JSON data ({exc})") from None
    for name, mapping in (("version term", terms or {}), ("cache key", cache_keys or {})):
        for key, value in mapping.items():
            if not isinstance(key, str) or not key or not isinstance(value, str):
                raise UsageError(f"a {name} needs a non-empty name and a string value")
    if trainer is not None and not (
        isinstance(trainer.name, str) and trainer.name and isinstance(trainer.version, str)
    ):
        raise UsageError("a trainer needs a name and a version, both strings")
    if cache_root is not None and not isinstance(cache_root, str):
        raise UsageError("the cache root must be a string")
    if run is None and identity is not None:
        run = default_run(identity)
    if run is not None and (not isinstance(run, str) or not RUN_PATTERN.fullmatch(run)):
        raise UsageError(
            f"run {run!r} must be 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    check_chunk_size(chunk_size)
    try:
        checked = check_metrics(metrics) if metrics else {}
    except IntegrityError as exc:
        raise UsageError(f"bad metrics ({exc})") from None
    if created is None:
        now = datetime.now(timezone.utc)
        created = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
    head = Manifest(
        id=rp_id or secrets.token_hex(16),
        created=created,
        producer=Producer("restorepoint", __version__),
        position=position,
        chunk_size=chunk_size,
        trainer=trainer,
        terms=dict(terms or {}),
        config=config,
        config_identity=identity,
        operational_keys=tuple(operational),
        cache_keys=dict(cache_keys or {}),
        cache_root=cache_root,
        run=run,
        metrics=checked,
    )
    # The reader's own checks (id and time formats, depth, number domain) on the exact bytes.
    try:
        Manifest.from_head_dict(strict_loads(canonical_dumps(head.head_dict()), "head"))
    except (IntegrityError, CanonicalizationError) as exc:
        raise UsageError(f"the restore point would not be readable: {exc}") from None
    return head


def check_chunk_size(chunk_size: Any) -> None:
    if (
        not isinstance(chunk_size, int)
        or isinstance(chunk_size, bool)
        or not CHUNK_SIZE_MIN <= chunk_size <= CHUNK_SIZE_MAX
        or chunk_size & (chunk_size - 1)
    ):
        raise UsageError("chunk size must be a power of two from 64 KiB to 64 MiB")


def created_now() -> str:
    """The present as a head's ``created`` (UTC, milliseconds)."""
    now = datetime.now(timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def fresh(head: Manifest, *, rp_id: str | None = None, created: str | None = None) -> Manifest:
    """``head`` with a new id and creation time (or the given ones): each pack of a HeadSpec
    is a restore point of its own. Neither needs validating: both are made here."""
    return replace(head, id=rp_id or secrets.token_hex(16), created=created or created_now())


@dataclass(frozen=True)
class HeadSpec:
    """The identity part and position of a restore point to pack: trainer, version terms,
    config and its operational keys, cache keys, cache root, position, run. Validated once,
    when it is made, by the same checks a reader makes of a head (``describe``): a bad value
    is a UsageError before anything is read or written."""

    position: Position | int
    trainer: Trainer | Sequence[str] | None = None
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
    #: A commit's parts or a part's commit (spec section 25): the head then lists multipart/1
    #: and is written as format 1.1.
    parts: Parts | None = None
    part: PartOf | None = None
    #: What this restore point measured (spec 4.3): kept by prune --keep-best (19.5).
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: The head as ``describe`` made it: what every pack of this spec writes (with its own id
    #: and time unless ``rp_id`` and ``created`` fix them).
    manifest: Manifest = field(init=False, repr=False, compare=False)

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
            metrics=self.metrics,
        )
        object.__setattr__(self, "manifest", head)
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
        metrics: Mapping[str, float] | None = None,
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
            metrics=dict(metrics or {}),
        )

    def at(self, position: Position, metrics: Mapping[str, float] | None = None) -> HeadSpec:
        """The same identity at another position (each snapshot of a run; a fresh id), with
        that snapshot's metrics (none unless given: metrics belong to one position)."""
        return replace(self, position=position, created=None, rp_id=None, metrics=metrics or {})

    def head(self) -> Manifest:
        """The head to write: this spec's, with a fresh id and time unless they are fixed."""
        head = fresh(self.manifest, rp_id=self.rp_id, created=self.created)
        if self.parts is None and self.part is None:
            return head
        return replace(
            head,
            parts=self.parts,
            part=self.part,
            format_version=MULTIPART_VERSION,
            required_features=tuple(sorted({*head.required_features, MULTIPART_FEATURE})),
        )


#: PackOptions.adaptive's values.
ADAPTIVE = ("off", "always", "deadline")


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
    #: The adaptive codec choice (codec auto only: spec section 13, W4b): ``"off"``, every
    #: chunk probed; ``"always"``, each chunk's mode (probe or raw) chosen from what compression
    #: and the store cost, aiming to land before the store deadline less ``deadline_margin``
    #: seconds when one is set; ``"deadline"``, the same only while a store deadline is set (a
    #: stop, a reclaim notice: ResumableRun's), every chunk probed otherwise.
    adaptive: str = "off"
    deadline_margin: float = 1.0
    #: An incremental restore point (spec section 28): into a store, the chunks that the run's
    #: newest restore point there holds are referenced, not uploaded again. None (the
    #: default): incremental where it can be (a store DEST, not encrypted, not multi-part),
    #: full elsewhere; True: incremental, and a usage error where it cannot be; False: a full
    #: restore point of the older format (1.0, or 1.1 multi-part), which any reader reads.
    incremental: bool | None = None

    def __post_init__(self) -> None:
        check_chunk_size(self.chunk_size)
        if self.adaptive not in ADAPTIVE:
            raise UsageError(
                f"adaptive must be one of {', '.join(ADAPTIVE)}, not {self.adaptive!r}"
            )

    def waited_for(self) -> PackOptions:
        """These options for a publish that training waits for whole (a stop): an encode
        thread per core (up to the default) where fewer were asked for. Beside training, one
        leaves the training thread a core; under a stop there is nothing to leave it for (1
        GiB on 2 cores: the stop 1.52 s against 1.69 s with one, docs/performance.md)."""
        threads = default_threads()
        if self.threads is not None and self.threads < threads:
            return replace(self, threads=threads)
        return self
