"""The reference page (docs/reference/cli.md) and the README say what the code does: every option
the command line takes, every exit code in launcher/errors.py, and README links that lead somewhere.
The config reference is generated from the schema, so it must name every key the schema has."""
from __future__ import annotations

import dataclasses
import os
import re

from launcher import errors
from launcher.cli import command
from scripts import gen_config_docs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _read(*parts: str) -> str:
    with open(os.path.join(REPO, *parts)) as f:
        return f.read()


def _exit_code_rows(text: str) -> set[int]:
    """The codes in the first column of the '## Exit codes' table."""
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d+) \|", section, flags=re.M)}


def test_every_cli_option_is_on_the_reference_page():
    page = _read("docs", "reference", "cli.md")
    missing = [param.opts for param in command.params
               if param.param_type_name == "option" and not any(f"`{o}" in page or f" {o}`" in page or f"{o}," in page
                                                               for o in param.opts)]
    assert not missing, f"options the CLI takes but docs/reference/cli.md does not name: {missing}"


def test_every_exit_code_is_documented():
    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    for where in (("docs", "reference", "cli.md"), ("README.md",)):
        assert codes <= _exit_code_rows(_read(*where)), f"{os.path.join(*where)}: {sorted(codes - _exit_code_rows(_read(*where)))}"


def test_readme_links_lead_to_files():
    readme = _read("README.md")
    targets = {t.split("#", 1)[0] for t in re.findall(r"\]\(([^)\s]+)\)", readme)
               if not t.startswith(("http://", "https://", "#"))}
    missing = sorted(t for t in targets if not os.path.exists(os.path.join(REPO, t)))
    assert targets and not missing, f"README.md links to files that do not exist: {missing}"


def _leaf_keys(cls) -> set[str]:
    keys = set()
    for f in dataclasses.fields(cls):
        if f.metadata.get("kind") == "section":
            keys |= _leaf_keys(f.metadata["section"])
        elif f.metadata.get("kind") not in (None, "internal"):
            keys.add(f.name)
    return keys


def test_config_reference_names_every_schema_key():
    schema = gen_config_docs.load_schema()
    text = gen_config_docs.config_reference()
    missing = sorted(k for k in _leaf_keys(schema.ZeroConfig) if f"| `{k}` |" not in text)
    assert not missing, missing
    assert "| `stage` | int | `0` | `0`, `1`, `2`, `3` |" in text   # default and choices from the metadata
