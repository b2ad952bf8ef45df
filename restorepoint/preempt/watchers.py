"""Reclaim-notice watchers: the cloud's warning that a spot VM is about to go (docs/preempt.md).

- AWS: the instance metadata service, with an IMDSv2 session token: ``spot/instance-action``
  (a stop or termination at a stated time, about two minutes ahead: snapshot, then stop) and
  ``events/recommendations/rebalance`` (an elevated risk: snapshot only, keep training).
- GCP: ``instance/preempted`` (long-polled with ``wait_for_change``; about 30 seconds ahead:
  snapshot, then stop) and ``instance/maintenance-event`` (snapshot only), with the
  ``Metadata-Flavor: Google`` header.

The endpoints are configurable, so tests point them at emulators on loopback. Only the standard
library's HTTP client is used: a watcher must not need an extra.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

__all__ = [
    "AWS_ENDPOINT",
    "GCP_ENDPOINT",
    "AwsWatcher",
    "GcpWatcher",
    "Notice",
    "Watcher",
]

log = logging.getLogger("restorepoint.preempt")

AWS_ENDPOINT = "http://169.254.169.254"
GCP_ENDPOINT = "http://metadata.google.internal"
#: GCP gives about 30 seconds between the preemption notice and the shutdown.
GCP_NOTICE_S = 30.0

Kind = Literal["stop", "snapshot"]


@dataclass(frozen=True)
class Notice:
    """A warning from the platform: ``stop`` (snapshot, then stop) or ``snapshot`` (snapshot
    and train on), with the deadline when the platform states one."""

    kind: Kind
    source: str
    received: float
    deadline: float | None
    detail: str

    @property
    def seconds_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.time()


class Watcher:
    """Polls in background threads and puts Notices on ``notices``; ``stop()`` ends it."""

    def __init__(self) -> None:
        self.notices: queue.Queue[Notice] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for target in self._loops():
            t = threading.Thread(target=self._guard, args=(target,), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()

    def _loops(self) -> list[object]:
        return []

    def _guard(self, loop: object) -> None:
        # A metadata service that misbehaves must never take the supervisor down.
        while not self._stop.is_set():
            try:
                loop()  # type: ignore[operator]
                return
            except Exception as exc:
                log.warning("metadata watcher error (retrying): %s", exc)
                self._stop.wait(1.0)


def _http_endpoint(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        from ..errors import UsageError

        raise UsageError(f"a metadata endpoint must be an http(s) URL, not {url!r}")
    return url.rstrip("/")


def _parse_time(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class AwsWatcher(Watcher):
    """EC2 spot: ``spot/instance-action`` and rebalance recommendations, through IMDSv2."""

    def __init__(
        self, endpoint: str = AWS_ENDPOINT, interval: float = 2.0, timeout: float = 2.0
    ) -> None:
        super().__init__()
        self.endpoint = _http_endpoint(endpoint)
        self.interval = interval
        self.timeout = timeout
        self._token: str | None = None
        self._token_expires = 0.0
        self._seen_action: str | None = None
        self._seen_rebalance: str | None = None

    def _loops(self) -> list[object]:
        return [self._poll]

    def _get_token(self) -> str:
        if self._token is None or time.time() > self._token_expires - 60:
            req = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
                f"{self.endpoint}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"},
            )
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                self._token = resp.read().decode().strip()
            self._token_expires = time.time() + 21600
        return self._token

    def _get(self, path: str) -> str | None:
        """The body of a metadata path, or None when it is absent (404)."""
        for _attempt in range(2):
            req = urllib.request.Request(  # noqa: S310 - http(s) only, checked above
                f"{self.endpoint}/latest/meta-data/{path}",
                headers={"X-aws-ec2-metadata-token": self._get_token()},
            )
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                    return str(resp.read().decode())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401:  # the token expired early: get another one
                    self._token = None
                    continue
                raise
        return None

    def check(self) -> list[Notice]:
        out: list[Notice] = []
        now = time.time()
        action = self._get("spot/instance-action")
        if action is not None and action != self._seen_action:
            self._seen_action = action
            try:
                doc = json.loads(action)
            except ValueError:
                doc = {}
            deadline = _parse_time(str(doc.get("time", ""))) if isinstance(doc, dict) else None
            what = doc.get("action", "stop") if isinstance(doc, dict) else "stop"
            out.append(Notice("stop", "aws", now, deadline, f"spot instance-action: {what}"))
        rebalance = self._get("events/recommendations/rebalance")
        if rebalance is not None and rebalance != self._seen_rebalance:
            self._seen_rebalance = rebalance
            out.append(Notice("snapshot", "aws", now, None, "rebalance recommendation"))
        return out

    def _poll(self) -> None:
        while not self._stop.is_set():
            for notice in self.check():
                self.notices.put(notice)
            self._stop.wait(self.interval)


class GcpWatcher(Watcher):
    """GCE preemptible and spot VMs: ``instance/preempted`` and ``instance/maintenance-event``,
    each long-polled with ``wait_for_change``."""

    def __init__(self, endpoint: str = GCP_ENDPOINT, timeout_s: int = 60) -> None:
        super().__init__()
        self.endpoint = _http_endpoint(endpoint)
        self.timeout_s = timeout_s
        # On the instance, not in the loops: a loop restarted after an error must not announce
        # the same preemption or maintenance event a second time.
        self._preempted_fired = False
        self._maintenance_last = "NONE"

    def _loops(self) -> list[object]:
        return [self._preempted, self._maintenance]

    def _wait(self, key: str, etag: str | None, wait: bool) -> tuple[str, str | None]:
        url = f"{self.endpoint}/computeMetadata/v1/instance/{key}"
        if wait:
            url += f"?wait_for_change=true&timeout_sec={self.timeout_s}"
            if etag:
                url += f"&last_etag={etag}"
        req = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})  # noqa: S310
        with urllib.request.urlopen(req, timeout=self.timeout_s + 5) as resp:  # noqa: S310
            return resp.read().decode().strip(), resp.headers.get("ETag")

    def _watch(self, key: str, fire: object) -> None:
        # The first request reads the value as it is: a wait_for_change without an ETag waits
        # for the NEXT change, and would sit out a preemption announced before the watcher
        # started until timeout_s passes, most of the 30 seconds of notice.
        etag = None
        wait = False
        while not self._stop.is_set():
            value, etag = self._wait(key, etag, wait)
            wait = True
            fire(value)  # type: ignore[operator]

    def _preempted(self) -> None:
        def fire(value: str) -> None:
            if value.upper() == "TRUE" and not self._preempted_fired:
                self._preempted_fired = True
                now = time.time()
                self.notices.put(Notice("stop", "gcp", now, now + GCP_NOTICE_S, "preempted"))

        self._watch("preempted", fire)

    def _maintenance(self) -> None:
        def fire(value: str) -> None:
            if value != self._maintenance_last and value.upper() != "NONE":
                self.notices.put(
                    Notice("snapshot", "gcp", time.time(), None, f"maintenance-event: {value}")
                )
            self._maintenance_last = value

        self._watch("maintenance-event", fire)
