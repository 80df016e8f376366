"""`make test` runs the end-to-end modules side by side: no two stacks may share a compose project, a
published address or a Docker-in-Docker subnet (tests/e2e/places.py), and no module may publish on an
address written anywhere else (a quoted one, or one given as `VAR=address`)."""

import re
from pathlib import Path

from tests.e2e import places

E2E = Path(__file__).resolve().parents[1] / "e2e"
RENDER_ONLY = {"test_security.py"}  # renders compose files with addresses; starts nothing on them
LITERAL = re.compile(r"""["'=](127\.0\.0\.\d+|10\.\d+\.\d+)["']""")


def test_every_place_is_its_own():
    for field in ("project", "bind"):
        values = [getattr(p, field) for p in places.PLACES]
        assert len(set(values)) == len(values), f"two e2e stacks share a {field}: {sorted(values)}"
    subnets = [n.subnet for n in places.NETS]
    assert len(set(subnets)) == len(subnets), subnets
    assert len(places.PLACES) >= 13 and len(places.NETS) == 3


def test_no_stack_is_the_users_own():
    """`make up`'s defaults (project mwms on 127.0.0.1) are the user's job: the README's quickstart runs
    `make test` after `make up WORKERS=3`, and the session stack's `make clean` stopped and emptied it."""
    import contract

    default_bind = re.search(
        r"\),(127\.0\.0\.\d+)\)", (E2E.parents[1] / "compose" / "compose.mk").read_text()
    )[1]
    assert all(p.project != contract.DEFAULT_PROJECT for p in places.PLACES), places.PLACES
    assert all(p.bind != default_bind for p in places.PLACES), places.PLACES


def test_no_module_writes_an_address_of_its_own():
    found = {
        f.name: LITERAL.findall(f.read_text())
        for f in sorted(E2E.glob("test_*.py"))
        if f.name not in RENDER_ONLY
    }
    assert not {k: v for k, v in found.items() if v}, "use tests/e2e/places.py"
