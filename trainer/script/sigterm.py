"""SIGTERM ends a user's script again once its MultiWorkerMirroredStrategy is built (SCRIPT= runs).

When MWMS starts its multi-worker context, TensorFlow's coordination service registers a C++ SIGTERM
handler, its preemption notifier (tsl's preemption_notifier.cc logs "SIGTERM caught at ..."). It
only records the signal for TensorFlow's own preemption protocol, which neither `model.fit` nor a
custom loop uses, so the script went on training: `docker stop` (`make down`, a restart, a preempted
node) waited out the stop grace (60 s) and the engine's SIGKILL, and a handler the script had set
before building the strategy never ran. A PreemptionCheckpointHandler built afterwards installs its
own Python handler and is unaffected.

`install` wraps the strategy's constructor: once it returns, the Python-level handler Python held
before it is put back (the default for most scripts: terminate, as any Python program does; the
script's own if it set one), replacing TensorFlow's notifier.
"""

from __future__ import annotations

import functools
import logging
import signal
import threading

from trainer.cluster import joining

log = logging.getLogger("trainer.script.sigterm")


def install() -> None:
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

    strategy = mwms.CollectiveAllReduceStrategy
    built = strategy.__init__

    @functools.wraps(built)
    def init(self, *args, **kwargs):
        before = signal.getsignal(signal.SIGTERM)
        with joining.joining():  # the supervisor SIGKILLs a task signalled now: nothing else could end it
            built(self, *args, **kwargs)
        restore(before)

    strategy.__init__ = init


def restore(handler) -> None:
    """Set `handler` for SIGTERM again (it may be TensorFlow's C++ one underneath, which Python does not see)."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return  # set outside Python, or a strategy built off the main thread: signals are not ours to set
    signal.signal(signal.SIGTERM, handler)
    log.info("sigterm: SIGTERM ends the script again (TensorFlow's preemption notifier only records it)")
