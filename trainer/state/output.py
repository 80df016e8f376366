"""The trained model leaves the checkpoint volume: the final export and the run's summary, copied out.

At the end of a job the chief writes `<checkpoint-dir>/summary.json` next to the export, then copies
`<checkpoint-dir>/export` (the SavedModel) to `<to>/model` and the summary to `<to>/summary.json`,
each to a temporary name first, then renamed; only then does it record the copy in
`<checkpoint-dir>/export.copied`. An export made after that record (a later job) clears
it first, so `uncopied` tells whether the volume holds a final model that exists nowhere else, which
`make clean` will not delete without FORCE=1. Standard library only: `make output` and `make clean`
run it in a container that mounts the volume.

    python -m trainer.state.output copy --checkpoint-dir /checkpoints --to /output
    python -m trainer.state.output check --checkpoint-dir /checkpoints
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence

from trainer.state import atomic

EXPORT = "export"
MARK = "export.copied"
SUMMARY = "summary.json"


def forget_copy(checkpoint_dir: str) -> None:
    """Before a new export: the old record would vouch for a model that is about to be replaced."""
    mark = os.path.join(checkpoint_dir, MARK)
    if os.path.exists(mark):
        os.remove(mark)


def record(checkpoint_dir: str, summary: Mapping[str, object]) -> None:
    """The run's summary next to its export, so that any later copy carries both."""
    atomic.write_json(os.path.join(checkpoint_dir, SUMMARY), summary, indent=1)


def copy_out(checkpoint_dir: str, to: str) -> str:
    """Copy the export (and the summary recorded with it) to `to`; returns the model's new path."""
    source = os.path.join(checkpoint_dir, EXPORT)
    if not os.path.isdir(source):
        raise FileNotFoundError(f"no final model in {checkpoint_dir} (no {EXPORT}/): nothing to copy")
    os.makedirs(to, exist_ok=True)
    model, tmp = os.path.join(to, "model"), os.path.join(to, ".model.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    shutil.rmtree(model, ignore_errors=True)
    os.replace(tmp, model)
    summary = os.path.join(checkpoint_dir, SUMMARY)
    if os.path.exists(summary):
        shutil.copyfile(summary, os.path.join(to, ".summary.tmp"))
        os.replace(os.path.join(to, ".summary.tmp"), os.path.join(to, SUMMARY))
    atomic.write_json(os.path.join(checkpoint_dir, MARK), {"to": to}, indent=1)
    return model


def uncopied(checkpoint_dir: str) -> bool:
    """True when the folder holds a final model never copied out."""
    return os.path.isdir(os.path.join(checkpoint_dir, EXPORT)) and not os.path.exists(
        os.path.join(checkpoint_dir, MARK)
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.state.output", description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("copy", "check"))
    p.add_argument("--checkpoint-dir", required=True)
    p.add_argument("--to", help="copy: the folder to copy the model into")
    ns = p.parse_args(argv)
    if ns.action == "check":
        if uncopied(ns.checkpoint_dir):
            print(
                "the checkpoint volume holds a final model that was never copied out: `make output` copies it "
                "to OUTPUT=, or `make clean FORCE=1` deletes it anyway",
                file=sys.stderr,
            )
            return 1
        return 0
    try:
        path = copy_out(ns.checkpoint_dir, ns.to)
    except OSError as err:
        print(f"output: {err}", file=sys.stderr)
        return 1
    print(f"output: the final model is in {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
