"""`python -m trainer.cluster.jobset_entry CMD...`: build TF_CONFIG from the JobSet's pod identity, then exec CMD.

A JobSet has no TensorFlow operator to write TF_CONFIG, but every pod knows who it is: the JobSet and
replicated job names (pod annotations, passed in by the downward API) and its index in an Indexed Job
(JOB_COMPLETION_INDEX, set by Kubernetes). The manifest adds the number of workers. Peers are
addressed by their pod hostnames (trainer.cluster.spec.JOBSET_ADDRESS). A TF_CONFIG already set wins.
Pure Python: a wrong environment exits 2 with one line before anything starts.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence

from contract import TF_PORT
from trainer.cluster.spec import JOBSET_ADDRESS, TASK_TYPES, ClusterSpecError, TaskId, from_template
from trainer.errors import EXIT_CONFIG

JOBSET_NAME_KEY = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_KEY = "jobset.sigs.k8s.io/replicatedjob-name"
ENV_JOBSET = "JOBSET_NAME"
ENV_REPLICATED_JOB = "JOBSET_REPLICATED_JOB"
ENV_INDEX = "JOB_COMPLETION_INDEX"
ENV_WORKERS = "JOBSET_WORKERS"

log = logging.getLogger("trainer.cluster.jobset_entry")


def tf_config(env: Mapping[str, str]) -> str:
    """This pod's TF_CONFIG; ClusterSpecError names the variable that is missing or wrong."""
    values = {}
    for var in (ENV_JOBSET, ENV_REPLICATED_JOB, ENV_INDEX, ENV_WORKERS):
        values[var] = env.get(var, "").strip()
        if not values[var]:
            raise ClusterSpecError(f"{var} is not set: the JobSet manifest from `make k8s` passes it")
    for var in (ENV_INDEX, ENV_WORKERS):
        if not values[var].isdigit():
            raise ClusterSpecError(f"{var}={values[var]!r}: must be a number")
    if values[ENV_REPLICATED_JOB] not in TASK_TYPES:
        raise ClusterSpecError(
            f"{ENV_REPLICATED_JOB}={values[ENV_REPLICATED_JOB]!r}: name the replicated "
            f"jobs {' and '.join(TASK_TYPES)}"
        )
    spec = from_template(int(values[ENV_WORKERS]), JOBSET_ADDRESS, port=TF_PORT, jobset=values[ENV_JOBSET])
    task = TaskId(values[ENV_REPLICATED_JOB], int(values[ENV_INDEX]))
    return spec.with_task(task).to_tf_config()


def main(argv: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    """Execs argv with TF_CONFIG set; returns only on a configuration error."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname).1s %(message)s", stream=sys.stderr
    )
    if not argv:
        log.error(
            "configuration error: give the command to run, as in "
            "`python -m trainer.cluster.jobset_entry python -m trainer`"
        )
        return EXIT_CONFIG
    child = dict(env)
    if not child.get("TF_CONFIG", "").strip():
        try:
            child["TF_CONFIG"] = tf_config(env)
        except ClusterSpecError as err:
            log.error("configuration error: %s", err)
            return EXIT_CONFIG
    log.info("TF_CONFIG=%s", child["TF_CONFIG"])
    os.execvpe(argv[0], list(argv), child)
    return EXIT_CONFIG  # unreachable: exec replaced the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
