"""TFRecord input for the built-in tasks, and a writer to produce such files from synthetic data.

A record is a tf.train.Example with `x` (float list, the flattened features), `label` (int64) and
`id` (int64). Sharding: with at least as many files as input pipelines each pipeline reads its own
files (policy FILE, no wasted reads); otherwise every pipeline reads everything and keeps one
record in N (policy DATA).

    python -m trainer.records --task mlp --out /tmp/data --files 4
"""

from __future__ import annotations

import argparse
import glob
import logging
import os

import tensorflow as tf

from trainer import data, taskspec
from trainer.data import AUTOTUNE, Synthetic, finish

log = logging.getLogger(__name__)


def shard_policy(num_files: int, num_pipelines: int) -> str:
    return "FILE" if num_files >= num_pipelines else "DATA"


def dataset(
    pattern: str,
    problem: Synthetic,
    ctx: tf.distribute.InputContext,
    per_replica_batch: int,
    input_delay_ms: float = 0.0,
) -> tf.data.Dataset:
    files = sorted(glob.glob(pattern))
    if not files:
        raise FileNotFoundError(f"--data {pattern!r} matches no files")
    n, i = ctx.num_input_pipelines, ctx.input_pipeline_id
    policy = shard_policy(len(files), n)
    log.info("input: %d TFRecord files, %d input pipelines: auto-shard policy %s", len(files), n, policy)
    if policy == "FILE":
        ds = tf.data.Dataset.from_tensor_slices(files[i::n])
        ds = ds.interleave(
            tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=AUTOTUNE, deterministic=True
        )
    else:
        ds = tf.data.TFRecordDataset(files).shard(n, i)
    spec = {
        "x": tf.io.FixedLenFeature(problem.input_shape, tf.float32),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }

    def parse(records):
        ex = tf.io.parse_example(records, spec)
        return ex["x"], ex["label"], ex["id"]

    ds = ds.repeat().batch(per_replica_batch, drop_remainder=True)
    return finish(ds.map(parse, num_parallel_calls=AUTOTUNE), input_delay_ms)


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
    p = argparse.ArgumentParser(prog="python -m trainer.records", description="Write synthetic TFRecords")
    p.add_argument("--task", default="mlp", choices=taskspec.names())
    p.add_argument("--out", required=True)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    paths = write(data.problem(args.task, args.seed), args.out, args.files)
    print(f"wrote {len(paths)} files to {args.out}")


if __name__ == "__main__":
    main()
