"""The daemon's shape, measured (issue 36): not a test.  For each source tree given (a checkout's
``src``; the current one by default), in a subprocess that imports that tree:

* **import depth and internal import edges of daemon/**: grimp's import graph of
  ``batchgrader`` (the library import-linter is built on), restricted to the modules of
  ``batchgrader.daemon``: the edges between them, and the longest chain of imports among them
  (in modules);
* **calls from the loop to the first external write**: a real ``Daemon(..., sandbox=True,
  once=True)`` grades a two-row file (``preflight_rows: 0``: its first write is the upload); at
  the first call of the OpenAI SDK's ``Files.create`` the stack is read, and the frames of
  ``batchgrader`` code from the loop's frame (``Daemon._main_loop``, or the scheduler's
  ``TickTimer.run`` before the one loop) to the SDK are counted;
* **lines of source**: every line of ``src/batchgrader/**/*.py`` (as ``wc -l``), and of
  ``daemon/``;
* **classes over 25 methods**: functions defined in a class body (ast), with those it inherits
  from the project's own classes (a base found by name: in its module first, else the one class
  of that name).

    .venv/bin/python bench/bench_architecture.py                          # this checkout
    .venv/bin/python bench/bench_architecture.py --src /tmp/before/src    # another, e.g. a git worktree
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANY_METHODS = 25

PROBE = r"""
import json, sys, tempfile, threading
from pathlib import Path

import grimp

graph = grimp.build_graph("batchgrader")
daemon = {m for m in graph.modules if m == "batchgrader.daemon" or m.startswith("batchgrader.daemon.")}
edges = {(a, b) for a in daemon for b in graph.find_modules_directly_imported_by(a) if b in daemon and a != b}
memo = {}
def depth(m, seen=()):
    if m in memo:
        return memo[m]
    d = 1 + max((depth(b, seen + (m,)) for a, b in edges if a == m and b not in seen), default=0)
    memo[m] = d
    return d
levels = max((depth(m) for m in daemon), default=0)

from batchgrader.core.host.home import Home
from batchgrader.daemon.process import Daemon
import openai.resources.files as files

frames = []
LOOPS = ("_main_loop", "run")
original = files.Files.create
def create(self, *a, **k):
    if not frames:
        f = sys._getframe(1)
        stack = []
        while f is not None:
            stack.append((f.f_code.co_filename, f.f_code.co_name))
            f = f.f_back
        frames.append(stack)
    return original(self, *a, **k)
files.Files.create = create  # the probe's own wrapper: what it measures is the stack, not the call

with tempfile.TemporaryDirectory() as tmp:
    home = Home(Path(tmp))
    home.ensure()
    home.config_file.write_text("preflight_rows: 0\nstable_seconds: 0\nrescan_interval_seconds: 0.2\n")
    (home.inbox / "a.csv").write_text("id,response\n0,fine\n1,good\n")
    Daemon(home, sandbox=True, once=True).run()
stack = frames[0]  # innermost first
ours = [(f, n) for f, n in stack if "/batchgrader/" in f]
loop = next(i for i, (f, n) in enumerate(ours) if (n == "_main_loop" and f.endswith("process.py")) or (n == "run" and f.endswith("tick_timer.py")))
chain = [n for f, n in reversed(ours[:loop])]
print(json.dumps({"edges": len(edges), "levels": levels, "modules": len(daemon), "calls": len(chain), "chain": chain}))
"""


def lines_of(src: Path, under: str = "") -> int:
    return sum(len(p.read_bytes().splitlines()) for p in (src / "batchgrader" / under).rglob("*.py"))


def big_classes(src: Path, largest: list[str] | None = None) -> list[str]:
    """The classes over :data:`MANY_METHODS` methods; ``largest`` gets the largest class named."""
    classes: dict[tuple[str, str], tuple[set[str], list[str]]] = {}  # (module, class) -> (methods, base names)
    for p in sorted((src / "batchgrader").rglob("*.py")):
        rel = str(p.relative_to(src / "batchgrader"))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                own = {b.name for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))}
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))
                ]
                classes[(rel, node.name)] = (own, bases)
    by_name: dict[str, list[tuple[str, str]]] = {}
    for key in classes:
        by_name.setdefault(key[1], []).append(key)

    def methods(key: tuple[str, str], seen: frozenset = frozenset()) -> set[str]:
        own, bases = classes[key]
        out = set(own)
        for base in bases:
            found = (key[0], base) if (key[0], base) in classes else None
            if found is None and len(by_name.get(base, [])) == 1:
                found = by_name[base][0]
            if found is not None and found not in seen:
                out |= methods(found, seen | {key})
        return out

    out = []
    counts = {key: len(methods(key)) for key in classes}
    for key, n in counts.items():
        if n > MANY_METHODS:
            out.append(f"{key[0]}:{key[1]} ({n})")
    if largest is not None and counts:
        key = max(counts, key=lambda k: counts[k])
        largest.append(f"{key[0]}:{key[1]} ({counts[key]})")
    return out


def measure(src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"probe failed for {src}:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["lines"] = lines_of(src)
    figures["daemon_lines"] = lines_of(src, "daemon")
    largest: list[str] = []
    figures["big_classes"] = big_classes(src, largest)
    figures["largest_class"] = largest[0] if largest else ""
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, nargs="*", default=[ROOT / "src"], help="source trees to measure (each a checkout's src)")
    args = ap.parse_args()
    for src in args.src:
        f = measure(src.resolve())
        print(f"{src}:")
        print(f"  daemon/: {f['modules']} modules, {f['edges']} internal import edges, {f['levels']} levels")
        print(f"  calls from the loop to the first external write: {f['calls']} ({' > '.join(f['chain'])})")
        print(f"  lines of source: {f['lines']:,} (daemon/: {f['daemon_lines']:,})")
        print(
            f"  classes over {MANY_METHODS} methods: {', '.join(f['big_classes']) or 'none'} (the largest: {f['largest_class']})"
        )


if __name__ == "__main__":
    main()
