"""The model criteria of an eval as BatchGrader jobs: one job per grader model (and sampling
settings), one request per row per criterion; the ``cosine`` criteria's texts as one embedding job.

A batch has one model (OpenAI: "each input file can only include requests to a single model")
and one system prompt, while each of its requests may carry its own response schema (the
``schema_column`` setting, ``pipeline/rowschema.py``), so:

* the model criteria of one model, ``label_model`` and ``score_model`` alike, share a job when
  their temperature, reasoning effort and output bound agree (the eval's criteria usually share
  a model, so an eval's model criteria are usually one job); criteria of another model, or with
  other sampling settings, get a job of their own;
* the job's rows are ``items x criteria``: custom id ``i<item>-c<criterion>`` (``-s<k>`` is
  added per sample by the samples feature), the criterion's messages rendered for that item in
  the ``prompt`` column;
* the job's system prompt is the criteria's system (and developer) messages when they are the
  same static text for every criterion; otherwise each row's prompt starts with its criterion's
  instructions (noted);
* the answer is ``{"result": ...}``, and each row's request carries its criterion's schema in
  the ``schema`` column (:func:`criterion_schema`): an enum of its labels for ``label_model``, a
  number within its ``range`` for ``score_model``; structured output rules out another label or
  the other kind, and the answer is checked against that schema on reading (``invalid_output``
  else).  The job's ``response_format`` (:func:`answer_schema`) is what every row's answer fits,
  ``anyOf`` the kinds when the job holds both: it names the result's column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from batchgrader.pipeline.evals import templates
from batchgrader.pipeline.evals.data import Row
from batchgrader.pipeline.evals.graders import ANSWER_FIELD
from batchgrader.pipeline.evals.spec import Criterion, EvalSpec, Message

SYSTEM_ROLES = ("system", "developer")
PROMPT_COLUMN = "prompt"
ID_COLUMN = "id"
SCHEMA_COLUMN = "schema"  # each row's own response schema: its criterion's (the profile's schema_column)


@dataclass
class JobPlan:
    """One job: its model, the criteria it answers, the profile settings and the request rows."""

    key: str
    model: str
    criteria: tuple[int, ...]
    settings: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kind: str = "model"  # "model": the model criteria's answers; "embeddings": the cosine criteria's vectors

    @property
    def requests_per_item(self) -> int:
        """Requests per item and criterion (an embedding job embeds the input and the reference)."""
        return len(EMBEDDED_SIDES) if self.kind == "embeddings" else 1


def custom_id(index: int, criterion: int) -> str:
    return f"i{index}-c{criterion}"


#: the two texts a ``cosine`` criterion embeds per item: its rendered input and reference
EMBEDDED_SIDES = ("input", "reference")
EMBEDDING_COLUMN = "embedding"


def embedding_id(index: int, criterion: int, side: str) -> str:
    return f"{custom_id(index, criterion)}-{side[:3]}"


def job_settings(model: str, output_column: str, **overrides: Any) -> dict[str, Any]:
    """A planned job's profile settings: its rows' ``prompt`` cell sent as the user message
    (templated already), answers in ``output_column``, none of a profile's extras (system
    prompt, examples, schema, reference, groups) unless ``overrides`` sets them."""
    return {
        "model": model,
        "system_prompt": None,
        "system_prompt_name": None,
        "examples_file": None,
        "user_prompt": "{" + PROMPT_COLUMN + "}",
        "response_field": PROMPT_COLUMN,
        "id_column": ID_COLUMN,
        "output_column": output_column,
        "response_format": None,
        "samples": 1,
        "temperature": None,
        "reasoning_effort": None,
        "reference_column": None,
        "reference_field": None,
        "group_column": None,
        "skip_empty": False,
        **overrides,
    }


def plan_embeddings(spec: EvalSpec, rows: Sequence[Row], model: str, key: str) -> JobPlan | None:
    """The embedding job of the eval's ``cosine`` criteria (None without one): one
    ``/v1/embeddings`` request per item, criterion and side (custom id ``i<item>-c<criterion>-inp``
    / ``-ref``), the rendered text in the ``prompt`` column, sent to OpenAI's Batch API."""
    crits = spec.embedded_criteria
    if not crits:
        return None
    settings = job_settings(model, EMBEDDING_COLUMN, provider="openai")
    plan = JobPlan(key, model, tuple(c.index for c in crits), settings, kind="embeddings")
    for row in rows:
        sample = templates.sample_namespace(row.sample)
        for c in crits:
            for side in EMBEDDED_SIDES:
                text = templates.render(str(c.raw[side]), row.item, sample)
                plan.rows.append(
                    {
                        ID_COLUMN: embedding_id(row.index, c.index, side),
                        "eval_item": row.index,
                        "criterion": c.name,
                        PROMPT_COLUMN: text,
                    }
                )
    return plan


def _group_key(c: Criterion) -> tuple[Any, ...]:
    sp = c.sampling
    return (c.model, sp.get("temperature"), sp.get("reasoning_effort"), sp.get("max_completions_tokens"))


def _system_text(c: Criterion) -> str:
    return "\n\n".join(m.content for m in leading_system(c.messages))


def leading_system(messages: Sequence[Message]) -> list[Message]:
    out = []
    for m in messages:
        if m.role not in SYSTEM_ROLES:
            break
        out.append(m)
    return out


def _answer_object(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {ANSWER_FIELD: value}, "required": [ANSWER_FIELD], "additionalProperties": False}


def criterion_schema(c: Criterion) -> dict[str, Any]:
    """The schema of criterion ``c``'s requests: ``{"result": one of its labels}`` for
    ``label_model``, ``{"result": a number within its range}`` for ``score_model``."""
    if c.type == "label_model":
        return _answer_object({"type": "string", "enum": list(c.labels)})
    return _answer_object({"type": "number", "minimum": c.range[0], "maximum": c.range[1]})


def answer_schema(criteria: Sequence[Criterion]) -> dict[str, Any]:
    """What every answer of a job of ``criteria`` fits (the job's ``response_format``, which names
    the result's column): the labels of its label criteria, a number within the bounds of its
    score criteria's ranges, ``anyOf`` the two when it holds both.  Each request is sent with its
    own criterion's narrower schema (:func:`criterion_schema`)."""
    labels: list[str] = []
    for c in criteria:
        labels += [lab for lab in c.labels if lab not in labels]
    scored = [c for c in criteria if c.type == "score_model"]
    label: dict[str, Any] = {"type": "string", "enum": labels}
    # bounds that hold every criterion's range (each row's own range is checked on reading)
    number: dict[str, Any] = (
        {"type": "number", "minimum": min(c.range[0] for c in scored), "maximum": max(c.range[1] for c in scored)}
        if scored
        else {}
    )
    value: dict[str, Any] = label if not scored else number if not labels else {"anyOf": [label, number]}
    return _answer_object(value)


def answer_instruction(c: Criterion) -> str:
    if c.type == "label_model":
        return (
            f'Answer in the field "{ANSWER_FIELD}" with exactly one of these labels: '
            + ", ".join(json.dumps(x) for x in c.labels)
            + "."
        )
    lo, hi = c.range
    return f'Answer in the field "{ANSWER_FIELD}" with a number from {lo:g} to {hi:g}.'


def render_prompt(c: Criterion, row: Row, shared_system: bool) -> str:
    """The row's user message for criterion ``c``: its messages rendered (the leading system
    messages left out when the job's system prompt carries them), then the answer instruction."""
    sample = templates.sample_namespace(row.sample)
    messages = list(c.messages)
    if shared_system:
        messages = messages[len(leading_system(messages)) :]
    rendered = [(m.role, templates.render(m.content, row.item, sample)) for m in messages]
    if len(rendered) == 1 and rendered[0][0] == "user":
        body = rendered[0][1]
    else:
        body = "\n\n".join(f"[{role}]\n{text}" for role, text in rendered)
    return body.rstrip() + "\n\n" + answer_instruction(c)


def escape_system(text: str) -> str:
    """A system prompt's braces as literal braces (BatchGrader's system prompt knows only {examples})."""
    return text.replace("{", "{{").replace("}", "}}")


def plan_jobs(
    spec: EvalSpec, rows: Sequence[Row], samples: int | None = None, embedding_model: str | None = None
) -> list[JobPlan]:
    """The eval's grading jobs: the model criteria's (see the module's docstring), then, with
    ``cosine`` criteria, the embedding job (:func:`plan_embeddings`, on ``embedding_model``)."""
    groups: dict[tuple[Any, ...], list[Criterion]] = {}
    for c in spec.model_criteria:
        groups.setdefault(_group_key(c), []).append(c)
    plans: list[JobPlan] = []
    for n, (key, crits) in enumerate(groups.items(), start=1):
        model, temperature, effort, max_tokens = key
        systems = {_system_text(c) for c in crits}
        system = systems.pop() if len(systems) == 1 else None
        shared = bool(system) and not templates.variables(system or "")
        notes: list[str] = []
        if len(crits) > 1 and not shared and any(_system_text(c) for c in crits):
            notes.append(
                f"{model}: the criteria {', '.join(repr(c.name) for c in crits)} have different (or templated) system messages; "
                "a batch job has one system prompt, so each row's message starts with its criterion's instructions"
            )
        if any(len(c.messages) - len(leading_system(c.messages)) > 1 for c in crits):
            notes.append(
                f"{model}: criteria with several user/assistant messages are sent as one user message, each part under its [role]"
            )
        settings = job_settings(
            model,
            "grade",
            system_prompt=escape_system(system) if shared and system else None,
            response_format=answer_schema(crits),
            schema_column=SCHEMA_COLUMN,
            samples=samples or 1,
            temperature=temperature,
            reasoning_effort=effort,
        )
        if max_tokens is not None:
            settings["max_completion_tokens"] = int(max_tokens)
        plan = JobPlan(f"j{n}", str(model), tuple(c.index for c in crits), settings, notes=notes)
        own = {c.index: json.dumps(criterion_schema(c), separators=(",", ":")) for c in crits}
        for row in rows:
            for c in crits:
                plan.rows.append(
                    {
                        ID_COLUMN: custom_id(row.index, c.index),
                        "eval_item": row.index,
                        "criterion": c.name,
                        PROMPT_COLUMN: render_prompt(c, row, shared),
                        SCHEMA_COLUMN: own[c.index],
                    }
                )
        plans.append(plan)
    if spec.embedded_criteria:
        from batchgrader.pipeline.evals.graders import DEFAULT_EMBEDDING_VARIANT, EMBEDDING_VARIANTS

        model = embedding_model or EMBEDDING_VARIANTS[DEFAULT_EMBEDDING_VARIANT]
        emb = plan_embeddings(spec, rows, model, f"j{len(plans) + 1}")
        assert emb is not None
        plans.append(emb)
    return plans


def settings_hash(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:10]
