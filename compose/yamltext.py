"""A tiny, deterministic YAML writer for the generated compose files.

The generator must run on a bare `python3` (no PyYAML) because `make up` runs before any venv
exists. Every string is written as a JSON string, which is a valid YAML double-quoted scalar, so
nothing is ever mis-typed (`"on"`, `"0"`, `"2222"` stay strings). For Compose `$` is doubled because
compose interpolates every string: generated values are literal. Kubernetes expands only `$(VAR)` in
commands and env values, so its emitter escapes those itself and dumps with `dollars=False`. A value
Compose must interpolate itself (a `${VAR:-default}` set by `make up`'s stack.env) is an `Interpolated`.
"""

from __future__ import annotations

import json


class Interpolated(str):
    """A value Compose must interpolate (`${BIND_ADDR:-127.0.0.1}:<port>:<port>`): written without doubling `$`."""


def dump(doc: dict, header: str = "", *, dollars: bool = True) -> str:
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    lines += _block(doc, 0)
    text = "\n".join(lines) + "\n"
    return text if dollars else text.replace("$$", "$")  # every `$` was doubled: exactly undone


def _scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Interpolated):
        return json.dumps(str(value))
    if isinstance(value, str):
        return json.dumps(value.replace("$", "$$"))
    raise TypeError(f"cannot write {type(value).__name__} to compose YAML")


def _block(value: dict | list, indent: int) -> list[str]:
    pad = "  " * indent
    items = value.items() if isinstance(value, dict) else ((None, v) for v in value)
    lines = []
    for key, item in items:
        head = f"{pad}{_key(key)}:" if key is not None else f"{pad}-"
        if key is None and isinstance(item, dict) and item:
            nested = _block(item, indent + 1)  # "- first: x" then the other keys aligned under it
            lines += [f"{pad}- {nested[0].lstrip()}", *nested[1:]]
        elif isinstance(item, (dict, list)) and item:
            lines.append(head)
            lines += _block(item, indent + 1)
        elif isinstance(item, (dict, list)):
            lines.append(f"{head} {'{}' if isinstance(item, dict) else '[]'}")
        else:
            lines.append(f"{head} {_scalar(item)}")
    return lines


def _key(key: str) -> str:
    plain = key.replace("-", "").replace("_", "").replace(".", "").isalnum()
    return key if plain else json.dumps(key)
