"""The sweep as a picture: busbw against size per setting, next to raw TCP."""

from __future__ import annotations

from pathlib import Path

from contract.benchcomm import Row
from trainer.host import allreduce_sweep as sweep


def write_png(table: list[Row], tcp: float | None, n: int, where: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant in dict.fromkeys(r.variant for r in table):
        mine = [r for r in table if r.variant == variant and r.payload == sweep.EQUAL]
        ax_bw.plot([r.size for r in mine], [r.busbw / 1e6 for r in mine], marker="o", label=variant)
        ax_t.plot([r.size for r in mine], [r.seconds * 1e3 for r in mine], marker="o", label=variant)
    if tcp:
        ax_bw.axhline(
            tcp / 1e6, color="black", linestyle="--", label=f"raw TCP (iperf3) {tcp / 1e6:.0f} MB/s"
        )
    ax_bw.set(
        xscale="log",
        yscale="log",
        xlabel="bytes per all-reduce",
        ylabel="busbw MB/s",
        title=f"TensorFlow all-reduce bus bandwidth, {n} tasks ({where})",
    )
    ax_t.set(
        xscale="log",
        yscale="log",
        xlabel="bytes per all-reduce",
        ylabel="ms per all-reduce",
        title="time per all-reduce",
    )
    for ax in (ax_bw, ax_t):
        ticks = sorted({r.size for r in table if r.payload == sweep.EQUAL})
        ax.set_xticks(ticks, [sweep.human(s) for s in ticks], rotation=45)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
