"""Metric definitions: the default set, the TOML loader, validation errors and where filters."""

from __future__ import annotations

import contextlib
import io
import pickle
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from drainpipe.pipeline.definitions import (
    DEFAULT_DEFINITIONS,
    DefinitionError,
    Definitions,
    MetricDef,
    TopNDef,
    load_definitions,
    parse_definitions,
    parse_where,
    signature,
)
from testlib import event_batch


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "metrics.toml"
    path.write_text(textwrap.dedent(text))
    return path


def _load_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(DefinitionError) as info:
        load_definitions(_write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------------------------------ default set


def test_default_set_is_exactly_the_contract() -> None:
    metrics = {m.name: m for m in DEFAULT_DEFINITIONS.metrics}
    assert len(metrics) == 16
    for scope in ("service", "instance", "endpoint"):
        assert metrics[f"{scope}_cpm"] == MetricDef(f"{scope}_cpm", scope, "cpm")
        assert metrics[f"{scope}_resp_time"] == MetricDef(f"{scope}_resp_time", scope, "avg", field="latency_ms")
        assert metrics[f"{scope}_sla"] == MetricDef(f"{scope}_sla", scope, "sla")
        assert metrics[f"{scope}_percentile"] == MetricDef(f"{scope}_percentile", scope, "percentile", precision_ms=10)
        assert metrics[f"{scope}_apdex"] == MetricDef(f"{scope}_apdex", scope, "apdex", threshold_ms=500)
    assert metrics["service_error_count"] == MetricDef(
        "service_error_count", "service", "count", where="status == false"
    )
    assert DEFAULT_DEFINITIONS.topns == (TopNDef("top_slow_statements", "service", "db_statement", 10),)
    assert len(DEFAULT_DEFINITIONS) == 17


def test_definitions_are_hashable_picklable_values() -> None:
    copy = pickle.loads(pickle.dumps(DEFAULT_DEFINITIONS))
    assert copy == DEFAULT_DEFINITIONS and hash(copy) == hash(DEFAULT_DEFINITIONS)
    assert DEFAULT_DEFINITIONS.get("service_cpm").function == "cpm"
    with pytest.raises(KeyError):
        DEFAULT_DEFINITIONS.get("nope")
    subset = DEFAULT_DEFINITIONS.select(["service_cpm", "top_slow_statements"])
    assert subset.names == ("service_cpm", "top_slow_statements")


def test_signature_ignores_the_name_and_normalises_where() -> None:
    a = MetricDef("a", "service", "count", where="status==false")
    b = MetricDef("b", "service", "count", where="status  ==  false")
    assert signature(a) == signature(b)
    assert signature(a) != signature(MetricDef("a", "service", "count"))
    assert signature(TopNDef("t")) != signature(TopNDef("t", n=5))


# ------------------------------------------------------------------------------------------ loading


def test_load_the_documented_example(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
        [[metric]]
        name = "service_resp_time"   # unique, [a-z0-9_]+
        scope = "service"
        function = "avg"
        field = "latency_ms"

        [[metric]]
        name = "slow_errors"
        scope = "endpoint"
        function = "count"
        where = 'status == false and latency_ms >= 1000 and db_statement != "x"'

        [[metric]]
        name = "ep_p"
        scope = "endpoint"
        function = "percentile"
        precision_ms = 2.5

        [[metric]]
        name = "inst_apdex"
        scope = "instance"
        function = "apdex"
        threshold_ms = 300

        [[topn]]
        name = "top_slow_statements"
        scope = "service"
        key = "db_statement"
        n = 10
        """,
    )
    definitions = load_definitions(path)
    assert definitions.names == ("service_resp_time", "slow_errors", "ep_p", "inst_apdex", "top_slow_statements")
    assert definitions.get("slow_errors").filter is not None
    assert (
        str(definitions.get("slow_errors").filter) == 'status == false and latency_ms >= 1000 and db_statement != "x"'
    )
    assert definitions.get("ep_p").precision_ms == 2.5


def test_topn_defaults_and_metrics_only_file(tmp_path: Path) -> None:
    definitions = load_definitions(_write(tmp_path, '[[topn]]\nname = "t"\n'))
    assert definitions.topns == (TopNDef("t", "service", "db_statement", 10),)
    assert definitions.metrics == ()


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('function = "avgg"\nfield = "latency_ms"', "unknown function 'avgg'"),
        ('function = "avg"', "function 'avg' needs a field"),
        ('function = "sum"\nfield = "service"', "field 'service' is not numeric"),
        ('function = "max"\nfield = "lat"', "unknown field 'lat'"),
        ('function = "count"\nfield = "latency_ms"', "takes no field"),
        ('function = "apdex"', "apdex needs threshold_ms"),
        ('function = "apdex"\nthreshold_ms = 0', "threshold_ms must be a positive number"),
        ('function = "apdex"\nthreshold_ms = "500"', "threshold_ms must be a positive number"),
        ('function = "percentile"', "percentile needs precision_ms"),
        ('function = "cpm"\nprecision_ms = 10', "precision_ms only applies to percentile"),
        ('function = "count"\nwhere = "status = false"', "bad where 'status = false'"),
        ('function = "count"\nwhere = "colour == 1"', "unknown field 'colour'"),
        ('function = "count"\nwhere = "status < true"', "status can only be compared with == or !="),
        ('function = "count"\nwhere = "latency_ms > \\"x\\""', "latency_ms is numeric"),
        ('function = "count"\nwhere = "service == 3"', "service is a string"),
        ('function = "count"\nwhere = "status == false or status == true"', "expected 'and'"),
        ('function = "count"\nwhere = "status =="', "incomplete clause"),
        ('function = "count"\nwhere = "latency_ms > 1 and"', "incomplete clause"),
        ('function = "count"\ncolour = "red"', "unknown key 'colour'"),
    ],
)
def test_metric_errors_name_the_metric_and_problem(tmp_path: Path, body: str, expected: str) -> None:
    message = _load_error(tmp_path, f'# comment\n[[metric]]\nname = "m1"\nscope = "service"\n{body}\n')
    assert "metrics.toml:2: metric 'm1'" in message
    assert expected in message


def test_unknown_scope(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '[[metric]]\nname = "m"\nscope = "region"\nfunction = "count"\n')
    assert "metric 'm': unknown scope 'region'" in message


def test_line_of_the_failing_table(tmp_path: Path) -> None:
    text = '[[metric]]\nname = "ok"\nscope = "service"\nfunction = "cpm"\n\n[[metric]]\nname = "bad"\nscope = "x"\nfunction = "cpm"\n'
    assert _load_error(tmp_path, text).endswith(
        "metrics.toml:6: metric 'bad': unknown scope 'x' (expected one of service, instance, endpoint)"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[[metric]]\nname = "Bad-Name"\nscope = "service"\nfunction = "cpm"\n', "metric name 'Bad-Name' is invalid"),
        ('[[metric]]\nscope = "service"\nfunction = "cpm"\n', "missing name"),
        ('[[metric]]\nname = "m"\nfunction = "cpm"\n', "metric 'm': missing scope"),
        ('[[metric]]\nname = "m"\nscope = "service"\n', "metric 'm': missing function"),
        (
            '[[metric]]\nname = "m"\nscope = "service"\nfunction = "cpm"\n[[metric]]\nname = "m"\nscope = "service"\nfunction = "count"\n',
            "duplicate name 'm'",
        ),
        ('[[metric]]\nname = "m"\nscope = "service"\nfunction = "cpm"\n[[topn]]\nname = "m"\n', "duplicate name 'm'"),
        ('[[topn]]\nname = "t"\nn = 0\n', "topn 't': n must be an integer >= 1"),
        ('[[topn]]\nname = "t"\nkey = "latency_ms"\n', "topn 't': key must be a string field"),
        ("[[metric]]\nname = \n", "invalid TOML"),
        ("[metrics]\nx = 1\n", "unknown top-level key 'metrics'"),
        ("metric = 3\n", "must be written as [[metric]] tables"),
        ("# nothing\n", "defines nothing"),
        ('defaults = false\n[retention]\nminute = "2d"\n', "defaults = false and no [[metric]] or [[topn]] tables"),
        ("defaults = 1\n", "defaults must be true or false"),
        (
            'defaults = true\n[[metric]]\nname = "service_cpm"\nscope = "service"\nfunction = "count"\n',
            "metric 'service_cpm' has the name of a built-in one",
        ),
        (
            'defaults = true\n[[topn]]\nname = "top_slow_statements"\n',
            "topn 'top_slow_statements' has the name of a built-in",
        ),
    ],
)
def test_file_errors(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _load_error(tmp_path, text)


def test_a_file_with_settings_only_keeps_the_built_in_set(tmp_path: Path) -> None:
    """Turning a switch on does not mean copying the definitions: exemplars, retention or the span mapping alone."""
    exemplars = load_definitions(_write(tmp_path, "[prometheus]\nexemplars = true\n"))
    assert exemplars.metrics == DEFAULT_DEFINITIONS.metrics
    assert exemplars.names == (*DEFAULT_DEFINITIONS.names, "exemplars") and exemplars.spans.trace_ids
    kept = load_definitions(_write(tmp_path, '[retention]\nminute = "2d"\n[[alert]]\nname = "slow"\n'
                                              'metric = "service_resp_time"\nthreshold = 100\n'))  # fmt: skip
    assert kept.all == DEFAULT_DEFINITIONS.all and kept.retention.minute == 2 * 86_400_000
    assert [a.metric for a in kept.alerts] == ["service_resp_time"]  # an alert on a built-in metric


def test_defaults_true_adds_a_files_own_definitions(tmp_path: Path) -> None:
    both = load_definitions(
        _write(
            tmp_path,
            """
        defaults = true
        [[metric]]
        name = "endpoint_slow_calls"
        scope = "endpoint"
        function = "count"
        where = "latency_ms > 1000"
        [[topn]]
        name = "top_slow_endpoints"
        key = "endpoint"
        """,
        )
    )
    assert both.metrics == (*DEFAULT_DEFINITIONS.metrics, MetricDef("endpoint_slow_calls", "endpoint", "count",
                                                                    where="latency_ms > 1000"))  # fmt: skip
    assert both.topns == (*DEFAULT_DEFINITIONS.topns, TopNDef("top_slow_endpoints", key="endpoint"))
    alone = load_definitions(_write(tmp_path, '[[metric]]\nname = "m"\nscope = "service"\nfunction = "cpm"\n'))
    assert alone.names == ("m",)  # tables without defaults = true: the file's own set, as before


def test_the_printed_built_in_set_reads_back_the_same(tmp_path: Path) -> None:
    """``drainpipe definitions`` prints a file to edit: read back, it is the built-in set; so are other sets."""
    from drainpipe.cli import main
    from drainpipe.pipeline import definitions_toml

    path = tmp_path / "printed.toml"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["definitions"]) == 0
    path.write_text(out.getvalue())
    assert load_definitions(path) == DEFAULT_DEFINITIONS
    own = Definitions(
        (MetricDef("a", "endpoint", "percentile", precision_ms=2.5), MetricDef("b", "service", "max", field="latency_ms",
         where='db_statement == "SELECT \\"x\\""')),
        (TopNDef("t", "instance", "endpoint", 3, minutes=5, latency_buckets_ms=(10, 250.5)),),
        retention=DEFAULT_DEFINITIONS.retention.with_overrides({"minute": 36 * 3_600_000, "day": None}),
    )  # fmt: skip
    assert parse_definitions(definitions_toml(own)) == own


def test_bad_toml_reports_the_line(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '[[metric]]\nname = "m"\nscope = service\n')
    assert "invalid TOML" in message and "line 3" in message


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(DefinitionError, match="cannot read metric definitions"):
        load_definitions(tmp_path / "missing.toml")
    (tmp_path / "bin.toml").write_bytes(b"\xff\xfe")
    with pytest.raises(DefinitionError, match="not UTF-8"):
        load_definitions(tmp_path / "bin.toml")


def test_constructing_invalid_definitions_raises() -> None:
    with pytest.raises(DefinitionError, match="unknown function"):
        MetricDef("x", "service", "median")
    with pytest.raises(DefinitionError, match="duplicate name"):
        Definitions((MetricDef("x", "service", "cpm"), MetricDef("x", "service", "count")))
    assert isinstance(DefinitionError("x"), ValueError)
    assert (
        parse_definitions('[[metric]]\nname="a"\nscope="service"\nfunction="min"\nfield="ts"\n').metrics[0].field
        == "ts"
    )


# ------------------------------------------------------------------------------------------ where filters


def _events() -> pa.RecordBatch:
    return event_batch([(0, "a", "", "/x", 1.0, True, "s1"), (60_000, "b", "i", "", 500.0, False, None),
                        (120_000, "a", "i", "/y", 2000.5, False, "s2"), (180_000, 'q"uote', "", "", 10.0, True, None)])  # fmt: skip


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("status == false", [False, True, True, False]),
        ("status != false", [True, False, False, True]),
        ("latency_ms >= 500", [False, True, True, False]),
        ("latency_ms > 500 and status == false", [False, False, True, False]),
        ("latency_ms < 1e3 and latency_ms <= 10", [True, False, False, True]),
        ("ts > 60000", [False, False, True, True]),
        ("ts >= 60000.5", [False, False, True, True]),
        ("service == 'a'", [True, False, True, False]),
        ('service == "q\\"uote"', [False, False, False, True]),
        ("instance != ''", [False, True, True, False]),
        ('db_statement == "s1"', [True, False, False, False]),
        ('db_statement != "s1"', [False, False, True, False]),  # nulls never match
        ('endpoint > "/x"', [False, False, True, False]),
        ("latency_ms > -1", [True, True, True, True]),
    ],
)
def test_where_masks(where: str, expected: list[bool]) -> None:
    mask = parse_where(where).mask(_events())
    assert mask.dtype == np.bool_
    assert mask.tolist() == expected


def test_where_mask_on_chunked_table() -> None:
    table = pa.Table.from_batches([_events(), _events()])
    assert parse_where("status == true").mask(table).tolist() == [True, False, False, True] * 2
