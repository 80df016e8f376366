import os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import trainer
import tensorflow as tf
from trainer import config as config_lib, step, tasks, training
from trainer.cluster import parse_tf_config
config = config_lib.from_args([], os.environ)
spec = parse_tf_config(os.environ.get("TF_CONFIG"))
strategy = training.make_strategy(config, spec)
with strategy.scope():
    task = tasks.build(tasks.load("mlp"), per_replica_batch=32, seed=0, data="", input_delay_ms=0)
    opt = step.optimizer(config, 1)
it = iter(strategy.distribute_datasets_from_function(task.dataset_fn))
fns = step.build(strategy, task, opt, 32)
for name, fn in (("timed", fns.timed), ("plain", fns.plain), ("timed", fns.timed), ("plain", fns.plain)):
    for K in (1, 50):
        fn(it, K)[1].numpy()
        t = time.perf_counter()
        for _ in range(400 // K): fn(it, K)[1].numpy()
        if spec is None or spec.is_chief: print(name, K, round(400 / (time.perf_counter() - t), 1), "steps/s", flush=True)
