"""`bgctl evals import`: an exported eval (and its items, run, output items) into the home.

Everything is read and checked first (:func:`prepare_import`: the eval against openai-python's
types and the API's rules, the rows against ``item_schema`` and every template variable, each
metric available here, each model in the catalogue with its settings); any problem raises
:class:`~batchgrader.pipeline.evals.spec.EvalInputError` with all of them, and nothing is written.

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

from batchgrader.core.host.home import Home
from batchgrader.pipeline.evals import chain, graders, runs
from batchgrader.pipeline.evals import data as evdata
from batchgrader.pipeline.evals.folder import PLAN_FILE, QUEUED_FILE, evals_root
from batchgrader.pipeline.evals.plan import JobPlan, plan_jobs
from batchgrader.pipeline.evals.spec import EvalInputError, EvalSpec, Problem, RunSpec, parse_eval, parse_run, slug


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
    generation: JobPlan | None = None  # generate-then-grade: the generation job (the grading jobs follow it)
    embedding_model: str | None = None  # the cosine criteria's embedding model (None: no cosine criterion)
    schedule: dict[str, Any] | None = None  # {cron, source}: a new run of the eval at each time (pipeline/evals/runs.py)

    @property
    def queued_now(self) -> list[JobPlan]:
        """The jobs the import queues: the generation, or the grading jobs."""
        return [self.generation] if self.generation else self.jobs

    def all_jobs(self) -> list[JobPlan]:
        return ([self.generation] if self.generation else []) + self.jobs

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
            if c.embedded and self.embedding_model:
                rec["computed"] = "from OpenAI embeddings, at batch price"
                rec["variant"] = graders.embedding_variant(self.embedding_model)
                rec["variant_description"] = graders.describe("cosine", rec["variant"])
                rec["model"] = self.embedding_model
                rec["job"] = next(j.key for j in self.jobs if j.kind == "embeddings")
            elif c.type == "text_similarity":
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
            "embedding_model": self.embedding_model,
            "schedule": self.schedule,
            "item_rule": "an item passes when every criterion passes; it is errored when a criterion has no verdict and none failed",
            "criteria": criteria,
            "jobs": [
                {
                    "key": j.key,
                    "model": j.model,
                    "kind": j.kind,
                    "criteria": list(j.criteria),
                    "requests": self._rows(j) * (self.samples if j.kind == "model" else 1),
                    "rows": self._rows(j),
                    "file": self.job_file(j),
                    "response_format": j.settings["response_format"],
                    "system_prompt": j.settings["system_prompt"],
                    **({"queued": "when the generation's result is written"} if self.generation else {}),
                }
                for j in self.jobs
            ],
            "generation": self._generation_record(),
            "run": {"id": self.run.id, "name": self.run.name} if self.run else None,
            "notes": self.notes,
        }

    def job_file(self, job: JobPlan) -> str:
        return f"{self.name}-{job.key}.jsonl"

    def _rows(self, job: JobPlan) -> int:
        """A job's request rows (a grading after a generation: one per item and criterion, at most)."""
        return len(job.rows) if not self.generation else len(self.rows) * len(job.criteria) * job.requests_per_item

    def _generation_record(self) -> dict[str, Any] | None:
        if self.generation is None or self.run is None or self.run.generation is None:
            return None
        g = self.generation
        return {
            "key": g.key,
            "kind": self.run.generation.kind,
            "model": g.model,
            "requests": len(g.rows),
            "rows": len(g.rows),
            "file": self.job_file(g),
            "response_format": g.settings.get("response_format"),
            "system_prompt": g.settings["system_prompt"],
            "data_source": dict(self.run.generation.data_source),
        }


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
    embedding_model: str | None = None,
    schedule: str | None = None,
    schedule_source: str | None = None,
) -> Prepared:
    """Read and check everything; raise :class:`EvalInputError` with every problem.
    ``embedding_model``: the OpenAI embedding model of the ``cosine`` criteria (default
    text-embedding-3-large, the one OpenAI's Evals used)."""
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
    gen = run.generation if run else None
    if gen is not None:
        if any(r.sample is not None for r in rows):
            notes.append("the items' own samples are not graded: the run samples its model first (generate-then-grade)")
            rows = [evdata.Row(r.index, r.item, None, r.where) for r in rows]
    elif output_items is not None and data_path is not None:
        rows, filled = evdata.with_samples_from(rows, output_items)
        if filled:
            notes.append(f"{filled} item(s) without a sample take the sample of their output item (same datasource_item_id)")
    problems = evdata.check_rows(spec, rows, samples_later=gen is not None)
    if gen is not None:
        problems += chain.check_generation(gen, rows)
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
            from batchgrader.pipeline.evals.pygrader import unavailable

            why = unavailable()
            if why:
                problems.append(
                    Problem(f"testing_criteria[{c.index - 1}] ({c.name!r})", why, "run it where the sandbox works, or drop it")
                )
    embedding = _embedding_model(spec, embedding_model, problems)
    has_jobs = bool(spec.model_criteria or spec.embedded_criteria or gen)
    bad_schedule = runs.schedule_problem(schedule, schedule_source, has_jobs)
    if bad_schedule is not None:
        problems.append(bad_schedule)
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
    jobs = plan_jobs(spec, [] if gen else rows, samples, embedding)
    generation = chain.plan_generation(gen, rows) if gen else None
    for j in ([generation] if generation else []) + jobs:
        notes += j.notes
    if embedding:
        notes.append(
            f"cosine criteria: their inputs and references are embedded with {embedding} through OpenAI's Batch API "
            "(/v1/embeddings, at batch price; an OpenAI key is needed whatever provider the other criteria use)"
        )
    scheduled = runs.scheduled_record(schedule, schedule_source) if schedule and schedule_source else None
    if scheduled:
        notes.append(
            f"scheduled: at each time of {scheduled['cron']!r} (UTC) the daemon runs the whole eval again over the items in "
            f"{schedule_source} (each run its own results, named {name}-<YYYYMMDDTHHMM>Z)"
        )
    return Prepared(
        name, spec, run, rows, output_items, jobs, notes, allow_python, samples or 1, generation, embedding, scheduled
    )


def _embedding_model(spec: EvalSpec, model: str | None, problems: list[Problem]) -> str | None:
    """The embedding model of the cosine criteria (None without one); a model that is not one of
    OpenAI's embedding models in the catalogue is a problem (this program embeds through OpenAI's
    Batch API only)."""
    from batchgrader.pipeline.catalogue import shipped_spec

    if not spec.embedded_criteria:
        if model:
            problems.append(Problem("--embedding-model", "the eval has no cosine criterion", "leave --embedding-model out"))
        return None
    chosen = model or graders.EMBEDDING_VARIANTS[graders.DEFAULT_EMBEDDING_VARIANT]
    row = shipped_spec(chosen)
    if not row.embeddings or row.provider != "openai":
        known = ", ".join(graders.EMBEDDING_VARIANTS.values())
        what = (
            f"{chosen!r} is a {row.provider} model, not an embedding model"
            if row.provider and not row.embeddings
            else f"{chosen!r} is not one of OpenAI's embedding models in the catalogue"
        )
        problems.append(
            Problem(
                "--embedding-model",
                f"{what}: cosine criteria are embedded through OpenAI's Batch API (/v1/embeddings) only; other providers' "
                "batch embeddings are not supported here",
                f"pass --embedding-model with one of {known} (and set OPENAI_API_KEY), or drop the cosine criteria",
            )
        )
    return chosen


def install(home: Home, prepared: Prepared, load_config: Callable[[], Any]) -> dict[str, Any]:
    """Write the eval's folder, its profiles and its queued rows (see the module's docstring):
    what was written, for the summary."""
    from batchgrader.core.configuration.config import ConfigError
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
            for job, profile in zip(prepared.all_jobs(), profiles):
                if job in prepared.queued_now:
                    check_input(tmp / "requests" / prepared.job_file(job), config.profile(profile), home)
        except (ConfigError, InputError) as exc:
            raise EvalInputError(
                [Problem("profiles", str(exc), "change the criteria's models or settings, or add the model to pricing.csv")]
            ) from None
        after = _log_position(home)
        os.rename(tmp, final)
        renamed = True
        by_key = dict(zip((j.key for j in prepared.all_jobs()), profiles))
        for job in prepared.queued_now:
            queued.append(submit_file(home, final / "requests" / prepared.job_file(job), by_key[job.key]))
        record: dict[str, Any] = {
            "after_seq": after,
            "stage": "generation" if prepared.generation else "grading",
            "jobs": [{"key": j.key, "profile": by_key[j.key], "path": str(q)} for j, q in zip(prepared.queued_now, queued)],
        }
        if prepared.generation:  # the grading's profiles, for the jobs queued when the generation's result is written
            record["next"] = [{"key": j.key, "profile": by_key[j.key]} for j in prepared.jobs]
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
    from batchgrader.core.configuration.config import ConfigError
    from batchgrader.ops.profiles import profile_with

    out = []
    for job in prepared.all_jobs():
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
    for job in prepared.queued_now:
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
    if plan["generation"]:
        out["generation"] = plan["generation"]
    if written:
        out.update(written)
        listed = ([out["generation"]] if prepared.generation else []) + out["jobs"]
        for job, profile in zip(listed, written["profiles"]):
            job["profile"] = profile
        for job, path in zip(listed, written["queued"]):
            job["queued"] = path
    return out
