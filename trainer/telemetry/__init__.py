"""What a task exports: the Prometheus metrics (contract/), /proc/net/dev counters, TensorBoard scalars and
the profiler server, and `make profile`'s in-stack capture."""
