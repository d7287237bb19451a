"""Web-server access logs: nginx's and Apache's "combined" format with the request time appended.

The log_format lines to use (``docs/pipeline.md``, "Access logs")::

    nginx:   log_format timed '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                              '"$http_referer" "$http_user_agent" $request_time';
    Apache:  LogFormat "%h %l %u %t \\"%r\\" %>s %b \\"%{Referer}i\\" \\"%{User-agent}i\\" %D" timed

The last field is the request time: with a decimal point it is seconds (nginx's ``$request_time``, millisecond
resolution), without one microseconds (Apache's ``%D``). One line is one request of the service given with
``--service``: ts = the line's time, endpoint = method + normalized path (:mod:`..endpoints`), status = HTTP status
< 500, instance empty. A line that does not parse is rejected with a reason (dead letter), and reading goes on.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Sequence

from ...errors import InputError
from ..batches import EventBatch
from ..options import InputOptions
from ..validation import validate_tuples
from .base import LineDecoder, LineFormat

__all__ = ["AccessLog", "decode_access_lines"]

_LINE = re.compile(
    rb'(?P<host>\S+) \S+ (?:\S+|"[^"]*") \[(?P<time>[^\]]+)\] "(?P<request>(?:[^"\\]|\\.)*)" (?P<status>\d{3}) \S+'
    rb' "(?:[^"\\]|\\.)*" "(?:[^"\\]|\\.)*" (?P<rt>\d+(?:\.\d+)?)\s*\Z'
)
_TIME = re.compile(r"(\d{2})/([A-Z][a-z]{2})/(\d{4}):(\d{2}):(\d{2}):(\d{2}) ([+-])(\d{2})(\d{2})\Z")
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}


def _epoch_ms(text: str) -> int | None:
    m = _TIME.fullmatch(text)
    if m is None or m.group(2) not in _MONTHS:
        return None
    day, mon, year, hh, mm, ss = int(m[1]), _MONTHS[m[2]], int(m[3]), int(m[4]), int(m[5]), int(m[6])
    offset = (int(m[8]) * 60 + int(m[9])) * 60 * (1 if m[7] == "+" else -1)
    try:
        seconds = calendar.timegm((year, mon, day, hh, mm, ss, 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    return (seconds - offset) * 1000


def decode_access_lines(
    lines: Sequence[bytes], first_line: int, options: InputOptions
) -> tuple[EventBatch, list[tuple[int, bytes, str]]]:
    """Lines (line ``first_line + 1`` on) -> the canonical batch of their requests and ``(line, raw, reason)`` per
    rejected line. Blank lines are skipped."""
    rows: list[tuple[int, tuple]] = []
    bad: list[tuple[int, bytes, str]] = []
    normalize = options.endpoints.normalize
    service = options.service
    for i, raw in enumerate(lines, first_line + 1):
        line = raw.rstrip(b"\r\n")
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            bad.append((i, raw, "not an access log line"))
            continue
        ts = _epoch_ms(m["time"].decode("ascii", "replace"))
        if ts is None:
            bad.append((i, raw, "bad timestamp: ts"))
            continue
        request = m["request"].decode("utf-8", "backslashreplace").split(" ")
        if len(request) < 2 or not request[0].isalpha():
            bad.append((i, raw, "bad value: request"))
            continue
        rt = m["rt"]
        latency = float(rt) * 1000.0 if b"." in rt else int(rt) / 1000.0
        endpoint = normalize(f"{request[0]} {request[1]}")
        rows.append((i, (ts, service, "", endpoint, latency, int(m["status"]) < 500, None)))
    batch, rejects = validate_tuples(rows)
    by_line = dict(zip(range(first_line + 1, first_line + 1 + len(lines)), lines))
    bad += [(i, by_line[i], reason) for i, reason in rejects]
    return EventBatch.of(batch), sorted(bad, key=lambda r: r[0])


class AccessLog(LineFormat):
    """``.log`` files: one request of ``--service`` per line."""

    name = "access"
    suffixes = (".log",)
    cost_per_byte = 1.5  # a regular expression per line

    def check(self, path: str, options: InputOptions) -> None:
        if not options.service:
            raise InputError(f"{path!r} is an access log: say which service it belongs to with --service NAME")

    def decoder(self, options: InputOptions) -> LineDecoder:
        return lambda lines, first: decode_access_lines(lines, first, options)
