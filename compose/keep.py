"""What `make clean` must keep: a final model never copied out of the checkpoint volume, every OUTPUT=
folder (inside RUN_DIR or not), and whatever is not this project's own.

RUN_DIR of the default project is .run itself, which also holds the other projects' folders
(.run/PROJECT), the swarm stacks' (.run/swarm) and the default OUTPUT root (.run/output): a clean of one
project removes its own generated files only. A folder holding a SavedModel or a run summary is a model
copied out, whoever wrote it: never removed. Standard library only.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

from compose.engine import Engine, Stack
from compose.projectlock import NAME as LOCK
from compose.settings import RECORD, Settings
from trainer.host import __version__

KEPT_NAMES = {LOCK, "output", "swarm"}
"""The lock clean itself holds, the default OUTPUT root, the swarm stacks' folders (make stack-*)."""
ANOTHER_PROJECT = ("stack.env", LOCK, RECORD)
MODEL_FILES = ("saved_model.pb", "summary.json")


def uncopied_model(s: Settings, eng: Engine) -> str | None:
    """Why clean must not remove the checkpoint volume (one line), or None. Asked of the volume itself,
    with or without the stack's files: a fresh clone or `rm -rf .run` still has the volume."""
    volume = f"{s.project}_checkpoints"
    if eng.result("volume", "inspect", volume).returncode:
        return None
    image = f"{s.image_repo}:{__version__}-cpu"
    if not eng.image_present(image):
        return (
            f"cannot check volume {volume} for a final model not yet copied out: the trainer image {image} is "
            f"missing (make images{s.shown}); make clean FORCE=1 deletes it anyway"
        )
    r = eng.result("run", "--rm", "--network", "none", "-v", f"{volume}:/checkpoints:ro", "--entrypoint", "python",
                   image, "-m", "trainer.state.output", "check", "--checkpoint-dir", "/checkpoints")  # fmt: skip
    if r.returncode == 0:
        return None
    return (r.stderr.strip().splitlines() or [f"volume {volume} holds a final model never copied out"])[-1]


def outputs(s: Settings) -> set[Path]:
    """Every OUTPUT folder of this project: the one given now and the one its last make up recorded."""
    found = {Path(s.output).resolve()} if s.output else set()
    recorded = Stack(s.project, s.run_dir).settings().get("OUTPUT", "")
    return found | ({Path(recorded).resolve()} if recorded else set())


def removable(s: Settings) -> Iterator[Path]:
    """The entries of RUN_DIR clean removes."""
    if not s.run_dir.is_dir():
        return
    keep = outputs(s)
    for entry in sorted(s.run_dir.iterdir()):
        full = entry.resolve()
        if entry.name in KEPT_NAMES or any(k == full or full in k.parents or k in full.parents for k in keep):
            continue
        if entry.is_dir() and (any((entry / n).exists() for n in ANOTHER_PROJECT) or holds_model(entry)):
            continue
        yield entry


def holds_model(folder: Path) -> bool:
    return any(next(folder.rglob(name), None) for name in MODEL_FILES)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
