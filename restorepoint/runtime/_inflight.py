"""A stop's view of a periodic publish still in flight (docs/adapters.md, "Snapshots and
signals": a stop while a periodic publish is in flight).

The snapshot worker publishes one snapshot at a time, so a stop's snapshot waits for the
publish in hand. Where the time left before the store deadline holds both, both land, and
nothing changes. Where it holds the stop's publish but not the rest of the one in flight and
then the stop's, waiting would land the older state and let the stop's, which holds every
step, miss its deadline: the one in flight is abandoned (``ops._abandon``), and the stop's
starts at once. Where it does not hold even the stop's publish, the one in flight goes on: it
may still land.

A publish of the run is estimated to take half again as long as the slowest of its last
``RECENT`` publishes: a store's speed varies from one publish to the next (to moto's S3 server,
1 GiB: a stop's publish took 1.1x to 1.6x the run's first, docs/performance.md),
and a publish abandoned for a stop's that then misses its deadline leaves the store the
restore point before both. The estimate errs on the long side, so that abandoning is done only
where the stop's publish fits with room to spare."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..ops._abandon import Abandon
from ..storage import deadline_left

__all__ = ["RECENT", "SAFETY", "Flights", "InFlight", "estimate", "supersedes"]

#: The run's publishes the estimate looks back on, and the factor on the slowest of them.
RECENT = 5
SAFETY = 1.5


@dataclass
class InFlight:
    """The publish in flight: of the snapshot at ``step``, started at ``started``
    (``time.monotonic``), given up through ``abandon``."""

    step: int
    started: float = field(default_factory=time.monotonic)
    abandon: Abandon = field(default_factory=Abandon)


def supersedes(
    *, elapsed: float, estimate: float | None, left: float | None, margin: float
) -> bool:
    """Whether a stop's newer snapshot supersedes the publish in flight: ``elapsed``, the
    seconds that one has run; ``estimate``, the seconds a publish of the run takes (None: no
    publish of it has landed yet, and nothing is known); ``left``, the seconds before the
    store deadline (None: there is none); ``margin``, the seconds to keep in hand. Only where
    the stop's publish fits the time left and the rest of the one in flight followed by the
    stop's does not. A publish in flight past its estimate is taken to be about to land."""
    if estimate is None or left is None:
        return False
    room = left - margin
    rest = max(0.0, estimate - elapsed)
    return estimate <= room < rest + estimate


def estimate(seconds: Sequence[float]) -> float | None:
    """The seconds a publish of the run is taken to need, from the times its publishes took
    (oldest first; None: none has landed yet, and nothing is known)."""
    recent = list(seconds)[-RECENT:]
    return SAFETY * max(recent) if recent else None


class Flights:
    """One worker's publishes as a stop sees them: the one in flight, which a newer snapshot
    may supersede, and the times the last ``RECENT`` that landed took. The worker's thread
    begins, ends and lands them; a stop's thread calls ``supersede``."""

    def __init__(self) -> None:
        self.flight: InFlight | None = None
        #: Replaced whole, never changed in place: a stop's thread reads it as it is.
        self._took: tuple[float, ...] = ()

    def begin(self, step: int) -> InFlight:
        """The publish of the snapshot at ``step`` starts: the one in flight now."""
        self.flight = InFlight(step)
        return self.flight

    def end(self) -> None:
        """The publish in flight is over, however it ended."""
        self.flight = None

    def landed(self, seconds: float) -> None:
        """A publish landed, in ``seconds``: what the next estimates are made from."""
        self._took = (*self._took[-(RECENT - 1) :], seconds)

    def supersede(self, newer: int, margin: float) -> dict[str, float] | None:
        """A newer snapshot, at step ``newer``, waits (a stop's, or one under a store
        deadline): abandon the publish in flight where ``supersedes`` says so, from
        ``estimate`` of the times the publishes took. The figures the choice was made on, for
        the caller's event; None where the publish in flight (if any) goes on."""
        flight = self.flight
        if flight is None or flight.step >= newer:
            return None
        guess = estimate(self._took)
        elapsed, left = time.monotonic() - flight.started, deadline_left()
        if not supersedes(elapsed=elapsed, estimate=guess, left=left, margin=margin):
            return None
        assert guess is not None
        assert left is not None
        flight.abandon.ask(
            f"abandoned for the snapshot at step {newer}: the {left:.1f} s before the store "
            f"deadline hold its publish (at most {guess:.1f} s), not this one's rest before it"
        )
        return {
            "step": flight.step,
            "by": newer,
            "elapsed_s": round(elapsed, 3),
            "estimate_s": round(guess, 3),
            "deadline_left_s": round(left, 3),
        }
