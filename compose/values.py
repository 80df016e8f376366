"""Every value a user may give make, its kind, and the one-line rule it must follow (issue 46).

One table (VARIABLES) names each variable with a kind (KINDS). Make checks the checked kinds at parse
time, before anything runs, through the fragment this module writes (`python -m compose.values --make`
> compose/values.mk, included by the top Makefile right after it takes command-line values as typed):
make functions only, no $(shell). The lifecycle's Python calls `check(name, value)` with the same rules.

Why the rules are what they are: a checked value becomes a path, a project or container name, a
command-line flag or part of a compose file; its characters are the ones such a thing needs, and none
a shell, make or YAML would read as code or as a separator (quotes, backticks, $, ;, &, |, <, >,
parentheses, spaces, newlines, #). A leading `-` is refused wherever a value becomes an argument: a
command would read it as an option. Free text (FREE: argument lists such as PYTEST_ARGS, a token,
trainer knobs such as STEPS= that the trainer's config checks) is never refused here; make hands it on
only in the environment and splits argument lists without a shell (`--with-args` below).

Standard library only: the host's python3 runs it before any venv exists.
"""

from __future__ import annotations

import os
import shlex
import string
import sys
from dataclasses import dataclass

LOWER, UPPER, DIGITS = string.ascii_lowercase, string.ascii_uppercase, string.digits
ALNUM = LOWER + UPPER + DIGITS


@dataclass(frozen=True)
class Kind:
    """What one kind of value may be: `words` it may equal, else characters from `chars` (no `chars`:
    only the words), never starting with one of `not_first`, at most `max_dots` dots; `each`: a
    space-separated list whose every word is one of them. FREE (chars None, no words) is never refused."""

    name: str
    rule: str
    chars: str | None = ""
    words: tuple[str, ...] = ()
    not_first: str = "-"
    max_dots: int | None = None
    each: tuple[str, ...] = ()

    @property
    def free(self) -> bool:
        return self.chars is None and not self.words and not self.each


def _choice(name: str, *words: str, rule: str = "") -> Kind:
    return Kind(name, rule or f"one of {', '.join(words)}", words=words)


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "name",
            "a name is lowercase letters, digits, - and _, starting with a letter or digit "
            "(Compose's project-name rule: it names containers, networks and folders)",
            chars=LOWER + DIGITS + "-_",
            not_first="-_",
        ),
        Kind(
            "dns",
            "a Kubernetes name is lowercase letters, digits, - and ., starting with a letter or digit",
            chars=LOWER + DIGITS + "-.",
            not_first="-.",
        ),
        Kind("count", "a count is digits only", chars=DIGITS),
        Kind("number", "a number is digits with at most one dot (seconds)", chars=DIGITS + ".", max_dots=1),
        _choice("flag", "0", "1", rule="1 turns it on; 0 or empty leaves it off"),
        _choice("force", "1", rule="1 or empty (FORCE=1 deletes a final model never copied out)"),
        _choice("offline", "auto", "0", "1"),
        _choice("transport", "registry", "load"),
        _choice("chaos-engine", "dind", "host"),
        _choice("resize-keep", "per-replica-batch", "global-batch"),
        _choice("variant", "cpu", "gpu"),
        Kind(
            "k8s-targets",
            "space-separated words among tfjob, jobset, trainjob",
            chars=LOWER + " ",
            each=("tfjob", "jobset", "trainjob"),
        ),
        Kind(
            "gpus",
            "auto, 0 (CPU only), a count such as 4, or GPU ids such as 0,2",
            chars=DIGITS + ",",
            words=("auto",),
            not_first=",",
        ),
        Kind("address", "an address is a host name or IP: letters, digits, . - :", chars=ALNUM + ".-:"),
        Kind("subnet", "the first three numbers of a /24, e.g. 10.210.0", chars=DIGITS + ".", not_first="."),
        Kind(
            "url",
            "a URL is scheme://host:port/path: letters, digits and . - _ : / % + = @ , (no query string, no spaces)",
            chars=ALNUM + ".-_:/%+=@,",
        ),
        Kind(
            "image",
            "an image reference or registry is letters, digits and . - _ / : @ (e.g. host:5000/repo:tag)",
            chars=ALNUM + ".-_/:@",
        ),
        Kind(
            "path",
            "a path is letters, digits and . - _ / + , @ % : (no spaces, quotes, $, `, ; or newlines: "
            "it reaches commands, mounts and compose files; no leading -: a command would read an option)",
            chars=ALNUM + ".-_/+,@%:",
        ),
        Kind("run", "a run id is letters, digits and - _ . : (e.g. 20260101T120000Z)", chars=ALNUM + "-_.:"),
        Kind("quantity", "a quantity is letters, digits and . (e.g. 1Gi, 500m, 15d, 2GB)", chars=ALNUM + "."),
        Kind("uid", "a uid is letters, digits, - and _", chars=ALNUM + "-_"),
        Kind(
            "nodes",
            "node names separated by commas, e.g. node-1,node-2",
            chars=LOWER + DIGITS + "-_,",
            not_first="-_,",
        ),
        Kind(
            "free",
            "free text: never refused by make, handed on only in the environment (argument lists are "
            "split like a shell would, without one)",
            chars=None,
        ),
    )
}


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str
    example: str
    empty_ok: bool = True


def _vars(kind: str, empty_ok: bool, *pairs: tuple[str, str]) -> list[Variable]:
    return [Variable(n, kind, e, empty_ok) for n, e in pairs]


VARIABLES: dict[str, Variable] = {
    v.name: v
    for v in [
        *_vars("name", False, ("PROJECT", "mwms2"), ("STACK", "mwms2"), ("SWARM_NAME", "mwms-swarm2")),
        *_vars("name", True, ("SERVICE", "worker-1")),
        *_vars("dns", False, ("K8S_NAME", "mwms"), ("K8S_NAMESPACE", "default")),
        *_vars("dns", True, ("K8S_STORAGE_CLASS", "standard")),
        *_vars(
            "count",
            False,
            ("WORKERS", "3"),
            ("MAX_RESTARTS", "5"),
            ("NODES", "3"),
            ("FAULTS", "20"),
            ("UNIT_JOBS", "4"),
            ("E2E_JOBS", "4"),
            ("GPUS_PER_WORKER", "1"),
            ("K8S_GPUS", "0"),
            ("PROFILE_KEEP", "5"),
        ),
        *_vars("count", True, ("SEED", "7"), ("MIN_WORKERS", "1")),
        *_vars("number", False, ("SCALING_SECONDS", "20"), ("PROFILE_SECONDS", "2")),
        *_vars("number", True, ("TUNE_SECONDS", "60"), ("RESIZE_AFTER", "30"), ("COMPARE_SKIP", "10")),
        *_vars(
            "flag",
            True,
            ("APPLY", "1"),
            ("TUNE_RESTART_OK", "1"),
            ("JSON", "1"),
            ("SWARM_ENCRYPT", "1"),
            ("PROMETHEUS_LIFECYCLE", "1"),
        ),
        *_vars("force", True, ("FORCE", "1")),
        *_vars("offline", False, ("OFFLINE", "1")),
        *_vars("transport", False, ("TRANSPORT", "load")),
        *_vars("chaos-engine", False, ("CHAOS_ENGINE", "host")),
        *_vars("resize-keep", True, ("RESIZE_KEEP", "global-batch")),
        *_vars("variant", True, ("VARIANT", "gpu")),
        *_vars("k8s-targets", False, ("K8S_TARGETS", "tfjob")),
        *_vars("gpus", False, ("GPUS", "0")),
        *_vars("address", False, ("BIND_ADDR", "127.0.0.2")),
        *_vars("subnet", False, ("SWARM_SUBNET", "10.211.0")),
        *_vars("url", False, ("PROMETHEUS_URL", "http://prometheus.example")),
        *_vars("url", True, ("GRAFANA_URL", "https://grafana.example")),
        *_vars(
            "image",
            False,
            ("IMAGE_REPO", "mwms/trainer"),
            ("REGISTRY", "127.0.0.1:5000"),
            ("NODE_REGISTRY", "10.210.0.10:5000"),
            ("PROMETHEUS_IMAGE", "mwms/prometheus:2.42.0-bookworm"),
            ("ALERTMANAGER_IMAGE", "mwms/alertmanager:0.25.0-bookworm"),
        ),
        *_vars(
            "image",
            True,
            ("GRAFANA_IMAGE", "grafana/grafana:10.4.2"),
            ("K8S_IMAGE", "host:5000/trainer@sha256:..."),
        ),
        *_vars(
            "path",
            False,
            ("RUN_DIR", ".run/mwms2"),
            ("SECRETS_DIR", "secrets"),
            ("PYTHON", "/usr/bin/python3"),
            ("PROMTOOL", "promtool"),
            ("AMTOOL", "amtool"),
            ("K8S_DIR", ".run/k8s"),
            ("ALERTMANAGER_CONFIG", "monitoring/config/alertmanager/alertmanager.yml"),
        ),
        *_vars("path", True, ("SCRIPT", "my/train.py"), ("DATA", "/data/records"), ("OUTPUT", "models/run1")),
        *_vars("run", True, ("RUN", "20260101T120000Z"), ("WITH", "20260101T110000Z")),
        *_vars("quantity", False, ("K8S_STORAGE", "1Gi")),
        *_vars(
            "quantity",
            True,
            ("CPU_PER_TASK", "2"),
            ("MEMORY_PER_TASK", "4Gi"),
            ("PROMETHEUS_RETENTION_TIME", "15d"),
            ("PROMETHEUS_RETENTION_SIZE", "2GB"),
        ),
        *_vars("uid", False, ("GRAFANA_DATASOURCE_UID", "prometheus")),
        *_vars("nodes", True, ("TRAINER_NODES", "node-1,node-2")),
        *_vars(
            "free",
            True,
            ("ARGS", "--input-delay-ms 20"),
            ("PYTEST_ARGS", "-k 'a and b'"),
            ("BENCH_ARGS", "--rounds 7"),
            ("SCRIPT_BENCH_ARGS", "--rounds 5"),
            ("TRAIN_ARGS", "--steps 300"),
            ("BENCH_COMM_ARGS", "--where bridge"),
            ("SCALING_ARGS", "--task cnn"),
            ("TUNE_CANDIDATES", "..."),
            ("GRAFANA_TOKEN", "..."),
        ),
    ]
}
"""Every variable a user may give make. Trainer knobs (STEPS=, TASK=, any trainer flag upper-cased,
compose/knobs.py) are free text too: the trainer's config checks them, make only hands them on."""

CHECKED = tuple(n for n, v in VARIABLES.items() if not KINDS[v.kind].free)
FREE = tuple(n for n, v in VARIABLES.items() if KINDS[v.kind].free)


def shown(value: str) -> str:
    """The value on one line, quoted: a newline or tab shown escaped (make's refusal shows it alike)."""
    return "'" + value.replace("\n", "\\n").replace("\t", "\\t") + "'"


def _fits(kind: Kind, value: str) -> bool:
    if value in kind.words:
        return True
    if kind.each:
        return set(value) <= set(kind.chars or "") and all(w in kind.each for w in value.split(" ") if w)
    if not kind.chars:
        return False
    return (
        set(value) <= set(kind.chars)
        and value[0] not in kind.not_first
        and (kind.max_dots is None or value.count(".") <= kind.max_dots)
    )


def problem(name: str, value: str) -> str | None:
    """None if `value` follows NAME's rule, else the one-line refusal naming NAME and the fix."""
    var = VARIABLES[name]
    kind = KINDS[var.kind]
    if kind.free:
        return None
    if (value == "" and var.empty_ok) or (value != "" and _fits(kind, value)):
        return None
    return f"{name}={shown(value)}: {kind.rule} (e.g. {name}={var.example})"


def check(name: str, value: str) -> None:
    """Raise ValueError (one line naming NAME and the fix) unless VALUE follows NAME's rule.
    KeyError for a name not in VARIABLES: every value make takes is in the table."""
    message = problem(name, value)
    if message:
        raise ValueError(message)


def check_environ(environ: dict[str, str] | os._Environ[str]) -> None:
    """check() every table variable present in ENVIRON."""
    for name in VARIABLES:
        if name in environ:
            check(name, environ[name])


# --- the make fragment ---------------------------------------------------------------------------

_SPECIAL = {",": "$(_values_comma)", " ": "$(_values_space)", "$": "$$", "#": "\\#"}


def _mk_text(text: str) -> str:
    """Literal text inside a make function call on a parsed (non-recipe) line."""
    return "".join(_SPECIAL.get(c, c) for c in text)


def _mk_message(text: str) -> str:
    """Literal text of an $(error ...) argument: commas and spaces may stay, $ and # may not."""
    return text.replace("$", "$$").replace("#", "\\#")


def _deleted(chars: str, ref: str) -> str:
    """Make text: REF with every character of CHARS deleted, then whitespace made visible."""
    out = ref
    for c in chars:
        out = f"$(subst {_mk_text(c)},,{out})"
    return f"$(call _values_visible,{out})"


def _mk_bad(var: Variable) -> str:
    """Make text that expands to something non-blank when $(NAME) breaks its rule."""
    kind = KINDS[var.kind]
    v = f"$({var.name})"
    visible = f"$(call _values_visible,{v})"
    tests = []
    if kind.each:
        tests += [_deleted(kind.chars or "", v), f"$(filter-out {' '.join(kind.each)},{v})"]
    else:
        fits = []
        if kind.chars:
            fits.append(_deleted(kind.chars, v))  # a character outside the set
            if kind.not_first:
                pattern = " ".join(_mk_text(c) + "%" for c in kind.not_first)
                fits.append(f"$(filter {pattern},{visible})")
            if kind.max_dots is not None:
                fits.append(f"$(word {kind.max_dots + 2},$(subst .,$(_values_space),x{visible}x))")
        else:
            fits.append("bad")
        broken = "".join(fits)
        if kind.words:
            broken = f"$(if $(filter {' '.join(kind.words)},{visible}),,{broken})"
        tests.append(broken)
    # Blank (whitespace only shows as !, so only an empty value): refused unless empty_ok.
    return f"$(if {visible},{''.join(tests)}{'' if var.empty_ok else ',empty'})"


def make_fragment() -> str:
    given = " ".join(VARIABLES)
    lines = [
        "# GENERATED by `python -m compose.values --make` from compose/values.py: do not edit; run that",
        "# command after changing the table (tests/unit/test_hostile_values.py compares this file with it).",
        "# Included by the top Makefile before anything uses a value: make functions only, no $(shell).",
        "",
        "_values_empty :=",
        "_values_space := $(_values_empty) $(_values_empty)",
        "_values_tab := $(_values_empty)\t$(_values_empty)",
        "_values_comma := ,",
        "define _values_nl",
        "",
        "",
        "endef",
        "_values_visible = $(subst $(_values_nl),!,$(subst $(_values_tab),!,$(subst $(_values_space),!,$(1))))",
        "_values_shown = '$(subst $(_values_nl),\\n,$(subst $(_values_tab),\\t,$(1)))'",
        "",
        f"_values_all := {given}",
        "# Taken from the environment (CI may set PROJECT there): make would expand a $ in them, so they are",
        "# taken as typed, as the Makefile takes the command line's, and stay exported.",
        "_values_environment := $(foreach v,$(_values_all),$(if $(filter environment,$(origin $(v))),$(v)))",
        "$(foreach v,$(_values_environment),$(eval override $(v) := $$(value $(v))))",
        "export $(_values_environment)",
        "_values_given := $(filter $(_values_all),$(MAKE_COMMAND_LINE) $(_values_environment))",
        "",
    ]
    for name in CHECKED:
        var = VARIABLES[name]
        rule = KINDS[var.kind].rule
        message = f"{name}=$(call _values_shown,$({name})): {_mk_message(rule)} (e.g. {name}={_mk_message(var.example)})"
        lines += [
            f"ifneq ($(filter {name},$(_values_given)),)",
            f"$(if {_mk_bad(var)},$(error {message}))",
            "endif",
        ]
    return "\n".join(lines) + "\n"


def _with_args(argv: list[str]) -> int:
    """`--with-args VAR cmd...`: run cmd with $VAR's words appended, split as a shell would split
    them (quotes honoured) but by shlex, so nothing in them runs; exit with cmd's status."""
    name, command = argv[0], argv[1:]
    try:
        words = shlex.split(os.environ.get(name, ""))
    except ValueError as e:
        print(f"{name}={shown(os.environ.get(name, ''))}: {e} (quote as in a shell)", file=sys.stderr)
        return 2
    os.execvp(command[0], command + words)
    return 127  # not reached


def _check_named(names: list[str]) -> int:
    """`--check VAR...`: each VAR of the environment against its rule; the first refusal, one line, exit 2."""
    for name in names:
        message = problem(name, os.environ.get(name, ""))
        if message:
            print(message, file=sys.stderr)
            return 2
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--make"]:
        sys.stdout.write(make_fragment())
        return 0
    if argv[:1] == ["--with-args"] and len(argv) >= 3:
        return _with_args(argv[1:])
    if argv[:1] == ["--check"]:
        return _check_named(argv[1:])
    if argv[:1] == ["--table"]:
        for name, var in VARIABLES.items():
            print(f"{name:26} {var.kind:13} {KINDS[var.kind].rule}")
        return 0
    print(
        "usage: python -m compose.values --make | --table | --check VAR... | --with-args VAR command [arg...]",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
