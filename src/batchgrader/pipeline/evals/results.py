"""An imported eval's results, as OpenAI's Evals API gave them, once its jobs have ended.

:func:`finish` reads the eval's folder and each job's result file, computes every local
criterion, reads every model criterion's answer (:mod:`batchgrader.pipeline.evals.graders`), and writes
into the outbox, beside the jobs' result files:

* ``<name>_run.json``: an eval run (``result_counts``, ``per_testing_criteria_results``,
  ``per_model_usage``, ...) in the shape of ``GET /evals/{id}/runs/{run_id}``;
* ``<name>_output_items.jsonl``: one output item per row, ``results[{name, type, score, passed}]``;
* ``<name>_report.json``: each criterion's pass rate with a 95 % Wilson interval, the cost per
  model, the similarity variants used, and the comparison with imported output items.

The item rule: an item *passes* when every criterion passed; it *failed* when a criterion
failed; else (a criterion had no verdict: an error, an answer outside the labels or the range)
it is *errored*.  Criteria are AND-ed, never voted.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.log.jobstate import JobState
from batchgrader.pipeline.evals import compare as cmp
from batchgrader.pipeline.evals import graders, templates
from batchgrader.pipeline.evals.data import Row
from batchgrader.pipeline.evals.folder import RESULTS_FILE, Loaded, load, write_json
from batchgrader.pipeline.evals.plan import EMBEDDING_COLUMN, custom_id, embedding_id
from batchgrader.pipeline.evals.spec import Criterion

Z95 = 1.959963984540054
PAID_SOURCES = ("batch", "preflight", "online", "flex")


def read_answers(path: str | None) -> dict[str, dict[str, Any]]:
    """A job's result file (JSONL, as the rows were queued) by custom id."""
    if not path:
        return {}
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                out[str(rec.get("id"))] = rec
    return out


def _verdict_local(c: Criterion, row: Row, variant: str | None) -> graders.Verdict:
    sample = templates.sample_namespace(row.sample)
    try:
        value = templates.render(str(c.raw["input"]), row.item, sample)
        reference = templates.render(str(c.raw["reference"]), row.item, sample)
    except templates.MissingVariable as exc:
        return graders.Verdict(None, False, "invalid_variable_error", {"message": str(exc)})
    return graders.local_verdict(c, value, reference, variant)


def _verdict_model(c: Criterion, row: Row, answers: Mapping[str, Mapping[str, Any]]) -> graders.Verdict:
    rec = answers.get(custom_id(row.index, c.index))
    if rec is None:
        return graders.Verdict(None, False, "no_answer", {"message": "the job's result has no row for this item and criterion"})
    error = rec.get("error")
    if error:  # the result's error column: "code: message"
        code, _sep, message = str(error).partition(": ")
        return graders.Verdict(None, False, code, {"message": message} if message else {})
    return graders.model_verdict(c, {graders.ANSWER_FIELD: rec.get(graders.ANSWER_FIELD)}, None)


def _vector(rec: Mapping[str, Any]) -> Any:
    value = rec.get(EMBEDDING_COLUMN)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _verdict_cosine(c: Criterion, row: Row, answers: Mapping[str, Mapping[str, Any]], variant: str) -> graders.Verdict:
    """A ``cosine`` criterion's verdict from the embedding job's vectors of the row's input and reference."""
    vectors = []
    for side in ("input", "reference"):
        rec = answers.get(embedding_id(row.index, c.index, side))
        if rec is None:
            return graders.Verdict(
                None, False, "no_answer", {"message": f"the embedding job's result has no row for this item's {side}"}
            )
        if rec.get("error"):
            code, _sep, message = str(rec["error"]).partition(": ")
            return graders.Verdict(None, False, code, {"message": f"{side}: {message}" if message else side})
        vectors.append(_vector(rec))
    return graders.embedding_verdict(c, vectors[0], vectors[1], variant)


def cosine_variant(loaded: Loaded, c: Criterion) -> str:
    """The embedding variant the import chose for a ``cosine`` criterion (plan.json)."""
    for rec in loaded.plan.get("criteria") or ():
        if rec.get("index") == c.index and rec.get("variant"):
            return str(rec["variant"])
    return graders.DEFAULT_EMBEDDING_VARIANT


def grade(
    loaded: Loaded, answers: Mapping[str, Mapping[str, Any]], variants: Mapping[int, str] | None = None
) -> dict[int, dict[int, graders.Verdict]]:
    """Every criterion's verdict on every row: ``{item index: {criterion index: verdict}}``."""
    variants = variants or {}
    out: dict[int, dict[int, graders.Verdict]] = {r.index: {} for r in loaded.rows}
    unsampled = {
        r.index: loaded.sample_errors[r.index] for r in loaded.rows if r.sample is None and r.index in loaded.sample_errors
    }
    sampled = [r for r in loaded.rows if r.index not in unsampled]
    for c in loaded.spec.criteria:
        for index, why in unsampled.items():  # generate-then-grade: the generation gave this item no answer
            out[index][c.index] = graders.Verdict(None, False, "sample_error", {"message": why})
        if c.type == "python":
            from batchgrader.pipeline.evals.pygrader import grade_rows

            for r, v in zip(sampled, grade_rows(c, sampled)):
                out[r.index][c.index] = v
            continue
        for r in sampled:
            if c.embedded:
                out[r.index][c.index] = _verdict_cosine(c, r, answers, cosine_variant(loaded, c))
            elif c.type in ("string_check", "text_similarity"):
                out[r.index][c.index] = _verdict_local(c, r, variants.get(c.index))
            else:
                out[r.index][c.index] = _verdict_model(c, r, answers)
    return out


def item_status(verdicts: Mapping[int, graders.Verdict]) -> str:
    """``pass`` when every criterion passed, ``fail`` when one failed, else ``error``."""
    vs = list(verdicts.values())
    if any(not v.passed and v.error is None for v in vs):
        return "fail"
    if any(v.error is not None for v in vs):
        return "error"
    return "pass"


def wilson(passed: int, n: int) -> tuple[float, float] | None:
    """The 95 % Wilson score interval of a pass rate (None without rows)."""
    if n == 0:
        return None
    p = passed / n
    denom = 1 + Z95**2 / n
    centre = (p + Z95**2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def _result_type(c: Criterion) -> str:
    return c.type.replace("_", "-") + "-grader"


def output_items(
    loaded: Loaded, verdicts: Mapping[int, Mapping[int, graders.Verdict]], run_id: str, created: int
) -> list[dict[str, Any]]:
    out = []
    for r in loaded.rows:
        vs = verdicts[r.index]
        sample = templates.sample_namespace(r.sample) or {}
        results = []
        for c in loaded.spec.criteria:
            v = vs[c.index]
            res: dict[str, Any] = {
                "name": c.name,
                "type": _result_type(c),
                "score": v.score if v.score is not None else 0.0,
                "passed": v.passed,
            }
            if v.error or v.detail:
                res["sample"] = {**({"error": v.error} if v.error else {}), **dict(v.detail)}
            results.append(res)
        out.append(
            {
                "object": "eval.run.output_item",
                "id": f"outputitem_{run_id}_{r.index}",
                "run_id": run_id,
                "eval_id": loaded.spec.id,
                "created_at": created,
                "status": item_status(vs),
                "datasource_item_id": r.index,
                "datasource_item": r.item,
                "results": results,
                "sample": {
                    "input": [],
                    "output": [{"role": "assistant", "content": sample["output_text"]}]
                    if isinstance(sample.get("output_text"), str)
                    else [],
                    "finish_reason": str(sample.get("finish_reason") or ""),
                    "model": str(sample.get("model") or ""),
                    "usage": _usage(sample.get("usage")),
                    "error": {"code": "sample_error", "message": loaded.sample_errors[r.index]}
                    if r.sample is None and r.index in loaded.sample_errors
                    else {"code": "", "message": ""},
                    "temperature": 0.0,
                    "max_completion_tokens": 0,
                    "top_p": 0.0,
                    "seed": 0,
                },
            }
        )
    return out


def _usage(u: Any) -> dict[str, int]:
    u = u if isinstance(u, Mapping) else {}
    keys = ("prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens")
    return {k: int(u.get(k) or 0) if isinstance(u.get(k), int | float) else 0 for k in keys}


def per_model(
    jobs: Sequence[tuple[JobState, int]], answers_by_job: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """``per_model_usage`` and the cost per model, from each job's folded state and result rows
    (``jobs``: each job with the samples each of its rows asked)."""
    by: dict[str, dict[str, Any]] = {}
    for j, samples in jobs:
        u = by.setdefault(
            str(j.model),
            {
                "model_name": str(j.model),
                "invocation_count": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "cached_tokens": 0,
                "cost_usd": 0.0,
            },
        )
        u["prompt_tokens"] += j.prompt_tokens
        u["completion_tokens"] += j.completion_tokens
        u["total_tokens"] += j.prompt_tokens + j.completion_tokens
        u["cached_tokens"] += j.cached_tokens
        u["cost_usd"] += j.cost_usd
        for rec in answers_by_job.get(j.job_id, {}).values():
            sources = str(rec.get("answered_by") or "").split("+")
            if any(s in PAID_SOURCES for s in sources):
                u["invocation_count"] += samples
    return list(by.values())


def run_record(
    loaded: Loaded,
    verdicts: Mapping[int, Mapping[int, graders.Verdict]],
    usage: Sequence[Mapping[str, Any]],
    run_id: str,
    created: int,
    status: str,
) -> dict[str, Any]:
    statuses = [item_status(v) for v in verdicts.values()]
    per_criterion = []
    for c in loaded.spec.criteria:
        vs = [verdicts[r.index][c.index] for r in loaded.rows]
        per_criterion.append(
            {
                "testing_criteria": c.ident,
                "passed": sum(v.passed for v in vs),
                "failed": sum(not v.passed and v.error is None for v in vs),
            }
        )
    generation = loaded.plan.get("generation")
    models = [generation["model"]] if generation else sorted({c.model for c in loaded.spec.criteria if c.model})
    # the items are not repeated inline: the source names the imported items file
    source = {"type": "file_id", "id": str(loaded.folder / "items.jsonl")}
    data_source = {**generation["data_source"], "source": source} if generation else {"type": "jsonl", "source": source}
    return {
        "object": "eval.run",
        "id": run_id,
        "eval_id": loaded.spec.id,
        "name": f"{loaded.name} (BatchGrader)",
        "created_at": created,
        "status": status,
        "model": ", ".join(models),
        "report_url": "",
        "error": {"code": "", "message": ""},
        "metadata": {"batchgrader_eval": loaded.name},
        "data_source": data_source,
        "result_counts": {
            "total": len(statuses),
            "errored": statuses.count("error"),
            "failed": statuses.count("fail"),
            "passed": statuses.count("pass"),
        },
        "per_testing_criteria_results": per_criterion,
        "per_model_usage": [{k: v for k, v in u.items() if k != "cost_usd"} for u in usage],
    }


def report(
    loaded: Loaded,
    verdicts: Mapping[int, Mapping[int, graders.Verdict]],
    usage: Sequence[Mapping[str, Any]],
    variants: Mapping[int, Mapping[str, Any]],
) -> dict[str, Any]:
    criteria = []
    for c in loaded.spec.criteria:
        vs = [verdicts[r.index][c.index] for r in loaded.rows]
        passed = sum(v.passed for v in vs)
        failed = sum(not v.passed and v.error is None for v in vs)
        errors: dict[str, int] = {}
        for v in vs:
            if v.error:
                errors[v.error] = errors.get(v.error, 0) + 1
        interval = wilson(passed, passed + failed)
        rec: dict[str, Any] = {
            "name": c.name,
            "type": c.type,
            "passed": passed,
            "failed": failed,
            "errored": sum(errors.values()),
            "errors": errors,
            "pass_rate": passed / (passed + failed) if passed + failed else None,
            "ci95": list(interval) if interval else None,
            "pass_rule": c.threshold_rule,
        }
        if c.model:
            rec["model"] = c.model
        if c.type == "text_similarity":
            metric = c.raw["evaluation_metric"]
            if c.embedded:
                chosen = cosine_variant(loaded, c)
                basis = "the embedding model chosen at import (its vectors are paid for, so no other is tried)"
            else:
                chosen = variants.get(c.index, {}).get("chosen") or graders.DEFAULT_VARIANT[metric]
                basis = (
                    "closest to the imported OpenAI scores"
                    if c.index in variants
                    else "default (no OpenAI scores to compare: approximate)"
                )
            rec["variant"] = chosen
            rec["variant_description"] = graders.describe(metric, chosen)
            rec["variant_basis"] = basis
            if c.embedded:
                rec["model"] = chosen.removeprefix("openai-")
        criteria.append(rec)
    out: dict[str, Any] = {
        "eval": loaded.name,
        "eval_id": loaded.spec.id,
        "item_rule": loaded.plan.get("item_rule"),
        "criteria": criteria,
        "cost_by_model": [
            {"model": u["model_name"], "cost_usd": round(float(u["cost_usd"]), 9), "requests": u["invocation_count"]}
            for u in usage
        ],
        "cost_usd": round(sum(float(u["cost_usd"]) for u in usage), 9),
    }
    if loaded.reference is not None:
        ref = cmp.reference_results(loaded.reference)
        out["comparison"] = cmp.compare(loaded.spec.criteria, verdicts, ref)
        out["variant_search"] = {loaded.spec.criteria[i - 1].name: v for i, v in variants.items()}
    return out


def finish(
    home: Home,
    name: str,
    jobs: Sequence[tuple[str, JobState]],
    *,
    fingerprint: Sequence[str] = (),
    now: float | None = None,
) -> dict[str, Any]:
    """Compute the eval's results from its ended ``jobs`` (``(key, job)`` of every stage: see
    :class:`~batchgrader.core.rules.evalchain.WriteResults`), write run.json, output_items.jsonl and the
    report into the outbox (each atomically), then ``results.json`` with ``fingerprint``; the
    report, with the paths written.  Writing them again gives the same files (but ``created_at``)."""
    from batchgrader.fsio import atomic_write_bytes

    loaded = load(home, name)
    if loaded.generated:
        from batchgrader.pipeline.evals.chain import GENERATION_KEY, ensure_samples

        gen = next((j for k, j in jobs if k == GENERATION_KEY), None)
        if gen is not None and ensure_samples(loaded.folder, gen):
            loaded = load(home, name)
    answers_by_job = {j.job_id: read_answers(j.result_path) for k, j in jobs}
    answers: dict[str, dict[str, Any]] = {}
    for k, j in jobs:
        if k != "gen":
            answers.update(answers_by_job[j.job_id])
    ref = cmp.reference_results(loaded.reference) if loaded.reference is not None else {}
    variants = cmp.choose_variants(loaded.spec.criteria, loaded.rows, ref) if ref else {}
    verdicts = grade(loaded, answers, {i: v["chosen"] for i, v in variants.items()})
    samples = int(loaded.plan.get("samples") or 1)
    single = {"gen"} | {str(j["key"]) for j in loaded.plan.get("jobs") or () if j.get("kind") == "embeddings"}
    usage = per_model([(j, 1 if k in single else samples) for k, j in jobs], answers_by_job)
    created = int(now if now is not None else time.time())
    run_id = f"evalrun_bg_{loaded.name}"
    states = {"failed" if j.rejected else str(j.ended) for _k, j in jobs}
    generation_failed = loaded.generated and not loaded.grading
    status = "failed" if generation_failed or (states and states <= {"failed", "cancelled"}) else "completed"
    run = run_record(loaded, verdicts, usage, run_id, created, status)
    items = output_items(loaded, verdicts, run_id, created)
    rep = report(loaded, verdicts, usage, variants)
    rep["result_counts"] = run["result_counts"]
    rep["status"] = status
    rep["jobs"] = [
        {
            "key": k,
            "job_id": j.job_id,
            "state": "failed" if j.rejected else j.ended,
            "model": j.model,
            "result_path": j.result_path,
        }
        for k, j in jobs
    ]
    outbox = home.ensure().outbox
    outbox.mkdir(parents=True, exist_ok=True)
    paths = {
        "run": outbox / f"{loaded.name}_run.json",
        "output_items": outbox / f"{loaded.name}_output_items.jsonl",
        "report": outbox / f"{loaded.name}_report.json",
    }
    atomic_write_bytes(paths["output_items"], "".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items).encode("utf-8"))
    atomic_write_bytes(paths["run"], (json.dumps(run, indent=1) + "\n").encode("utf-8"))
    atomic_write_bytes(paths["report"], (json.dumps(rep, indent=1) + "\n").encode("utf-8"))
    rep["paths"] = {k: str(v) for k, v in paths.items()}
    write_json(loaded.folder / RESULTS_FILE, {"for": list(fingerprint), "written_at": created, "paths": rep["paths"]})
    return rep
