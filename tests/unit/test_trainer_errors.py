"""The exit-code contract (trainer/errors.py) that compose's restart policy and `make wait` rely on."""

import subprocess
import sys

import pytest

from trainer import errors


def test_codes_and_classes():
    assert (errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_CONFIG, errors.EXIT_MISSING_PEERS) == (0, 1, 2, 3)
    assert (errors.EXIT_PEER_LOST, errors.EXIT_PREEMPTED) == (200, 201)
    assert errors.PeerLostError.exit_code == 200 and errors.PreemptedError.exit_code == 201
    assert errors.MissingPeersError.exit_code == 3 and errors.ConfigError.exit_code == 2


@pytest.mark.parametrize(
    "code,retryable",
    [
        (0, False),
        (1, False),
        (2, False),
        (3, False),
        (42, False),
        (127, False),
        (128, True),
        (137, True),
        (143, True),
        (200, True),
        (201, True),
        (255, True),
    ],
)
def test_retryable_is_128_to_255(code, retryable):
    # 42 is TensorFlow's own preemption exit: permanent for us, so the trainer never exits with it.
    assert errors.is_retryable(code) is retryable


@pytest.mark.parametrize("code", [2, 201])
def test_exit_now_exits_with_the_code(code):
    script = f"from trainer.__main__ import exit_now; exit_now({code})"
    assert subprocess.run([sys.executable, "-c", script], capture_output=True).returncode == code
