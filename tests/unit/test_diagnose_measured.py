"""make diagnose cites what make tune measured on this job (monitoring/verdicts/measured.py)."""

from monitoring.verdicts import measured

ADVICE = (
    "Pack gradients: --bytes-per-pack (with make up, BYTES_PER_PACK=1048576); `make bench-comm` shows the best value.",
    "Compress the gradients: --allreduce-dtype bfloat16 (with make up, ALLREDUCE_DTYPE=bfloat16) halves the bytes.",
)
RESULT = {
    "at": "2026-12-04T08:14:00Z",
    "run": "20261204T0800Z",
    "null": {"ratios": [0.97, 1.03, 1.01]},
    "candidates": [{"name": "BYTES_PER_PACK=1048576", "ratios": [1.12, 1.18, 1.24]}],
    "best": "BYTES_PER_PACK=1048576",
}


def test_a_tried_setting_is_quoted_with_its_figure_on_this_job():
    pack, dtype, null = measured.cite(ADVICE, RESULT, run="20261204T0800Z")
    assert pack.endswith(
        "Measured: BYTES_PER_PACK=1048576: 1.18x (1.12-1.24) steps/s on this job, `make tune` 08:14."
    )
    assert dtype == ADVICE[1]  # not tried: not quoted
    assert "0.97-1.03" in null and "best: BYTES_PER_PACK=1048576" in null


def test_without_a_tune_the_advice_says_make_tune_measures_it():
    assert measured.cite(ADVICE, None) == (*ADVICE, measured.TUNE_HINT)
    assert measured.cite((), None) == ()


def test_an_unreadable_result_is_none(tmp_path):
    (tmp_path / "tune.json").write_text("{")
    assert measured.load(tmp_path / "tune.json") is None
    assert measured.load(tmp_path / "missing.json") is None


def test_make_compares_verdict_is_quoted_while_its_run_is_the_one_diagnosed(tmp_path):
    from monitoring import compare

    text = "20261205T0100Z vs 20261205T0050Z: slower by 31 % beyond the spread, input wait +20.1 ms"
    compare.record(tmp_path / "compare.json", "20261205T0050Z", "20261205T0100Z", {"text": text})
    result = measured.load(tmp_path / "compare.json")
    *_, quoted = measured.compared(ADVICE, result, "20261205T0100Z")
    assert quoted.startswith("`make compare` ") and quoted.endswith(text)
    assert measured.compared(ADVICE, result, "20261205T0200Z") == ADVICE  # another run's compare
    assert measured.compared((), result, "20261205T0100Z") == ()


def test_a_tune_of_another_run_is_said_to_be_of_that_run_not_of_this_job():
    """Issue 47: `make diagnose` quoted any tune.json as "on this job", whatever run it tuned."""
    result = {**RESULT, "run": "20261204T0700Z", "project": "p"}
    pack, _, null = measured.cite(ADVICE, result, run="20261204T0700Z", project="p")
    assert "steps/s on this job" in pack and "on run" not in pack
    pack, _, null = measured.cite(ADVICE, result, run="20261204T0900Z", project="p")
    assert "on this job" not in pack and "on run 20261204T0700Z (not the run diagnosed)" in pack, pack
    assert "2026-12-04 08:14" in pack and "20261204T0700Z" in null, (pack, null)


def test_another_projects_tune_or_compare_is_not_quoted(tmp_path):
    from monitoring import compare

    result = {**RESULT, "run": "20261204T0700Z", "project": "q"}
    assert measured.cite(ADVICE, result, run="20261204T0700Z", project="p") == (*ADVICE, measured.TUNE_HINT)
    compare.record(tmp_path / "compare.json", "A", "20261204T0700Z", {"text": "slower"}, project="q")
    quoted = measured.load(tmp_path / "compare.json")
    assert measured.compared(ADVICE, quoted, "20261204T0700Z", project="p") == ADVICE
    assert measured.compared(ADVICE, quoted, "20261204T0700Z", project="q")[-1].endswith("slower")
