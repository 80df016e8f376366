"""What a run records at start (contract.RUN_SETTINGS): the settings its speed and optimisation depend
on, so `make compare` can name those that differ between two runs and `make tune` what it changed.
Pure: the config, the replicas and the environment are passed in."""

from __future__ import annotations

from collections.abc import Mapping

from trainer.cluster import server_config

ALLOCATOR_ENV = "GLIBC_TUNABLES"
THREAD_POOLS = {"intraop_threads": "TF_NUM_INTRAOP_THREADS", "interop_threads": "TF_NUM_INTEROP_THREADS"}
"""RUN_SETTINGS label -> the variable TensorFlow sizes that thread pool from (`make tune`'s SCRIPT=
candidates, server_config.PROCESS_SETTINGS)."""


def allocator(env: Mapping[str, str]) -> str:
    """`tuned` when the process runs with server_config.ENVIRONMENT's allocator settings, `stock` without
    any, `custom` for others: the value names the setting, not its long tunables string."""
    value = env.get(ALLOCATOR_ENV, "")
    if not value:
        return "stock"
    return "tuned" if value == server_config.ENVIRONMENT[ALLOCATOR_ENV] else "custom"


def process(env: Mapping[str, str]) -> dict[str, str]:
    """The process settings a run's speed depends on: the allocator, and each thread pool's size where
    one is set (empty where TensorFlow sizes it itself, as a run from before these labels reads)."""
    return {"allocator": allocator(env), **{label: env.get(name, "") for label, name in THREAD_POOLS.items()}}


def of_config(config, replicas: int, env: Mapping[str, str]) -> dict[str, str]:
    """The built-in loop's settings, as RUN_SETTINGS labels."""
    return {
        "task": config.task,
        "world_size": str(replicas),
        "per_replica_batch": str(config.per_replica_batch),
        "learning_rate": f"{config.learning_rate:g}",
        "bytes_per_pack": str(config.bytes_per_pack),
        "allreduce_dtype": config.allreduce_dtype,
        "allreduce_mode": config.allreduce_mode,
        "steps_per_call": str(config.steps_per_call),
        "measure_every": str(config.measure_every),
        "input_delay_ms": f"{config.input_delay_ms:g}",
        **process(env),
    }


def of_script(script: str, env: Mapping[str, str]) -> dict[str, str]:
    """A SCRIPT= run's: its name and what the wrapper controls (the rest is the script's own)."""
    return {"task": script, **process(env)}
