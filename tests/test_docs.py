"""The documentation keeps up with the code: every CLI command, every config key, every module,
and the README's two commands (which CI runs verbatim)."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from batchgrader.cli.commands import cli
from batchgrader.core.configuration.config import KEYS, env_name

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIG_DOC = DOCS / "configuration.md"
ARCH_DOC = DOCS / "architecture.md"

MAIN_JOB_COMMAND = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && "
    "BATCHGRADER_HOME=./demo-home .venv/bin/bgctl submit examples/reviews.csv && "
    "BATCHGRADER_HOME=./demo-home .venv/bin/bgctl daemon --sandbox --once && "
    "BATCHGRADER_HOME=./demo-home .venv/bin/bgctl status"
)
TEST_COMMAND = "bash .ci/system-packages && python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -n 4 -q"


def all_docs_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in [README, *sorted(DOCS.glob("*.md"))])


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, cmd in sorted(group.commands.items()):
        path = (*prefix, name)
        paths.append(path)
        if isinstance(cmd, click.Group):
            paths += command_paths(cmd, path)
    return paths


def fenced_blocks(markdown: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^```[^\n]*\n(.*?)^```[ \t]*$", markdown, re.M | re.S)]


# --- CLI -----------------------------------------------------------------------------------------


def test_the_command_tree_is_walked():
    paths = command_paths(cli)
    assert ("service", "install") in paths and ("config", "show") in paths and ("daemon",) in paths


@pytest.mark.parametrize("path", [" ".join(p) for p in command_paths(cli)])
def test_every_cli_command_is_documented(path):
    text = all_docs_text()
    pattern = r"bgctl " + r"\s+".join(map(re.escape, path.split())) + r"(?![\w-])"
    assert re.search(pattern, text), f"`bgctl {path}` is not mentioned in README.md or docs/*.md"


# --- configuration ---------------------------------------------------------------------------------


def test_the_key_tables_are_generated_from_the_declarations():
    from batchgrader.core.configuration.config_docs import regenerate

    text = CONFIG_DOC.read_text(encoding="utf-8")
    assert regenerate(text) == text, (
        "docs/configuration.md is stale: run python -m batchgrader.core.configuration.config_docs docs/configuration.md"
    )


def test_every_config_key_has_one_row_and_no_row_is_unknown():
    rows = re.findall(r"^\|\s*`([a-z0-9_]+)`\s*\|[^|]*\|\s*`BATCHGRADER_", CONFIG_DOC.read_text(encoding="utf-8"), re.M)
    assert sorted(rows) == sorted(KEYS), "each key has exactly one row in docs/configuration.md"


def test_a_stale_key_table_or_a_missing_section_is_found():
    from batchgrader.core.configuration.config_docs import StaleSection, regenerate

    text = CONFIG_DOC.read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `log_level` |"))
    stale = text.replace(row, row.replace("| no | no: restart |", "| yes | yes |"), 1)
    assert stale != text and regenerate(stale) == text
    assert regenerate(text.replace(row + "\n", "", 1)) == text  # a row left out comes back
    with pytest.raises(StaleSection, match="Housekeeping"):
        regenerate(text.replace("### Housekeeping", "### Keeping house"))


def test_a_row_shows_what_the_declaration_says():
    from batchgrader.core.configuration.config_docs import row

    cells = [c.strip() for c in row(KEYS["gemini_api_key"]).strip("|").split("|")]
    assert cells[:3] == ["`gemini_api_key`", "`null`", "`BATCHGRADER_GEMINI_API_KEY`, `GEMINI_API_KEY`, `GOOGLE_API_KEY`"]
    assert cells[4:] == ["no", "no: restart"]
    cells = [c.strip() for c in row(KEYS["samples"]).strip("|").split("|")]
    assert (cells[1], cells[2], cells[4:]) == ("`1`", f"`{env_name('samples')}`", ["yes", "yes"])


# --- events ------------------------------------------------------------------------------------------


def test_the_event_tables_are_generated_from_the_declarations():
    from batchgrader.core.log.eventdocs import regenerate

    text = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    assert regenerate(text) == text, "docs/events.md is stale: run python -m batchgrader.core.log.eventdocs docs/events.md"


def test_a_stale_event_table_or_a_missing_section_is_found():
    from batchgrader.core.log.eventdocs import StaleSection, regenerate

    text = (ROOT / "docs" / "events.md").read_text(encoding="utf-8")
    stale = text.replace("| `reason` | human-readable reason and what to do |", "| `reason` | why |", 1)
    assert stale != text and regenerate(stale) == text
    older = text.replace("version 1 · emitted by: budget.", "version 0 · emitted by: budget.", 1)
    assert older != text and regenerate(older) == text
    rows = "| `code` | budget key that holds it |\n| `reason` | human-readable reason and what to do |\n"
    empty = text.replace(rows, "", 1)  # a new section starts with an empty table
    assert empty != text and regenerate(empty) == text
    with pytest.raises(StaleSection, match="lacks a section for: JobHeld"):
        regenerate(text.replace("### `JobHeld`", "### `JobHold`"))


def test_the_answer_sources_table_is_generated_from_their_declarations():
    from batchgrader.core.log.answer_sources import doc_table

    assert doc_table() in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")


# --- architecture ------------------------------------------------------------------------------------


def test_every_module_is_in_the_architecture_doc():
    text = ARCH_DOC.read_text(encoding="utf-8")
    pkg = ROOT / "src" / "batchgrader"
    modules = sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    missing = [m for m in modules if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not describe: {', '.join(missing)}"


def test_every_subpackage_says_its_job():
    import ast

    pkg = ROOT / "src" / "batchgrader"
    for init in sorted(pkg.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and doc.startswith(init.parent.name + ":"), f"{init} has no docstring naming its job"


# --- the README's two commands -------------------------------------------------------------------


@pytest.mark.parametrize("command", [MAIN_JOB_COMMAND, TEST_COMMAND], ids=["main job", "tests"])
def test_readme_command_is_verbatim_in_its_own_fenced_block(command):
    blocks = [b.strip() for b in fenced_blocks(README.read_text(encoding="utf-8"))]
    assert command in blocks, f"README.md has no fenced code block holding exactly:\n{command}"


def test_ci_runs_the_readme_test_command():
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert TEST_COMMAND in lines, ".ci/run does not run the README's test command verbatim"


def test_readme_main_job_uses_the_shipped_example():
    assert (ROOT / "examples" / "reviews.csv").is_file()


def test_the_readme_stays_a_five_minute_read():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/guide.md"
    for doc in ("guide.md", "configuration.md", "python.md"):
        assert f"(docs/{doc}" in README.read_text(encoding="utf-8"), f"README.md does not link docs/{doc}"
