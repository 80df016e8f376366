"""Input: a task's synthetic problem as a tf.data pipeline, and TFRecord input (`--data`)."""
