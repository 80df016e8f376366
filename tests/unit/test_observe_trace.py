"""The split of traced calls from op events (trainer/observe/trace.py): synthetic events with known
answers, including overlapping collectives, an input wait inside a collective and ops outside calls."""

from __future__ import annotations

import pytest

from trainer.observe import trace


def test_interval_algebra():
    assert trace.union([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert trace.clip([(0, 2), (3, 5)], 1, 4) == [(1, 2), (3, 4)]
    assert trace.minus([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert trace.length(trace.minus([(0, 1)], [(0, 1)])) == 0


def test_split_of_two_calls():
    events = [
        (0.0, 10.0, "call:__inference_train_step_7"),
        (0.0, 1.0, "IteratorGetNext"),  # input wait: 1
        (1.0, 5.0, "MatMul"),
        (5.0, 8.0, "CollectiveReduceV2"),  # all-reduce 5..9, two overlapping collectives
        (6.0, 9.0, "CollectiveReduceV2"),
        (9.0, 10.0, "AssignAddVariableOp"),
        (20.0, 30.0, "call:__inference_train_step_7"),
        (22.0, 26.0, "CollectiveReduceV2"),
        (23.0, 24.0, "MultiDeviceIteratorGetNextFromShard"),  # inside the collective: not input
        (40.0, 41.0, "MatMul"),  # outside every call: ignored
        (40.0, 45.0, "CollectiveReduceV2"),
    ]
    parts = trace.split(sorted(events))
    assert parts.calls == 2 and parts.span == pytest.approx(20.0)
    assert parts.allreduce == pytest.approx(4.0 + 4.0)
    assert parts.input == pytest.approx(1.0)
    assert parts.compute == pytest.approx(20.0 - 8.0 - 1.0)


def test_kinds_from_event_names():
    prefixes = ("__inference_train_step_",)
    assert (
        trace._kind("EagerLocalExecute: __inference_train_step_13", prefixes)
        == "call:__inference_train_step_13"
    )
    assert trace._kind("EagerLocalExecute: __inference_other_13", prefixes) is None
    assert trace._kind("while/CollectiveReduceV2:CollectiveReduceV2", prefixes) == "CollectiveReduceV2"
    assert trace._kind("ExecutorState::Process", prefixes) is None
    assert trace._kind(trace.LAUNCH, prefixes) == trace.LAUNCH


def test_an_async_get_next_waits_on_the_iterator_thread():
    """IteratorGetNext is an async kernel: its op event on the executor's thread lasts microseconds,
    the wait for the batch is `IteratorGetNextOp::DoCompute` on the iterator's thread. Read from the
    op event alone, a fit script's slow tf.data map (a 200 ms py_function sleep per batch, traced on
    TF 2.21) was 100 % compute and 0 % input wait, and make diagnose named the chief a straggler."""
    prefixes = ("__inference_train_function_",)
    assert trace._kind("IteratorGetNextOp::DoCompute", prefixes) == "IteratorGetNext"
    assert trace._kind("IteratorGetNextAsOptionalOp::DoCompute", prefixes) == "IteratorGetNextAsOptional"
    events = [
        (0.0, 1.0, "call:__inference_train_function_415"),
        (0.0, 0.0001, "IteratorGetNext"),  # the op event: the kernel starting
        (0.0, 0.8, trace._kind("IteratorGetNextOp::DoCompute", prefixes)),  # the wait
        (0.8, 0.9, "MatMul"),
    ]
    parts = trace.split(sorted(events))
    assert parts.input == pytest.approx(0.8) and parts.compute == pytest.approx(0.2)


def test_no_calls_no_parts():
    assert trace.split([(0.0, 1.0, "MatMul")]) == trace.Parts()


def test_the_collective_counts_the_scheduling_around_it():
    """Its input ready at 2 (the pack's concat ends), the collective runs 3..5, the next op starts at
    6: the step waited 2..6 for it, as the marks count it. An idle gap with no op before the
    collective in the call is not added (nothing says the input was ready then)."""
    events = [
        (0.0, 10.0, "call:__inference_train_function_3"),
        (1.0, 2.0, "ConcatV2"),
        (2.0, 2.0, "Timestamp"),  # a mark is no neighbour
        (3.0, 5.0, "CollectiveReduceV2"),
        (6.0, 7.0, "SplitV"),
        (20.0, 30.0, "call:__inference_train_function_3"),
        (24.0, 25.0, "CollectiveReduceV2"),
    ]
    assert trace.split(sorted(events)).allreduce == pytest.approx(4.0 + 1.0)
