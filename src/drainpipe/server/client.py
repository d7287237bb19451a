"""``drainpipe stats``: the dashboard's live view in the terminal (rich), read from a server's ``/v1/stats``."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..errors import StatsError

SPARK = "▁▂▃▄▅▆▇█"
WIDTH = 60  # samples shown in sparklines


def fetch_stats(url: str, token: str | None = None, timeout: float = 5.0) -> dict[str, Any]:
    """GET ``<url>/v1/stats`` as a dict."""
    endpoint = url.rstrip("/") + "/v1/stats"
    request = urllib.request.Request(endpoint, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        hint = " (pass --token or set DRAINPIPE_TOKEN)" if exc.code == 401 else ""
        raise StatsError(f"{endpoint}: HTTP {exc.code} {exc.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise StatsError(f"cannot reach {endpoint}: {reason}") from None
    except ValueError as exc:
        raise StatsError(f"{endpoint}: not a drainpipe stats answer ({exc})") from None


def _num(n: float | None) -> str:
    if n is None:
        return "–"
    a = abs(n)
    if a >= 1e6:
        return f"{n / 1e6:.2f}M"
    if a >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.1f}".rstrip("0").rstrip(".") if isinstance(n, float) else f"{n:,}"


def sparkline(values: list[float], top: float | None = None) -> str:
    if not values:
        return ""
    top = top if top is not None else max(values)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)


def _heat_style(pct: float) -> str:
    u = max(0.0, min(1.0, pct / 100))
    if u < 0.05:
        return "green4"
    if u < 0.25:
        return "green3"
    if u < 0.5:
        return "yellow3"
    if u < 0.75:
        return "dark_orange"
    return "red1"


def _heat_strip(partitions: list[float], width: int = 64) -> Text:
    """One block per partition (max over groups when there are more partitions than ``width``)."""
    if len(partitions) > width:
        size = -(-len(partitions) // width)
        partitions = [max(partitions[i : i + size]) for i in range(0, len(partitions), size)]
    text = Text()
    for pct in partitions:
        text.append("█", style=_heat_style(pct))
    return text


def _duration(s: float) -> str:
    s = int(s)
    h, m = divmod(s, 3600)
    m, sec = divmod(m, 60)
    return (f"{h}h " if h else "") + (f"{m}m " if h or m else "") + f"{sec}s"


def render_stats(view: dict[str, Any]) -> Group:
    """The live view as rich renderables: the same figures as the dashboard."""
    ing, st = view["ingest"], view["store"]
    status = (
        "[yellow]draining[/]"
        if view.get("draining")
        else "[red]store unavailable[/]"
        if not st["available"]
        else "[green]live[/]"
    )
    head = Text.from_markup(
        f"[bold]drainpipe[/] {status}   up {_duration(view['uptime_s'])}   store {view.get('store_url', '')}"
    )
    kpi = Table(box=None, show_edge=False, pad_edge=False)
    for col in (
        "events/s",
        "accepted",
        "rejected",
        "dropped",
        "refused 429/503",
        "store write p50/p99 ms",
        "rebalances",
    ):
        kpi.add_column(col, justify="right")
    kpi.add_row(
        _num(ing["events_per_s"]),
        f"{ing['accepted']:,}",
        f"{ing['rejected']:,}",
        f"{ing['dropped']:,}",
        f"{ing['refused_429']:,}/{ing['refused_503']:,}",
        f"{st['p50_write_ms']}/{st['p99_write_ms']}",
        f"{sum(q['rebalances'] for q in view['queues']):,}",
    )

    heat = Table(box=None, show_header=False, pad_edge=False)
    heat.add_column("queue", style="dim")
    heat.add_column("partitions (green empty → red full)")
    heat.add_column("", justify="right", style="dim")
    for q in view["queues"]:
        heat.add_row(
            q["name"],
            _heat_strip(q["partitions"]),
            f"{len(q['partitions'])} parts {q['used_pct']:.1f}% {len(q['tasks'])} thr",
        )

    history = view.get("history", [])[-WIDTH:]
    marks = view.get("rebalances", [])
    loads = Table(box=None, pad_edge=False)
    loads.add_column("drain thread", style="dim")
    loads.add_column(f"items/s, last {len(history)} s (▼ rebalance)")
    loads.add_column("now", justify="right")
    loads.add_column("parts", justify="right")
    for q in view["queues"]:
        if q["role"] not in ("L1", "L2"):
            continue
        series = [
            [
                (p.get("task_load", {}).get(q["name"]) or [0] * len(q["tasks"]))[k]
                if k < len(p.get("task_load", {}).get(q["name"]) or [])
                else 0
                for p in history
            ]
            for k in range(len(q["tasks"]))
        ]
        top = max((v for s in series for v in s), default=0)
        times = [p["t"] for p in history]
        marker = "".join(
            "▼" if any(r["queue"] == q["name"] and t - 1 < r["at"] <= t for r in marks) else " " for t in times
        )
        loads.add_row(f"{q['name']} ({q['rebalances']} rebalances)", Text(marker, style="yellow"), "", "")
        for k, s in enumerate(series):
            now = q["task_load"][k] if k < len(q["task_load"]) else 0
            loads.add_row(
                f"  thread {k}",
                Text(sparkline(s, top), style="cyan"),
                _num(now),
                str(q["task_partitions"][k]) if k < len(q["task_partitions"]) else "",
            )
    rate = [p.get("events_per_s", 0) for p in history]
    drops = [p.get("drops_per_s", 0) for p in history]
    loads.add_row("ingest events/s", Text(sparkline(rate), style="bright_blue"), _num(ing["events_per_s"]), "")
    loads.add_row("drops/s", Text(sparkline(drops, max(drops + [1])), style="red"), _num(ing["drops_per_s"]), "")

    top = view.get("top_services", {})
    services = Table(
        title=f"busiest services, latest minute {top.get('bucket') or '(no data yet)'}",
        title_justify="left",
        box=None,
        pad_edge=False,
    )
    for i, col in enumerate(top.get("columns", [])):
        label = col[len("service_") :] if i >= 2 and col.startswith("service_") else col
        services.add_column(label, justify="left" if i < 2 else "right")
    for row in top.get("rows", []):
        services.add_row(*(str(v) if i == 0 else (str(v)[11:16] if i == 1 else _num(v)) for i, v in enumerate(row)))

    recent = [
        f"{time.strftime('%H:%M:%S', time.localtime(r['at']))} {r['queue']}: moved {r['moved']} in "
        f"{r['duration_ms']:.2f} ms, max/min {r['ratio_before']} → {r['ratio_after']}"
        for r in marks[-4:]
    ]
    parts: list[Any] = [
        head,
        kpi,
        Panel(heat, title="partition buffers", title_align="left"),
        Panel(loads, title="load", title_align="left"),
        services,
    ]
    if recent:
        parts.append(Text("recent rebalances: " + "; ".join(recent), style="dim"))
    return Group(*parts)


def run_stats(
    url: str, token: str | None = None, *, once: bool = False, interval: float = 1.0, console: Console | None = None
) -> int:
    console = console or Console()
    if once:
        console.print(render_stats(fetch_stats(url, token)))
        return 0
    with Live(render_stats(fetch_stats(url, token)), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            time.sleep(interval)
            try:
                live.update(render_stats(fetch_stats(url, token)))
            except StatsError as exc:
                live.update(Text(f"drainpipe stats: {exc} (retrying)", style="red"))
