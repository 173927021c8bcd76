"""An imported eval's results, as OpenAI's Evals API gave them, once its jobs have ended.

:func:`finish` reads the eval's folder and each job's result file, computes every local
criterion, reads every model criterion's answer (:mod:`batchgrader.evals.graders`), and writes
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchgrader.core.home import Home
from batchgrader.evals import compare as cmp
from batchgrader.evals import graders, templates
from batchgrader.evals.data import Row, read_output_items
from batchgrader.evals.importer import PLAN_FILE, QUEUED_FILE, evals_root
from batchgrader.evals.plan import custom_id
from batchgrader.evals.spec import Criterion, EvalSpec, parse_eval

Z95 = 1.959963984540054
PAID_SOURCES = ("batch", "preflight", "online", "flex")


class NotReady(RuntimeError):
    """A job of the eval has not ended yet (or was never taken): the message says which and what to do."""


class UnknownEval(LookupError):
    pass


@dataclass
class Loaded:
    name: str
    folder: Path
    spec: EvalSpec
    plan: dict[str, Any]
    rows: list[Row]
    reference: list[dict[str, Any]] | None
    queued: dict[str, Any]


def load(home: Home, name: str) -> Loaded:
    folder = evals_root(home) / name
    if not (folder / PLAN_FILE).is_file():
        known = (
            sorted(p.name for p in evals_root(home).iterdir() if (p / PLAN_FILE).is_file()) if evals_root(home).is_dir() else []
        )
        raise UnknownEval(
            f"no imported eval {name!r} in {evals_root(home)} (imported: {', '.join(known) or 'none'}); import it with `bgctl evals import`"
        )
    plan = json.loads((folder / PLAN_FILE).read_text(encoding="utf-8"))
    spec = parse_eval(json.loads((folder / "eval.json").read_text(encoding="utf-8")), allow_python=bool(plan.get("allow_python")))
    rows = []
    with open(folder / "items.jsonl", encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            rec = json.loads(line)
            rows.append(Row(int(rec["index"]), rec["item"], rec.get("sample"), f"items.jsonl line {n}"))
    ref_path = folder / "reference" / "output_items.jsonl"
    reference = read_output_items(ref_path) if ref_path.is_file() else None
    queued_path = folder / QUEUED_FILE
    queued = json.loads(queued_path.read_text(encoding="utf-8")) if queued_path.is_file() else {"after_seq": 0, "jobs": []}
    return Loaded(name, folder, spec, plan, rows, reference, queued)


def list_evals(home: Home) -> list[dict[str, Any]]:
    root = evals_root(home)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.iterdir()):
        if (p / PLAN_FILE).is_file():
            plan = json.loads((p / PLAN_FILE).read_text(encoding="utf-8"))
            out.append(
                {
                    "name": p.name,
                    "eval_id": plan["eval_id"],
                    "eval_name": plan["eval_name"],
                    "rows": plan["rows"],
                    "jobs": len(plan["jobs"]),
                }
            )
    return out


def job_outcomes(home: Home, loaded: Loaded) -> list[dict[str, Any]]:
    """Each queued job's status row, once it has ended with its result written; :class:`NotReady` before."""
    from batchgrader.ops.grade import Queued, ended, job_of, job_status

    out = []
    for job in loaded.queued["jobs"]:
        job_id = job_of(home, Queued(Path(job["path"]), int(loaded.queued.get("after_seq", 0))))
        if job_id is None:
            raise NotReady(f"{job['path']} has not been taken by the daemon yet: start it (`bgctl daemon`), or wait")
        done = ended(home, job_id)
        if done is None:
            state = job_status(home, job_id)["state"]
            raise NotReady(
                f"job {job_id} ({job['key']}, profile {job['profile']}) is {state}: wait for it (`bgctl status {job_id}`)"
            )
        out.append({**done, "key": job["key"], "profile": job["profile"]})
    return out


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


def grade(
    loaded: Loaded, answers: Mapping[str, Mapping[str, Any]], variants: Mapping[int, str] | None = None
) -> dict[int, dict[int, graders.Verdict]]:
    """Every criterion's verdict on every row: ``{item index: {criterion index: verdict}}``."""
    variants = variants or {}
    out: dict[int, dict[int, graders.Verdict]] = {r.index: {} for r in loaded.rows}
    for c in loaded.spec.criteria:
        if c.type == "python":
            from batchgrader.evals.pygrader import grade_rows

            for r, v in zip(loaded.rows, grade_rows(c, loaded.rows)):
                out[r.index][c.index] = v
            continue
        for r in loaded.rows:
            if c.type in ("string_check", "text_similarity"):
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
                    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0, "cached_tokens": 0},
                    "error": {"code": "", "message": ""},
                    "temperature": 0.0,
                    "max_completion_tokens": 0,
                    "top_p": 0.0,
                    "seed": 0,
                },
            }
        )
    return out


def per_model(
    jobs: Sequence[Mapping[str, Any]], answers_by_job: Mapping[str, Mapping[str, Mapping[str, Any]]], samples: int
) -> list[dict[str, Any]]:
    """``per_model_usage`` and the cost per model, from each job's status row and result rows."""
    by: dict[str, dict[str, Any]] = {}
    for j in jobs:
        u = by.setdefault(
            str(j.get("model")),
            {
                "model_name": str(j.get("model")),
                "invocation_count": 0,
                "prompt_tokens": 0,
                "completion_tokens": 0,
                "total_tokens": 0,
                "cached_tokens": 0,
                "cost_usd": 0.0,
            },
        )
        prompt = int(j.get("prompt_tokens") or j.get("input_tokens") or 0)
        completion = int(j.get("output_tokens") or 0)
        u["prompt_tokens"] += prompt
        u["completion_tokens"] += completion
        u["total_tokens"] += prompt + completion
        u["cached_tokens"] += int(j.get("cached_tokens") or 0)
        u["cost_usd"] += float(j.get("cost_usd") or 0.0)
        for rec in answers_by_job.get(str(j.get("job_id")), {}).values():
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
    models = sorted({c.model for c in loaded.spec.criteria if c.model})
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
        # the items are not repeated inline: the source names the imported items file
        "data_source": {"type": "jsonl", "source": {"type": "file_id", "id": str(loaded.folder / "items.jsonl")}},
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
            chosen = variants.get(c.index, {}).get("chosen") or graders.DEFAULT_VARIANT[metric]
            rec["variant"] = chosen
            rec["variant_description"] = graders.describe(metric, chosen)
            rec["variant_basis"] = (
                "closest to the imported OpenAI scores"
                if c.index in variants
                else "default (no OpenAI scores to compare: approximate)"
            )
        criteria.append(rec)
    out: dict[str, Any] = {
        "eval": loaded.name,
        "eval_id": loaded.spec.id,
        "item_rule": loaded.plan.get("item_rule"),
        "criteria": criteria,
        "cost_by_model": [
            {"model": u["model_name"], "cost_usd": round(float(u["cost_usd"]), 6), "requests": u["invocation_count"]}
            for u in usage
        ],
        "cost_usd": round(sum(float(u["cost_usd"]) for u in usage), 6),
    }
    if loaded.reference is not None:
        ref = cmp.reference_results(loaded.reference)
        out["comparison"] = cmp.compare(loaded.spec.criteria, verdicts, ref)
        out["variant_search"] = {loaded.spec.criteria[i - 1].name: v for i, v in variants.items()}
    return out


def finish(home: Home, name: str, *, now: float | None = None) -> dict[str, Any]:
    """Compute the eval's results and write run.json, output_items.jsonl and the report into the
    outbox (:class:`NotReady` while a job runs); the report, with the paths written."""
    from batchgrader.fsio import atomic_write_bytes

    loaded = load(home, name)
    jobs = job_outcomes(home, loaded)
    answers_by_job = {str(j["job_id"]): read_answers(j.get("result_path")) for j in jobs}
    answers: dict[str, dict[str, Any]] = {}
    for a in answers_by_job.values():
        answers.update(a)
    ref = cmp.reference_results(loaded.reference) if loaded.reference is not None else {}
    variants = cmp.choose_variants(loaded.spec.criteria, loaded.rows, ref) if ref else {}
    verdicts = grade(loaded, answers, {i: v["chosen"] for i, v in variants.items()})
    usage = per_model(jobs, answers_by_job, int(loaded.plan.get("samples") or 1))
    created = int(now if now is not None else time.time())
    run_id = f"evalrun_bg_{loaded.name}"
    states = {str(j.get("state")) for j in jobs}
    status = "failed" if states and states <= {"failed", "cancelled"} else "completed"
    run = run_record(loaded, verdicts, usage, run_id, created, status)
    items = output_items(loaded, verdicts, run_id, created)
    rep = report(loaded, verdicts, usage, variants)
    rep["result_counts"] = run["result_counts"]
    rep["jobs"] = [
        {"job_id": j["job_id"], "state": j["state"], "model": j.get("model"), "result_path": j.get("result_path")} for j in jobs
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
    return rep
