"""Generate-then-grade: a ``completions`` or ``responses`` run as two chained jobs.

The **generation** is an ordinary job (planned by :func:`plan_generation`, queued by `bgctl evals
import`): one row per item (custom id ``i<item>``), its ``prompt`` the run's input messages
rendered for the item (the leading system messages, when they are the same text for every item,
become the job's system prompt), the run's model and sampling parameters as the profile's.  Its
answer column, ``output_text``, becomes the item's ``sample.output_text`` (and, parsed,
``sample.output_json``).

The **grading** is the import's usual plan over the items with those samples.  When the
generation's result is written the daemon's eval step (on the decision of
:func:`batchgrader.core.rules.evalchain.decide_eval`) calls :func:`queue_grading`, which

1. reads the generation's result into ``samples.jsonl`` (an item the generation failed keeps
   its error, and is not graded: its verdicts are ``sample_error``);
2. writes the grading's request rows under ``requests/``;
3. records ``grading.json`` (each job's inbox path, and the log position) atomically;
4. copies each request file into its profile's inbox folder at the recorded path (a temporary
   name, then a rename).

A crash before 3 leaves no record: the decision asks again and the same files are written.  A
crash after 3 leaves the record: the grading is never planned again, and a recorded file that
reached neither the inbox nor a job is copied again by :func:`requeue` (to the same path).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home
from batchgrader.core.log.jobstate import JobState
from batchgrader.pipeline.evals import templates
from batchgrader.pipeline.evals.data import Row
from batchgrader.pipeline.evals.folder import (
    GENERATION_KEY,
    GRADING_FILE,
    QUEUED_FILE,
    SAMPLES_FILE,
    dump_jsonl,
    load,
    read_json,
    write_json,
)
from batchgrader.pipeline.evals.plan import (
    ID_COLUMN,
    PROMPT_COLUMN,
    JobPlan,
    escape_system,
    job_settings,
    leading_system,
    plan_jobs,
)
from batchgrader.pipeline.evals.spec import Generation, Message, Problem

OUTPUT_COLUMN = "output_text"


def generation_id(index: int) -> str:
    return f"i{index}"


def _messages_of(gen: Generation, row: Row) -> list[Message]:
    if gen.item_reference is None:
        return list(gen.messages)
    value = templates.lookup(gen.item_reference, row.item, None)
    out = []
    for m in value if isinstance(value, list) else []:
        if isinstance(m, Mapping) and isinstance(m.get("role"), str):
            out.append(Message(str(m["role"]), templates.text(m.get("content", ""))))
    return out


def check_generation(gen: Generation, rows: Sequence[Row]) -> list[Problem]:
    """Every item the generation's messages cannot be rendered for (a variable it lacks, no
    messages at its ``item_reference``), before anything is written."""
    bad: list[str] = []
    for r in rows:
        try:
            msgs = _messages_of(gen, r)
            if not msgs:
                raise templates.MissingVariable(str(gen.item_reference), "is not a list of messages ({role, content})")
            for m in msgs:
                templates.render(m.content, r.item, None)
        except templates.MissingVariable as exc:
            bad.append(f"{r.where} ({exc})")
    if not bad:
        return []
    return [
        Problem(
            "run.data_source.input_messages",
            f"{len(bad)} of {len(rows)} items cannot fill the messages: "
            + "; ".join(bad[:5])
            + ("; ..." if len(bad) > 5 else ""),
            "add the missing fields to every item, or change the run's input_messages",
        )
    ]


def _prompt(messages: Sequence[Message], row: Row) -> str:
    rendered = [(m.role, templates.render(m.content, row.item, None)) for m in messages]
    if len(rendered) == 1 and rendered[0][0] == "user":
        return rendered[0][1]
    return "\n\n".join(f"[{role}]\n{text}" for role, text in rendered)


def plan_generation(gen: Generation, rows: Sequence[Row]) -> JobPlan:
    """The generation job: its profile settings and one request row per item."""
    notes: list[str] = []
    system: str | None = None
    shared = 0
    if gen.item_reference is None:
        lead = leading_system(gen.messages)
        text = "\n\n".join(m.content for m in lead)
        if lead and not templates.variables(text):
            system, shared = text, len(lead)
        if len(gen.messages) - shared > 1:
            notes.append(
                "run.data_source.input_messages: several messages are sent as one user message, each part under its [role]"
            )
    else:
        notes.append(f"the messages at {gen.item_reference} are sent as one user message, each part under its [role]")
    settings = job_settings(
        gen.model,
        OUTPUT_COLUMN,
        **{"system_prompt": escape_system(system) if system else None} | {k: v for k, v in gen.settings.items() if k != "model"},
    )
    plan = JobPlan(GENERATION_KEY, gen.model, (), settings, notes=notes)
    for r in rows:
        msgs = _messages_of(gen, r)[shared:]
        plan.rows.append({ID_COLUMN: generation_id(r.index), "eval_item": r.index, PROMPT_COLUMN: _prompt(msgs, r)})
    return plan


def samples_from_result(path: str | None, model: str, structured: bool) -> dict[int, dict[str, Any]]:
    """Each item's sample (``{"sample": {...}}``) or error (``{"error": "..."}``) from the
    generation's result file (JSONL, as its rows were queued)."""
    out: dict[int, dict[str, Any]] = {}
    if not path or not Path(path).is_file():
        return out
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            index = int(rec.get("eval_item", str(rec.get(ID_COLUMN, "i-1"))[1:]))
            text = rec.get(OUTPUT_COLUMN)
            if rec.get("error") or not isinstance(text, str):
                out[index] = {"error": str(rec.get("error") or "the generation gave no answer")}
                continue
            prompt, completion = int(rec.get("input_tokens") or 0), int(rec.get("output_tokens") or 0)
            sample: dict[str, Any] = {
                "output_text": text,
                "model": model,
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                    "cached_tokens": 0,
                },
            }
            if structured:
                try:
                    sample["output_json"] = json.loads(text)
                except ValueError:
                    pass
            out[index] = {"sample": sample}
    return out


def write_samples(folder: Path, generation: JobState) -> None:
    """``samples.jsonl`` from the generation's result (an item without a result row: its error)."""
    plan = read_json(folder / "plan.json")
    gen = plan["generation"]
    found = samples_from_result(generation.result_path, str(gen["model"]), bool(gen.get("response_format")))
    why = f"the generation job {generation.job_id} ended {generation.ended or 'rejected'} without an answer for this item"
    records = []
    with open(folder / "items.jsonl", encoding="utf-8") as f:
        for line in f:
            index = int(json.loads(line)["index"])
            records.append({"index": index, **found.get(index, {"error": why})})
    dump_jsonl(folder / SAMPLES_FILE, records)


def ensure_samples(folder: Path, generation: JobState) -> bool:
    """Write ``samples.jsonl`` unless it is there; whether it was written."""
    if (folder / SAMPLES_FILE).is_file():
        return False
    write_samples(folder, generation)
    return True


def _destination(home: Home, profile: str, name: str, taken: set[Path]) -> Path:
    folder = home.inbox / profile if profile != "default" else home.inbox
    dest, n = folder / name, 1
    stem, suffix = os.path.splitext(name)
    while dest.exists() or dest in taken:
        dest, n = folder / f"{stem}-{n}{suffix}", n + 1
    return dest


def copy_into_inbox(src: Path, dest: Path) -> None:
    """``src`` as ``dest`` in the inbox: a temporary dot-name (ignored by the scan), then a rename."""
    from batchgrader.fsio import fsync_dir

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.part"
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def queue_grading(home: Home, name: str, generation: JobState, after_seq: int) -> list[Path]:
    """Queue the grading of the generation's answers (see the module's docstring); the inbox paths."""
    loaded = load(home, name)
    folder = loaded.folder
    write_samples(folder, generation)
    loaded = load(home, name)
    sampled = [r for r in loaded.rows if r.sample is not None]
    profiles = {j["key"]: j["profile"] for j in read_json(folder / QUEUED_FILE).get("next") or ()}
    plans = [
        p
        for p in plan_jobs(loaded.spec, sampled, int(loaded.plan.get("samples") or 1), loaded.plan.get("embedding_model"))
        if p.rows
    ]
    jobs: list[dict[str, str]] = []
    taken: set[Path] = set()
    for p in plans:
        file = f"{name}-{p.key}.jsonl"
        dump_jsonl(folder / "requests" / file, p.rows)
        dest = _destination(home, profiles[p.key], file, taken)
        taken.add(dest)
        jobs.append({"key": p.key, "profile": profiles[p.key], "path": str(dest), "file": file})
    write_json(
        folder / GRADING_FILE,
        {"stage": "grading", "after_seq": after_seq, "generation_job": generation.job_id, "jobs": jobs},
    )
    for j in jobs:
        copy_into_inbox(folder / "requests" / j["file"], Path(j["path"]))
    return [Path(j["path"]) for j in jobs]


def requeue(home: Home, name: str, key: str) -> Path:
    """Copy a recorded grading file into the inbox again, at its recorded path."""
    from batchgrader.pipeline.evals.folder import evals_root

    folder = evals_root(home) / name
    job = next(j for j in read_json(folder / GRADING_FILE)["jobs"] if j["key"] == key)
    copy_into_inbox(folder / "requests" / job["file"], Path(job["path"]))
    return Path(job["path"])
