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


@pytest.mark.parametrize("error,code", [("PreemptedError", 201), ("PeerLostError", 200), ("ConfigError", 2)])
def test_a_retryable_failure_exits_before_the_loops_objects_are_freed(tmp_path, error, code):
    """What the training loop's frames hold (TensorFlow's datasets, iterators, collectives) is freed when
    the traceback is: after a lost peer or a preemption that teardown waited for peers already gone (a
    `make down` took 20-40 s in 5 of 9 tries). A retryable exit leaves before it; another exit frees them."""
    freed = tmp_path / "freed"
    script = f"""
from trainer import errors, run
from trainer.__main__ import exit_now, main

class Held:  # one of the loop's objects, whose teardown would wait
    def __del__(self):
        open({str(freed)!r}, "w").close()

def training(config, spec):
    held = Held()
    raise errors.{error}("the failure")

run.run = training
exit_now(main([], {{}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr[-2000:]
    assert freed.exists() is not errors.is_retryable(code), done.stderr[-2000:]
