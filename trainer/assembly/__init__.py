"""The assembly: builds everything TensorFlow needs for one task (strategy, model, optimizer,
checkpoints, input) and hands it to trainer/train/loop.py's Controller. It sits above every folder it
assembles and none of them imports it, as orbit's Controller imports only its runner (STYLE.md 21).
trainer/run.py imports it once the config is valid and the peers answer."""
