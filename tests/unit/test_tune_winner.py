"""make tune's winner file over an earlier one (monitoring/tune/winner.py), and tune.json's run and
project, which make diagnose checks before it quotes the file (issue 47)."""

from monitoring.tune import winner
from monitoring.tune.table import Row

FIRST = "make tune 2026-12-07 10:00 UTC on run A: ALLREDUCE_DTYPE=bfloat16 1.20x steps/s"
SECOND = "make tune 2026-12-07 11:00 UTC on run B: BYTES_PER_PACK=1048576 1.10x steps/s"


def test_a_second_winner_keeps_the_firsts_other_settings_and_says_what_it_replaces(tmp_path):
    said = []
    winner.write(tmp_path, (("ALLREDUCE_DTYPE", "bfloat16"),), FIRST, True, say=said.append)
    assert said == [], "a first winner replaces nothing"
    winner.write(tmp_path, (("BYTES_PER_PACK", "1048576"),), SECOND, False, say=said.append)
    assert winner.read(tmp_path) == {
        "ALLREDUCE_DTYPE": "bfloat16",
        "BYTES_PER_PACK": "1048576",
        "RESUME_NEW_SETTINGS": "1",  # the kept setting still changes the optimisation
    }
    (line,) = said
    assert f"replaces the winner of {FIRST}" in line and "keeps ALLREDUCE_DTYPE=bfloat16" in line, line
    text = (tmp_path / winner.FILE).read_text()
    assert text.startswith(f"# {SECOND}\n") and f"{winner.EARLIER}{FIRST}" in text
    assert text.splitlines()[-2] == "BYTES_PER_PACK=1048576", "this winner's settings last"


def test_a_winner_that_sets_the_same_setting_says_old_and_new_and_keeps_nothing(tmp_path):
    said = []
    winner.write(tmp_path, (("BYTES_PER_PACK", "1048576"),), SECOND, False, say=said.append)
    winner.write(tmp_path, (("BYTES_PER_PACK", "4096"),), "make tune: 1.1x", False, say=said.append)
    assert winner.read(tmp_path) == {"BYTES_PER_PACK": "4096"}
    assert said == [
        f"tune: {tmp_path / winner.FILE} replaces the winner of {SECOND} (BYTES_PER_PACK 1048576 -> 4096)"
    ]
    assert winner.EARLIER not in (tmp_path / winner.FILE).read_text()


def test_a_winner_that_no_longer_changes_the_optimisation_drops_the_resume_flag(tmp_path):
    said = []
    winner.write(tmp_path, (("ALLREDUCE_DTYPE", "bfloat16"),), FIRST, True, say=said.append)
    winner.write(tmp_path, (("ALLREDUCE_DTYPE", "float32"),), "make tune: 1.1x", False, say=said.append)
    assert winner.read(tmp_path) == {"ALLREDUCE_DTYPE": "float32"}
    assert said[-1].endswith("(ALLREDUCE_DTYPE bfloat16 -> float32; drops RESUME_NEW_SETTINGS=1)"), said


def test_tune_json_names_its_run_and_project(tmp_path):
    import json

    row = Row("BYTES_PER_PACK=1048576", (1.1, 1.2), 10.0, 320.0, {"step": 20.0}, 0.3)
    winner.record(tmp_path, "20261207T1000Z", [row], row, None, 12.0, project="p")
    got = json.loads((tmp_path / winner.RESULT).read_text())
    assert (got["run"], got["project"]) == ("20261207T1000Z", "p")
