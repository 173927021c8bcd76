"""`bgctl evals`: import an OpenAI eval, and read its results as OpenAI gave them.  Thin:
:mod:`batchgrader.evals.importer` checks and writes, :mod:`batchgrader.evals.results` follows
the run's jobs and has its results written (:mod:`batchgrader.pipeline.evals.results`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from batchgrader.cli.context import Ctx, emit_json
from batchgrader.cli.errors import EXIT_FAILURE, EXIT_USAGE, BgctlError


@click.group("evals")
def evals() -> None:
    """OpenAI Evals at batch price: import an eval, run it, read run.json as OpenAI wrote it."""


def _input_error(exc: Any, as_json: bool) -> BgctlError:
    if as_json:
        emit_json({"imported": False, "problems": exc.as_dicts()})
    lines = "\n".join(f"  {i}. {p}" for i, p in enumerate(exc.problems, 1))
    n = len(exc.problems)
    return BgctlError(f"{n} problem{'s' if n > 1 else ''} in the input (nothing was written or sent):\n{lines}", EXIT_USAGE)


FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@evals.command("import")
@click.argument("eval_file", metavar="EVAL.json", type=FILE)
@click.option("--data", "data", type=FILE, default=None, help='The items, JSONL: {"item": {...}, "sample": {...}} per line.')
@click.option("--run", "run", type=FILE, default=None, help="An exported run (GET /evals/{id}/runs/{run_id}).")
@click.option("--output-items", "output_items", type=FILE, default=None, help="The run's exported output items, to compare with.")
@click.option("--name", default=None, help="The eval's name in the home (default: its id).")
@click.option("--samples", type=click.IntRange(1, 20), default=None, help="Answers asked per row and model criterion (voted).")
@click.option(
    "--allow-python", is_flag=True, help="Run python graders' code (in a subprocess without network, time- and memory-limited)."
)
@click.option(
    "--embedding-model",
    default=None,
    help="The OpenAI embedding model of cosine criteria (default text-embedding-3-large, as OpenAI's Evals used).",
)
@click.option("--schedule", default=None, help="Run the whole eval again at these times: a cron expression, UTC ('0 2 * * *').")
@click.option("--schedule-source", default=None, help="The items each scheduled run grades: a JSONL file, or a folder of them.")
@click.option("--dry-run", is_flag=True, help="Check and plan only: nothing is written or queued.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def import_(
    obj: Ctx,
    eval_file: Path,
    data: Path | None,
    run: Path | None,
    output_items: Path | None,
    name: str | None,
    samples: int | None,
    allow_python: bool,
    embedding_model: str | None,
    schedule: str | None,
    schedule_source: str | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Import EVAL.json (an eval as the API returned it): profiles, pass rules and the rows to grade, queued in the inbox.

    Every problem is reported (field and fix) before anything is written; the model criteria's
    rows are queued as one job per grader model; cosine criteria's texts as one embedding job
    (OpenAI's Batch API); string_check and the other text_similarity metrics are computed
    locally when the results are read (`bgctl evals results NAME`)."""
    from batchgrader.evals import importer
    from batchgrader.pipeline.evals.spec import EvalInputError

    try:
        prepared = importer.prepare_import(
            obj.home,
            eval_file,
            data_path=data,
            run_path=run,
            output_items_path=output_items,
            name=name,
            samples=samples,
            allow_python=allow_python,
            embedding_model=embedding_model,
            schedule=schedule,
            schedule_source=schedule_source,
        )
        written = None if dry_run else importer.install(obj.home, prepared, obj.config)
    except EvalInputError as exc:
        raise _input_error(exc, as_json) from None
    res = importer.summary(prepared, written)
    if as_json:
        emit_json(res)
        return
    click.echo(f"{'planned' if dry_run else 'imported'} eval {res['eval_id']} as {res['name']!r}: {res['rows']} rows")
    for c in res["criteria"]:
        where = f"job {c['job']} ({c['model']})" if c.get("job") else c["computed"]
        variant = f"; variant {c['variant']}: {c['variant_description']}" if c.get("variant") else ""
        click.echo(f"  {c['index']}. {c['name']} [{c['type']}] {where}: {c['pass_rule']}{variant}")
    if res.get("generation"):
        j = res["generation"]
        queued = f" -> {j['queued']}" if j.get("queued") else ""
        click.echo(f"  generation {j['key']}: {j['model']}, {j['requests']} requests (profile {j.get('profile', '-')}){queued}")
    for j in res["jobs"]:
        queued = f" -> {j['queued']}" if isinstance(j.get("queued"), str) and not res.get("generation") else ""
        after = ", queued when the generation's result is written" if res.get("generation") else ""
        click.echo(f"  job {j['key']}: {j['model']}, {j['requests']} requests (profile {j.get('profile', '-')}){queued}{after}")
    for n in res["notes"]:
        click.echo(f"  note: {n}")
    if not dry_run:
        click.echo(f"next: bgctl evals results {res['name']}" + (" --wait" if res["jobs"] or res.get("generation") else ""))


@evals.command("results")
@click.argument("name")
@click.option("--wait", is_flag=True, help="Wait until the eval's jobs end (running the daemon in the foreground if none runs).")
@click.option("--sandbox", is_flag=True, help="With --wait and no daemon running: the emulator, SIMULATED answers.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, help="With --wait: stop waiting after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the report).")
@click.pass_obj
def results(obj: Ctx, name: str, wait: bool, sandbox: bool, timeout: float | None, as_json: bool) -> None:
    """Write NAME's run.json, output_items.jsonl and report into the outbox once its jobs ended; print the pass rates.

    Exit 0, 1 when a job has not ended (without --wait), 2 for an unknown eval."""
    from batchgrader.evals import results as r

    try:
        if wait:
            from batchgrader.ops import grade as g

            try:
                r.wait_for(obj.home, name, sandbox=sandbox, timeout=timeout)
            except g.GradeError as exc:
                raise BgctlError(str(exc), EXIT_FAILURE) from None
        rep = r.finish(obj.home, name)
    except r.UnknownEval as exc:
        raise BgctlError(str(exc), EXIT_USAGE) from None
    except r.NotReady as exc:
        raise BgctlError(f"{exc} (or pass --wait)", EXIT_FAILURE) from None
    if as_json:
        emit_json(rep)
        return
    click.echo(render_report(rep))


def render_report(rep: dict[str, Any]) -> str:
    rc = rep["result_counts"]
    lines = [f"eval {rep['eval']}: {rc['passed']} passed, {rc['failed']} failed, {rc['errored']} errored of {rc['total']} items"]
    for c in rep["criteria"]:
        if c["pass_rate"] is None:
            rate = "no verdicts"
        else:
            lo, hi = c["ci95"]
            rate = f"{c['pass_rate']:.1%} passed (95% CI {lo:.1%} to {hi:.1%})"
        errs = ", ".join(f"{k} {v}" for k, v in c["errors"].items())
        lines.append(
            f"  {c['name']} [{c['type']}]: {rate}; {c['passed']}/{c['failed']}/{c['errored']} passed/failed/errored"
            + (f" ({errs})" if errs else "")
        )
        if c.get("variant"):
            lines.append(f"    variant {c['variant']} ({c['variant_basis']})")
    for m in rep["cost_by_model"]:
        lines.append(f"  cost {m['model']}: ${m['cost_usd']:.4f} for {m['requests']} requests")
    for c in rep.get("comparison") or []:
        if not c.get("compared"):
            lines.append(f"  vs OpenAI {c['criterion']}: no items to compare")
            continue
        k = "n/a" if c["kappa"] is None else f"{c['kappa']:.2f}"
        diff = "" if c["score_max_abs_diff"] is None else f", max score diff {c['score_max_abs_diff']:.3f}"
        lines.append(
            f"  vs OpenAI {c['criterion']}: {c['agreement']:.1%} agree (kappa {k}) on {c['compared']}; "
            f"flips {c['flips_to_pass']} to pass, {c['flips_to_fail']} to fail{diff}"
        )
    for key, path in (rep.get("paths") or {}).items():
        lines.append(f"{key}: {path}")
    return "\n".join(lines)


@evals.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def list_(obj: Ctx, as_json: bool) -> None:
    """The evals imported into the home, each as one run (generation and grading): its state and jobs."""
    from batchgrader.evals.results import list_runs

    rows = list_runs(obj.home)
    if as_json:
        emit_json(rows)
        return
    if not rows:
        click.echo("no eval imported: bgctl evals import EVAL.json --data ITEMS.jsonl")
        sys.exit(0)
    for e in rows:
        jobs = ", ".join(f"{j['stage']} {j['key']} {j['job_id'] or '-'} {j['state']}" for j in e["run_jobs"])
        sch = e.get("schedule")
        when = f"; scheduled {sch['cron']} (UTC) over {sch['source']}" if sch else ""
        click.echo(
            f"{e['name']}: {e['eval_name']} ({e['eval_id']}), {e['rows']} rows, {e['state']}"
            + (f"; {jobs}" if jobs else "")
            + when
        )


EVALS_COMMANDS = (evals,)
