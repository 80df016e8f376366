"""Why is the cluster slow? The verdict from one snapshot of per-task figures: pure, no I/O.

The one definition of the verdicts: thresholds, codes, names and advice. `make diagnose`
(monitoring/diagnose.py) fills `TaskSample`s from Prometheus and calls `diagnose`; `make rules`
(monitoring/rules/rulegen.py) generates from this module the recording rules that compute the same codes
in PromQL for the dashboards, the alerts and their prose, and the promtool tests, which run the
cases of monitoring/verdicts/cases.py that the Python tests also run. Priority (the higher code
wins, both per task and for the cluster):

    7 down > 6 stuck > 5 stalled > 4 mismatch > 3 straggler > 2 input-bound > 1 communication-bound > 0 healthy

Per task, communication-bound means "this task spends most of its step in all-reduce"; the cluster
is communication-bound only when every task does (otherwise someone is making the others wait).
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field

import contract
from trainer.host import observe_config

# Thresholds: the generated rules, alerts and dashboards read these; nothing else writes them.
INPUT_SHARE = 0.2
"""Input wait above this share of step time: the input pipeline cannot feed the replica."""
ALLREDUCE_SHARE = 0.5
"""All-reduce above this share of step time on every task: communication dominates."""
STRAGGLER_RATIO = 1.5
"""Compute time above this multiple of the others' (the median task once the slowest is set aside):
a straggler. Setting the slowest aside makes 1.5x mean the same with 2 tasks as with 20."""
STALL_SECONDS = 120.0
"""No step for this long while not done: stalled."""
STUCK_RECENT = 600.0
"""A task its supervisor ended as stuck (SUPERVISE_STALL, trainer/supervise/supervisor.py) this many seconds ago
or less is `stuck`: the task named, not the whole job, as long as the restart is news."""

SEVERITY = (
    "healthy",
    "communication-bound",
    "input-bound",
    "straggler",
    "mismatch",
    "stalled",
    "stuck",
    "down",
)
"""The verdicts from least to most severe. A verdict's code is its position here, so the worst of
several verdicts is the largest code: `diagnose` takes the max in Python, the generated rules with
PromQL's `max by` (which is why the codes are numbers). Reorder here and both follow."""
HEALTHY, COMMUNICATION, INPUT, STRAGGLER, MISMATCH, STALLED, STUCK, DOWN = range(len(SEVERITY))
NO_DATA, FINISHED = -1, -2
"""Not verdicts on the training: nothing to judge, or nothing left to judge."""
NAMES = {**dict(enumerate(SEVERITY)), NO_DATA: "no-data", FINISHED: "finished"}
PERFORMANCE = (HEALTHY, COMMUNICATION, INPUT, STRAGGLER)
"""Verdicts on a cluster that trains: a build or world-size mismatch anywhere outranks them."""
NAMES_TASKS = (INPUT, STRAGGLER, MISMATCH, STALLED, STUCK, DOWN)
"""Cluster verdicts that name the tasks to blame (communication-bound is every task's, healthy nobody's)."""
EXIT_HEALTHY, EXIT_PROBLEM, EXIT_NO_DATA = 0, 1, 2

ADVICE = {
    HEALTHY: [
        "No verdict's threshold is crossed. To go faster, add replicas or use a faster device; check "
        "`make scaling` for where adding workers stops paying. When the largest part of the step is "
        "all-reduce or input wait (above), its verdict's advice applies before the threshold: "
        "`make bench-comm` and docs/communication.md, or docs/data.md."
    ],
    COMMUNICATION: [
        "Amortise the all-reduce: a larger --per-replica-batch does more compute per byte exchanged.",
        "Pack gradients: --bytes-per-pack (with make up, BYTES_PER_PACK=1048576); `make bench-comm` shows "
        "the best value.",
        "Compress the gradients: --allreduce-dtype bfloat16 (with make up, ALLREDUCE_DTYPE=bfloat16) halves "
        "the bytes all-reduced; `make bench` (e) measured 0.35-0.60x the float32 time (medians) on a ResNet-50-sized "
        "payload, and the loss stays within 15% of float32's (tests/cluster/test_compression.py).",
        "On GPUs use NCCL (CommunicationImplementation.NCCL / AUTO); on CPU, a faster network or fewer, "
        "larger workers.",
    ],
    INPUT: [
        "Prefetch (dataset.prefetch(tf.data.AUTOTUNE)) and parallelise map/interleave "
        "(num_parallel_calls=AUTOTUNE).",
        "Cache decoded data (dataset.cache()) if it fits; move expensive preprocessing offline.",
        "With FILE sharding give at least as many input files as workers (more readers).",
    ],
    STRAGGLER: [
        "Check that task's host and container: CPU limit (docker update --cpus / cgroup throttling), "
        "noisy neighbours, thermal throttling, a different device or driver, a larger data shard.",
        "Synchronous training runs at the pace of the slowest task: fix or replace it before adding workers.",
    ],
    MISMATCH: [
        "Every task must run the same image, TensorFlow, trainer version, strategy, model and world "
        "size: rebuild and restart the whole cluster from one image (`make up`)."
    ],
    STALLED: [
        "No step for minutes: a peer may hang inside a collective, or the input blocks. Read every "
        "task's logs (`make logs`), then restart the whole cluster; it resumes from the checkpoint."
    ],
    STUCK: [
        "Its step stood still longer than SUPERVISE_STALL while its peers waited in the collective (its "
        "input step was behind theirs): its supervisor wrote every thread's Python stack to its log and "
        "restarted it, and the job resumed from its last checkpoint. Read the stack (`make logs "
        "SERVICE=<task>`, after the `supervise: stuck:` line): tf.data or your dataset code means a "
        "blocked input pipeline, the main thread in your code a host deadlock.",
        "Stuck again at the same step: look at the data or the code that step reaches.",
    ],
    DOWN: [
        "A task is not answering: read its logs (`make logs SERVICE=<task>`). MWMS cannot continue "
        "without it. A task killed from outside (`docker kill`, exit 137) stays down under Docker's "
        "restart policy: `make wait` starts it again (and keeps a job going unattended); else `make up` "
        "restarts the whole cluster (it resumes from the last checkpoint)."
    ],
    NO_DATA: [
        "Nothing to judge yet: is the stack up (`make up`) and has it trained for a minute? "
        f"Check PROMETHEUS_URL and http://127.0.0.1:{contract.PROMETHEUS_PORT}/targets."
    ],
    FINISHED: ["The run is over; nothing to fix."],
}
SCRIPT_ADVICE = {
    COMMUNICATION: [
        "Amortise the all-reduce: a larger global batch (your dataset's `batch(...)`) does more compute "
        "per byte exchanged.",
        "Pack gradients: build the strategy with `tf.distribute.MultiWorkerMirroredStrategy("
        "communication_options=tf.distribute.experimental.CommunicationOptions(bytes_per_pack=1048576))`; "
        "`make bench-comm` shows the best value for this network.",
        "Compress the gradients (a custom loop): all-reduce bfloat16 casts of them "
        "(`tf.distribute.get_replica_context().all_reduce('sum', [tf.cast(g, tf.bfloat16) for g in grads])`), "
        "cast back, then `optimizer.apply_gradients(..., skip_gradients_aggregation=True)`; `make bench` "
        "(e) measured 0.35-0.60x the float32 time (medians) on a ResNet-50-sized payload.",
        "On GPUs use NCCL (`CommunicationOptions(implementation=tf.distribute.experimental."
        "CommunicationImplementation.NCCL)`); on CPU, a faster network or fewer, larger workers.",
    ],
}
"""Where a user's own script (SCRIPT=) needs other words: what to change in its code, not our flags."""


@dataclass(frozen=True, kw_only=True)
class TaskSample:
    """One task's figures over the last minute (the `task:…1m` recording rules); None = unknown."""

    task: str
    """`chief`, `worker-0`, ... (contract.task_name)."""
    up: bool = True
    state: str | None = None
    """The task's last state, one of contract.STATES."""
    last_step_age: float | None = None
    """Seconds since the task's last step; None before its first step."""
    step: float | None = None
    """Mean seconds per step; None when no step was timed in the window."""
    compute_share: float | None = None
    allreduce_share: float | None = None
    input_share: float | None = None
    compute: float | None = None
    """Mean compute seconds per step."""
    busbw: float | None = None
    """All-reduce bus bandwidth, bytes/s."""
    build: tuple[str, ...] | None = None
    """The values of contract.BUILD_LABELS from the build info."""
    world_size: int | None = None
    stuck_step: int | None = None
    """Step at which its supervisor last ended the task as stuck (in the run looked at); None: never."""
    stuck_age: float | None = None
    """Seconds since then."""


@dataclass(frozen=True)
class Finding:
    verdict: str
    code: int
    tasks: tuple[str, ...] = ()
    """The tasks the verdict names (the straggler, the input-bound ones, the ones down)."""
    evidence: tuple[str, ...] = ()
    advice: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    cluster: Finding
    tasks: dict[str, Finding] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.cluster.code == NO_DATA:
            return EXIT_NO_DATA
        return EXIT_HEALTHY if self.cluster.code in (HEALTHY, FINISHED) else EXIT_PROBLEM


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "?" if x is None else f"{1000 * x:.1f} ms"


def _done(t: TaskSample) -> bool:
    return t.state == "done"


def compute_reference(computes: list[float]) -> float | None:
    """What the others compute per step: the median task once the slowest one is set aside (a task
    alone is its own reference). The generated `cluster:…:reference1m` rule computes the same."""
    ordered = sorted(computes)
    return statistics.median(ordered[:-1]) if len(ordered) > 1 else (ordered or [None])[0]


def compute_ratios(samples: list[TaskSample]) -> dict[str, float]:
    """Task -> its compute time / compute_reference, for the tasks with a compute time."""
    timed = {t.task: t.compute for t in samples if t.compute is not None and t.compute >= 0}
    reference = compute_reference(list(timed.values()))
    return {task: x / reference for task, x in timed.items()} if reference else {}


def odd_ones(samples: list[TaskSample]) -> dict[str, str]:
    """Tasks whose build differs from the most common one (ties: nobody singled out) or whose world
    size is below the largest; task -> why. verdict.yml computes the same."""
    groups = Counter(t.build for t in samples if t.build is not None)
    largest = max(groups.values(), default=0)
    world = max((t.world_size for t in samples if t.world_size is not None), default=None)
    odd = {}
    for t in samples:
        if t.build is not None and groups[t.build] < largest:
            common = [b for b, n in groups.items() if n == largest]
            odd[t.task] = (
                f"build {t.build} differs from {len(common) == 1 and common[0] or common} on most tasks"
            )
        elif t.world_size is not None and t.world_size < world:
            odd[t.task] = f"world size {t.world_size}, others {world}"
    return odd


def mismatched(samples: list[TaskSample]) -> bool:
    """More than one build or world size in the cluster (the cluster-level mismatch)."""
    return (
        len({t.build for t in samples if t.build is not None}) > 1
        or len({t.world_size for t in samples if t.world_size is not None}) > 1
    )


def stalled(t: TaskSample) -> bool:
    return (
        t.last_step_age is not None
        and t.last_step_age > STALL_SECONDS
        and t.state not in ("done", "checkpointing")
    )


def stuck(t: TaskSample) -> bool:
    """Ended as stuck by its supervisor at most STUCK_RECENT seconds ago."""
    return t.stuck_age is not None and t.stuck_age <= STUCK_RECENT


def stuck_evidence(t: TaskSample) -> str:
    return (
        f"{t.task}: ended as stuck at step {t.stuck_step} {t.stuck_age:.0f} s ago (behind its peers, not in "
        f"the collective) and restarted; its Python stack: `make logs SERVICE={t.task}`"
    )


def task_code(t: TaskSample, odd: dict[str, str], ratio: float | None = None) -> int | None:
    """The task's verdict code, None when it has no figures yet: the first check that holds, most
    severe first (the health of the task, then its build, then its figures)."""
    checks = (
        (DOWN, not t.up and not _done(t)),
        (STUCK, stuck(t)),
        (STALLED, stalled(t)),
        (MISMATCH, t.task in odd),
        (None, t.step is None),
        (None, t.compute_share is None),  # steps timed, not split: nothing says where the time went
        (STRAGGLER, ratio is not None and ratio > STRAGGLER_RATIO),
        (INPUT, t.input_share is not None and t.input_share > INPUT_SHARE),
        (COMMUNICATION, t.allreduce_share is not None and t.allreduce_share > ALLREDUCE_SHARE),
    )
    return next((code for code, holds in checks if holds), HEALTHY)


def _task_evidence(t: TaskSample, code: int, odd: dict[str, str], ratio: float | None) -> tuple[str, ...]:
    if code == DOWN:
        return (f"{t.task}: target down (last state {t.state or 'unknown'})",)
    if code == STUCK:
        return (stuck_evidence(t),)
    if code == STALLED:
        return (f"{t.task}: no step for {t.last_step_age:.0f} s (state {t.state or 'unknown'})",)
    if code == MISMATCH:
        return (f"{t.task}: {odd[t.task]}",)
    times = "?" if ratio is None else f"{ratio:.2f}x"
    return (
        f"{t.task}: step {_ms(t.step)} = compute {_pct(t.compute_share)} + all-reduce "
        f"{_pct(t.allreduce_share)} + input {_pct(t.input_share)}; compute {_ms(t.compute)} = {times} the others",
    )


def diagnose(
    samples: list[TaskSample], *, link_busbw: float | None = None, link_size: int | None = None
) -> Diagnosis:
    """The cluster's verdict and each task's. `link_busbw`: the bus bandwidth (bytes/s) `make bench-comm`
    measured on this network for all-reduces of `link_size` bytes (the size nearest the gradients'),
    to say how close the training's all-reduce runs to what TensorFlow can get out of the network."""
    if not samples:
        return _summary(NO_DATA, "no trainer targets in Prometheus")
    if all(_done(t) for t in samples):
        # Over, but an operator still learns which task got stuck on the way, and where its stack is.
        were = tuple(stuck_evidence(t) for t in samples if t.stuck_step is not None)
        return _summary(FINISHED, f"all {len(samples)} tasks are done", *were)
    odd = odd_ones(samples)
    ratios = compute_ratios([t for t in samples if t.step is not None])
    codes = {t.task: task_code(t, odd, ratios.get(t.task)) for t in samples}
    tasks = {
        t.task: Finding(NAMES[c], c, (t.task,), _task_evidence(t, c, odd, ratios.get(t.task)))
        for t in samples
        if (c := codes[t.task]) is not None
    }
    judged = [t for t in samples if codes[t.task] is not None]
    if not judged:
        return _summary(NO_DATA, _unjudged(samples))
    worst = _cluster_code(judged, codes)
    named = tuple(sorted(t.task for t in judged if codes[t.task] == worst)) if worst in NAMES_TASKS else ()
    evidence = [
        e
        for t in judged
        for e in tasks[t.task].evidence
        if worst in (HEALTHY, COMMUNICATION) or t.task in named
    ]
    if worst in PERFORMANCE and mismatched(samples):  # e.g. two builds, two tasks each: nobody singled out
        worst, named = MISMATCH, ()
        evidence = [f"{t.task}: build {t.build}, world size {t.world_size}" for t in samples]
    lead, tail = EXPLAIN.get(worst, _nothing)(judged, named, ratios, (link_busbw, link_size))
    finding = Finding(NAMES[worst], worst, named, tuple(lead + evidence + tail), advice(worst, judged))
    return Diagnosis(finding, tasks)


def advice(code: int, judged: list[TaskSample]) -> tuple[str, ...]:
    """ADVICE, or SCRIPT_ADVICE's words when every judged task runs a user's script."""
    strategy = contract.BUILD_LABELS.index("strategy")
    script = all(t.build is not None and t.build[strategy] == contract.SCRIPT_STRATEGY for t in judged)
    return tuple((SCRIPT_ADVICE if script else ADVICE).get(code, ADVICE[code]))


def _summary(code: int, evidence: str, *more: str) -> Diagnosis:
    """A verdict on the whole run with a line of evidence (no data, finished), and any more."""
    return Diagnosis(Finding(NAMES[code], code, evidence=(evidence, *more), advice=tuple(ADVICE[code])))


def _unjudged(samples: list[TaskSample]) -> str:
    """Why no task could be judged: no timed step, or timed steps without their split."""
    unsplit = [t.task for t in samples if t.step is not None and t.compute_share is None]
    if unsplit:
        return (
            f"{', '.join(unsplit)} time their steps but export no compute / all-reduce / input split, "
            "so nothing says where the time goes (a SCRIPT= run's XLA-compiled steps are split only "
            f"by sampling: make up ... {observe_config.PERIOD_ENV}=30, docs/script.md)"
        )
    states = ", ".join(sorted({t.state or "unknown" for t in samples}))
    return f"{len(samples)} tasks up but no timed steps in the last minute (states: {states})"


def _cluster_code(judged: list[TaskSample], codes: dict[str, int | None]) -> int:
    """The most severe task verdict, except that communication-bound needs every task still training."""
    worst = max(codes[t.task] for t in judged)
    if worst == COMMUNICATION and not all(codes[t.task] == COMMUNICATION for t in judged if not _done(t)):
        return HEALTHY  # some tasks wait, not all: nobody is clearly to blame at these thresholds
    return worst


def _nothing(*_) -> tuple[list[str], list[str]]:
    return [], []


def _straggler(judged, named, ratios, _link) -> tuple[list[str], list[str]]:
    """Lead: how much slower each straggler computes; tail: the others wait for it in all-reduce."""
    reference = compute_reference([t.compute for t in judged if t.compute is not None])
    lead = [
        f"{t.task} computes {ratios[t.task]:.1f}x the others ({_ms(t.compute)} vs {_ms(reference)} per step)"
        for t in reversed([s for s in judged if s.task in named])
    ]
    others = [t for t in judged if t.task not in named and t.allreduce_share is not None]
    waits = ", ".join(f"{t.task} {_pct(t.allreduce_share)}" for t in others)
    return lead, [f"the others wait in all-reduce: {waits}"] if others else []


def _communication(judged, _named, _ratios, link) -> tuple[list[str], list[str]]:
    """Lead: every task is over the share; tail: the bus bandwidth, against bench-comm's when known."""
    lead = [f"every task spends more than {_pct(ALLREDUCE_SHARE)} of its step in all-reduce"]
    best = max((t.busbw for t in judged if t.busbw is not None), default=None)
    link_busbw, link_size = link
    if best is None:
        return lead, []
    if not link_busbw:
        return lead, [
            f"all-reduce bus bandwidth {best / 1e6:.1f} MB/s (run `make bench-comm` to compare "
            "with what the network gives)"
        ]
    at = f" for {link_size / 1024:.0f} KiB" if link_size else ""
    return lead, [
        f"all-reduce bus bandwidth {best / 1e6:.1f} MB/s = {100 * best / link_busbw:.0f}% of "
        f"the {link_busbw / 1e6:.0f} MB/s `make bench-comm` measured{at} on this network "
        "(near 100%: the all-reduce itself is the limit; far below: latency or waiting)"
    ]


PARTS = {"compute": "compute_share", "all-reduce": "allreduce_share", "input wait": "input_share"}
"""The parts of a step, each with its TaskSample share."""


def _healthy(judged, _named, _ratios, _link) -> tuple[list[str], list[str]]:
    """Lead: the largest part of the step, so that "healthy" is not read as "compute-bound" (a
    cluster whose all-reduce is 49-51% of every step is healthy at these thresholds)."""
    shares = {part: [s for t in judged if (s := getattr(t, key)) is not None] for part, key in PARTS.items()}
    shares = {part: values for part, values in shares.items() if values}
    if not shares:
        return [], []
    largest = max(shares, key=lambda part: statistics.median(shares[part]))
    low, high = min(shares[largest]), max(shares[largest])
    spread = _pct(low) if _pct(low) == _pct(high) else f"{_pct(low)}-{_pct(high)}"
    return [f"no threshold crossed; the largest part of the step is {largest} ({spread} on the tasks)"], []


def _input(_judged, named, _ratios, _link) -> tuple[list[str], list[str]]:
    return [f"input wait above {_pct(INPUT_SHARE)} of the step on {', '.join(named)}"], []


EXPLAIN = {HEALTHY: _healthy, STRAGGLER: _straggler, COMMUNICATION: _communication, INPUT: _input}
"""Verdict -> the evidence lines it adds before and after the named tasks' own."""
