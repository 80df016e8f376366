"""Which settings `make tune` tries: those the verdict's advice names that the product changes without
editing the user's code. Pure: the current settings and the verdict in, candidates out.

A candidate is a few make variables (`BYTES_PER_PACK=1048576`), the form `make up` and the winner file
take; `changes_optimisation` marks those that change the arithmetic of training (a job setting of
trainer/state/manifest.py: the gradients' dtype, the batch, the rate), whose loss the table shows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from monitoring.verdicts import verdict
from trainer.host import ENV_PREFIX, ConfigError, from_args, manifest, server_config

ALLOCATOR = "GLIBC_TUNABLES"
PROCESS_VARIABLES = ("TF_", "GLIBC_")
"""Candidate settings the process reads (TensorFlow, glibc), not trainer flags; make up gives those of
PROCESS_SETTINGS to every task."""
PROCESS_SETTINGS = server_config.PROCESS_SETTINGS
PACK_BYTES = 1048576
"""The pack size `make bench-comm` found best on CPU rings (docs/communication.md)."""


@dataclass(frozen=True)
class Candidate:
    name: str
    """What the table shows: `BYTES_PER_PACK=1048576`."""
    settings: tuple[tuple[str, str], ...]
    """(make variable, value) pairs; the trainer reads TRAINER_<NAME>."""
    why: str

    @property
    def changes_optimisation(self) -> bool:
        return any(k.lower() in manifest.JOB_SETTINGS for k, _ in self.settings)


def _one(name: str, value: str, why: str) -> Candidate:
    return Candidate(f"{name}={value}", ((name, value),), why)


def loop_candidates(current: Mapping[str, str], code: int, largest: str) -> list[Candidate]:
    """The built-in loop's candidates for verdict `code` whose largest step part is `largest`
    (`all-reduce`, `compute`, `input wait`), each a change from `current` (RUN_SETTINGS labels)."""
    out: list[Candidate] = []
    communication = code == verdict.COMMUNICATION or largest == "all-reduce"
    if communication and current.get("bytes_per_pack", "0") == "0":
        out.append(_one("BYTES_PER_PACK", str(PACK_BYTES), "advice: pack gradients"))
    if communication and current.get("allreduce_dtype", "float32") == "float32":
        out.append(_one("ALLREDUCE_DTYPE", "bfloat16", "advice: compress the gradients"))
    if communication and current.get("allreduce_mode", "serial") == "serial":
        out.append(_one("ALLREDUCE_MODE", "overlap", "all-reduce each pack as its gradients are ready"))
    if largest != "all-reduce" and current.get("steps_per_call", "0") == "0":
        out.append(
            _one("STEPS_PER_CALL", "8", "short calls: less work per dispatch, the input refills between")
        )
    return out


def _allocator(current: Mapping[str, str]) -> Candidate:
    """The other allocator setting than the run's (trainer/cluster/server_config.ENVIRONMENT or glibc's stock)."""
    tuned = current.get("allocator") == "tuned"
    value = "" if tuned else server_config.ENVIRONMENT[ALLOCATOR]
    return Candidate(
        "allocator=" + ("stock" if tuned else "tuned"), ((ALLOCATOR, value),), "the allocator setting"
    )


def script_candidates(current: Mapping[str, str], cores: int) -> list[Candidate]:
    """A SCRIPT= run's: what its wrapper's processes take without editing the script (the allocator,
    TensorFlow's thread pools; make up gives a winner to every task). Its strategy, and so its
    CommunicationOptions, are the script's own code: the wrapper does not build it."""
    threads = str(max(1, cores // 2))
    pools = Candidate(
        f"TF_NUM_INTRAOP_THREADS={threads}",
        (("TF_NUM_INTRAOP_THREADS", threads), ("TF_NUM_INTEROP_THREADS", "1")),
        "smaller thread pools: every task of this host shares its cores",
    )
    taken = (current.get("intraop_threads"), current.get("interop_threads")) == (threads, "1")
    return [_allocator(current), *([] if taken else [pools])]


def parse(text: str) -> list[Candidate]:
    """TUNE_CANDIDATES: `NAME=value NAME=value+NAME=value` (space-separated candidates, `+` joins settings)."""
    out = []
    for item in text.split():
        pairs = [p.partition("=") for p in item.split("+")]
        if any(not sep or not k.isupper() for k, sep, _ in pairs):
            raise ValueError(f"TUNE_CANDIDATES {item!r}: want NAME=value, joined with + for one candidate")
        out.append(Candidate(item, tuple((k, v) for k, _, v in pairs), "given"))
    return out


def check(chosen: list[Candidate], job_env: Mapping[str, str], script: bool) -> None:
    """Refuse, in one line, a candidate the trials would only see fail: a trainer flag the trainer
    refuses on this job's settings, or one given to a SCRIPT= job, whose script reads none of them."""
    for k in chosen:
        unknown = [n for n, _ in k.settings if n.startswith(PROCESS_VARIABLES) and n not in PROCESS_SETTINGS]
        if unknown:
            raise ValueError(
                f"TUNE_CANDIDATES {k.name}: {unknown[0]} is not a process setting make up can give every task "
                f"({', '.join(PROCESS_SETTINGS)})"
            )
        flags = {ENV_PREFIX + n: v for n, v in k.settings if not n.startswith(PROCESS_VARIABLES)}
        if flags and script:
            raise ValueError(
                f"TUNE_CANDIDATES {k.name}: a SCRIPT= job's script reads no trainer flag; "
                "try process settings (TF_NUM_INTRAOP_THREADS=..., GLIBC_TUNABLES=...)"
            )
        try:
            from_args([], {**job_env, **flags})
        except ConfigError as err:
            raise ValueError(f"TUNE_CANDIDATES {k.name}: {str(err).splitlines()[0]}") from None
