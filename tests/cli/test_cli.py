"""The command a newcomer meets: one clear line and exit 2 for every mistake they can make, a traceback and
"this is a bug" for anything else, and the defects found by trying it as a new user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from drainpipe import cli
from drainpipe.cli import EXIT_BUG, EXIT_USER, build_parser, main
from drainpipe.pipeline.store import open_store
from testlib import T0


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture
def store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A store holding two days of events of one service (10:00 on 2026-11-21 and 2026-11-22)."""
    records = [
        {"ts": T0 + day * 86_400_000 + i * 60_000, "service": "svc", "latency_ms": 10.0 + i}
        for day in (0, 1)
        for i in range(3)
    ]
    url = f"duckdb:///{tmp_path}/s.duckdb"
    code, _, err = run(capsys, "run", "-q", "--input", write_jsonl(tmp_path / "e.jsonl", records), "--store", url)
    assert code == 0, err
    return url


def test_query_on_a_store_that_does_not_exist_says_so_and_creates_nothing(tmp_path, capsys) -> None:
    code, out, err = run(capsys, "query", "--store", f"duckdb:///{tmp_path}/missing.duckdb")
    assert code == EXIT_USER and out == ""
    assert err.startswith("drainpipe: error: no such store") and err.count("\n") == 1
    assert not (tmp_path / "missing.duckdb").exists()


def test_unknown_metric_or_topn_names_the_stored_ones(store, capsys) -> None:
    code, _, err = run(capsys, "query", "--store", store, "--metric", "service_cmp")
    assert code == EXIT_USER and "no metric named 'service_cmp'" in err and "service_cpm" in err
    code, _, err = run(capsys, "query", "--store", store, "--topn", "top_slow")
    assert code == EXIT_USER and "no top-N named 'top_slow'" in err and "top_slow_statements" in err
    code, out, _ = run(capsys, "query", "--store", store, "--metric", "service_cpm")
    assert code == 0 and "service_cpm" in out


def test_negative_limit_is_refused(store, capsys) -> None:
    code, out, err = run(capsys, "query", "--store", store, "--limit", "-2")
    assert code == EXIT_USER and out == "" and "--limit: must be >= 0, got -2" in err
    code, out, _ = run(
        capsys,
        "query",
        "--store",
        store,
        "--metric",
        "service_cpm",
        "--granularity",
        "minute",
        "--limit",
        "2",
        "--format",
        "csv",
    )
    assert code == 0 and len(out.splitlines()) == 3  # header + 2


def test_to_a_date_means_the_whole_day(store, capsys) -> None:
    args = ("query", "--store", store, "--metric", "service_cpm", "--granularity", "minute", "--format", "json")
    code, out, _ = run(capsys, *args, "--to", "2026-11-21")
    buckets = [r["time_bucket"] for r in json.loads(out)]
    assert code == 0 and buckets == ["2026-11-21T10:00:00Z", "2026-11-21T10:01:00Z", "2026-11-21T10:02:00Z"]
    code, out, _ = run(capsys, *args, "--from", "2026-11-22", "--to", "2026-11-22T10:01:00Z")
    assert [r["time_bucket"] for r in json.loads(out)] == ["2026-11-22T10:00:00Z", "2026-11-22T10:01:00Z"]


@pytest.mark.parametrize("command", ["query", "run", "generate", "stream", "serve", "demo"])
def test_every_option_has_help_text(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
    missing = [a.option_strings for a in sub._actions if a.option_strings and not a.help]
    assert not missing, missing


def _strict_json(text: str) -> object:
    def refuse(token: str) -> object:
        raise ValueError(f"non-standard JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_absurd_latencies_are_rejected_and_json_output_is_always_standard(tmp_path, capsys) -> None:
    records = [
        {"ts": T0, "service": "svc", "latency_ms": 1e308},
        {"ts": T0, "service": "svc", "latency_ms": 1e308},
        {"ts": T0, "service": "svc", "latency_ms": 20.0},
    ]
    url = f"duckdb:///{tmp_path}/big.duckdb"
    code, out, _ = run(capsys, "run", "-q", "--input", write_jsonl(tmp_path / "big.jsonl", records), "--store", url)
    assert code == 0 and "accepted 1 + rejected 2" in out
    code, out, _ = run(capsys, "query", "--store", url, "--metric", "service_resp_time", "--format", "json")
    assert code == 0 and {r["value"] for r in _strict_json(out)} == {20.0}  # type: ignore[union-attr]
    # a stored non-finite value (from an older build) is rendered as null, never as Infinity
    s = open_store(url)
    s.backend.execute("UPDATE metric_values SET value = 'inf'::DOUBLE")  # type: ignore[attr-defined]
    s.close()
    code, out, _ = run(capsys, "query", "--store", url, "--metric", "service_resp_time", "--format", "json")
    assert code == 0 and {r["value"] for r in _strict_json(out)} == {None}  # type: ignore[union-attr]


def test_csv_without_a_header_row_is_one_clear_error(tmp_path, capsys) -> None:
    path = tmp_path / "no-header.csv"
    path.write_text(f"{T0},svc,,,1.5,true,\n{T0},svc,,,2.5,true,\n")
    code, out, err = run(capsys, "run", "-q", "--input", str(path), "--store", f"duckdb:///{tmp_path}/c.duckdb")
    assert code == EXIT_USER and err.count("\n") == 1
    assert "lacks the column(s) ts, service, latency_ms" in err


def test_generate_mistakes_name_the_options(tmp_path, capsys) -> None:
    code, _, err = run(capsys, "generate", "--events", "-5", "-o", str(tmp_path / "x.jsonl"))
    assert code == EXIT_USER and "--events: must be >= 0, got -5" in err and "n >= 0" not in err
    code, _, err = run(capsys, "generate", "--services", "0", "-o", str(tmp_path / "x.jsonl"))
    assert code == EXIT_USER and "--services must be >= 1" in err
    code, _, err = run(capsys, "generate", "--events", "5", "-o", str(tmp_path / "nodir" / "x.jsonl"))
    assert code == EXIT_USER and "does not exist" in err and "no such file" not in err


def test_postgresql_errors_name_the_url_once_without_the_password(capsys) -> None:
    code, _, err = run(capsys, "query", "--store", "postgresql://u:secret@127.0.0.1:1/db")
    assert code == EXIT_USER and err.count("postgresql://") == 1 and "secret" not in err


def test_a_rerun_that_applies_nothing_says_so(tmp_path, capsys) -> None:
    records = [{"ts": T0 + i, "service": "svc", "latency_ms": 1.0} for i in range(50)]
    args = (
        "run",
        "-q",
        "--input",
        write_jsonl(tmp_path / "e.jsonl", records),
        "--store",
        f"duckdb:///{tmp_path}/r.duckdb",
    )
    code, out, _ = run(capsys, *args)
    assert code == 0 and "events/s" in out and "nothing new" not in out
    code, out, _ = run(capsys, *args)
    assert code == 0 and "nothing new: every input was already stored" in out and "events/s" not in out


def test_a_bug_prints_the_traceback_and_says_it_is_a_bug(monkeypatch, capsys) -> None:
    def broken(args: object) -> int:
        raise KeyError("internal")

    monkeypatch.setattr(cli, "cmd_query", broken)
    code, _, err = run(capsys, "query")
    assert code == EXIT_BUG and "Traceback" in err and "KeyError" in err and "this is a bug in drainpipe" in err


def test_a_value_error_from_a_bug_is_not_mistaken_for_a_user_error(monkeypatch, capsys) -> None:
    def broken(args: object) -> int:
        raise ValueError("a bug's ValueError")

    monkeypatch.setattr(cli, "cmd_query", broken)
    code, _, err = run(capsys, "query")
    assert code == EXIT_BUG and "Traceback" in err


def test_demo_writes_where_git_ignores_it() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["demo"]  # type: ignore[union-attr]
    out = next(a for a in sub._actions if a.dest == "out").default
    assert out == os.path.join(".drainpipe", "demo")
    ignored = (Path(__file__).resolve().parents[2] / ".gitignore").read_text().split()
    assert ".drainpipe/" in ignored


def test_a_relative_duckdb_path_that_was_meant_absolute_gets_the_four_slashes_hint(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the relative reading (tmp/...) does not exist here; the absolute one does
    absolute = tmp_path / "x.duckdb"
    code, _, err = run(capsys, "query", "--store", f"duckdb://{absolute}")  # three slashes + an absolute path
    assert code == EXIT_USER and f"use four slashes: duckdb:///{absolute}" in err and err.count("\n") == 1
    code, _, err = run(capsys, "query", "--store", "duckdb:///nowhere/x.duckdb")  # no absolute reading either
    assert code == EXIT_USER and "four slashes" not in err


def test_query_help_shows_the_duckdb_url_convention(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    assert "duckdb:////absolute/path.duckdb (four slashes)" in " ".join(capsys.readouterr().out.split())


def test_the_run_command_tunes_its_own_process_and_leaves_a_calling_program_alone(tmp_path, capsys) -> None:
    """The ``drainpipe run`` process (the console script: no argv) hides pandas, which pyarrow would import (0.16 s,
    35 MB) just to ask whether a value is a pandas object, turns transparent huge pages off, and at its end freezes
    its objects out of the collections the interpreter runs at exit; the same results. ``main(argv)`` from a program
    leaves the program's imports and collector alone. It also asks for one OpenBLAS thread before numpy is imported."""
    import gc
    import importlib.util

    records = [{"ts": T0 + i * 1000, "service": f"s{i % 3}", "latency_ms": 1.0 + i, "status": i % 5 != 0}
               for i in range(500)]  # fmt: skip
    path = write_jsonl(tmp_path / "e.jsonl", records)
    program = (
        "import gc, os, sys\nimport drainpipe.processes as p\ntuned = []\nreal = p.tune_own_process\n"
        "p.tune_own_process = lambda: (tuned.append('numpy' in sys.modules), real())\n"
        "from drainpipe.cli import main\nrc = main()\nprint('pandas loaded:', 'pandas' in sys.modules)\n"
        "print('frozen:', gc.get_freeze_count() > 0)\nprint('numpy before tuning:', tuned)\n"
        "print('blas threads:', os.environ.get('OPENBLAS_NUM_THREADS'))\n"
        "print(open('/proc/self/status').read())\nsys.exit(rc)"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    outputs = {}
    for name in ("a", "b"):
        url = f"duckdb:///{tmp_path / name}.duckdb"
        if name == "a":
            done = subprocess.run([sys.executable, "-c", program, "run", "--input", path, "--store", url, "-q"],
                                  capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert "pandas loaded: False" in done.stdout and "frozen: True" in done.stdout
            # one OpenBLAS thread, asked for before numpy starts its threads
            assert "numpy before tuning: [False]" in done.stdout and "blas threads: 1" in done.stdout
            if "THP_enabled" in done.stdout:  # Linux: no transparent huge pages for the run's processes
                assert re.search(r"THP_enabled:\s*0", done.stdout)
        else:
            frozen = gc.get_freeze_count()
            assert main(["run", "--input", path, "--store", url, "-q"]) == 0
            assert importlib.util.find_spec("pandas") is not None  # still importable here
            assert gc.get_freeze_count() == frozen
        store = open_store(url)
        try:
            outputs[name] = store.query()
        finally:
            store.close()
    assert outputs["a"] == outputs["b"] and len(outputs["a"]) > 0


@pytest.mark.parametrize("command", ["serve", "consume"])
def test_the_live_commands_take_arrows_buffers_from_the_system_allocator(tmp_path, command) -> None:
    """``serve`` and ``consume``, in a process of their own, set Arrow's pool to the system allocator before their
    helpers start (they inherit the variable); a pool the user chose stays. They hide pandas, which pyarrow's first
    conversion of a Python value would import (48 MB of PSS). ``serve`` shortens the switch interval to 1 ms (its
    connection loop waits for the GIL at most that long); ``consume`` keeps the interpreter's 5 ms."""
    program = (
        "import os, sys\nimport drainpipe.processes as p\nreal = p.tune_live_process\n"
        "def tune(*args):\n    print('pyarrow before:', 'pyarrow' in sys.modules)\n    real(*args)\n    import pyarrow\n"
        "    print('switch interval:', sys.getswitchinterval())\n"
        "    print('pool:', pyarrow.default_memory_pool().backend_name,"
        " os.environ['ARROW_DEFAULT_MEMORY_POOL'])\n    pyarrow.scalar(0, pyarrow.int64())\n"
        "    print('pandas loaded:', 'pandas' in sys.modules)\n    sys.exit(7)\n"
        "p.tune_live_process = tune\nfrom drainpipe.cli import main\nsys.exit(main())"
    )
    store = f"duckdb:///{tmp_path / 's.duckdb'}"
    args = {"serve": ["serve", "--store", store, "--port", "0"],
            "consume": ["consume", "--store", store, "--bootstrap-servers", "127.0.0.1:1", "--topic", "t",
                        "--group", "g"]}[command]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120,
                          env=env)  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert "pyarrow before: False" in done.stdout and "pool: system system" in done.stdout
    assert "pandas loaded: False" in done.stdout
    assert f"switch interval: {0.001 if command == 'serve' else 0.005}" in done.stdout
    done = subprocess.run([sys.executable, "-c", program, *args], capture_output=True, text=True, timeout=120,
                          env={**env, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"})  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert "pool: mimalloc mimalloc" in done.stdout


def test_compact_deletes_what_the_retention_no_longer_keeps(store, capsys) -> None:
    """The fixture's store holds minutes of 2026-11-21 and 2026-11-22: a day later, with minute rows kept one day,
    the first day's minutes go (and only they); hour and day rows stay."""

    def minutes() -> set[str]:
        code, out, _ = run(capsys, "query", "--store", store, "--metric", "service_cpm", "--granularity", "minute",
                           "--format", "csv")  # fmt: skip
        assert code == 0
        return {line.split(",")[3][:10] for line in out.splitlines()[1:]}

    assert minutes() == {"2026-11-21", "2026-11-22"}
    code, out, err = run(
        capsys, "compact", "--store", store, "--retention", "minute=1d", "--now", "2026-11-23T00:00:00Z"
    )
    assert code == 0, err
    assert "retention: minute 1d, hour 90d, day 800d, topn 7d" in out and "metric_values" in out
    assert minutes() == {"2026-11-22"}
    code, out, _ = run(capsys, "query", "--store", store, "--metric", "service_cpm", "--granularity", "day")
    assert "2026-11-21" in out
    code, _, err = run(capsys, "compact", "--store", store, "--retention", "minute=1y")
    assert code == EXIT_USER and "expected a duration" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--kafka-config", "no.such.setting=1"],
            'kafka consumer settings: No such configuration property: "no.such.setting"',
        ),
        (["--kafka-config", "novalue"], "--kafka-config takes KEY=VALUE, not 'novalue'"),
        (["--session-timeout-s", "0"], "--session-timeout-s must be > 0"),
    ],
)
def test_consume_refuses_bad_settings_in_one_line(tmp_path, capsys, extra: list[str], message: str) -> None:
    import threading

    threads = threading.active_count()
    code, _, err = run(capsys, "consume", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--group", "g",
                       "--store", f"duckdb:///{tmp_path / 's.duckdb'}", *extra)  # fmt: skip
    assert code == EXIT_USER and err.strip().splitlines() == [f"drainpipe: error: {message}"], err
    assert threading.active_count() == threads  # nothing started is left running (an engine's threads were)


def test_kafka_encodings_and_the_stream_input_are_checked_in_one_place_each(capsys) -> None:
    """Both Kafka commands offer exactly the encodings the decoder reads; ``stream`` takes a directory or topics."""
    from drainpipe.inputs.messages import ENCODINGS

    parser = build_parser()
    for command in ("consume", "stream"):
        sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
        [encoding] = [a for a in sub._actions if a.dest == "encoding"]
        assert tuple(encoding.choices) == ENCODINGS, command
    for argv in (["--input", "d", "--bootstrap-servers", "h:1", "--topic", "t"], ["--bootstrap-servers", "h:1"],
                 ["--input", "d", "--topic", "t"], []):  # fmt: skip
        assert main(["stream", "--checkpoint", "ck", *argv]) == EXIT_USER
        assert "stream reads either --input DIR or --bootstrap-servers with --topic" in capsys.readouterr().err
    assert main(["stream", "--checkpoint", "ck", "--bootstrap-servers", "h:1", "--topic", "t", "--max-messages", "-1"]
                ) == EXIT_USER  # fmt: skip
    assert "--max-messages must be 0 (no bound) or more" in capsys.readouterr().err


def test_the_live_commands_load_no_parquet_reader_and_no_snappy() -> None:
    """``serve`` and ``consume`` never read Parquet, and write snappy only for ``--remote-write``: the libraries load
    at their first use, not with the commands (10 MB and 3 MB of each process's PSS, against the live path's memory
    budgets); a Parquet file is still read where one is given (the format's own tests)."""
    code = (
        "import sys\n"
        "import drainpipe.kafka.member, drainpipe.server.service\n"  # (what the commands run: every input format)
        "print(all(m in sys.modules for m in ('drainpipe.inputs.formats.parquet_format',"
        " 'drainpipe.pipeline.remote_write')))\n"
        "print(sorted(m for m in ('pyarrow.parquet', 'pyarrow.fs', 'cramjam') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split("\n")[:2] == ["True", "[]"], done.stdout + done.stderr
