"""Every third-party package the code imports is declared in pyproject.toml: the package's in its
dependencies (or an extra), the tests' and benchmarks' in the dependencies or the test extra."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _names(requirements: list[str]) -> set[str]:
    """The distributions ``requirements`` name; ``batchgrader[x,y]`` (an extra pulling in others) names theirs."""
    out = set()
    for r in requirements:
        name = re.split(r"[<>=!~\[;\s]", r, maxsplit=1)[0].lower().replace("_", "-")
        if name == PROJECT["name"] and "[" in r:
            for extra in r.split("[", 1)[1].split("]", 1)[0].split(","):
                out |= _names(PROJECT["optional-dependencies"][extra.strip()])
        else:
            out.add(name)
    return out


def imported(folder: str) -> dict[str, str]:
    """Top-level module imported under ``folder`` -> a file importing it (the standard library,
    our own package and the folder's own modules left out)."""
    base = ROOT / folder
    own = {p.stem for d in ("tests", "bench") for p in (ROOT / d).rglob("*.py")} | {"batchgrader", "__future__"}
    out: dict[str, str] = {}
    for path in sorted(base.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own:
                    out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def _undeclared(folder: str, declared: set[str]) -> list[str]:
    dists = importlib.metadata.packages_distributions()
    out = []
    for module, where in sorted(imported(folder).items()):
        names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
        if not names & declared:
            out.append(f"{module} ({', '.join(sorted(names))}), imported in {where}")
    return out


def test_every_package_the_source_imports_is_declared():
    declared = _names(PROJECT["dependencies"])
    for extra in PROJECT.get("optional-dependencies", {}).values():
        declared |= _names(extra)
    assert _undeclared("src", declared) == []


@pytest.mark.parametrize("folder", ["tests", "bench"])
def test_every_package_the_tests_and_benchmarks_import_is_declared(folder):
    declared = _names(PROJECT["dependencies"]) | _names(PROJECT["optional-dependencies"]["test"])
    assert _undeclared(folder, declared) == []


def test_the_check_finds_an_undeclared_import():
    declared = _names(PROJECT["dependencies"])
    assert {"numpy", "google-genai", "scikit-learn"} <= declared  # a requirement's name, versions and extras cut off
    assert _names(["batchgrader[test]"]) == _names(PROJECT["optional-dependencies"]["test"])
    extras = set(PROJECT.get("optional-dependencies", {})) - {"test"}  # a feature's extras: postgres, evals, ...
    with_extras = declared.union(*(_names(PROJECT["optional-dependencies"][e]) for e in extras))
    missing = _undeclared("src", with_extras - {"numpy", "scikit-learn"})
    assert [m.split(" ")[0] for m in missing] == ["numpy", "sklearn"]  # sklearn: the import name of scikit-learn
