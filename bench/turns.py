"""Modes of one benchmark, run in turns inside one process (`make bench` (a)-(d)).

Each mode is a function that works for ever and calls `turn()` after every chunk of work (one call
of k steps); it runs in its own thread, and only the mode holding the turn runs. The scheduler gives
the modes one turn each in a fixed order, so every task of a cluster runs the same collectives in
the same order, and times each turn. Why turns of one call (~0.5 s) and not a whole mode at a
time: this machine's speed moves by up to 2x from one second to the next with nothing of ours
running (its two vCPUs share a core; docs/measurements.md), so modes timed one after another for
seconds each measured the machine. A mode whose loop keeps state across calls (the trainer's
Controller timing one call in four) keeps it across turns, which a restarted loop per turn would not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

Mode = Callable[[Callable[[], None]], None]
"""A mode: called once with `turn`, works for ever, calling `turn()` after each chunk."""


class Stop(Exception):
    """Raised out of `turn()` when the schedule is over: it ends the mode's loop at a chunk boundary."""


class Turns:
    def __init__(self, modes: dict[str, Mode]) -> None:
        self._cond = threading.Condition()
        self._owner: str | None = None  # the mode running now; None: the scheduler
        self._stopping = False
        self._error: BaseException | None = None
        self._ended: set[str] = set()
        self._threads = [
            threading.Thread(target=self._run, args=(name, mode), name=f"turns-{name}", daemon=True)
            for name, mode in modes.items()
        ]
        for t in self._threads:
            t.start()

    def turn(self, name: str) -> float:
        """Let `name` run one chunk; its seconds. A mode's failure is raised here."""
        with self._cond:
            start = time.perf_counter()
            self._owner = name
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._owner is None)
            seconds = time.perf_counter() - start
        if self._error is not None:
            raise self._error
        if name in self._ended:
            raise RuntimeError(f"bench mode {name!r} returned: a mode must run until it is stopped")
        return seconds

    def close(self) -> None:
        """Stop every mode at its turn point and wait for the threads."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join()

    def __enter__(self) -> Turns:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait(self, name: str) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._owner == name or self._stopping)
            if self._owner != name:
                raise Stop

    def _give_back(self, name: str) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify_all()
        self._wait(name)

    def _run(self, name: str, mode: Mode) -> None:
        try:
            self._wait(name)
            mode(lambda: self._give_back(name))
        except Stop:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the scheduler, raised by turn()
            self._error = e
        with self._cond:
            self._ended.add(name)
            if self._owner == name:
                self._owner = None
            self._cond.notify_all()
