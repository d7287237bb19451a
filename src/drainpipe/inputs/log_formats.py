"""Access-log formats: an nginx ``log_format`` string or an Apache ``LogFormat`` string compiled into what the
readers need: one regular expression (the same text for Python's ``re`` and for RE2 in pyarrow) with a named group
per variable that feeds an event field, and a program for the C scanner (``drainpipe.native.logscan``) that
reads the same lines the same way.

Variables that feed event fields (``docs/pipeline.md``, "Access logs", has this table for users):

================= ===================================== =============================================================
field             nginx                                 Apache
================= ===================================== =============================================================
``ts``            ``$time_local``, ``$time_iso8601``,   ``%t``, ``%{sec}t``, ``%{msec}t``
                  ``$msec``
``endpoint``      ``$request``, or ``$request_method``  ``%r``, or ``%m`` with ``%U``
                  with ``$request_uri`` / ``$uri``
``latency_ms``    ``$request_time`` (s, a fraction),    ``%D`` (us), ``%T`` / ``%{s}T`` (whole s), ``%{ms}T``,
                  else ``$upstream_response_time``      ``%{us}T``
                  (s; several times add up)
``status``        ``$status`` (< 500 is ok)             ``%>s``, ``%s``
``instance``      ``$hostname``                         ``%v``
================= ===================================== =============================================================

Every other variable is read and ignored; ``-`` is a missing value. Each variable is matched up to the first
character of the literal text that follows it (inside quotes, backslash escapes are skipped over), so a format is
read in one left-to-right pass with no backtracking: the regular expression and the C scanner accept the same
lines and cut them at the same places.

The default format (no ``--log-format``) is "combined" with the request time appended, its unit read off the value
(a decimal point: seconds, nginx's ``$request_time``; none: microseconds, Apache's ``%D``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

__all__ = ["LogFormat", "parse_log_format", "DEFAULT_LOG_FORMAT"]

# roles: what a variable feeds, and how its text is read
TS_CLF = "ts_clf"  # 10/Oct/2000:13:55:36 -0700
TS_ISO = "ts_iso"  # 2000-10-10T13:55:36-07:00
TS_SEC = "ts_sec"  # 971211336 or 971211336.123
TS_MSEC = "ts_msec"  # 971211336123
REQUEST = "request"  # GET /path?query HTTP/1.1
METHOD = "method"
PATH = "path"
STATUS = "status"
SECONDS = "seconds"  # 0.123
WHOLE_SECONDS = "whole_seconds"  # 1
MILLIS = "millis"
MICROS = "micros"
AUTO_TIME = "auto_time"  # a decimal point: seconds; none: microseconds (the default format's last field)
UPSTREAM = "upstream"  # 0.010, 0.020 : 0.005 (seconds, added up)
INSTANCE = "instance"
SKIP = "skip"

_TS_ROLES = (TS_CLF, TS_ISO, TS_SEC, TS_MSEC)
_LATENCY_ROLES = (SECONDS, WHOLE_SECONDS, MILLIS, MICROS, AUTO_TIME)

#: the text each typed role matches (a role not here matches anything up to the next literal's first character)
_D = "[0-9]"  # not \d: Python's re would match any Unicode digit with it, RE2 only ASCII ones
_SHAPES = {
    TS_CLF: rf"{_D}{{2}}/[A-Za-z]{{3}}/{_D}{{4}}:{_D}{{2}}:{_D}{{2}}:{_D}{{2}} [+-]{_D}{{4}}",
    TS_ISO: rf"{_D}{{4}}-{_D}{{2}}-{_D}{{2}}T{_D}{{2}}:{_D}{{2}}:{_D}{{2}}(?:[+-]{_D}{{2}}:{_D}{{2}}|Z)",
    TS_SEC: rf"{_D}+(?:\.{_D}+)?",
    TS_MSEC: rf"{_D}+",
    STATUS: rf"{_D}{{3}}",
    SECONDS: rf"-|{_D}+(?:\.{_D}+)?",
    WHOLE_SECONDS: rf"-|{_D}+",
    MILLIS: rf"-|{_D}+",
    MICROS: rf"-|{_D}+",
    AUTO_TIME: rf"{_D}+(?:\.{_D}+)?",
    UPSTREAM: rf"(?:-|{_D}+(?:\.{_D}+)?)(?:(?:, | : )(?:-|{_D}+(?:\.{_D}+)?))*",
}

_NGINX = {
    "time_local": TS_CLF,
    "time_iso8601": TS_ISO,
    "msec": TS_SEC,
    "request": REQUEST,
    "request_method": METHOD,
    "request_uri": PATH,
    "uri": PATH,
    "document_uri": PATH,
    "status": STATUS,
    "request_time": SECONDS,
    "upstream_response_time": UPSTREAM,
    "hostname": INSTANCE,
}
_NGINX_VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]+)\}|([A-Za-z0-9_]+))")

# Apache: the directive letter (after an optional {arg} and < or >) -> role; None: known, ignored
_APACHE = {
    "t": TS_CLF, "r": REQUEST, "m": METHOD, "U": PATH, "s": STATUS, "D": MICROS, "T": WHOLE_SECONDS, "v": INSTANCE,
    **{c: SKIP for c in "aAbBCefhHiIkLlnoOpPqRSuVXxz^"},
}  # fmt: skip
_APACHE_T_UNITS = {"s": WHOLE_SECONDS, "ms": MILLIS, "us": MICROS}
_APACHE_TIME_ARGS = {"sec": TS_SEC, "msec": TS_MSEC}
_APACHE_DIRECTIVE = re.compile(r"%(?:([<>]?)(?:\{([^}]*)\})?([<>]?)([A-Za-z^%]))")


@dataclass(frozen=True)
class LogFormat:
    """A compiled access-log format. ``fields``: the (group name, role) of each variable that feeds an event field,
    in line order; ``pattern``: the regular expression for a whole line (trailing whitespace allowed), the same text
    for ``re`` and RE2; ``program``: the scanner's steps (``(kind, text)``: ``"lit"`` with the literal, or a role
    with the character that ends its value, ``""`` at the end of the line), and ``quoted``: per step, whether the
    value sits in double quotes (backslash escapes are skipped over). ``text`` is the format as given."""

    text: str
    pattern: str
    fields: tuple[tuple[str, str], ...]
    program: tuple[tuple[str, str], ...]
    quoted: tuple[bool, ...]


def _tokens_nginx(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _NGINX_VAR.finditer(text):
        if m.start() > pos:
            out.append(("lit", text[pos : m.start()]))
        name = m.group(1) or m.group(2)
        out.append((_NGINX.get(name, SKIP), name))
        pos = m.end()
    if pos < len(text):
        out.append(("lit", text[pos:]))
    return out


def _tokens_apache(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    lit = ""
    while pos < len(text):
        i = text.find("%", pos)
        if i < 0:
            lit += text[pos:]
            break
        lit += text[pos:i]
        m = _APACHE_DIRECTIVE.match(text, i)
        if m is None:
            raise InputError(f"--log-format: cannot read the directive at {text[i : i + 8]!r}")
        pos = m.end()
        arg, letter = m.group(2), m.group(4)
        if letter == "%":
            lit += "%"
            continue
        if letter == "t" and arg is not None:
            role = _APACHE_TIME_ARGS.get(arg)
            if role is None:
                raise InputError(f"--log-format: %{{{arg}}}t is not a time drainpipe reads (use %t, %{{sec}}t or "
                                 "%{msec}t)")  # fmt: skip
        elif letter == "T" and arg is not None:
            role = _APACHE_T_UNITS.get(arg)
            if role is None:
                raise InputError(f"--log-format: %{{{arg}}}T has no unit drainpipe knows (s, ms or us)")
        elif letter in _APACHE:
            role = _APACHE[letter]
        else:
            raise InputError(f"--log-format: unknown Apache directive %{letter}")
        if lit:
            out.append(("lit", lit))
            lit = ""
        out.append((role, letter))
    if lit:
        out.append(("lit", lit))
    # %t carries its own brackets: [10/Oct/2000:13:55:36 -0700]
    fixed: list[tuple[str, str]] = []
    for kind, value in out:
        if kind == TS_CLF:
            fixed += [("lit", "["), (kind, value), ("lit", "]")]
        else:
            fixed.append((kind, value))
    return _merge_literals(fixed)


def _merge_literals(tokens: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, value in tokens:
        if kind == "lit" and out and out[-1][0] == "lit":
            out[-1] = ("lit", out[-1][1] + value)
        else:
            out.append((kind, value))
    return out


def _unescape(text: str) -> str:
    """The format as written in a config file's quotes: ``\\"`` is ``"``, ``\\t`` a tab."""
    return text.replace('\\"', '"').replace("\\t", "\t")


def _shape(role: str, stop: str, quoted: bool) -> str:
    if role in _SHAPES:
        return _SHAPES[role]
    if role == REQUEST and not quoted:
        return r"[A-Za-z]+ [^ ]*(?: [^ ]*)?" if stop != " " else r"[^ ]*"
    if quoted:
        return r'(?:[^"\\]|\\.)*'
    if stop == "":
        return r".*?"
    return "[^" + re.escape(stop) + "]*" if stop != "\n" else r"[^\n]*"


def parse_log_format(text: str) -> LogFormat:
    """Compile an nginx ``log_format`` string (``$variables``) or an Apache ``LogFormat`` string (``%directives``).

    Raises :class:`~drainpipe.errors.InputError` (one line) for a format drainpipe cannot use: no time, no request
    (``$request``, ``%r``, or a method and a path), no request time, an unknown Apache directive, or two variables
    with no literal text between them (where one ends could not be told)."""
    text = _unescape(text.strip())
    if not text:
        raise InputError("--log-format: the format is empty")
    apache = "%" in text and "$" not in text
    return _compile(text, _tokens_apache(text) if apache else _tokens_nginx(text))


def _compile(text: str, tokens: list[tuple[str, str]]) -> LogFormat:
    roles = [k for k, _ in tokens if k != "lit"]
    if not any(r in _TS_ROLES for r in roles):
        raise InputError("--log-format: no time ($time_local, $time_iso8601, $msec, %t): each line needs one")
    if REQUEST not in roles and not (METHOD in roles and PATH in roles):
        raise InputError("--log-format: no request ($request, %r, or a method and a path): the endpoint comes from it")
    if not any(r in _LATENCY_ROLES or r == UPSTREAM for r in roles):
        raise InputError(
            "--log-format: no request time ($request_time, $upstream_response_time, %D, %T): each request needs "
            "its latency"
        )
    pattern = ["^"]
    fields: list[tuple[str, str]] = []
    program: list[tuple[str, str]] = []
    quoted: list[bool] = []
    seen: dict[str, int] = {}
    in_quotes = False
    for i, (kind, value) in enumerate(tokens):
        if kind == "lit":
            pattern.append(re.escape(value))
            program.append(("lit", value))
            quoted.append(False)
            in_quotes ^= value.count('"') % 2 == 1
            continue
        following = tokens[i + 1] if i + 1 < len(tokens) else ("lit", "")
        if following[0] != "lit":
            raise InputError(f"--log-format: nothing separates {value!r} from the variable after it")
        stop = following[1][:1]
        q = in_quotes and stop == '"'
        role_taken = kind != SKIP and (
            kind in seen
            or (kind in _TS_ROLES and any(r in _TS_ROLES for r in seen))
            or (kind in _LATENCY_ROLES and any(r in _LATENCY_ROLES for r in seen))
        )
        if kind == SKIP or role_taken:  # a second time or latency: read as any other text, ignored
            pattern.append("(?:" + _shape(SKIP, stop, q) + ")")
            program.append((SKIP, stop))
        else:
            seen[kind] = len(fields)
            name = f"f{len(fields)}"
            fields.append((name, kind))
            pattern.append(f"(?P<{name}>{_shape(kind, stop, q)})")
            program.append((kind, stop))
        quoted.append(q)
    pattern.append(r"[ \t\r\n]*$")
    if not _scannable(program, quoted):
        program, quoted = [], []
    return LogFormat(text, "".join(pattern), tuple(fields), tuple(program), tuple(quoted))


#: the roles the C scanner reads (others: the format has no program, and pyarrow reads it)
_SCANNED = {SKIP, TS_CLF, REQUEST, STATUS, SECONDS, WHOLE_SECONDS, MILLIS, MICROS, AUTO_TIME, UPSTREAM, INSTANCE}


def _scannable(program: list[tuple[str, str]], quoted: list[bool]) -> bool:
    """Whether the scanner's greedy pass reads every line as the regular expression does: only roles it knows, a
    request in quotes, and no typed value followed by a character its shape could go on with (the expression would
    backtrack there; the scanner does not)."""
    for i, ((kind, _), q) in enumerate(zip(program, quoted)):
        if kind == "lit":
            continue
        if kind not in _SCANNED or (kind == REQUEST and not q):
            return False
        after = program[i + 1][1] if i + 1 < len(program) else ""
        if kind in _SHAPES and (after[:1].isdigit() or after[:1] in (".", "-") or after.startswith((", ", " : "))):
            return False
    return True


#: the format read when none is given: "combined" with the request time appended, its unit read off the value
DEFAULT_LOG_FORMAT = _compile(
    "(combined + request time)",
    _tokens_nginx(
        '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
        '"$http_user_agent" '
    )  # fmt: skip
    + [(AUTO_TIME, "request_time")],
)
