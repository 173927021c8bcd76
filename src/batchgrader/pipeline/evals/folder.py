"""An imported eval's folder, ``<home>/evals/<name>/``, and what it records.

Written by `bgctl evals import`: ``eval.json`` (as given), ``plan.json`` (every criterion's
pass rule, the jobs; for generate-then-grade the generation too), ``items.jsonl``,
``reference/`` (an imported run and its output items), ``requests/`` (each job's rows) and
``queued.json`` (the import's queued files: the grading jobs, or the generation job of a
generate-then-grade run, with the log position before they were queued).

Written later, by the daemon's eval step or `bgctl evals results`:

* ``grading.json`` (generate-then-grade): the grading's queued files, recorded *before* they
  are copied into the inbox (:mod:`batchgrader.pipeline.evals.chain`);
* ``samples.jsonl`` (generate-then-grade): each item's sample (or why it has none), read from
  the generation's result;
* ``results.json``: which job results the outbox's run.json, output items and report were
  computed from, written after them (:mod:`batchgrader.pipeline.evals.results`).

:func:`record` reads what the pure decision (:mod:`batchgrader.core.rules.evalchain`) needs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.rules.evalchain import EvalRecord, QueuedFile, Stage
from batchgrader.pipeline.evals.data import Row, read_output_items
from batchgrader.pipeline.evals.spec import EvalSpec, parse_eval

EVALS_DIR = "evals"
PLAN_FILE = "plan.json"
QUEUED_FILE = "queued.json"
GRADING_FILE = "grading.json"
SAMPLES_FILE = "samples.jsonl"
RESULTS_FILE = "results.json"
GENERATION_KEY = "gen"


class UnknownEval(LookupError):
    pass


def evals_root(home: Home) -> Path:
    return home.root / EVALS_DIR


def names(home: Home) -> list[str]:
    """The evals imported into the home (folders with a plan), sorted."""
    root = evals_root(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if not p.name.startswith(".") and (p / PLAN_FILE).is_file())


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, data: Any) -> None:
    """``data`` as ``path``, atomically (a crash leaves the old file or the new one)."""
    from batchgrader.fsio import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def dump_jsonl(path: Path, records: Sequence[Any]) -> None:
    """``records`` as JSON lines, atomically."""
    from batchgrader.fsio import atomic_write_bytes

    atomic_write_bytes(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))


def _stage(data: Mapping[str, Any] | None, default: str) -> Stage | None:
    if data is None:
        return None
    files = tuple(QueuedFile(str(j["key"]), os.path.normpath(str(j["path"]))) for j in data.get("jobs") or ())
    return Stage(str(data.get("stage") or default), int(data.get("after_seq") or 0), files)


def folder_of(home: Home, name: str) -> Path:
    """The eval's folder; :class:`UnknownEval` (naming the evals imported) when there is none."""
    folder = evals_root(home) / name
    if not (folder / PLAN_FILE).is_file():
        raise UnknownEval(
            f"no imported eval {name!r} in {evals_root(home)} (imported: {', '.join(names(home)) or 'none'}); "
            "import it with `bgctl evals import`"
        )
    return folder


def record(home: Home, name: str) -> EvalRecord:
    """What the eval's folder records of its stages and its written results."""
    folder = folder_of(home, name)
    plan = read_json(folder / PLAN_FILE)
    queued_path, grading_path, results_path = folder / QUEUED_FILE, folder / GRADING_FILE, folder / RESULTS_FILE
    queued = read_json(queued_path) if queued_path.is_file() else {"after_seq": 0, "jobs": []}
    first = _stage(queued, "generation" if plan.get("generation") else "grading")
    written = read_json(results_path) if results_path.is_file() else None
    if plan.get("generation"):
        grading = _stage(read_json(grading_path), "grading") if grading_path.is_file() else None
        generation = first
    else:
        grading, generation = first, None
    return EvalRecord(
        name=name,
        generation=generation,
        grading=grading,
        results_for=tuple(written["for"]) if written is not None else None,
    )


@dataclass
class Loaded:
    """An eval's folder read: its spec and plan, its rows (with their samples: the items' own, or
    for generate-then-grade those read from the generation), the imported reference output items,
    and its stages' queued files."""

    name: str
    folder: Path
    spec: EvalSpec
    plan: dict[str, Any]
    rows: list[Row]
    reference: list[dict[str, Any]] | None
    queued: dict[str, Any]
    grading: dict[str, Any] | None
    sample_errors: dict[int, str]

    @property
    def generated(self) -> bool:
        """A generate-then-grade run: the samples come from the generation job."""
        return bool(self.plan.get("generation"))


def load(home: Home, name: str) -> Loaded:
    folder = folder_of(home, name)
    plan = read_json(folder / PLAN_FILE)
    spec = parse_eval(read_json(folder / "eval.json"), allow_python=bool(plan.get("allow_python")))
    rows = []
    with open(folder / "items.jsonl", encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            rec = json.loads(line)
            rows.append(Row(int(rec["index"]), rec["item"], rec.get("sample"), f"items.jsonl line {n}"))
    sample_errors: dict[int, str] = {}
    if plan.get("generation"):
        samples, sample_errors = read_samples(folder)
        rows = [Row(r.index, r.item, samples.get(r.index), r.where) for r in rows]
        for r in rows:
            if r.sample is None and r.index not in sample_errors:
                sample_errors[r.index] = "the generation job has not answered this item"
    ref_path = folder / "reference" / "output_items.jsonl"
    reference = read_output_items(ref_path) if ref_path.is_file() else None
    queued_path, grading_path = folder / QUEUED_FILE, folder / GRADING_FILE
    queued = read_json(queued_path) if queued_path.is_file() else {"after_seq": 0, "jobs": []}
    grading = read_json(grading_path) if grading_path.is_file() else None
    return Loaded(name, folder, spec, plan, rows, reference, queued, grading, sample_errors)


def read_samples(folder: Path) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """``samples.jsonl``: each item's sample, and why an item has none."""
    samples: dict[int, dict[str, Any]] = {}
    errors: dict[int, str] = {}
    path = folder / SAMPLES_FILE
    if not path.is_file():
        return samples, errors
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                if isinstance(rec.get("sample"), dict):
                    samples[int(rec["index"])] = rec["sample"]
                else:
                    errors[int(rec["index"])] = str(rec.get("error") or "no sample")
    return samples, errors


def list_evals(home: Home) -> list[dict[str, Any]]:
    out = []
    for name in names(home):
        plan = read_json(evals_root(home) / name / PLAN_FILE)
        out.append(
            {
                "name": name,
                "eval_id": plan["eval_id"],
                "eval_name": plan["eval_name"],
                "rows": plan["rows"],
                "jobs": len(plan["jobs"]) + (1 if plan.get("generation") else 0),
                "generate_then_grade": bool(plan.get("generation")),
                "schedule": plan.get("schedule"),  # {cron, source}: run again at those times
                "scheduled": plan.get("scheduled"),  # {eval, for}: a scheduled run of that eval
            }
        )
    return out
