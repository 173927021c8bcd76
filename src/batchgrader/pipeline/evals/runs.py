"""An imported eval on a schedule: each scheduled time a new run of the whole eval over the
items of its ``source`` (a JSONL file of ``{"item": ..., "sample": ...}`` lines, or a folder of
them), with its own results.

`bgctl evals import --schedule CRON --schedule-source PATH` records the schedule in the eval's
``plan.json``.  The daemon's schedule step decides the times with the profiles' rule
(:func:`batchgrader.core.rules.cron.due_runs_of`, under the schedule name ``eval:<name>``: a time is
recorded by ``ScheduledRunStarted`` with its first job's ``JobAccepted``, so a restart or a
second daemon never runs it again, and times missed while no daemon ran run once, the latest).
For a time it calls :func:`stage_run`, which writes the run's own eval folder,
``<home>/evals/<name>-<YYYYMMDDTHHMM>Z/`` (the eval, its plan without the schedule, the source's
items checked as the import checks them, the first stage's request files and ``queued.json``),
written under a temporary name and renamed into place, once: a second call for the same time
finds it and returns the same files.  The step then starts each request file as a job whose id
is derived from (schedule, time, file); from there the run is an imported eval like any other:
the eval step queues its grading after a generation and writes its ``run.json``, output items and
report into the outbox under the run's name.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.rules.cron import ProfileSchedule
from batchgrader.pipeline.evals import chain
from batchgrader.pipeline.evals import data as evdata
from batchgrader.pipeline.evals.folder import PLAN_FILE, QUEUED_FILE, dump_jsonl, evals_root, names, read_json, write_json
from batchgrader.pipeline.evals.plan import JobPlan, plan_jobs
from batchgrader.pipeline.evals.spec import EvalInputError, Problem, parse_eval, parse_run

#: a scheduled eval's schedule name (``ScheduledRunStarted.schedule``): beside the profiles' names
PREFIX = "eval:"


def schedule_name(name: str) -> str:
    return PREFIX + name


def eval_schedules(home: Home) -> list[ProfileSchedule]:
    """Every imported eval's schedule (``plan.json`` ``schedule``), as the profiles' are read."""
    out = []
    for name in names(home):
        sch = (read_json(evals_root(home) / name / PLAN_FILE).get("schedule")) or None
        if isinstance(sch, dict) and sch.get("cron") and sch.get("source"):
            out.append(ProfileSchedule(schedule_name(name), str(sch["cron"]), str(sch["source"]), own_profile=False))
    return out


def run_name(name: str, scheduled_for: float) -> str:
    """The run's name (its folder and its outbox files): the eval's, then the time (UTC, minutes)."""
    return f"{name}-{datetime.fromtimestamp(scheduled_for, UTC).strftime('%Y%m%dT%H%M')}Z"


def source_path(home: Home, source: str) -> Path:
    p = Path(source).expanduser()
    return p if p.is_absolute() else home.root / p


def source_rows(home: Home, source: str) -> list[evdata.Row] | None:
    """The source's items: a JSONL file, or a folder's ``*.jsonl`` files in name order (one
    list, counted from 0); None when there is none (yet)."""
    p = source_path(home, source)
    files = [p] if p.is_file() else sorted(f for f in p.glob("*.jsonl") if f.is_file()) if p.is_dir() else []
    if not files:
        return None
    rows: list[evdata.Row] = []
    for f in files:
        more, _notes = evdata.read_items(f)
        rows += [evdata.Row(len(rows) + i, r.item, r.sample, r.where) for i, r in enumerate(more)]
    return rows


@dataclass(frozen=True)
class StagedFile:
    key: str
    profile: str
    path: str  # the request file in the run's folder: the job's source


@dataclass(frozen=True)
class StagedRun:
    name: str
    folder: Path
    files: tuple[StagedFile, ...]


def _staged(folder: Path) -> StagedRun:
    queued = read_json(folder / QUEUED_FILE)
    files = tuple(StagedFile(str(j["key"]), str(j["profile"]), str(j["path"])) for j in queued["jobs"])
    return StagedRun(folder.name, folder, files)


def stage_run(home: Home, name: str, scheduled_for: float, after_seq: int) -> StagedRun | None:
    """The run of eval ``name`` at ``scheduled_for`` written as its own eval folder (see the
    module's docstring), or the one written before; None when the source has no file yet.
    Items that the eval cannot grade raise :class:`EvalInputError` (nothing is written)."""
    root = evals_root(home)
    src_folder = root / name
    plan = read_json(src_folder / PLAN_FILE)
    run = run_name(name, scheduled_for)
    final = root / run
    if (final / QUEUED_FILE).is_file():
        return _staged(final)
    rows = source_rows(home, str(plan["schedule"]["source"]))
    if rows is None:
        return None
    spec = parse_eval(read_json(src_folder / "eval.json"), allow_python=bool(plan.get("allow_python")))
    ref_run = src_folder / "reference" / "run.json"
    gen = parse_run(read_json(ref_run)).generation if plan.get("generation") and ref_run.is_file() else None
    if gen is not None:
        rows = [evdata.Row(r.index, r.item, None, r.where) for r in rows]
    problems = evdata.check_rows(spec, rows, samples_later=gen is not None)
    if gen is not None:
        problems += chain.check_generation(gen, rows)
    if problems:
        raise EvalInputError(problems)
    queued = read_json(src_folder / QUEUED_FILE)
    profiles = {str(j["key"]): str(j["profile"]) for j in list(queued.get("jobs") or ()) + list(queued.get("next") or ())}
    first: list[JobPlan]
    if gen is not None:
        first = [chain.plan_generation(gen, rows)]
        grading = plan_jobs(spec, [], int(plan.get("samples") or 1), plan.get("embedding_model"))
    else:
        first = [p for p in plan_jobs(spec, rows, int(plan.get("samples") or 1), plan.get("embedding_model")) if p.rows]
        grading = []
    tmp = root / f".{run}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "requests").mkdir(parents=True)
    try:
        (tmp / "eval.json").write_bytes((src_folder / "eval.json").read_bytes())
        if gen is not None:
            (tmp / "reference").mkdir()
            (tmp / "reference" / "run.json").write_bytes(ref_run.read_bytes())
        record: dict[str, Any] = {k: v for k, v in plan.items() if k != "schedule"}
        record.update(name=run, rows=len(rows), scheduled={"eval": name, "for": scheduled_for})
        write_json(tmp / PLAN_FILE, record)
        dump_jsonl(tmp / "items.jsonl", [r.record() for r in rows])
        jobs = []
        for p in first:
            file = f"{run}-{p.key}.jsonl"
            dump_jsonl(tmp / "requests" / file, p.rows)
            jobs.append({"key": p.key, "profile": profiles[p.key], "path": str(final / "requests" / file)})
        q: dict[str, Any] = {"after_seq": after_seq, "stage": "generation" if gen is not None else "grading", "jobs": jobs}
        if gen is not None:
            q["next"] = [{"key": p.key, "profile": profiles[p.key]} for p in grading]
        write_json(tmp / QUEUED_FILE, q)
        try:
            os.rename(tmp, final)
        except OSError:  # another daemon (or an earlier try) put it there first
            if not (final / QUEUED_FILE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return _staged(final)


def schedule_problem(cron: str | None, source: str | None, has_jobs: bool) -> Problem | None:
    """Why an import's ``--schedule`` / ``--schedule-source`` cannot be recorded, or None."""
    from batchgrader.core.rules.cron import check_schedule

    if not cron and not source:
        return None
    if not cron or not source:
        return Problem(
            "--schedule" if not cron else "--schedule-source",
            "a scheduled eval needs both a cron expression and a source of items",
            "pass --schedule 'MIN HOUR DAY MONTH WEEKDAY' (UTC) and --schedule-source ITEMS.jsonl (or a folder of them)",
        )
    try:
        check_schedule(cron)
    except ValueError as exc:
        return Problem("--schedule", f"{cron!r} is not a schedule", f"give {exc}")
    if not has_jobs:
        return Problem(
            "--schedule",
            "the eval has no criterion that needs a batch job (every criterion is computed locally)",
            "run it with `bgctl evals import` when its items change, or add a model criterion",
        )
    return None


def scheduled_record(cron: str, source: str) -> dict[str, Any]:
    return {"cron": cron.strip(), "source": source}
