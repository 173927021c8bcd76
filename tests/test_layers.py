"""The layer order holds: each subpackage imports only from the layers below it
(fsio, core, pipeline, store, provider | emulator | reports, daemon, ops, cli; ``a | b`` are independent
siblings, neither importing the other), checked by import-linter with the contract in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import batchgrader

ROOT = Path(__file__).resolve().parent.parent


def layers_contract() -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    return contract


def test_every_part_of_the_package_has_a_layer():
    package = Path(batchgrader.__file__).parent
    parts = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    parts |= {p.parent.name for p in package.glob("*/__init__.py")}
    named = {name.strip() for layer in layers_contract()["layers"] for name in layer.split("|")}
    assert parts == named


def test_no_import_runs_against_the_layer_order():
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
