"""The container's entry point: restarts the task by exit code, with a budget renewed by checkpoints,
and ends a stuck task (`python -m trainer.supervise`)."""
