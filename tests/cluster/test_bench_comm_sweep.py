"""`make bench-comm`'s sweep on a real 2-task loopback cluster (bench/comm.py driving
trainer/bench/allreduce_sweep.py in two processes): every variant of a payload is timed in turns,
so that a slow minute of the shared cores cannot land on one variant (it did: 2026-12-02, a 4 ms
step on every small payload of the variant that ran third, gone when the order changed)."""

import pytest

pytestmark = pytest.mark.cluster

VARIANTS = ("RING/0", "AUTO/0", "RING/16MiB")
REPEATS = 6


def test_each_repeat_times_every_variant_and_the_variants_take_turns():
    from bench.comm import _run_sweep, local_endpoints
    from trainer.bench.allreduce_sweep import turn_order

    args = ["--sizes", "4096", "--variants", ",".join(VARIANTS), "--repeats", str(REPEATS), "--shapes", "{}"]
    results, _ = _run_sweep(local_endpoints(1), args)
    assert len(results) == 2
    for result in results:
        cells = {t["variant"]: t for t in result["timings"]}
        assert set(cells) == set(VARIANTS)
        assert all(len(c["samples"]) == len(c["at"]) == REPEATS for c in cells.values())
        ran = [v for _, v in sorted((at, v) for v, c in cells.items() for at in c["at"])]
        # in the drawn order of every repeat, every variant once per repeat, as every task drew it
        assert ran == [v for r in range(REPEATS) for v in turn_order("equal8", r, VARIANTS)]
        assert len({tuple(turn_order("equal8", r, VARIANTS)) for r in range(REPEATS)}) > 1
