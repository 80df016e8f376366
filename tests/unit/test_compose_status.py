"""`make status`: the per-task table from container states and Prometheus series."""

from __future__ import annotations

from compose import status


def test_table_rows_per_task_in_order() -> None:
    states = {"worker-1": "running", "prometheus": "running", "chief": "exited (0)", "worker-0": "running"}
    values = {"step": {("chief", "0"): 120.0, ("worker", "0"): 118.0}, "steps/s": {("chief", "0"): 2.5, ("worker", "0"): float("nan")},
              "step time": {("chief", "0"): 0.4}, "all-reduce": {("chief", "0"): 0.25},
              "input wait": {("chief", "0"): 0.05}, "checkpoint": {("chief", "0"): 100.0}}
    expr_to_col = {expr: col for col, expr in status.QUERIES.items()}
    rows = status.table(states, lambda expr: values.get(expr_to_col[expr], {}))
    assert rows[0] == status.COLUMNS
    assert rows[1] == ("chief", "exited (0)", "120", "2.50", "0.400 s", "25%", "5%", "100")
    assert [r[0] for r in rows[1:]] == ["chief", "worker-0", "worker-1"]
    assert rows[2][2:4] == ("118", "-")
    assert rows[3][2:] == ("-",) * 6
    text = status.render(rows)
    assert text.splitlines()[0].startswith("task ")


def test_task_keys() -> None:
    assert status.task_key("chief") == ("chief", "0")
    assert status.task_key("worker-12") == ("worker", "12")
    assert status.task_key("prometheus") is None
