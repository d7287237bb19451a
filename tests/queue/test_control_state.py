"""The queue core's explicit control states (``_control_state``), their own unit: every transition drawn is taken,
every other raises, and what each state forbids follows from the states alone (a model beside them, by
hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from drainpipe._control_state import ControlState, ShrinkState, TaskState, TypeState

OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["fail_over", "rejoin"]), st.integers(0, 2)),
        st.tuples(st.sampled_from(["begin_change", "end_change"]), st.sampled_from(["a", "b"])),
        st.tuples(st.sampled_from(["begin_shrink", "end_shrink"]), st.none()),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_transitions_and_what_they_forbid_follow_a_model(ops: list[tuple[str, object]]) -> None:
    state = ControlState()
    failed: set[int] = set()
    changing: set[object] = set()
    dropping = False
    for name, subject in ops:
        legal = {
            "fail_over": subject not in failed,
            "rejoin": subject in failed,
            "begin_change": subject not in changing,
            "end_change": subject in changing,
            "begin_shrink": not dropping,
            "end_shrink": dropping,
        }[name]
        call = getattr(state, name)
        if not legal:
            with pytest.raises(AssertionError, match="is not a transition"):
                call(*(() if subject is None else (subject,)))
            continue
        call(*(() if subject is None else (subject,)))
        if name == "fail_over":
            failed.add(subject)  # type: ignore[arg-type]
        elif name == "rejoin":
            failed.discard(subject)  # type: ignore[arg-type]
        elif name == "begin_change":
            changing.add(subject)
        elif name == "end_change":
            changing.discard(subject)
        else:
            dropping = name == "begin_shrink"
        assert state.failed_over() == tuple(sorted(failed))
        assert all(state.task(t) is (TaskState.FAILED_OVER if t in failed else TaskState.RUNNING) for t in range(3))
        assert all(state.type(t) is (TypeState.CHANGING if t in changing else TypeState.STEADY) for t in "ab")
        assert state.may_plan() == state.may_resize() == (not failed)
        assert state.may_start_shrink() == (not failed and not changing and not dropping)
        assert state.may_drop() == (not changing)


def test_a_fresh_state_forbids_nothing() -> None:
    state = ControlState()
    assert state.may_plan() and state.may_resize() and state.may_start_shrink() and state.may_drop()
    assert state.task(0) is TaskState.RUNNING and state.type("x") is TypeState.STEADY
    assert ShrinkState.IDLE.value != ShrinkState.DROPPING.value
