"""Host-side tools: the local launcher, benchmarks, the scaling sweep, bench-comm's driver.

They run on the host only (they start local processes, drive Docker and iperf3, draw PNGs) and
are not in the trainer image: images/trainer.Dockerfile.dockerignore excludes this package. They
may import the in-container trainer package; nothing in it imports them.
"""
