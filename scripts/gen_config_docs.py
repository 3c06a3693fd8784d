#!/usr/bin/env python3
"""The engine config's reference, written from the schema's own field docs.

Every config key is a field of a frozen dataclass whose metadata carries ``kind``, ``doc`` and the
checks (``min``, ``max``, ``choices``, ``aliases``, ...); the config loader validates with the same
metadata, so this page cannot drift from what the engine accepts.

Two ways to use it:
    python scripts/gen_config_docs.py      prints the Markdown
    mkdocs build                           mkdocs.yml names this file as a hook: it fills the
                                           marker line in docs/reference/config.md
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys

# The one place that names the schema's module: when the module moves, change this line.
SCHEMA_MODULE = "launcher.zero.config.schema"
ROOT_CLASS = "ZeroConfig"
UNSUPPORTED_SECTIONS = "ACCEPTED_UNSUPPORTED"
# among those, the sections the pipeline engine and the dry-run read (the page's own text covers them)
READ_OUTSIDE_SCHEMA = ("pipeline", "tensor_parallel")

PAGE = "reference/config.md"
MARKER = "<!-- generated: config keys -->"

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_schema():
    """The schema module, from an installed dslaunch or from this checkout."""
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)
    return importlib.import_module(SCHEMA_MODULE)


def _literal(value) -> str:
    """A default as it is written in a JSON config."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2**62:
        return "no limit"
    return f"`{json.dumps(value)}`"


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return _literal(f.default)
    if f.default_factory is not dataclasses.MISSING:   # type: ignore[misc]
        value = f.default_factory()   # type: ignore[misc]
        return _literal(value) if isinstance(value, (dict, list)) else "see below"
    return ""


def _allowed(meta: dict) -> str:
    parts = []
    if "choices" in meta:
        parts.append(", ".join(_literal(c) for c in meta["choices"]))
    if "min" in meta:
        parts.append(f">= {meta['min']}")
    if "min_exclusive" in meta:
        parts.append(f"> {meta['min_exclusive']}")
    if "max" in meta:
        parts.append(f"<= {meta['max']}")
    if meta.get("nullable"):
        parts.append("`null`")
    return "; ".join(parts)


def _doc(meta: dict) -> str:
    text = meta["doc"]
    if meta.get("batch"):
        text += ' (`"auto"` or left out: derived by the batch rule)'
    if meta.get("aliases"):
        text += "; also spelled " + ", ".join(f"`{a}`" for a in meta["aliases"])
    return text.replace("|", "\\|")


def _sections(cls, path: str, found: dict) -> None:
    """Every section class under ``cls``, in order of first use, with each key path that uses it."""
    found.setdefault(cls, []).append(path)
    for f in dataclasses.fields(cls):
        section = f.metadata.get("section")
        if f.metadata.get("kind") == "section" and section is not None:
            _sections(section, f"{path}.{f.name}" if path else f.name, found)


def _table(cls) -> list[str]:
    rows = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        meta = f.metadata
        kind = meta.get("kind")
        if kind in (None, "internal"):
            continue
        if kind == "section":
            name = meta["section"].__name__
            rows.append(f"| `{f.name}` | section | | | {_doc(meta)} ([below](#{name.lower()})) |")
            continue
        rows.append(f"| `{f.name}` | {kind} | {_default(f)} | {_allowed(meta)} | {_doc(meta)} |")
    return rows


def config_reference() -> str:
    """The Markdown of every section and key, then the sections that load but do nothing here."""
    schema = load_schema()
    found: dict = {}
    _sections(getattr(schema, ROOT_CLASS), "", found)
    lines: list[str] = []
    for cls, paths in found.items():
        title = "top level" if paths == [""] else " / ".join(f"`{p}`" for p in paths)
        summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        lines += [f"### {title} {{#{cls.__name__.lower()}}}", "", summary, "", *_table(cls), ""]
    unsupported = [name for name in getattr(schema, UNSUPPORTED_SECTIONS) if name not in READ_OUTSIDE_SCHEMA]
    lines += ["### Sections that load but have no effect {#accepted-unsupported}", "",
              "These DeepSpeed top-level sections are accepted as they are, so a DeepSpeed config loads "
              "unchanged; the ZeRO engine prints one line for each one it finds, saying it has no effect.", "",
              ", ".join(f"`{name}`" for name in unsupported), ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """mkdocs hook: put the generated tables where the config page's marker line stands."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker line {MARKER!r}: the generated config keys have no place")
    return markdown.replace(MARKER, config_reference())


if __name__ == "__main__":
    print(config_reference())
