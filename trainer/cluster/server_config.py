"""Settings of TensorFlow's in-process gRPC server that MultiWorkerMirroredStrategy starts, and the one
hook that gets them there.

MWMS builds its server from a copy of the eager context's ConfigProto (`context.context().config`,
copied into `ServerDef.default_session_config` by `_initialize_multi_worker` in
collective_all_reduce_strategy.py). That ConfigProto starts from the context's private `_config`:
TF 2.21 has no public setter for the fields below, so `apply` sets `_config` before the strategy is
built, and refuses to run on a TensorFlow it was not checked against (the hook is private and may
move). docs/communication.md has the measurements behind DEFAULT.

    recv_buf_max_chunk       ConfigProto.experimental: the worker cuts each RecvBuf response (one
                             ring chunk of a collective) into protobuf strings of this many bytes;
                             0 = TF's default 4096, -1 = one piece (what DTensor's multi-client
                             setup sets)
    num_channels_per_target  ConfigProto.rpc_options: gRPC channels to each peer; 0 = TF's default 1
"""

from __future__ import annotations

from collections.abc import Mapping

FIELDS = {
    "recv_buf_max_chunk": ("experimental", "recv_buf_max_chunk"),
    "num_channels_per_target": ("rpc_options", "num_channels_per_target"),
}
"""Our short name -> (ConfigProto sub-message, field)."""

DEFAULT: Mapping[str, int] = {}
"""What the trainer and SCRIPT runs use: the bench-comm A/B winner (docs/communication.md). Empty:
no candidate beat TF's stock settings beyond the spread (recv_buf_max_chunk=-1 cost more CPU per
all-reduce: one 25 MB string per ring chunk is a fresh mmap, page-faulted and zeroed every time)."""

ENVIRONMENT: Mapping[str, str] = {
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.trim_threshold=4294967295:"
    "glibc.malloc.top_pad=268435456",
}
"""The process environment every task starts with (compose/deployment.trainer_env on every target,
bench.launch's local tasks): the bench-comm A/B winner (docs/communication.md). glibc's allocator
madvises its memory for transparent huge pages (used when the host's THP mode is `madvise` or
`always`), never trims its heap and grows it 256 MiB at a time, so the all-reduce's fresh buffers stop
being page-faulted and zeroed 4 KiB at a time: page faults per ResNet-50 all-reduce fell from ~165,000
to ~5,500 and CPU per all-reduce by 45-56 %. On the small `cnn`/`mlp` lists (0-4 faults either way)
it was within the spread of stock over 6 interleaved rounds, and the `cnn` job's all-reduce was not
slower. The cost: a task's resident memory stays at its peak.
glibc reads it only at process start (hence not in `apply`); tests/e2e/test_image_layout.py checks
the image's glibc takes every tunable."""

PROCESS_SETTINGS = ("GLIBC_TUNABLES", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")
"""Process variables a run may set for every task (`make tune`'s winner: RUN_DIR/tuned.env gives each as
TRAINER_<NAME>, compose/deployment.process_settings reads it): the allocator over ENVIRONMENT's, and
TensorFlow's thread pools, which it reads from the environment when it creates them. The only
settings a SCRIPT= run's tasks take without editing the script."""

CHECKED_TF = ("2.21.",)
"""TensorFlow versions whose MWMS was read to copy `context.context()._config` into its server."""


def parse(text: str) -> dict[str, int]:
    """`name=value,name=value` (or '' / 'stock' for TF's defaults) -> settings; one line on a bad name."""
    settings: dict[str, int] = {}
    for item in filter(None, text.replace("+", ",").split(",")):
        if item == "stock":
            continue
        name, sep, value = item.partition("=")
        if not sep or name not in FIELDS or not value.lstrip("-").isdigit():
            raise ValueError(
                f"server setting {item!r}: expected NAME=INT with NAME one of {', '.join(FIELDS)}"
            )
        settings[name] = int(value)
    return settings


def label(settings: Mapping[str, int]) -> str:
    """Short name of a setting (0 = TF's default, left out); 'stock' when nothing is set."""
    return "+".join(f"{k}={v}" for k, v in sorted(settings.items()) if v) or "stock"


def apply(settings: Mapping[str, int]) -> None:
    """Put `settings` into the ConfigProto MWMS will copy into its server. Call before the strategy is
    built (afterwards the server already runs with the old values); raises on an unchecked TF."""
    if not settings:
        return
    import tensorflow as tf
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    if not tf.__version__.startswith(CHECKED_TF):
        raise RuntimeError(
            f"trainer.cluster.server_config: TensorFlow {tf.__version__} was not checked (checked: "
            f"{', '.join(CHECKED_TF)}): read how its MultiWorkerMirroredStrategy builds the server's "
            "default_session_config, then extend CHECKED_TF (tests/cluster/test_server_config.py)"
        )
    ctx = context.context()
    if not hasattr(ctx, "_config"):
        raise RuntimeError(
            "trainer.cluster.server_config: context.context()._config is gone from this TensorFlow"
        )
    config = config_pb2.ConfigProto()
    if ctx._config is not None:
        config.CopyFrom(ctx._config)
    for name, value in settings.items():
        part, field = FIELDS[name]
        setattr(getattr(config, part), field, value)
    ctx._config = config


def in_server() -> dict[str, int]:
    """The settings in the running server's configuration (after the strategy started it)."""
    from tensorflow.python.eager import context

    server_def = context.context()._collective_ops_server_def
    if server_def is None:
        return {}
    config = server_def.default_session_config
    return {name: getattr(getattr(config, part), field) for name, (part, field) in FIELDS.items()}
