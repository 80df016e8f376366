"""`make report`: a PNG of the current or last training run from Prometheus, for places without
Grafana (offline stacks, CI artifacts, bug reports). Reads the same recording rules as the dashboards,
of one run only (--run, by default the project's latest: monitoring/runs.py)."""

import argparse
import logging
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and in CI
import matplotlib.pyplot as plt

import contract as c
from monitoring import runs
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.prom.promql import Window, find_window
from monitoring.rules import recording as r

log = logging.getLogger(__name__)

PARTS = (  # (recording rule, label), stacked bottom to top: together they make the clock's time per step
    (r.MEAN[c.COMPUTE], "compute"),
    (r.MEAN[c.ALLREDUCE], "all-reduce"),
    (r.MEAN[c.INPUT_WAIT], "input wait"),
    (r.OTHER, "other"),
    (r.OUTSIDE, "outside steps"),
)


def series(prom: Prometheus, expr: str, w: Window) -> dict[str, tuple[list[float], list[float]]]:
    """Task name ("cluster" for series without a task) → (seconds since start, values)."""
    out = {}
    for s in prom.query_range(expr, w.start, w.end, w.step):
        name = c.task_of(s["metric"]) if c.TASK_TYPE in s["metric"] else "cluster"
        out[name] = ([float(t) - w.start for t, _ in s["values"]], [float(v) for _, v in s["values"]])
    return out


def plot(
    *, breakdown: dict[str, dict[str, tuple]], throughput: dict, loss: dict, title: str, out: Path
) -> None:
    """breakdown: task → part label → (x, y). One stacked panel per task, then throughput and loss."""
    tasks = sorted(breakdown, key=c.task_order)
    rows = len(tasks) + 2
    fig, axes = plt.subplots(rows, 1, figsize=(11, 2.4 * rows), sharex=True, squeeze=False)
    axes = axes[:, 0]
    for ax, name in zip(axes, tasks, strict=False):  # the last two axes are throughput and loss
        parts = breakdown[name]
        xs = next(iter(parts.values()))[0]
        # Parts can miss a point the others have (a scrape at the edge); align on the first part's times.
        ys = [
            [dict(zip(*parts[label], strict=True)).get(x, 0.0) * 1000 for x in xs]
            if label in parts
            else [0.0] * len(xs)
            for _, label in PARTS
        ]
        ax.stackplot(xs, ys, labels=[label for _, label in PARTS], alpha=0.85)
        ax.set_ylabel(f"{name}\nms / step")
        ax.legend(loc="upper right", fontsize="small", ncol=len(PARTS))
        ax.grid(alpha=0.3)
    for ax, data, label in ((axes[-2], throughput, "examples / s"), (axes[-1], loss, "loss")):
        for name, (xs, ys) in sorted(data.items()):
            ax.plot(xs, ys, label=name)
        ax.set_ylabel(label)
        ax.legend(loc="upper right", fontsize="small", ncol=4)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the run started")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def report(prom: Prometheus, out: Path, *, lookback: float, now: float, sel: str = r.JOB_SELECTOR) -> bool:
    """Write the PNG of the run `sel` selects; False when Prometheus holds no data of it in the lookback."""
    w = find_window(prom, lookback=lookback, now=now, sel=sel)
    if w is None:
        return False
    breakdown: dict[str, dict[str, tuple]] = {}
    for expr, label in PARTS:
        for name, xy in series(prom, expr + sel, w).items():
            breakdown.setdefault(name, {})[label] = xy
    # Throughput over a short window, as Grafana's $__rate_interval would: a 1 min rate averages in the
    # idle start-up of a short run. (The breakdown is a ratio, which idle time does not skew.)
    examples = f"rate({c.EXAMPLES.name}{sel}[{max(20, 2 * round(w.step))}s])"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(w.start))
    plot(
        breakdown=breakdown,
        throughput=(
            series(prom, f"sum by ({r.BY_RUN}) ({examples})", w)
            | series(prom, f"sum by ({r.BY_TASK}) ({examples})", w)
        ),
        loss=series(prom, r.loss_after_first_step(sel), w),
        title=f"Training run from {started}, {w.end - w.start:.0f} s (step breakdown: 1 min means)",
        out=out,
    )
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitoring.report", description=__doc__)
    parser.add_argument("--prometheus", default=DEFAULT_URL, help="Prometheus base URL")
    parser.add_argument(
        "--project", default=c.DEFAULT_PROJECT, help="compose project or stack (make's PROJECT)"
    )
    parser.add_argument("--run", default="", help="run id (make's RUN); empty: the project's latest run")
    parser.add_argument("--out", type=Path, default=Path(".run/report.png"), help="PNG to write")
    parser.add_argument("--lookback", type=float, default=6 * 3600, help="seconds to search back for a run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    prom = Prometheus(url=args.prometheus)
    try:
        sel = r.selector(args.project, runs.resolve(prom, args.project, args.run) or "")
        written = report(prom, args.out, lookback=args.lookback, now=time.time(), sel=sel)
    except PrometheusError as e:
        log.error("report: cannot query %s: %s", args.prometheus, e)
        return 2
    if not written:
        log.error("report: no trainer metrics in %s over the last %.0f s", args.prometheus, args.lookback)
        return 2
    log.info("report: wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
