"""The step and the loop: the compiled, in-graph-timed step; the host loop that owns the step counter and
runs the after-call actions; the types they share; the training run that builds them."""
