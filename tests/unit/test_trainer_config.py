"""Config: flags over environment over defaults; every bad value names its flag and variable."""

import dataclasses

import pytest

from trainer import config
from trainer.config import Config
from trainer.errors import ConfigError

# Contract: compose files and other engineers set these; renaming one is a breaking change.
CONTRACT_ENV = {
    "TRAINER_STEPS",
    "TRAINER_PER_REPLICA_BATCH",
    "TRAINER_TASK",
    "TRAINER_STRATEGY",
    "TRAINER_METRICS_PORT",
    "TRAINER_CHECKPOINT_DIR",
    "TRAINER_SAVE_EVERY",
    "TRAINER_LOG_EVERY",
    "TRAINER_CLUSTER_TIMEOUT",
    "TRAINER_DATA",
    "TRAINER_INPUT_DELAY_MS",
    "TRAINER_SEED",
    "TRAINER_OUTPUT_DIR",
    "TRAINER_HEARTBEAT_TIMEOUT",
    "TRAINER_BYTES_PER_PACK",
    "TRAINER_LOGDIR",
    "TRAINER_PROFILER_PORT",
}


def test_contract_env_names_exist():
    assert CONTRACT_ENV <= set(config.to_env(Config()))


def test_contract_defaults():
    c = Config()
    assert (c.metrics_port, c.cluster_timeout, c.strategy) == (8000, 300.0, "mwms")


def test_flag_beats_env_beats_default():
    c = config.from_args(["--steps", "5"], {"TRAINER_STEPS": "9", "TRAINER_PER_REPLICA_BATCH": "8"})
    assert (c.steps, c.per_replica_batch, c.task) == (5, 8, "mlp")


def test_round_trip_through_env():
    c = Config(steps=7, task="cnn", input_delay_ms=2.5, checkpoint_dir="/x")
    assert config.from_args([], config.to_env(c)) == c


def test_empty_env_means_default():
    assert config.from_args([], {"TRAINER_STEPS": ""}).steps == Config().steps


@pytest.mark.parametrize(
    "argv, env, names",
    [
        ([], {"TRAINER_STEPS": "ten"}, "TRAINER_STEPS"),
        (["--steps", "0"], {}, "--steps"),
        (["--strategy", "ps"], {}, "--strategy"),
        (["--metrics-port", "70000"], {}, "--metrics-port"),
        (["--cluster-timeout", "0"], {}, "--cluster-timeout"),
        (["--heartbeat-timeout", "0.5"], {}, "--heartbeat-timeout"),
        (["--save-every", "-1"], {}, "--save-every"),
        ([], {"TRAINER_BYTES_PER_PACK": "-1"}, "TRAINER_BYTES_PER_PACK"),
        ([], {"TRAINER_INPUT_DELAY_MS": "x"}, "TRAINER_INPUT_DELAY_MS"),
    ],
)
def test_bad_values_name_the_field(argv, env, names):
    with pytest.raises(ConfigError, match=names):
        config.from_args(argv, env)


def test_frozen_and_keyword_only():
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 1
    with pytest.raises(TypeError):
        Config(1)


def test_every_field_documented():
    docs = config.field_docs()
    assert {f.name for f in dataclasses.fields(Config)} == set(docs)
