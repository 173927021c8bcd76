"""`bgctl evals import`: an exported eval (and its items, run, output items) into the home.

Everything is read and checked first (:func:`prepare_import`: the eval against openai-python's
types and the API's rules, the rows against ``item_schema`` and every template variable, each
metric available here, each model in the catalogue with its settings); any problem raises
:class:`~batchgrader.evals.spec.EvalInputError` with all of them, and nothing is written.

Then (:func:`install`) the eval's folder ``<home>/evals/<name>/`` is written under a temporary
name (``eval.json`` as given, ``plan.json`` with every criterion's pass rule and similarity
variant, ``items.jsonl``, ``reference/`` with the imported run and output items, ``requests/``
with each job's rows); the profiles (``eval-<hash>``, one per grader model) are added to
config.yaml as the Python API adds its own (config.yaml put back on any error); the folder is
renamed into place; and each job's rows are queued in its profile's inbox folder.  A failure at
any step removes what the earlier steps wrote.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batchgrader.core.home import Home
from batchgrader.evals import data as evdata
from batchgrader.evals import graders
from batchgrader.evals.plan import JobPlan, plan_jobs
from batchgrader.evals.spec import EvalInputError, EvalSpec, Problem, RunSpec, parse_eval, parse_run, slug

EVALS_DIR = "evals"
PLAN_FILE = "plan.json"
QUEUED_FILE = "queued.json"


def evals_root(home: Home) -> Path:
    return home.root / EVALS_DIR


@dataclass
class Prepared:
    """An import checked and planned, not written yet."""

    name: str
    spec: EvalSpec
    run: RunSpec | None
    rows: list[evdata.Row]
    output_items: list[dict[str, Any]] | None
    jobs: list[JobPlan]
    notes: list[str] = field(default_factory=list)
    allow_python: bool = False
    samples: int = 1

    def plan_record(self) -> dict[str, Any]:
        criteria = []
        for c in self.spec.criteria:
            rec: dict[str, Any] = {
                "index": c.index,
                "name": c.name,
                "id": c.ident,
                "type": c.type,
                "pass_rule": c.threshold_rule,
                "threshold": c.threshold,
                "computed": "locally, no model call" if c.type in ("string_check", "text_similarity", "python") else "by a model",
            }
            if c.type == "text_similarity":
                metric = c.raw["evaluation_metric"]
                rec["variant"] = graders.DEFAULT_VARIANT[metric]
                rec["variant_description"] = graders.describe(metric)
            if c.model:
                rec["model"] = c.model
                rec["job"] = next(j.key for j in self.jobs if c.index in j.criteria)
            criteria.append(rec)
        return {
            "name": self.name,
            "eval_id": self.spec.id,
            "eval_name": self.spec.name,
            "rows": len(self.rows),
            "samples": self.samples,
            "allow_python": self.allow_python,
            "item_rule": "an item passes when every criterion passes; it is errored when a criterion has no verdict and none failed",
            "criteria": criteria,
            "jobs": [
                {
                    "key": j.key,
                    "model": j.model,
                    "criteria": list(j.criteria),
                    "requests": len(j.rows) * self.samples,
                    "rows": len(j.rows),
                    "file": self.job_file(j),
                    "response_format": j.settings["response_format"],
                    "system_prompt": j.settings["system_prompt"],
                }
                for j in self.jobs
            ],
            "run": {"id": self.run.id, "name": self.run.name} if self.run else None,
            "notes": self.notes,
        }

    def job_file(self, job: JobPlan) -> str:
        return f"{self.name}-{job.key}.jsonl"


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EvalInputError([Problem(str(path), f"cannot be read ({exc.strerror})", f"give the path of the {what}")]) from None
    except UnicodeDecodeError:
        raise EvalInputError(
            [Problem(str(path), "is not UTF-8 text", f"give the {what} as the API returned it (JSON)")]
        ) from None
    except ValueError as exc:
        raise EvalInputError(
            [Problem(str(path), f"is not valid JSON ({exc})", f"give the {what} as the API returned it, unchanged")]
        ) from None


def prepare_import(
    home: Home,
    eval_path: Path,
    *,
    data_path: Path | None = None,
    run_path: Path | None = None,
    output_items_path: Path | None = None,
    name: str | None = None,
    samples: int | None = None,
    allow_python: bool = False,
) -> Prepared:
    """Read and check everything; raise :class:`EvalInputError` with every problem."""
    spec = parse_eval(_read_json(eval_path, "eval object"), allow_python=allow_python)
    notes = list(spec.notes)
    run = parse_run(_read_json(run_path, "run")) if run_path else None
    if run:
        notes += run.notes
    output_items = evdata.read_output_items(output_items_path) if output_items_path else None
    rows: list[evdata.Row]
    if data_path is not None:
        rows, more = evdata.read_items(data_path)
        notes += more
        if run and run.rows is not None:
            notes.append("--data given: the run's inline file_content is not used for the items")
    elif run and run.rows is not None:
        rows, more = evdata.rows_from_records(enumerate(run.rows, start=1), "run.data_source.source.content")
        notes += more
    elif output_items is not None:
        rows = evdata.rows_from_output_items(output_items, output_items_path.name if output_items_path else "output items")
        notes.append("items and samples read from the output items (their datasource_item and sample)")
    else:
        raise EvalInputError(
            [
                Problem(
                    "items",
                    "none given",
                    "pass --data ITEMS.jsonl (the run's items), or --run RUN.json with file_content, or --output-items",
                )
            ]
        )
    if output_items is not None and data_path is not None:
        rows, filled = evdata.with_samples_from(rows, output_items)
        if filled:
            notes.append(f"{filled} item(s) without a sample take the sample of their output item (same datasource_item_id)")
    problems = evdata.check_rows(spec, rows)
    for c in spec.criteria:
        if c.type == "text_similarity":
            why = graders.metric_unavailable(c.raw["evaluation_metric"])
            if why:
                problems.append(
                    Problem(
                        f"testing_criteria[{c.index - 1}] ({c.name!r}).evaluation_metric",
                        why,
                        "install it, or drop the criterion",
                    )
                )
        if c.type == "python":
            from batchgrader.evals.pygrader import unavailable

            why = unavailable()
            if why:
                problems.append(
                    Problem(f"testing_criteria[{c.index - 1}] ({c.name!r})", why, "run it where the sandbox works, or drop it")
                )
    name = slug(name or spec.id)
    if (evals_root(home) / name).exists():
        problems.append(
            Problem(
                "--name",
                f"an eval named {name!r} is imported already ({evals_root(home) / name})",
                "pass --name NEW_NAME, or remove that folder",
            )
        )
    if problems:
        raise EvalInputError(problems)
    jobs = plan_jobs(spec, rows, samples)
    for j in jobs:
        notes += j.notes
    return Prepared(name, spec, run, rows, output_items, jobs, notes, allow_python, samples or 1)


def install(home: Home, prepared: Prepared, load_config: Callable[[], Any]) -> dict[str, Any]:
    """Write the eval's folder, its profiles and its queued rows (see the module's docstring):
    what was written, for the summary."""
    from batchgrader.core.config import ConfigError
    from batchgrader.pipeline.catalogue import load_checked
    from batchgrader.pipeline.inbox import submit_file
    from batchgrader.pipeline.input_checks import check_input
    from batchgrader.pipeline.tables import InputError

    root = evals_root(home.ensure())
    root.mkdir(exist_ok=True)
    final = root / prepared.name
    tmp = root / f".{prepared.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    config_before = home.config_file.read_bytes() if home.config_file.exists() else None
    queued: list[Path] = []
    renamed = False
    try:
        _write_folder(tmp, prepared)
        profiles = _write_profiles(home, prepared)
        config = load_config()
        try:
            config, _table = load_checked(config)  # a model the catalogue lacks, a setting it refuses: nothing queued
            for job, profile in zip(prepared.jobs, profiles):
                check_input(tmp / "requests" / prepared.job_file(job), config.profile(profile), home)
        except (ConfigError, InputError) as exc:
            raise EvalInputError(
                [Problem("profiles", str(exc), "change the criteria's models or settings, or add the model to pricing.csv")]
            ) from None
        after = _log_position(home)
        os.rename(tmp, final)
        renamed = True
        for job, profile in zip(prepared.jobs, profiles):
            queued.append(submit_file(home, final / "requests" / prepared.job_file(job), profile))
        record = {
            "after_seq": after,
            "jobs": [{"key": j.key, "profile": p, "path": str(q)} for j, p, q in zip(prepared.jobs, profiles, queued)],
        }
        (final / QUEUED_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    except BaseException:
        for q in queued:
            q.unlink(missing_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if renamed:
            shutil.rmtree(final, ignore_errors=True)
        _restore(home, config_before)
        raise
    return {"folder": str(final), "profiles": profiles, "queued": [str(q) for q in queued]}


def _restore(home: Home, before: bytes | None) -> None:
    from batchgrader.fsio import atomic_write_bytes

    if before is None:
        home.config_file.unlink(missing_ok=True)
    elif not home.config_file.exists() or home.config_file.read_bytes() != before:
        atomic_write_bytes(home.config_file, before)


def _log_position(home: Home) -> int:
    from batchgrader.ops.grade import log_position

    return log_position(home)


def _write_profiles(home: Home, prepared: Prepared) -> list[str]:
    from batchgrader.core.config import ConfigError
    from batchgrader.ops.profiles import profile_with

    out = []
    for job in prepared.jobs:
        try:
            out.append(profile_with(home, None, job.settings, prefix="eval-", written_by=f"bgctl evals import {prepared.name}"))
        except ConfigError as exc:
            raise EvalInputError(
                [
                    Problem(
                        f"profile for {job.model} ({', '.join(f'criterion {i}' for i in job.criteria)})",
                        str(exc),
                        "change the criterion's model or sampling_params",
                    )
                ]
            ) from None
    return out


def _dump_jsonl(path: Path, records: Sequence[Any]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_folder(folder: Path, prepared: Prepared) -> None:
    (folder / "requests").mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps(prepared.spec.raw, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / PLAN_FILE).write_text(json.dumps(prepared.plan_record(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    _dump_jsonl(folder / "items.jsonl", [r.record() for r in prepared.rows])
    if prepared.run or prepared.output_items is not None:
        (folder / "reference").mkdir()
        if prepared.run:
            (folder / "reference" / "run.json").write_text(json.dumps(prepared.run.raw, indent=1) + "\n", encoding="utf-8")
        if prepared.output_items is not None:
            _dump_jsonl(folder / "reference" / "output_items.jsonl", prepared.output_items)
    for job in prepared.jobs:
        _dump_jsonl(folder / "requests" / prepared.job_file(job), job.rows)


def summary(prepared: Prepared, written: dict[str, Any] | None) -> dict[str, Any]:
    """The import's ``--json`` answer: the plan, what was written, and every note."""
    plan = prepared.plan_record()
    out: dict[str, Any] = {
        "imported": written is not None,
        "name": prepared.name,
        "eval_id": prepared.spec.id,
        "rows": len(prepared.rows),
        "criteria": plan["criteria"],
        "jobs": plan["jobs"],
        "notes": prepared.notes,
    }
    if written:
        out.update(written)
        for job, profile, path in zip(out["jobs"], written["profiles"], written["queued"]):
            job["profile"] = profile
            job["queued"] = path
    return out
