"""The head member ``metrics`` (spec section 4.3): named numbers a restore point records about
the training it holds (a validation loss, an accuracy), for retention by metric (section 19.5).

Metrics are not identity: the gate never compares them and no reader refuses an import because
of what they say. They are still read from a hostile head, so their shape is checked strictly:
bounded in count and name length, names from a small safe alphabet, values finite numbers."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from ..errors import LimitExceeded, MalformedManifest
from .limits import MAX_METRIC_NAME_BYTES, MAX_METRICS, MAX_SAFE_INTEGER

__all__ = ["METRIC_NAME", "check_metrics"]

#: A metric name: safe to print and to put on a command line as it is (Lightning logs names
#: such as ``val_loss`` or ``val/acc``).
METRIC_NAME = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._/-]{0," + str(MAX_METRIC_NAME_BYTES - 1) + r"}\Z"
)


def check_metrics(value: Any) -> dict[str, int | float]:
    """The metrics of a head, checked: an object of at most MAX_METRICS members, each a name
    matching METRIC_NAME mapped to a finite number (an integer within 2**53-1 in magnitude, or a
    float). LimitExceeded for too many; MalformedManifest for anything else."""
    if not isinstance(value, Mapping):
        raise MalformedManifest("metrics must be an object")
    if len(value) > MAX_METRICS:
        raise LimitExceeded(f"{len(value)} metrics; the limit is {MAX_METRICS}")
    if not value:
        raise MalformedManifest("metrics must not be empty (a writer omits the member)")
    out: dict[str, int | float] = {}
    for name, number in value.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise MalformedManifest(
                f"a metric name must be 1 to {MAX_METRIC_NAME_BYTES} letters, digits, "
                "'.', '_', '/' or '-', starting with a letter or digit"
            )
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise MalformedManifest(f"metric {name} must be a number")
        if isinstance(number, int):
            if abs(number) > MAX_SAFE_INTEGER:
                raise MalformedManifest(f"metric {name} is an integer beyond 2**53-1")
        elif not math.isfinite(number):
            raise MalformedManifest(f"metric {name} must be a finite number")
        out[name] = number
    return out
