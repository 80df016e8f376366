"""Your own script with the project's telemetry (`python -m trainer.script train.py [args]`): the wrapper,
and SIGTERM restored once MWMS is built. What it adds to the script's graph lives in ../observe/."""
