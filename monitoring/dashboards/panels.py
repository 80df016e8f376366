"""Small builders shared by the dashboards: every panel gets an id, a unit, a description and
queries against the Prometheus datasource by its fixed uid (no ${DS_...} placeholders)."""

import itertools
from dataclasses import dataclass

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common, dashboard
from grafana_foundation_sdk.models import prometheus as promql

import contract
from monitoring.rules import recording as rules

DATASOURCE = dashboard.DataSourceRef(type_val="prometheus", uid="prometheus")
TASK_LEGEND = "{{task_type}}-{{task_index}}"
"""Legends show chief as `chief-0`; every graph renames it to contract.task_name's `chief`."""
JOB = rules.selector("$project", "$run")[1:-1]
"""Every query selects one run of one stack (the Project and Run variables): runs never mix."""
RUN_SEL = "{" + JOB + "}"
TAG = "mwms"


def step_quantile(q: float, selector: str) -> str:
    """The q-quantile of each task's step time over Grafana's rate interval."""
    return (
        f"histogram_quantile({q}, sum by ({rules.BY_TASK}, le) "
        f"(rate({contract.STEP.bucket}{{{selector}}}[$__rate_interval])))"
    )


def query(expr: str, legend: str = "", *, ref_id: str = "A", instant: bool = False):
    """One PromQL target. ref_id is set explicitly: the SDK would otherwise emit it empty."""
    q = prometheus.Dataquery().expr(expr).ref_id(ref_id).datasource(DATASOURCE)
    if legend:
        q = q.legend_format(legend)
    return q.instant() if instant else q.range()


def targets(*exprs: tuple[str, str]):
    """(expr, legend) pairs → targets with ref ids A, B, C, ..."""
    return [query(expr, legend, ref_id=chr(ord("A") + i)) for i, (expr, legend) in enumerate(exprs)]


def thresholds(*steps: tuple[float | None, str]):
    return (
        db.ThresholdsConfig()
        .mode(dashboard.ThresholdsMode.ABSOLUTE)
        .steps([dashboard.Threshold(value=v, color=c) for v, c in steps])
    )


GREEN = (None, "green")


def graph(
    ids: itertools.count,
    title: str,
    description: str,
    unit: str,
    exprs,
    *,
    w: int = 12,
    h: int = 8,
    stacked: bool = False,
    limits=None,
    min_zero: bool = True,
):
    """A time series panel. limits: threshold steps drawn as dashed lines (what "bad" looks like)."""
    p = (
        timeseries.Panel()
        .id(next(ids))
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(targets(*exprs))
        .span(w)
        .height(h)
        .legend(
            cb.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
        )
        .line_width(1)
        .fill_opacity(40 if stacked else 10)
    )
    p = p.with_transformation(
        dashboard.DataTransformerConfig(
            id_val="renameByRegex",
            options={"regex": f"{contract.CHIEF}-0(.*)", "renamePattern": f"{contract.CHIEF}$1"},
        )
    )
    if min_zero:
        p = p.min(0)
    if stacked:
        p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    if limits:
        p = p.thresholds(thresholds(*limits)).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    return p


def single(
    ids: itertools.count,
    title: str,
    description: str,
    unit: str,
    expr: str,
    *,
    legend: str = "",
    w: int = 4,
    h: int = 4,
    limits=(GREEN,),
    text_mode=common.BigValueTextMode.AUTO,
):
    """A stat panel showing the last value, coloured by threshold."""
    return (
        stat.Panel()
        .id(next(ids))
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .targets(targets((expr, legend)))
        .span(w)
        .height(h)
        .thresholds(thresholds(*limits))
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .text_mode(text_mode)
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


def value_names(names: dict[int, tuple[str, str]]):
    """Value mappings: a numeric code shown as text in a colour ({code: (text, colour)})."""
    options = {
        str(code): dashboard.ValueMappingResult(text=text, color=color, index=i)
        for i, (code, (text, color)) in enumerate(names.items())
    }
    return [dashboard.ValueMap(options=options)]


def labels_table(
    ids: itertools.count,
    title: str,
    description: str,
    expr: str,
    *,
    hide: tuple[str, ...] = (),
    w: int = 12,
    h: int = 7,
):
    """An instant query shown as a table of label values, one row per series."""
    excluded = {name: True for name in ("Time", "Value", "__name__", "job", *hide)}
    return (
        table.Panel()
        .id(next(ids))
        .title(title)
        .description(description)
        .unit("none")
        .datasource(DATASOURCE)
        .targets([query(expr, ref_id="A", instant=True).format(promql.PromQueryFormat.TABLE)])
        .span(w)
        .height(h)
        .with_transformation(
            dashboard.DataTransformerConfig(id_val="organize", options={"excludeByName": excluded})
        )
    )


def scoped(rule: str) -> str:
    """A recording rule's series of the selected run (the rules keep the project and run labels)."""
    return rule + RUN_SEL


def project_variable():
    """The stack (Compose project, Swarm stack): one Prometheus may hold several."""
    return (
        db.QueryVariable("project")
        .label("Project")
        .datasource(DATASOURCE)
        .query(f"label_values(up{rules.JOB_SELECTOR}, {contract.PROJECT_LABEL})")
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
    )


def run_variable():
    """The run: ids are start times, newest first, so the default is the latest run; pick another
    to see an earlier one (its series stay in Prometheus)."""
    return (
        db.QueryVariable("run")
        .label("Run")
        .datasource(DATASOURCE)
        .query(f'label_values(up{{job="{contract.JOB}", project="$project"}}, {contract.RUN_LABEL})')
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_DESC)
    )


def task_variable(*, multi: bool):
    """The task selector: one value per scrape target (e.g. worker-1:<METRICS_PORT>), shown as worker-1."""
    v = (
        db.QueryVariable("task")
        .label("Task")
        .datasource(DATASOURCE)
        .query(f"label_values({contract.WORLD_SIZE.name}{{{JOB}}}, instance)")
        .regex("/(?<value>(?<text>[^:]+).*)/")
        .refresh(dashboard.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard.VariableSort.ALPHABETICAL_ASC)
        .multi(multi)
        .include_all(multi)
    )
    # Multi: every task by default (the overview repeats a panel per task); single: Grafana picks the first.
    return v.current(dashboard.VariableOption(text="All", value="$__all")) if multi else v


def row(ids: itertools.count, title: str):
    return db.Row(title).id(next(ids))


def new_dashboard(uid: str, title: str, description: str):
    return (
        db.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, "training", "tensorflow"])
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .tooltip(dashboard.DashboardCursorSync.CROSSHAIR)
        .editable()
        # Both dashboards carry the tag, so each links to the other with the same time range.
        .link(
            db.DashboardLink("Training dashboards")
            .type(dashboard.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(False)
            .keep_time(True)
            .include_vars(False)
        )
    )


# A dashboard is a table of these: each row of the table is one panel, in layout order, and
# `assemble` numbers them and adds them to the dashboard. A new panel is one more entry.


@dataclass(frozen=True, kw_only=True)
class Row:
    title: str

    def build(self, ids: itertools.count):
        return row(ids, self.title)


@dataclass(frozen=True, kw_only=True)
class Stat:
    """The last value of one query, coloured by `limits` (threshold steps); `names` maps codes to text."""

    title: str
    description: str
    unit: str
    expr: str
    legend: str = ""
    w: int = 4
    h: int = 4
    limits: tuple = (GREEN,)
    text_mode: common.BigValueTextMode = common.BigValueTextMode.AUTO
    names: dict[int, tuple[str, str]] | None = None

    def build(self, ids: itertools.count):
        p = single(
            ids,
            self.title,
            self.description,
            self.unit,
            self.expr,
            legend=self.legend,
            w=self.w,
            h=self.h,
            limits=self.limits,
            text_mode=self.text_mode,
        )
        return p.mappings(value_names(self.names)) if self.names else p


@dataclass(frozen=True, kw_only=True)
class Graph:
    """A time series of (expr, legend) queries; `repeat`: one copy per value of that variable, 4 a row."""

    title: str
    description: str
    unit: str
    exprs: tuple[tuple[str, str], ...]
    w: int = 12
    h: int = 8
    stacked: bool = False
    limits: tuple | None = None
    min_zero: bool = True
    repeat: str = ""

    def build(self, ids: itertools.count):
        p = graph(
            ids,
            self.title,
            self.description,
            self.unit,
            list(self.exprs),
            w=self.w,
            h=self.h,
            stacked=self.stacked,
            limits=self.limits,
            min_zero=self.min_zero,
        )
        return p.repeat(self.repeat).repeat_direction("h").max_per_row(4) if self.repeat else p


@dataclass(frozen=True, kw_only=True)
class Table:
    """An instant query shown as label values, one row per series; `hide` drops label columns."""

    title: str
    description: str
    expr: str
    hide: tuple[str, ...] = ()
    w: int = 12
    h: int = 7

    def build(self, ids: itertools.count):
        return labels_table(ids, self.title, self.description, self.expr, hide=self.hide, w=self.w, h=self.h)


def assemble(d, layout) -> object:
    """Add every row and panel of `layout` to dashboard builder `d`, ids 1, 2, ... in order."""
    ids = itertools.count(1)
    for item in layout:
        built = item.build(ids)
        d = d.with_row(built) if isinstance(item, Row) else d.with_panel(built)
    return d
