"""The layer order holds: each subpackage imports only from the layers below it
(fsio, core, pipeline, store, provider | emulator | reports, daemon, ops, cli; ``a | b`` are independent
siblings, neither importing the other), checked by import-linter with the contract in pyproject.toml; inside ``core``, the rules over the
log and the configuration (independent), all over the host."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import batchgrader

ROOT = Path(__file__).resolve().parent.parent


def layers_contract(container: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["containers"] == [container]]
    return contract


@pytest.mark.parametrize("container", ["batchgrader", "batchgrader.core"])
def test_every_part_of_the_package_has_a_layer(container):
    package = Path(batchgrader.__file__).parent.joinpath(*container.split(".")[1:])
    parts = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    parts |= {p.parent.name for p in package.glob("*/__init__.py")}
    named = {name.strip() for layer in layers_contract(container)["layers"] for name in layer.split("|")}
    assert parts == named


def test_no_import_runs_against_the_layer_order():
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
