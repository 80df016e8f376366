"""Where each end-to-end stack lives on this host: its compose project and the loopback address its
UIs are published on, and the subnet of each Docker-in-Docker network. `make test` runs the modules
side by side (pytest-xdist groups, tests/e2e/conftest.py), so no two may share any of them: each is
written once here, and tests/unit/test_e2e_places.py checks that they are distinct and that no module
writes an address of its own. A module's environment variable (named in its docstring) still
overrides its place, to run beside another checkout's tests on a shared engine."""

from __future__ import annotations

from typing import NamedTuple


class Place(NamedTuple):
    project: str
    bind: str


class Net(NamedTuple):
    name: str
    subnet: str  # the first three octets


# The session stack. Not make up's own defaults: those are the user's (`make up WORKERS=3` before `make
# test` is the README's quickstart), and the session's `make clean` stopped and emptied that job.
SESSION = Place("mwms-session", "127.0.0.13")
FAULTS = Place("mwms-faults", "127.0.0.2")
DIAGNOSE = Place("mwms-diagnose", "127.0.0.3")
CHAOS = Place("mwms-chaos", "127.0.0.4")
SWARM = Place("mwms-swarm-e2e", "127.0.0.5")  # the swarm's registry, its host side
ALERTS = Place("alerts-e2e", "127.0.0.6")
RUNS_A = Place("alerts-runs-a", "127.0.0.7")
RUNS_B = Place("alerts-runs-b", "127.0.0.8")
RESIZE = Place("resize-e2e", "127.0.0.9")
TENSORBOARD = Place("mwms-tensorboard", "127.0.0.10")
STUCK = Place("mwms-stuck", "127.0.0.11")
SCRIPT_REFUSED = Place("mwms-e2e-script", "127.0.0.12")  # a make up refused before any container
VERDICTS = Place("verdicts", "127.0.0.23")
TUNE = Place("tune-e2e", "127.0.0.41")

SWARM_NODES = Net("mwms-swarm-e2e", "10.212.0")
ENGINE_NODE = Net("mwms-engine-e2e", "10.224.0")
CHAOS_NODE = Net("mwms-chaos-engine", "10.225.0")

PLACES = [v for v in dict(globals()).values() if isinstance(v, Place)]
NETS = [v for v in dict(globals()).values() if isinstance(v, Net)]
