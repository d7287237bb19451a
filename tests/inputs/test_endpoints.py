"""Endpoint normalization: id segments become {id} (integers, UUIDs, long hex), the user's rules come first (the
first match wins), the query string goes; the TOML keys are validated; the span mapping is configurable."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from drainpipe.errors import DefinitionError
from drainpipe.inputs.endpoints import EndpointRules
from drainpipe.pipeline.definitions import parse_definitions

METRIC = '[[metric]]\nname = "a"\nscope = "service"\nfunction = "cpm"\n'


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("GET /users/42", "GET /users/{id}"),
        ("GET /orders/42/items/7?x=1", "GET /orders/{id}/items/{id}"),
        ("/files/3f2b8c4e-1d2a-4b6c-9e8f-0a1b2c3d4e5f", "/files/{id}"),
        ("POST /blob/deadbeefcafebabe1234", "POST /blob/{id}"),
        ("GET /blob/deadbeef", "GET /blob/deadbeef"),  # short hex: a word, not an id
        ("GET /v2/users", "GET /v2/users"),
        ("checkout", "checkout"),
        ("GET /", "GET /"),
    ],
)
def test_id_segments(raw: str, normalized: str) -> None:
    assert EndpointRules().normalize(raw) == normalized


def test_rules_first_and_ids_switch() -> None:
    rules = EndpointRules((("^GET /static/.*", "GET /static/*"), (r"^(\w+) /api/v\d+/", r"\1 /api/")), ids=False)
    assert rules.normalize("GET /static/js/app.123.js") == "GET /static/*"
    assert rules.normalize("PUT /api/v3/users/9") == "PUT /api/users/9"  # ids off: 9 stays
    assert pickle.loads(pickle.dumps(rules)).normalize("GET /static/x") == "GET /static/*"


@given(st.lists(st.sampled_from(["users", "42", "a1", "ffffffffffffffff0", "x"]), max_size=6))
def test_normalizing_twice_changes_nothing(segments: list[str]) -> None:
    rules = EndpointRules()
    once = rules.normalize("GET /" + "/".join(segments))
    assert rules.normalize(once) == once


def test_toml_keys() -> None:
    d = parse_definitions('endpoint_ids = false\n' + METRIC + '[[endpoint_rule]]\npattern = "^a"\ntemplate = "b"\n'
                          '[spans]\nendpoint = ["http.target"]\nrequest_kinds = ["server"]\n')  # fmt: skip
    assert d.endpoints == EndpointRules((("^a", "b"),), False)
    assert d.spans.endpoint == ("http.target",) and d.spans.request_kinds == ("server",)
    for bad, needle in (
        ('[[endpoint_rule]]\npattern = "("\ntemplate = "x"\n', "regular expression"),
        ('[[endpoint_rule]]\npattern = "a"\n', "pattern and template"),
        ('[spans]\nrequest_kinds = ["server", "nope"]\n', "unknown kind"),
        ('[spans]\nservice = "service.name"\n', "list of attribute names"),
        ("[spans]\ncolour = []\n", "unknown key"),
    ):
        with pytest.raises(DefinitionError, match=needle):
            parse_definitions(METRIC + bad)
