"""The deployment targets: one module each, found by name (`python -m compose.emit --target NAME`).

Every module here is a target and implements `Target`: the deployment description in
(compose/deployment.py's `Deployment`, compose/services.py's services), files plus a translation
report out; and, where the target has an engine here (Compose, Swarm), `deploy` and `undeploy` of
those files through compose/engine.py, as kompose's providers implement Deploy and Undeploy beside
Transform. Kubernetes targets emit only, and their `deploy` says so in one line. compose/emit.py owns everything around it: the command line, the header, the writer and
the report printer. A new target is a new module here; nothing else is edited (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol, runtime_checkable

from compose.deployment import Change, Deployment
from compose.engine import Engine


class NotDeployable(ValueError):
    """The target has no engine this project reaches: the one line saying how to deploy its files."""


@dataclass(frozen=True)
class Place:
    """Where a target's files run: the project's (stack's) name and the folder its files were written
    to; for Swarm, the swarm's name and node count (compose/swarm/nodes.sh makes its nodes)."""

    project: str
    out: Path
    swarm: str = ""
    nodes: int = 0


@dataclass(frozen=True)
class Yaml:
    """A generated YAML file: documents the writer dumps under the one header."""

    docs: tuple[dict, ...]
    dollars: bool = True
    """Double every `$` (Compose interpolates every string); False for Kubernetes, whose emitter
    escapes `$(VAR)` itself (compose/yamltext.py)."""


@dataclass(frozen=True, kw_only=True)
class Emitted:
    """What a target made of a deployment."""

    files: Mapping[str, Yaml | str]
    """Path under --out -> a YAML file (header added by the writer) or text written as is."""
    changes: Sequence[Change] = ()
    """The translation report: every setting dropped or rewritten for this target, and why."""
    summary: str = ""
    """One line: what was described ("chief + 2 workers, CPU only")."""
    notes: tuple[str, ...] = ()
    """Lines printed after the report (how long the job trains, ...)."""
    remove: tuple[str, ...] = ()
    """Paths under --out a previous run may have left that this one must not (a GPU overlay on a CPU
    run, superseded swarm configs): removed before writing."""
    extra: Mapping[str, object] = field(default_factory=dict)
    """Anything a caller of this target needs besides the files (Compose: the `-f` files in order)."""


@runtime_checkable
class Target(Protocol):
    """A target module's interface (kubernetes/kompose's Transformer, one per provider)."""

    TITLE: str
    """The translation report's heading ("compose", "swarm stack", "k8s TFJob")."""
    REMAKE: str
    """The command that regenerates the files, named in their header ("make up")."""
    OUT: str
    """Default --out."""

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """This target's own flags, besides the shared ones (compose/deployment.py add_arguments)."""

    def describe(self, ns: argparse.Namespace, environ: Mapping[str, str]) -> Deployment:
        """The Deployment the flags and the knobs in `environ` ask for on this target. ValueError: bad input."""

    def emit(self, d: Deployment, ns: argparse.Namespace) -> Emitted:
        """The files and the report. ValueError: the deployment cannot run on this target."""

    def deploy(self, place: Place, engine: Engine, services: Sequence[str] = ()) -> None:
        """Start (or update to) the files written to place.out; `services`: only these. NotDeployable:
        this target's files are applied by its own tools (one line saying how)."""

    def undeploy(self, place: Place, engine: Engine, volumes: bool = False) -> None:
        """Stop and remove what deploy started; `volumes`: its volumes too (checkpoints, history)."""


def names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load(name: str) -> ModuleType:
    if name not in names():
        raise ValueError(f"--target {name}: unknown target; one of {', '.join(names())}")
    module = importlib.import_module(f"{__name__}.{name}")
    if not isinstance(module, Target):
        raise TypeError(f"compose/targets/{name}.py does not implement compose.targets.Target")
    return module
