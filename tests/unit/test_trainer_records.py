"""--data: a folder or a glob of TFRecord files written by `python -m trainer.data.records`, shuffled per
epoch, resumable at any batch; bad data is one line naming the file (and record) and exit 2."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainer  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
import tensorflow as tf

from trainer.data import records
from trainer.data import synthetic as data
from trainer.errors import EXIT_CONFIG, DataError

ROOT = Path(__file__).resolve().parents[2]
MLP = data.problem("mlp", 0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    records.write(data.Synthetic(input_shape=(32,), num_classes=4, num_examples=600, seed=0), str(out), 3)
    return out


def _ctx(i=0, n=1):
    return tf.distribute.InputContext(num_input_pipelines=n, input_pipeline_id=i, num_replicas_in_sync=n)


def _ids(ds, batches):
    return [int(v) for _, _, ids in ds.take(batches) for v in ids.numpy()]


def test_a_folder_is_its_tfrecord_files(folder):
    (folder / "README.txt").write_text("not data")
    assert records.find(str(folder)) == sorted(str(p) for p in folder.glob("*.tfrecord"))
    assert records.find(str(folder / "part-0000[01].tfrecord")) == [
        str(folder / f"part-0000{k}.tfrecord") for k in (0, 1)
    ]


def test_every_epoch_is_each_example_once_in_a_new_order(folder):
    ids = _ids(
        records.dataset(records.Source(str(folder), MLP), _ctx(), per_replica_batch=50), 24
    )  # 2 epochs of 600
    first, second = ids[:600], ids[600:]
    assert sorted(first) == sorted(second) == list(range(600))
    assert first != second, "the same order every epoch"
    assert ids == _ids(records.dataset(records.Source(str(folder), MLP), _ctx(), per_replica_batch=50), 24), (
        "not reproducible"
    )


@pytest.mark.parametrize("start", [0, 5, 13, 30])  # within the first epoch, at the boundary, later epochs
def test_tfrecords_resume_at_any_batch(folder, start):
    whole = _ids(records.dataset(records.Source(str(folder), MLP), _ctx(), per_replica_batch=50), start + 6)
    resumed = _ids(
        records.dataset(
            records.Source(str(folder), MLP), _ctx(), per_replica_batch=50, start_example=start * 50
        ),
        6,
    )
    assert resumed == whole[start * 50 :]


@pytest.mark.parametrize("n", [2, 4])  # fewer and more pipelines than files (3)
def test_tfrecord_pipelines_stay_disjoint_when_resumed(folder, n):
    seen = [
        set(_ids(records.dataset(records.Source(str(folder), MLP), _ctx(i, n), 10, start_example=30 * n), 6))
        for i in range(n)
    ]
    assert all(not (seen[a] & seen[b]) for a in range(n) for b in range(a + 1, n))


@pytest.mark.parametrize("start", [0, 7, 300])
def test_synthetic_resumes_at_any_batch(start):
    whole = _ids(data.synthetic_dataset(MLP, _ctx(1, 2), 32), start + 4)
    resumed = data.synthetic_dataset(MLP, _ctx(1, 2), 32, start_example=start * 64)
    assert _ids(resumed, 4) == whole[start * 32 :]


def _job(read, sizes: list[tuple[int, int, int]]) -> list[int]:
    """The job's stream over segments of (pipelines, per-replica batch, steps), each resumed at the
    offset the previous one reached: per step, the pipelines' batches in pipeline order."""
    out, offset = [], 0
    for n, batch, steps in sizes:
        per = [_ids(read(_ctx(i, n), batch, offset), steps) for i in range(n)]
        for s in range(steps):
            out += [v for p in per for v in p[s * batch : (s + 1) * batch]]
        offset += n * batch * steps
    return out


@pytest.mark.parametrize("keep_global", [True, False])
def test_a_resized_job_sees_every_example_once_per_epoch(folder, keep_global):
    """3 -> 4 -> 2 pipelines across an epoch boundary (600 records): the same stream as one size when
    the global batch is kept (12), else still each example once per epoch."""

    def read(ctx, batch, offset):
        return records.dataset(records.Source(str(folder), MLP), ctx, batch, start_example=offset)

    sizes = [(3, 4, 20), (4, 3, 30), (2, 6, 20)] if keep_global else [(3, 4, 20), (4, 4, 30), (2, 4, 20)]
    resized = _job(read, sizes)
    if keep_global:
        assert resized == _job(read, [(3, 4, 70)])
    epochs = [resized[low : low + 600] for low in range(0, len(resized), 600)]
    assert sorted(epochs[0]) == list(range(600)) and len(set(epochs[1])) == len(epochs[1])


def test_a_user_pipeline_is_skipped_into():
    fn = data.resumed(lambda ctx: tf.data.Dataset.range(100), 70, 7)
    assert int(next(iter(fn(_ctx())))) == 7


def _bad(tmp_path, name: str, content: bytes) -> Path:
    d = tmp_path / "bad"
    d.mkdir(exist_ok=True)
    (d / name).write_bytes(content)
    return d


def _cnn_records(tmp_path) -> Path:
    out = tmp_path / "cnn"
    records.write(data.Synthetic(input_shape=(16, 16, 3), num_classes=4, num_examples=8, seed=0), str(out), 1)
    return out


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda t: t, "no TFRecord files (*.tfrecord*, *.tfr) in this folder"),
        (lambda t: t / "nothing-*.tfrecord", "matches no files"),
        (lambda t: _bad(t, "a.tfrecord", b""), "a.tfrecord: empty file"),
        (
            lambda t: _bad(t, "a.tfrecord", b"not a record file, just some text\n" * 10),
            "a.tfrecord: not a TFRecord file",
        ),
        (
            lambda t: _cnn_records(t),
            "part-00000.tfrecord: record 0: feature 'x' has 768 values, the task wants 32",
        ),
    ],
    ids=["empty folder", "glob of nothing", "empty file", "not TFRecord", "features of another task"],
)
def test_bad_data_is_named_up_front(tmp_path, make, expected):
    with pytest.raises(DataError) as err:
        records.dataset(records.Source(str(make(tmp_path)), MLP), _ctx(), 8)
    assert expected in str(err.value) and "\n" not in str(err.value)


def _corrupt_record(folder: Path, tmp_path: Path, k: int) -> Path:
    """A copy of part-00001 with record k's payload damaged (its CRC no longer matches)."""
    out = tmp_path / "damaged"
    out.mkdir()
    raw = bytearray((folder / "part-00001.tfrecord").read_bytes())
    size = len(raw) // 200  # 200 equal records per file
    raw[k * size + 20] ^= 0xFF
    (out / "part-00001.tfrecord").write_bytes(bytes(raw))
    return out


def test_a_bad_record_is_located(folder, tmp_path):
    bad = _corrupt_record(folder, tmp_path, 57)
    with pytest.raises(tf.errors.DataLossError) as err:
        _ids(records.dataset(records.Source(str(bad), MLP), _ctx(), 10), 100)
    located = str(records.locate(records.find(str(bad)), MLP, err.value))
    assert "part-00001.tfrecord: record 57: unreadable (DataLossError" in located, located


def test_the_trainer_exits_2_with_one_line_at_a_bad_record(folder, tmp_path):
    """The symptom end to end: no traceback, no bare "training failed"."""
    bad = _corrupt_record(folder, tmp_path, 57)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--strategy",
            "mirrored",
            "--metrics-port",
            "0",
            "--data",
            str(bad),
        ],
        cwd=ROOT,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == EXIT_CONFIG, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "training failed" not in proc.stderr, proc.stderr[-3000:]
    assert "part-00001.tfrecord: record 57: unreadable" in proc.stderr.strip().splitlines()[-1]
