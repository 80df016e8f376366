"""A resumed job at another world size: the batch and rate policy (trainer/state/resize.py), its one
line, the input offset a manifest records (trainer/data/position.py), and the job's example-id
record (trainer/state/ledger.py)."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from trainer.data import position
from trainer.errors import ConfigError
from trainer.state import ledger, resize


def _sizing(replicas, per, keep="per-replica-batch", reference=None):
    return resize.Sizing(
        replicas=replicas, per_replica_batch=per, reference_batch=reference or per, keep=keep
    )


def test_the_default_keeps_the_per_replica_batch_and_rescales_the_rate():
    now = resize.plan(replicas=4, per_replica_batch=16, keep="per-replica-batch", before=_sizing(3, 16))
    assert (now.global_batch, now.lr_scale) == (64, 4)
    assert resize.rate(0.01, "linear", now) == pytest.approx(0.04)
    assert resize.rate(0.01, "none", now) == 0.01


def test_global_batch_is_split_anew_and_the_rate_stays():
    before = _sizing(3, 16)
    now = resize.plan(replicas=4, per_replica_batch=16, keep="global-batch", before=before)
    assert (now.per_replica_batch, now.global_batch, now.lr_scale) == (12, 48, 3)
    # ... and again from the resized checkpoint: still the first segment's global batch
    again = resize.plan(replicas=2, per_replica_batch=16, keep="global-batch", before=now)
    assert (again.per_replica_batch, again.global_batch) == (24, 48)


def test_a_global_batch_that_does_not_divide_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        resize.plan(replicas=5, per_replica_batch=16, keep="global-batch", before=_sizing(3, 16))
    assert "global batch 48 does not divide over 5 replicas" in str(err.value)
    assert "\n" not in str(err.value)


def test_a_new_job_takes_the_flag():
    assert resize.plan(replicas=3, per_replica_batch=8, keep="global-batch", before=None) == _sizing(
        3, 8, "global-batch"
    )


def test_the_change_line_says_size_batch_rate_and_step():
    before, now = _sizing(3, 16), _sizing(4, 16)
    line = resize.change(before, now, 120, (0.03, 0.04))
    assert line == (
        "resized at step 120: 3 -> 4 replicas, global batch 48 -> 64 (4 x 16), peak lr 0.03 -> 0.04 "
        "(RESIZE_KEEP=per-replica-batch, warm-up not repeated)"
    )
    assert resize.change(before, before, 120, (0.03, 0.03)) is None


def test_a_manifest_older_than_resizes_gives_its_sizing_and_offset():
    body = {"step": 30, "settings": {"replicas": 2, "per_replica_batch": 16}}
    assert resize.saved(body) == _sizing(2, 16)
    assert position.saved_offset(body, 32) == 960
    assert resize.saved({**body, "sizing": _sizing(4, 12, "global-batch", 16).record()}) == _sizing(
        4, 12, "global-batch", 16
    )
    assert position.saved_offset({**body, "input": {"offset": 7}}, 32) == 7


def test_the_offset_moves_by_this_segments_global_batch():
    where = position.Position(step=100, offset=4800, global_batch=64)
    assert where.record(110) == {"offset": 5440}


def _chunks(folder, task, rank, pipelines, spans, per_step, epoch=6):
    book = ledger.Ledger(str(folder), task, rank, pipelines, epoch, since=spans[0][0])
    for start, end, ids in spans:
        out = SimpleNamespace(ids=np.asarray(ids, np.int64))
        assert out.ids.size == (end - start) * per_step
        book(out)
        book.flush(end)


def test_the_ledger_chains_segments_of_any_size_in_training_order(tmp_path):
    # 2 pipelines x 1 example for 2 steps, then 3 pipelines x 1 for 2 steps: 10 ids, epochs of 6
    _chunks(tmp_path, "chief", 0, 2, [(0, 2, [0, 2])], 1)
    _chunks(tmp_path, "worker-0", 1, 2, [(0, 2, [1, 3])], 1)
    for rank, ids in enumerate([[4, 1], [5, 2], [0, 3]]):
        _chunks(tmp_path, f"t{rank}", rank, 3, [(2, 4, ids)], 1)
    ids, last, epoch = ledger.stream(str(tmp_path))
    assert ids.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3] and (last, epoch) == (4, 6)
    assert ledger.problems(ids, epoch) == []
    assert ledger.problems(np.array([0, 1, 1, 3, 4, 5]), 6) == [
        "epoch 0: 1 examples repeated",
        "epoch 0: 1 examples missing",
    ]


def test_a_resume_drops_the_chunks_it_trains_again_and_a_gap_is_an_error(tmp_path):
    _chunks(tmp_path, "chief", 0, 1, [(0, 2, [0, 1]), (2, 4, [2, 3])], 1)
    assert ledger.forget_after(str(tmp_path), 2) == ["000000004-000000002-chief.json"]
    assert ledger.stream(str(tmp_path))[1] == 2
    _chunks(tmp_path, "chief", 0, 1, [(3, 4, [3])], 1)
    with pytest.raises(ledger.LedgerError, match="steps 2..3 are in no chunk"):
        ledger.stream(str(tmp_path))


def test_a_missing_task_is_an_error(tmp_path):
    _chunks(tmp_path, "chief", 0, 2, [(0, 1, [0])], 1)
    with pytest.raises(ledger.LedgerError, match="pipelines \\[0\\], want 0..1"):
        ledger.stream(str(tmp_path))


def test_the_cli_prints_one_line_with_the_digest(tmp_path, capsys):
    _chunks(tmp_path / ledger.FOLDER, "chief", 0, 1, [(0, 3, [2, 0, 1])], 1, epoch=3)
    assert ledger.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ledger: steps 0..3, 3 examples, 1.00 epochs of 3, each example once per epoch")
    assert ledger.digest(np.array([0, 1, 2])) in out
    assert json.loads((tmp_path / ledger.FOLDER / "000000003-000000000-chief.json").read_text())["to"] == 3
