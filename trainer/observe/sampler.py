"""The split of a step, sampled: a short profiler window every period, parsed in this process.

A thread waits until the step function has run a few calls (tracing done), then every `period`
seconds traces `window` seconds with tf.profiler, parses the trace (trace.py) and sets the
recorder's ratios: each part's seconds per traced call over the host's seconds per call in the
same window. A window that holds fewer than MIN_CALLS whole calls is lengthened for the next one
(up to MAX_WINDOW_S), so slow steps are still sampled. With `check`, windows run back to back and
all of them are summed as the reference (a near-full trace of the same steps) while only those at
the period set the ratios: what the cluster test compares.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass

from trainer.observe import trace
from trainer.observe.config import ObserveConfig
from trainer.observe.record import Ratios, Recorder

log = logging.getLogger(__name__)
MIN_CALLS = 3
MAX_WINDOW_S = 20.0
WARM_CALLS = 3
"""Calls seen before the first window: the first calls trace and compile the function."""


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


class Sampler:
    def __init__(self, recorder: Recorder, config: ObserveConfig) -> None:
        self.recorder = recorder
        self.config = config
        self.window_s = config.window_s
        self.reference = Window(trace.Parts(), 0.0, 0)
        self.sampled = Window(trace.Parts(), 0.0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="observe-sampler", daemon=True)

    def start(self) -> None:
        if self.config.period_s > 0:
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=MAX_WINDOW_S + 10)
        log.info("%s", self.recorder.summary())
        if self.config.check:
            print("observe-check:", json.dumps(self.check_result()), flush=True)

    def _run(self) -> None:
        while self.recorder.calls_seen() < WARM_CALLS:
            if self._stop.wait(0.2):
                return
        last = -float("inf")
        while not self._stop.is_set():
            due = time.monotonic() - last >= self.config.period_s
            if not (due or self.config.check):
                self._stop.wait(min(1.0, self.config.period_s - (time.monotonic() - last)))
                continue
            window = self._one()
            if window is None:
                continue
            if self.config.check:
                self.reference = _sum(self.reference, window)
            if due and (ratios := window.ratios()):
                last = time.monotonic()
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

    def _one(self) -> Window | None:
        import tensorflow as tf

        logdir = tempfile.mkdtemp(prefix="observe-")
        try:
            begin = time.time()
            try:
                tf.profiler.experimental.start(logdir)
            except Exception as err:  # noqa: BLE001 (another profiler session: the user's own, or make profile)
                self.recorder.say_once("profiler", "observe: profiler busy (%s): split not sampled now", err)
                self._stop.wait(self.config.period_s)
                return None
            self._stop.wait(self.window_s)
            tf.profiler.experimental.stop()
            end = time.time()
            events = trace.xspace_events(trace.latest_xplane(logdir), sorted(self.recorder.functions))
        finally:
            shutil.rmtree(logdir, ignore_errors=True)
        host = self.recorder.calls_between(begin, end)
        window = Window(trace.split(events), sum(c.seconds for c in host), len(host))
        if window.parts.calls < MIN_CALLS:
            per_call = window.host_seconds / window.host_calls if window.host_calls else self.window_s
            self.window_s = min(MAX_WINDOW_S, max(self.window_s, (MIN_CALLS + 1) * per_call))
        return window

    def check_result(self) -> dict:
        totals = self.recorder.totals
        step = totals["step"] or float("nan")
        ref = self.reference
        host = ref.host_seconds or float("nan")
        return {
            "exported": {k: totals[k] / step for k in ("compute", "allreduce", "input")},
            "reference": {
                "compute": ref.parts.compute / ref.parts.calls * ref.host_calls / host if ref.parts.calls else None,
                "allreduce": ref.parts.allreduce / ref.parts.calls * ref.host_calls / host if ref.parts.calls else None,
                "input": ref.parts.input / ref.parts.calls * ref.host_calls / host if ref.parts.calls else None,
            },
            "reference_calls": ref.parts.calls,
            "samples": self.sampled.parts.calls,
            "pid": os.getpid(),
        }


def _sum(a: Window, b: Window) -> Window:
    return Window(a.parts + b.parts, a.host_seconds + b.host_seconds, a.host_calls + b.host_calls)
