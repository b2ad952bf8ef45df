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
where the stop's publish fits with room to spare.

With a process group a snapshot is a commit of every rank's part, which lands once the slowest
rank's part is in: the ranks choose together (``agreed``), each from every rank's ``view``,
and either all give up the publish in flight or none does."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..ops._abandon import Abandon
from ..storage import deadline_left

__all__ = ["RECENT", "SAFETY", "Flights", "InFlight", "agreed", "estimate"]

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
    #: Given up as the run was left after a stop whose publish missed its time
    #: (``Flights.close``), not for a newer snapshot.
    closed: bool = False

    @property
    def superseded(self) -> bool:
        """Given up for a newer snapshot (``Flights.supersede``, ``give_up``)."""
        return self.abandon.asked and not self.closed


def _worth(rest: float, estimate: float, room: float) -> bool:
    """The rule: the stop's publish (``estimate``) fits ``room`` (the time left less the
    margin), the ``rest`` of the one in flight followed by the stop's does not. A publish in
    flight past its estimate has no rest: it is taken to be about to land."""
    return estimate <= room < rest + estimate


def agreed(views: Sequence[Mapping[str, float] | None], margin: float) -> dict[str, float] | None:
    """Whether the ranks give up the publish in flight together, from every rank's ``view``
    (``Flights.view``): only where every rank has a publish of the same step in flight and
    knows its estimate. The commit lands with the slowest rank's part, so the rule is applied
    to the longest estimate, the longest rest and the shortest time left. The figures the
    choice was made on, or None: none gives it up."""
    if not views or any(v is None for v in views):
        return None
    known = [v for v in views if v is not None]
    if len({v["step"] for v in known}) != 1:
        return None
    guess = max(v["estimate_s"] for v in known)
    rest = max(max(0.0, v["estimate_s"] - v["elapsed_s"]) for v in known)
    left = min(v["deadline_left_s"] for v in known)
    if not _worth(rest, guess, left - margin):
        return None
    return {
        "step": known[0]["step"],
        "elapsed_s": round(max(v["elapsed_s"] for v in known), 3),
        "estimate_s": round(guess, 3),
        "deadline_left_s": round(left, 3),
    }


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
        #: Why every publish is given up from now on (``close``); None: none is.
        self._closed: str | None = None

    def begin(self, step: int) -> InFlight:
        """The publish of the snapshot at ``step`` starts: the one in flight now (given up
        before its first chunk once the flights are closed)."""
        flight = self.flight = InFlight(step)
        why = self._closed
        if why is not None:
            flight.closed = True
            flight.abandon.ask(why)
        return flight

    def close(self, why: str) -> None:
        """Give up the publish in flight, at its next chunk, and every later one before its
        first: the run is being left after a stop whose publish did not land in time."""
        self._closed = why
        flight = self.flight
        if flight is not None:
            flight.closed = True
            flight.abandon.ask(why)

    def end(self) -> None:
        """The publish in flight is over, however it ended."""
        self.flight = None

    def landed(self, seconds: float) -> None:
        """A publish landed, in ``seconds``: what the next estimates are made from."""
        self._took = (*self._took[-(RECENT - 1) :], seconds)

    def view(self, newer: int) -> dict[str, float] | None:
        """This worker's side of the ranks' choice (``agreed``) for a newer snapshot at step
        ``newer``: the step of the publish in flight, the seconds it has run, the estimate
        and the seconds left before the store deadline. None where there is nothing to give
        up (no publish in flight, or not an older one) or nothing known (no estimate yet, no
        deadline)."""
        flight, guess, left = self.flight, estimate(self._took), deadline_left()
        if flight is None or flight.step >= newer or guess is None or left is None:
            return None
        return {
            "step": flight.step,
            "elapsed_s": time.monotonic() - flight.started,
            "estimate_s": guess,
            "deadline_left_s": left,
        }

    def give_up(self, newer: int, figures: Mapping[str, float]) -> bool:
        """Abandon the publish in flight for the snapshot at ``newer``, as the ranks agreed
        on ``figures``; False where it has ended meanwhile (or is another step's)."""
        flight = self.flight
        if flight is None or flight.step != figures["step"]:
            return False
        flight.abandon.ask(
            f"abandoned for the snapshot at step {newer}: the {figures['deadline_left_s']:.1f} "
            f"s before the store deadline hold its publish (at most "
            f"{figures['estimate_s']:.1f} s), not this one's rest before it"
        )
        return True

    def supersede(
        self,
        newer: int,
        margin: float,
        views: Sequence[Mapping[str, float] | None] | None = None,
    ) -> dict[str, float] | None:
        """A newer snapshot, at step ``newer``, waits (a stop's, or one under a store
        deadline): abandon the publish in flight where ``agreed`` says so, on this worker's
        own ``view``, or on every rank's ``views`` (with a process group, gathered by the
        caller). The figures the choice was made on (with ``by``), for the caller's event;
        None where the publish in flight (if any) goes on."""
        figures = agreed([self.view(newer)] if views is None else views, margin)
        if figures is None or not self.give_up(newer, figures):
            return None
        return {**figures, "by": newer}
