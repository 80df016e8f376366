"""The split of a step, sampled: a short profiler window every period, parsed in this process.

The profiler is started and stopped only between two calls of the step function, on the thread
that calls it (the hooks call `boundary()` before each call): started from a background thread
while collectives ran, it crashed workers here (SIGSEGV, SIGABRT). So a window holds whole calls,
exactly those the host timed in between. A background thread decides when a window is due (first
after WARM_CALLS calls, then every `period`), asks for its start and stop, and parses the trace
(trace.py) into the recorder's ratios: each part's seconds per traced call over the host's seconds
per call of the same calls. A window holding fewer than MIN_CALLS calls is lengthened for the next
(up to MAX_WINDOW_S). With `check`, windows run back to back and all are summed as the reference (a
near-full trace of the same steps) while only those at the period set the ratios.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

import trainer.observe.trace as trace
from trainer.observe.config import ObserveConfig
from trainer.observe.record import Ratios, Recorder

log = logging.getLogger(__name__)
MIN_CALLS = 3
MAX_WINDOW_S = 20.0
WARM_CALLS = 3
PARTS = ("compute", "allreduce", "input")
"""Calls seen before the first window: the first calls trace and compile the function."""


def PROFILER_OPTIONS():  # noqa: N802 (a constant, built late: it needs TensorFlow)
    """Host ops only: no Python tracer, no device tracer (the split needs neither)."""
    import tensorflow as tf

    return tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=0
    )


@dataclass(frozen=True)
class Window:
    parts: trace.Parts
    host_seconds: float
    host_calls: int

    def ratios(self) -> Ratios | None:
        if self.parts.calls < 1 or not self.host_calls or self.host_seconds <= 0:
            return None
        host_per_call = self.host_seconds / self.host_calls
        per_call = lambda x: x / self.parts.calls / host_per_call  # noqa: E731
        return Ratios(
            compute=per_call(self.parts.compute),
            allreduce=per_call(self.parts.allreduce),
            input=per_call(self.parts.input),
        )


@dataclass(frozen=True)
class Traced:
    logdir: str
    first_call: int
    """Index of the first host call the window holds; it holds them up to the stop's index."""
    last_call: int
    due: bool


class Sampler:
    def __init__(self, recorder: Recorder, config: ObserveConfig) -> None:
        self.recorder = recorder
        self.config = config
        self.window_s = config.window_s
        self.reference = Window(trace.Parts(), 0.0, 0)
        self.sampled = Window(trace.Parts(), 0.0, 0)
        self.compared = dict.fromkeys(("step", *PARTS), 0.0)
        """Exported seconds of the calls in the reference windows (check mode)."""
        self._stop = threading.Event()
        self._traced: queue.Queue[Traced | None] = queue.Queue()
        self._open: tuple[str, int, bool] | None = None
        """(logdir, first call, due) of the window being traced; touched on the calling thread only."""
        self._deadline = float("inf")
        self._next = 0.0
        self._last_applied = -float("inf")
        self._thread = threading.Thread(target=self._parse_loop, name="observe-sampler", daemon=True)
        if config.period_s > 0:
            recorder.boundary = self.boundary

    def start(self) -> None:
        if self.config.period_s > 0:
            self._thread.start()

    def boundary(self) -> None:
        """Between two calls, on the calling thread: close a window that is over, open one that is due."""
        if self.recorder.marks.seen and not self.config.check:
            return  # every step is marked: no profiler needed (check mode traces as the reference)
        now = time.monotonic()
        if self._open and now >= self._deadline:
            self._close_window()
            if self.config.check:
                self._open_window(now, due=now >= self._next)
        elif not self._open and self.recorder.calls_seen() >= WARM_CALLS and now >= self._next:
            self._open_window(now, due=True)

    def _open_window(self, now: float, due: bool) -> None:
        import tensorflow as tf

        logdir = tempfile.mkdtemp(prefix="observe-")
        try:
            tf.profiler.experimental.start(logdir, options=PROFILER_OPTIONS())
        except Exception as err:  # noqa: BLE001 (another profiler session: the user's own, or make profile)
            shutil.rmtree(logdir, ignore_errors=True)
            self.recorder.say_once("profiler", "observe: profiler busy (%s): split not sampled now", err)
            self._next = now + self.config.period_s
            return
        if due:
            self._next = now + self.config.period_s
        self._open = (logdir, self.recorder.calls_total(), due)
        self._deadline = now + self.window_s

    def _close_window(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()
        logdir, first, due = self._open
        self._open = None
        self._traced.put(Traced(logdir, first, self.recorder.calls_total(), due))

    def close(self) -> None:
        if self._open:
            self._close_window()
        self._traced.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        log.info("%s", self.recorder.summary())
        if self.config.check:
            print("observe-check:", json.dumps(self.check_result()), flush=True)

    def _parse_loop(self) -> None:
        while (traced := self._traced.get()) is not None:
            try:
                self._use(traced)
            except Exception:  # noqa: BLE001 (a trace we cannot read costs one sample, not the run)
                log.exception("observe: could not parse a profiler window")
            finally:
                shutil.rmtree(traced.logdir, ignore_errors=True)

    def _use(self, traced: Traced) -> None:
        events = trace.xspace_events(trace.latest_xplane(traced.logdir), sorted(self.recorder.functions))
        host = self.recorder.calls_since(traced.first_call, traced.last_call)
        window = Window(trace.split(events), sum(c.seconds for c in host), len(host))
        if window.parts.calls < MIN_CALLS:
            per_call = window.host_seconds / window.host_calls if window.host_calls else self.window_s
            self.window_s = min(MAX_WINDOW_S, max(self.window_s, (MIN_CALLS + 1) * per_call))
        if self.config.check and _comparable(window, host):
            self.reference = _sum(self.reference, window)
            for part in PARTS:
                self.compared[part] += sum(getattr(c.split, part) for c in host)
            self.compared["step"] += window.host_seconds
        ratios = window.ratios()
        if not (traced.due and ratios) or self.recorder.marks.seen:
            return
        self.recorder.set_ratios(ratios)
        self.sampled = _sum(self.sampled, window)
        log.info(
            "observe: split sampled over %d calls: compute %.0f%%, all-reduce %.0f%%, "
            "input wait %.0f%% of the step",
            window.parts.calls,
            100 * ratios.compute,
            100 * ratios.allreduce,
            100 * ratios.input,
        )

    def check_result(self) -> dict:
        """The exported split of the calls the reference windows hold whole, next to the trace's."""
        totals = self.compared
        step = totals["step"] or float("nan")
        ref = self.reference
        per_host = ref.host_calls / ref.host_seconds if ref.parts.calls and ref.host_seconds else float("nan")
        share = lambda x: x / ref.parts.calls * per_host if ref.parts.calls else float("nan")  # noqa: E731
        return {
            "exported": {k: totals[k] / step for k in PARTS},
            "reference": {k: share(getattr(ref.parts, k)) for k in PARTS},
            "reference_calls": ref.parts.calls,
            "host_calls": self.recorder.calls_total(),
            "samples": self.sampled.parts.calls,
            "pid": os.getpid(),
        }


def _comparable(window: Window, host: list) -> bool:
    """The trace holds every host call of the window, each exported with a split (none traced)."""
    return bool(host) and window.parts.calls == len(host) and all(c.split and not c.traced for c in host)


def _sum(a: Window, b: Window) -> Window:
    return Window(a.parts + b.parts, a.host_seconds + b.host_seconds, a.host_calls + b.host_calls)
