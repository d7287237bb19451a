"""The remote-write sender's options, and the ``--remote-write`` flags of ``run``, ``serve`` and ``consume`` that give
them: apart from the sender (:mod:`.remote_write`), whose protobuf and HTTP imports a command pays only when it
sends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import UsageError

__all__ = ["RemoteWriteOptions", "add_remote_write_options", "remote_write_options"]


@dataclass(frozen=True)
class RemoteWriteOptions:
    """Where and how to send. ``headers``: ``(name, value)`` pairs sent with every request (auth)."""

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    lateness_s: float = 60.0  # a minute is final this long after its end
    max_age_s: float = 3600.0  # minutes that started longer ago are not sent (counted)
    interval_s: float = 5.0  # how often the sending thread looks for final minutes
    max_samples: int = 20_000  # per request (whole minutes: one larger minute goes alone)
    window_minutes: int = 10  # minutes read from the store per query
    timeout_s: float = 10.0


def add_remote_write_options(parser: Any) -> None:
    """The ``--remote-write`` flags of ``serve``, ``consume`` and ``run`` (one definition for the three)."""
    parser.add_argument("--remote-write", metavar="URL",
                        help="send the stored per-minute metrics to this Prometheus remote-write URL (e.g. "
                             "http://prometheus:9090/api/v1/write) once each minute is final")  # fmt: skip
    parser.add_argument(
        "--remote-write-header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header for every remote-write request (repeatable), e.g. 'Authorization: Bearer T'",
    )
    parser.add_argument("--remote-write-lateness-s", type=float, default=60.0, metavar="SECONDS",
                        help="a minute is final (and sent) this long after it ends; events later than that stay "
                             "right in the store and are counted as late (default: %(default)s)")  # fmt: skip
    parser.add_argument("--remote-write-max-age-s", type=float, default=3600.0, metavar="SECONDS",
                        help="minutes older than this are not sent but counted (Prometheus refuses older samples "
                             "unless its out_of_order_time_window allows them) (default: %(default)s)")  # fmt: skip


def remote_write_options(args: Any) -> RemoteWriteOptions | None:
    """The options the flags give (None without ``--remote-write``); a :class:`~drainpipe.errors.UsageError` for
    a bad one."""
    if not args.remote_write:
        if args.remote_write_header:
            raise UsageError("--remote-write-header needs --remote-write")
        return None
    if not args.remote_write.startswith(("http://", "https://")):
        raise UsageError(f"--remote-write must be an http:// or https:// URL, not {args.remote_write!r}")
    headers = []
    for header in args.remote_write_header:
        name, colon, value = header.partition(":")
        if not colon or not name.strip():
            raise UsageError(f"--remote-write-header takes 'NAME: VALUE', not {header!r}")
        headers.append((name.strip(), value.strip()))
    if args.remote_write_lateness_s < 0 or args.remote_write_max_age_s <= 0:
        raise UsageError("--remote-write-lateness-s must be >= 0 and --remote-write-max-age-s > 0")
    return RemoteWriteOptions(args.remote_write, tuple(headers), args.remote_write_lateness_s,
                              args.remote_write_max_age_s)  # fmt: skip
