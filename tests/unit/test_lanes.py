"""tests/lanes.py: the side-by-side stage's lanes, read back from what the workers appended."""

from tests import lanes


def test_units_are_spanned_per_lane_in_the_order_they_started(tmp_path):
    log = tmp_path / "lanes.tsv"
    for row in [
        ("gw1", "tests/e2e/test_b.py", 100.0, 150.0),
        ("gw0", "tests/e2e/test_a.py", 100.0, 130.0),
        ("gw0", "tests/e2e/test_a.py", 130.0, 190.0),
        ("gw0", "tests/cluster/test_c.py", 190.0, 200.0),
        ("gw1", "session-stack", 150.0, 400.0),
    ]:
        lanes.record(*row, log=log)
    got = lanes.spans(log.read_text().splitlines())
    assert got == {
        "gw0": [("tests/e2e/test_a.py", 100.0, 190.0), ("tests/cluster/test_c.py", 190.0, 200.0)],
        "gw1": [("tests/e2e/test_b.py", 100.0, 150.0), ("session-stack", 150.0, 400.0)],
    }
    assert lanes.summary(log.read_text().splitlines()) == [
        "gw0 ends at 100 s: a 0-90, c 90-100",
        "gw1 ends at 300 s: b 0-50, session-stack 50-300",
    ]


def test_no_lines_no_summary():
    assert lanes.summary([]) == []
