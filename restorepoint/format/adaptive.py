"""The adaptive choice of a chunk's codec mode (spec section 13, W4b): during a publish, measure
what compressing a chunk costs and what the store takes per byte, and choose for each chunk of
a ``planes`` payload whether to run the probe (zstd or byte planes, whichever is smallest) or to
store it raw (mode 0). The format allows it: every chunk of codec ``planes`` names its own mode,
and a reader repeats nothing of the choice.

- **Store-bound** (the store takes a byte slower than the pool compresses one, scaled by what
  compression saves): compress, since fewer bytes reach the store sooner.
- **CPU-bound** (compression is the slower stage): store raw, since the store takes the plain
  bytes faster than the pool can shrink them.
- **Under a deadline** (a reclaim notice, a stop's ``upload_timeout``): compress while the
  compressed publish is estimated to land before the deadline less the margin; otherwise take
  whichever mode is estimated to land sooner.

The first chunks are always probed (the measurements need them), and every ``reprobe``-th chunk
after a run of raw chunks is too, so that the estimates follow the store and the CPU. The
estimates are cumulative: seconds over bytes, since the publish began. Nothing here sleeps or
reads a clock the caller did not hand in, except ``time.perf_counter`` for the measurements.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MODES", "Choices", "CodecChooser"]

#: The modes the chooser picks from: the codec's probe, or the chunk stored as is.
MODES = ("probe", "raw")
#: Bytes the store takes before the first choice (or an eighth of the payload, when that is
#: less): enough for it to have taken a part of a multipart upload (16 MiB), whose writes
#: otherwise only fill a buffer.
WARMUP_BYTES = 32 << 20
#: Without a deadline, raw wins only when it is estimated this much faster: a tie goes to the
#: smaller restore point.
RAW_ADVANTAGE = 0.9


@dataclass
class Choices:
    """What the chooser chose, for the publish's result and its telemetry."""

    chunks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MODES, 0))
    #: Seconds per plain byte of the pool's encoding, and per stored byte of the store (None:
    #: not measured); the stored / plain ratio of probed chunks.
    encode_s_per_byte: float | None = None
    store_s_per_byte: float | None = None
    ratio: float | None = None
    #: The seconds left before the deadline less the margin at the last choice (None: no
    #: deadline), and whether the estimate then said the publish lands within it.
    deadline_left_s: float | None = None
    on_time: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": dict(self.bytes),
            "chunks": dict(self.chunks),
            "deadline_left_s": _round(self.deadline_left_s),
            "encode_mb_s": _rate(self.encode_s_per_byte),
            "on_time": self.on_time,
            "ratio": _round(self.ratio),
            "store_mb_s": _rate(self.store_s_per_byte),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _rate(s_per_byte: float | None) -> float | None:
    return None if not s_per_byte else round(1e-6 / s_per_byte, 2)


class CodecChooser:
    """Chooses each chunk's mode; thread-safe (the pool's threads choose, the writer thread
    records the store's time). ``total``: the payload's plain bytes; ``threads``: the pool's
    encode threads; ``deadline_left``: the seconds left before the deadline, or None (called
    at each choice, so that a deadline set during the publish is met from then on);
    ``margin``: seconds kept in hand before it; ``deadline_only``: probe every chunk while
    there is no deadline (the chooser then only acts under a stop or a reclaim notice)."""

    def __init__(  # noqa: PLR0913 - the payload, the pool, the deadline and the policy's knobs
        self,
        total: int,
        *,
        threads: int = 1,
        deadline_left: Callable[[], float | None] = lambda: None,
        margin: float = 1.0,
        reprobe: int = 16,
        deadline_only: bool = False,
    ) -> None:
        self.deadline_only = deadline_only
        self.threads = max(1, threads)
        self.deadline_left = deadline_left
        self.margin = margin
        self.reprobe = max(1, reprobe)
        self.choices = Choices()
        self._left = total
        self._warmup = max(1, min(WARMUP_BYTES, total // 8))
        self._lock = threading.Lock()
        self._encode_s = 0.0
        self._encode_plain = 0
        self._encode_stored = 0
        self._store_s = 0.0
        self._store_bytes = 0
        self._since_probe = 0

    # -- measurements ----------------------------------------------------------------------

    def record_encode(self, plain: int, stored: int, seconds: float) -> None:
        """A probed chunk: ``plain`` bytes became ``stored`` in ``seconds`` (one pool thread)."""
        with self._lock:
            self._encode_s += seconds
            self._encode_plain += plain
            self._encode_stored += stored

    def record_store(self, stored: int, seconds: float) -> None:
        """The store took ``stored`` bytes in ``seconds`` (the writer thread's writes)."""
        with self._lock:
            self._store_s += seconds
            self._store_bytes += stored

    # -- the choice ------------------------------------------------------------------------

    def choose(self, plain: int) -> str:
        """The mode of the next chunk of ``plain`` bytes: "probe" or "raw"."""
        left = self.deadline_left()
        with self._lock:
            remaining = self._left
            self._left = max(0, self._left - plain)
            mode = self._choose(remaining, left)
            self._since_probe = 0 if mode == "probe" else self._since_probe + 1
            self.choices.chunks[mode] += 1
            self.choices.bytes[mode] += plain
        return mode

    def _choose(self, remaining: int, left: float | None) -> str:
        c = self.choices
        if left is not None:
            c.deadline_left_s = left - self.margin
        elif self.deadline_only:
            return "probe"
        if not self._encode_plain or self._store_bytes < self._warmup:
            return "probe"
        encode = self._encode_s / self._encode_plain / self.threads
        store = self._store_s / self._store_bytes
        ratio = self._encode_stored / self._encode_plain
        c.encode_s_per_byte, c.store_s_per_byte, c.ratio = encode, store, ratio
        # Seconds per plain byte of each mode: the slower of the pipeline's stages.
        t_probe = max(encode, store * ratio)
        t_raw = store
        if left is not None:
            budget = left - self.margin
            c.on_time = remaining * min(t_probe, t_raw) <= budget
            if remaining * t_probe <= budget:
                return "probe"
            return "raw" if t_raw < t_probe else "probe"
        if t_raw < RAW_ADVANTAGE * t_probe:
            # Keep the estimates fresh: a probe now and then, whatever they say.
            return "probe" if self._since_probe + 1 >= self.reprobe else "raw"
        return "probe"
