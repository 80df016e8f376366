"""The timed step's graph: what each mark waits for (read from the traced function, not timed).

A mark only brackets the work that is its ancestor in the dataflow graph: an op that is not an
ancestor of the step's last timestamp may still be running, or not started, when it is taken,
and its time lands in the next step.
"""

import pytest
import tensorflow as tf

import trainer  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)
from trainer.assembly import task as tasks
from trainer.config import Config
from trainer.train import step

# Ops that write a variable: the model's, the optimizer's (Adam's moments, the iteration count) and
# batch normalisation's moving averages.
UPDATES = (
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
    "AssignNewValue",
    "ResourceApplyAdam",
)


def _timed_graph(task_name: str, **config):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    cfg = Config(task=task_name, strategy="mirrored", **config)
    with strategy.scope():
        task = tasks.build(tasks.load(task_name), per_replica_batch=8, seed=0, data="", input_delay_ms=0.0)
        opt = step.optimizer(cfg, 1)
        opt.build(task.model.trainable_variables)
    timed, _ = step.functions(strategy, task, opt, 8, step.StepOptions.of(cfg))
    iterator = iter(strategy.distribute_datasets_from_function(task.dataset_fn))
    return timed.get_concrete_function(iterator, tf.constant(1)).graph.as_graph_def()


def _step_body(graph_def):
    """The function holding one step's ops (the in-graph loop's body): the one with the end mark."""
    for fdef in graph_def.library.function:
        if any(n.op == "Timestamp" and step.END_MARK in n.name for n in fdef.node_def):
            return fdef
    raise AssertionError("no function holds the step's end mark")


def _ancestors(fdef, name: str) -> set[str]:
    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in fdef.node_def}
    seen, todo = set(), [name]
    while todo:
        for parent in inputs.get(todo.pop(), []):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


@pytest.mark.parametrize("task_name", ["mlp", "cnn"])
def test_every_variable_update_precedes_the_steps_last_mark(task_name):
    body = _step_body(_timed_graph(task_name))
    end = next(n.name for n in body.node_def if n.op == "Timestamp" and step.END_MARK in n.name)
    # The input step counter is written when the batch is taken, read by scrapes: no mark needs it.
    updates = [n.name for n in body.node_def if n.op in UPDATES and step.INPUT_MARK not in n.name]
    assert len(updates) > 10, f"expected the optimizer's updates in the step body, found {updates}"
    late = sorted(set(updates) - _ancestors(body, end))
    assert not late, (
        f"{len(late)} of {len(updates)} variable updates are not before the last mark: {late[:5]}"
    )


def test_start_up_line_states_batch_rate_and_warm_up():
    assert step.describe_lr(Config(per_replica_batch=32, learning_rate=0.001), 4) == (
        "global batch 128 = 4 x 32, lr 0.004 = 4 x 0.001 (--lr-scaling linear), warm-up 100 steps"
    )
    assert step.describe_lr(Config(lr_scaling="none", learning_rate=0.01), 3).endswith(
        "lr 0.01 (--lr-scaling none)"
    )


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("bfloat16", 2), ("float16", 2)])
def test_all_reduced_bytes_count_the_dtype_sent(dtype, size):
    variables = [tf.Variable(tf.zeros([3, 5])), tf.Variable(tf.zeros([7]))]
    assert step.payload_bytes(variables, step.StepOptions(dtype=dtype)) == 22 * size
