"""Alerts of ``drainpipe serve``: the rules of the metrics TOML (``[[alert]]``, :mod:`drainpipe.pipeline.alerts`)
evaluated on the store every ``every_s``, and their firing and resolved notifications posted as JSON to a webhook.

* :class:`Alerter` (one thread) reads, per rule, the stored values of its latest complete periods and compares each
  matching entity's standing with the last: a new breach *fires*, the end of one *resolves*. Each transition is a
  notification, kept in a short history (the dashboard and ``/v1/stats`` show it with the alerts firing now) and
  handed to the notifier. A failed store read is logged and tried again next period.
* :class:`WebhookNotifier` (one thread) posts notifications in order, one at a time: a failed post (connection
  refused, timeout, an answer other than 2xx) is retried with exponential backoff (``retry_initial_s`` doubling up to
  ``retry_max_s``) until it is delivered or older than ``give_up_s``; then it is counted as given up and logged.
  The next notification waits behind it, so a receiver that comes back gets firing before resolved.

The body of a notification::

    {"status": "firing" | "resolved", "alert": "checkout slow", "entity": "checkout", "value": 312.5,
     "time_bucket": "2026-11-24T10:05:00Z", "since": "2026-11-24T10:03:00Z", "at": "2026-11-24T10:06:20Z",
     "rule": {"name": ..., "metric": "service_resp_time", "op": ">", "threshold": 250.0, "for": 3,
              "granularity": "minute", "entity": "checkout*", "label": ""}}

``value`` is that of the latest complete period (null when nothing was stored for it), ``since`` the start of the
first breaching period of a firing alert.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from typing import Any

from ..errors import StoreError, StoreUnavailable
from ..pipeline import AlertRule, complete_buckets, evaluate, parse_time, parse_time_ms, rule_fields

__all__ = ["Alerter", "WebhookNotifier"]

log = logging.getLogger("drainpipe.server")


class WebhookNotifier:
    """Posts notifications to ``url`` in order from its own thread; see the module docstring. ``send`` from any
    thread (never blocks); ``start`` and ``stop`` once."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 30.0,
        give_up_s: float = 3600.0,
        max_pending: int = 10_000,
    ) -> None:
        self.url = url
        self.timeout_s, self.retry_initial_s, self.retry_max_s, self.give_up_s = (
            timeout_s, retry_initial_s, retry_max_s, give_up_s)  # fmt: skip
        self._pending: deque[tuple[float, dict[str, Any]]] = deque()
        if max_pending < 2:  # the head is the note being posted: a full queue drops the oldest one waiting
            raise ValueError(f"max_pending must be at least 2, got {max_pending}")
        self._max_pending = max_pending
        self._cond = threading.Condition()
        self._stopping = False
        self.delivered = self.attempts = self.failed_attempts = self.given_up = self.dropped = 0
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name="drainpipe-webhook", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, notification: dict[str, Any]) -> None:
        with self._cond:
            if len(self._pending) >= self._max_pending:  # a receiver gone for long: keep the newest, and the one
                # being posted (the head: its thread books it when the post ends)
                del self._pending[1]  # (max_pending >= 2)
                self.dropped += 1
            self._pending.append((time.monotonic(), notification))
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                queued_at, notification = self._pending[0]
            delay = self.retry_initial_s
            while not (delivered := self._post(notification)):
                if time.monotonic() - queued_at > self.give_up_s:
                    log.error(
                        "alert webhook: gave up on a %s notification of %r after %.0f s: %s",
                        notification["status"],
                        notification["alert"],
                        self.give_up_s,
                        self.last_error,
                    )
                    break
                with self._cond:
                    if self._cond.wait_for(lambda: self._stopping, delay):
                        return
                delay = min(self.retry_max_s, delay * 2)
            # The books change together, under the lock :meth:`view` takes, and the note's flag last: a view that
            # shows the note delivered (the alerter's, read before this one's) also counts it and has it off the queue.
            with self._cond:
                self._pending.popleft()  # the head is this note: send() drops only notes behind it
                if delivered:
                    self.delivered += 1
                else:
                    self.given_up += 1
            if delivered:
                notification["delivered"] = True

    def _post(self, notification: dict[str, Any]) -> bool:
        self.attempts += 1
        notification["attempt"] += 1  # receivers may see a notification again after a lost answer: dedupe on it
        body = json.dumps({k: v for k, v in notification.items() if k != "delivered"}).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                answer.read()
            return True
        # HTTPError (non-2xx) is a URLError; a broken answer (IncompleteRead, BadStatusLine) an HTTPException
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:
            self.failed_attempts += 1
            self.last_error = str(getattr(exc, "reason", exc) or exc)[:300]
            if self.failed_attempts == 1 or notification["attempt"] == 1:
                log.warning("alert webhook %s failed (retrying with backoff): %s", self.url, self.last_error)
            return False

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def view(self) -> dict[str, Any]:
        """The notifier's books, one consistent snapshot (the dashboard's sampler keeps it for a while)."""
        with self._cond:
            return {"url": self.url, "delivered": self.delivered, "attempts": self.attempts,
                    "failed_attempts": self.failed_attempts, "pending": len(self._pending), "given_up": self.given_up,
                    "dropped": self.dropped, "last_error": self.last_error}  # fmt: skip


class Alerter:
    """Evaluates ``rules`` on ``store`` every ``every_s`` from its own thread; see the module docstring.

    ``clock``: epoch ms of "now" (default the store's clock, which tests replace); ``settle_s``: how long after its
    end a period is evaluated; ``notify``: where notifications go (a :class:`WebhookNotifier`'s ``send``, or None to
    only keep them for the dashboard)."""

    def __init__(
        self,
        rules: tuple[AlertRule, ...],
        store: Any,
        *,
        every_s: float = 30.0,
        settle_s: float = 10.0,
        notify: Callable[[dict[str, Any]], None] | None = None,
        clock: Callable[[], int] | None = None,
        history: int = 100,
    ) -> None:
        self.rules, self.store, self.every_s, self.notify = rules, store, every_s, notify
        self.settle_ms = int(settle_s * 1000)
        self.clock = clock or (lambda: int(store.clock()))
        self.firing: dict[tuple[str, str], dict[str, Any]] = {}  # (rule, entity) -> its firing notification
        self.recent: deque[dict[str, Any]] = deque(maxlen=history)
        self.evaluations = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="drainpipe-alerts", daemon=True)

    def start(self) -> None:
        if self.rules:
            self._thread.start()

    def _run(self) -> None:
        while not self._halt.wait(self.every_s):
            self.evaluate()

    def stop(self) -> None:
        self._halt.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def evaluate(self) -> list[dict[str, Any]]:
        """One evaluation of every rule; the notifications it made (also sent and kept). Called from one thread at a
        time (the alerter's own, or a test's); :meth:`view` may run meanwhile. The store is read without the lock:
        a slow store (a long merge holds it) must not stall the dashboard's sampler, which reads :meth:`view`."""
        now = self.clock()
        with self._lock:
            was_firing = set(self.firing)
        standings = []
        for rule in self.rules:
            buckets = complete_buckets(rule, now, self.settle_ms)
            try:
                rows = self.store.query(rule.metric, granularity=rule.granularity, start=buckets[0], end=buckets[-1])
            except (StoreError, StoreUnavailable) as exc:
                self.last_error = f"{rule.name}: {exc}"
                log.warning("alert %r: reading the store failed (tried again next period): %s", rule.name, exc)
                continue
            stored = [(r[1], parse_time_ms(r[3]), r[4], r[5]) for r in rows]
            firing = [entity for (name, entity) in was_firing if name == rule.name]
            standings.append((rule, buckets, evaluate(rule, stored, buckets, firing)))
        made: list[tuple[dict[str, Any], AlertRule]] = []
        with self._lock:
            for rule, buckets, breaches in standings:
                for b in breaches:
                    key = (rule.name, b.entity)
                    if b.breaching and key not in self.firing:
                        note = self._note("firing", rule, b.entity, b.value, b.bucket_ms, now, buckets[0])
                        self.firing[key] = note
                    elif not b.breaching and key in self.firing:
                        since = self.firing.pop(key)["since"]
                        note = self._note("resolved", rule, b.entity, b.value, b.bucket_ms, now, None)
                        note["since"] = since
                    else:
                        continue
                    made.append((note, rule))
                    self.recent.appendleft(note)
            self.evaluations += 1
        for note, rule in made:
            log.warning("alert %s: %r on %s (%s, value %s)", note["status"], rule.name, note["entity"],
                        rule.describe(), note["value"])  # fmt: skip
            if self.notify is not None:
                self.notify(note)
        return [note for note, _ in made]

    @staticmethod
    def _note(status: str, rule: AlertRule, entity: str, value: float | None, bucket_ms: int, now: int,
              since_ms: int | None) -> dict[str, Any]:  # fmt: skip
        return {"status": status, "alert": rule.name, "entity": entity, "value": value,
                "time_bucket": parse_time(bucket_ms), "since": None if since_ms is None else parse_time(since_ms),
                "at": parse_time(now), "rule": rule_fields(rule), "attempt": 0, "delivered": False}  # fmt: skip

    def view(self) -> dict[str, Any]:
        # Copies, not the notes themselves: the sampler keeps this view while the notifier's thread goes on marking
        # notes delivered, and a kept view must not show a note delivered that its webhook books do not count.
        with self._lock:
            firing = sorted((dict(n) for n in self.firing.values()), key=lambda n: (n["alert"], n["entity"]))
            recent = [dict(n) for n in itertools.islice(self.recent, 50)]
        return {"rules": [rule_fields(r) | {"describe": r.describe()} for r in self.rules],
                "firing": firing, "recent": recent, "evaluations": self.evaluations,
                "error": self.last_error}  # fmt: skip
