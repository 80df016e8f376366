"""TFRecord input for the built-in tasks, and a writer to produce such files from synthetic data.

A record is a tf.train.Example with `x` (float list, the flattened features), `label` (int64) and
`id` (int64). --data is a folder (its `*.tfrecord*` and `*.tfr` files) or a glob. Every pipeline reads
the same stream and keeps its slice of each global batch (synthetic.share): the input position is
one global record offset, so a job resized at a checkpoint goes on with the next record (the price:
every task reads every record; parsing is kept to its own slice). Every epoch the file order and the
records (a shuffle buffer) are shuffled anew from the seed and the epoch, so the stream is the same
on every run and a resume can start at its step's record.

Bad data is one line naming the file and the fault (exit 2): checked up front where it is cheap
(no files, an empty file, not TFRecord, the first record's features not the task's), else found at
the failing record, with the file and the record number, when the input pipeline stops on it.

    python -m trainer.data.records --task mlp --out /tmp/data --files 4
"""

from __future__ import annotations

import argparse
import glob
import logging
import math
import os
from typing import NamedTuple

import tensorflow as tf

from trainer.data import synthetic as data
from trainer.data.synthetic import AUTOTUNE, Synthetic, finish
from trainer.errors import DataError
from trainer.tasks import spec as taskspec

log = logging.getLogger(__name__)
FOLDER_PATTERNS = ("*.tfrecord*", "*.tfr")
SHUFFLE_BUFFER = 4096
# Data faults as the input pipeline raises them: a bad record (DataLoss), a record that does not parse.
DATA_FAULTS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError)


def find(pattern: str) -> list[str]:
    """The TFRecord files --data names: a folder's, or a glob's; DataError when there are none."""
    if os.path.isdir(pattern):
        files = sorted({f for p in FOLDER_PATTERNS for f in glob.glob(os.path.join(pattern, p))})
        if not files:
            others = len(os.listdir(pattern))
            raise DataError(
                f"--data {pattern}: no TFRecord files ({', '.join(FOLDER_PATTERNS)}) in this folder "
                f"(it holds {others} other entries); write some with `python -m trainer.data.records`"
            )
        return files
    files = sorted(f for f in glob.glob(pattern) if os.path.isfile(f))
    if not files:
        raise DataError(f"--data {pattern}: matches no files")
    return files


def features(problem: Synthetic) -> dict[str, tf.io.FixedLenFeature]:
    return {
        "x": tf.io.FixedLenFeature(problem.input_shape, tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }


def record_fault(record: bytes, problem: Synthetic) -> str | None:
    """Why one serialized record is not an example of `problem` (None: it is)."""
    try:
        feature = tf.train.Example.FromString(record).features.feature
    except Exception:  # noqa: BLE001 (protobuf's DecodeError is not importable the same way everywhere)
        return "not a tf.train.Example"
    want = {
        "x": ("float_list", math.prod(problem.input_shape)),
        "label": ("int64_list", 1),
        "id": ("int64_list", 1),
    }
    for name, (kind, count) in want.items():
        if name not in feature:
            return f"no feature {name!r} (it has {', '.join(sorted(feature)) or 'none'}; the task wants x, label, id)"
        if feature[name].WhichOneof("kind") != kind:
            return f"feature {name!r} is a {feature[name].WhichOneof('kind')}, the task wants a {kind}"
        got = len(getattr(feature[name], kind).value)
        if got != count:
            return f"feature {name!r} has {got} values, the task wants {count} (input shape {problem.input_shape})"
    return None


def check(files: list[str], problem: Synthetic) -> None:
    """What can be checked before training, per file: not empty, TFRecord, first record the task's."""
    for path in files:
        if os.path.getsize(path) == 0:
            raise DataError(f"--data: {path}: empty file")
        try:
            first = next(iter(tf.data.TFRecordDataset(path).take(1))).numpy()
        except tf.errors.DataLossError as err:
            raise DataError(f"--data: {path}: not a TFRecord file ({_first_line(err)})") from None
        except StopIteration:
            raise DataError(f"--data: {path}: holds no record") from None
        if fault := record_fault(first, problem):
            raise DataError(f"--data: {path}: record 0: {fault}")


def locate(files: list[str], problem: Synthetic, err: Exception) -> DataError:
    """The failing record, found by reading the files again (only after the pipeline stopped)."""
    for path in files:
        good = 0
        try:
            for record in tf.compat.v1.io.tf_record_iterator(path):
                if fault := record_fault(record, problem):
                    return DataError(f"--data: {path}: record {good}: {fault}")
                good += 1
        except tf.errors.DataLossError as loss:
            return DataError(f"--data: {path}: record {good}: unreadable ({_first_line(loss)})")
    return DataError(
        f"--data: the input pipeline failed ({_first_line(err)}); no bad record found in {len(files)} files"
    )


def _first_line(err: Exception) -> str:
    text = getattr(err, "message", None) or str(err)
    return f"{type(err).__name__}: {(text.splitlines() or [''])[0][:160]}"


class Source(NamedTuple):
    """TFRecord files (a folder or a glob) and the task's data problem their records must match."""

    pattern: str
    problem: Synthetic


def dataset(
    source: Source,
    ctx: tf.distribute.InputContext,
    per_replica_batch: int,
    input_delay_ms: float = 0.0,
    start_example: int = 0,
) -> tf.data.Dataset:
    """This pipeline's share (synthetic.share) of the job's one record stream, from its
    `start_example`-th record on."""
    pattern, problem = source
    files = find(pattern)
    check(files, problem)
    log.info("input: %d TFRecord files, every pipeline its slice of each global batch", len(files))
    first_epoch, offset = divmod(start_example, count(files)) if start_example else (0, 0)

    def epoch(e):
        # The same order on every pipeline (seeds without the pipeline): share() splits each global batch.
        order = tf.random.experimental.stateless_shuffle(
            tf.constant(files), seed=tf.stack([tf.constant(problem.seed, tf.int64), e])
        )
        ds = tf.data.Dataset.from_tensor_slices(order).interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE, deterministic=True
        )
        ds = ds.shuffle(SHUFFLE_BUFFER, seed=problem.seed * 1_000_003 + e)
        return ds.skip(tf.where(tf.equal(e, first_epoch), tf.constant(offset, tf.int64), 0))

    ds = tf.data.Dataset.counter(first_epoch).flat_map(epoch)
    ds = ds.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    spec = features(problem)

    def parse(records):
        ex = tf.io.parse_example(records, spec)
        return ex["x"], ex["label"], ex["id"]

    ds = data.share(ds, ctx, per_replica_batch).map(parse, num_parallel_calls=AUTOTUNE)
    return finish(ds, input_delay_ms)


def count(files: list[str]) -> int:
    """Records per epoch (a full read: only a resume asks, to find its epoch)."""
    count = int(tf.data.TFRecordDataset(files).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    if count == 0:
        raise DataError(f"--data: no records in {', '.join(files)}")
    return count


def write(problem: Synthetic, out_dir: str, num_files: int) -> list[str]:
    x, y, ids = problem.arrays()
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f"part-{k:05d}.tfrecord") for k in range(num_files)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    for j in range(len(ids)):
        ex = tf.train.Example(
            features=tf.train.Features(
                feature={
                    "x": tf.train.Feature(
                        float_list=tf.train.FloatList(value=x[j].astype("float32").ravel())
                    ),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[y[j]])),
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[ids[j]])),
                }
            )
        )
        writers[j % num_files].write(ex.SerializeToString())
    for w in writers:
        w.close()
    return paths


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m trainer.data.records", description="Write synthetic TFRecords"
    )
    p.add_argument("--task", default="mlp", choices=taskspec.names())
    p.add_argument("--out", required=True)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = write(data.problem(args.task, args.seed), args.out, args.files)
    print(f"wrote {len(paths)} files to {args.out}")


if __name__ == "__main__":
    main()
