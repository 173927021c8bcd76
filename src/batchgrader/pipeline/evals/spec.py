"""An eval object, a run and its output items, read as the API returned them.

Each criterion is checked with openai-python's own pydantic type for its ``type``
(``openai.types.graders``), then against the rules the API applied when the eval was created
(``passing_labels`` among ``labels``, a ``pass_threshold`` inside ``range``) and against what
BatchGrader can run.  Every problem is collected and raised together as one
:class:`EvalInputError`, each naming the field and the fix; fields that are read but have no
effect here are returned as :attr:`EvalSpec.notes`, never dropped silently.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchgrader.pipeline.evals import templates

CRITERION_TYPES = ("string_check", "text_similarity", "label_model", "score_model", "python")
MODEL_TYPES = ("label_model", "score_model")
LOCAL_TYPES = ("string_check", "text_similarity")
STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
METRICS = ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_3", "rouge_4", "rouge_5", "rouge_l", "cosine")
#: metrics refused at import (none now: ``cosine`` is computed from OpenAI embeddings requested in a batch job)
REFUSED_METRICS: dict[str, str] = {}
#: the metric computed from embeddings of the input and the reference (an embedding job, at batch price)
EMBEDDING_METRIC = "cosine"
ROLES = ("system", "developer", "user", "assistant")
# keys the API returns beside a criterion's schema fields
_CRITERION_EXTRA = {"id"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input: where (the field), what, and the fix."""

    where: str
    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}. Fix: {self.fix}"


class EvalInputError(ValueError):
    """Every problem found in the input (nothing was written)."""

    def __init__(self, problems: Sequence[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    def as_dicts(self) -> list[dict[str, str]]:
        return [{"field": p.where, "problem": p.what, "fix": p.fix} for p in self.problems]


@dataclass(frozen=True)
class Message:
    role: str
    content: str  # the template text (content blocks joined)


@dataclass(frozen=True)
class Criterion:
    """One testing criterion: ``index`` counts from 1 in the eval's order; ``ident`` is the id
    the API gave it (``per_testing_criteria_results`` names it so), else its name."""

    index: int
    name: str
    ident: str
    type: str
    raw: Mapping[str, Any]
    threshold: float | None = None
    threshold_rule: str = ""
    messages: tuple[Message, ...] = ()

    @property
    def model(self) -> str | None:
        return self.raw.get("model") if self.type in MODEL_TYPES else None

    @property
    def embedded(self) -> bool:
        """A ``text_similarity`` ``cosine`` criterion: its texts are embedded by a batch job."""
        return self.type == "text_similarity" and self.raw.get("evaluation_metric") == EMBEDDING_METRIC

    @property
    def labels(self) -> list[str]:
        return list(self.raw.get("labels") or [])

    @property
    def passing_labels(self) -> list[str]:
        return list(self.raw.get("passing_labels") or [])

    @property
    def range(self) -> tuple[float, float]:
        r = self.raw.get("range") or [0, 1]
        return float(r[0]), float(r[1])

    @property
    def sampling(self) -> Mapping[str, Any]:
        return self.raw.get("sampling_params") or {}

    def template_fields(self) -> dict[str, str]:
        """Every templated text of the criterion, by field name (``input``, ``input[0].content``)."""
        if self.type in MODEL_TYPES:
            return {f"input[{i}].content": m.content for i, m in enumerate(self.messages)}
        if self.type in LOCAL_TYPES:
            return {"input": str(self.raw.get("input", "")), "reference": str(self.raw.get("reference", ""))}
        return {}


@dataclass(frozen=True)
class EvalSpec:
    id: str
    name: str
    raw: Mapping[str, Any]
    item_schema: Mapping[str, Any] | None
    sample_schema: Mapping[str, Any] | None
    criteria: tuple[Criterion, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def model_criteria(self) -> list[Criterion]:
        return [c for c in self.criteria if c.type in MODEL_TYPES]

    @property
    def embedded_criteria(self) -> list[Criterion]:
        return [c for c in self.criteria if c.embedded]


def _obj(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def slug(text: str) -> str:
    """A file- and profile-name-safe form of an eval's id or name."""
    s = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.")
    return s[:60] or "eval"


def parse_eval(data: Any, *, allow_python: bool = False) -> EvalSpec:
    """The eval object ``data`` (a parsed ``GET /evals/{id}`` answer) as an :class:`EvalSpec`, or
    :class:`EvalInputError` with every problem."""
    problems: list[Problem] = []
    notes: list[str] = []
    if not isinstance(data, Mapping):
        raise EvalInputError([Problem("eval", f"is a JSON {type(data).__name__}, not an object", _EXPORT_FIX)])
    obj = data.get("object")
    if obj not in (None, "eval"):
        fix = "pass the run with --run RUN.json and the eval object itself as EVAL.json" if obj == "eval.run" else _EXPORT_FIX
        raise EvalInputError([Problem("eval.object", f"is {obj!r}, not 'eval'", fix)])
    if obj is None:
        notes.append("eval.object is missing: read as an eval object (a create request's body is accepted too)")
    ident = data.get("id") if isinstance(data.get("id"), str) else None
    name = data.get("name") if isinstance(data.get("name"), str) else None
    if not ident and not name:
        problems.append(Problem("eval.id", "the eval has neither an id nor a name", "export the eval with GET /evals/{eval_id}"))
    item_schema, sample_schema = _data_source(data.get("data_source_config"), problems, notes)
    criteria: list[Criterion] = []
    raw_criteria = data.get("testing_criteria")
    if not isinstance(raw_criteria, list) or not raw_criteria:
        problems.append(Problem("eval.testing_criteria", "is missing or empty", "an eval needs at least one testing criterion"))
        raw_criteria = []
    names: set[str] = set()
    for j, raw in enumerate(raw_criteria, start=1):
        c = _criterion(j, raw, problems, notes, allow_python)
        if c is None:
            continue
        if c.name in names:
            problems.append(
                Problem(
                    f"testing_criteria[{j - 1}].name",
                    f"{c.name!r} is the name of an earlier criterion too",
                    "give each criterion its own name (results are reported by name)",
                )
            )
        names.add(c.name)
        criteria.append(c)
    metadata = data.get("metadata") if isinstance(data.get("metadata"), Mapping) else {}
    for key in sorted(set(data) - {"object", "id", "name", "data_source_config", "testing_criteria", "metadata", "created_at"}):
        notes.append(f"eval.{key} is not part of the eval schema: ignored")
    if problems:
        raise EvalInputError(problems)
    return EvalSpec(
        id=ident or slug(name or "eval"),
        name=name or ident or "eval",
        raw=data,
        item_schema=item_schema,
        sample_schema=sample_schema,
        criteria=tuple(criteria),
        metadata=metadata or {},
        notes=tuple(notes),
    )


_EXPORT_FIX = "export the eval as the API returns it: GET /v1/evals/{eval_id} (client.evals.retrieve(id).to_json())"
_LOGS_FIX = (
    'export those responses to a JSONL file of {"item": {...}, "sample": {"output_text": ...}} lines (before '
    "2026-11-30: list them with the Responses or Chat Completions API, or GET /evals/{id}/runs/{run}/output_items) and "
    "import it with --data, or with --output-items"
)


def _data_source(
    dsc: Any, problems: list[Problem], notes: list[str]
) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
    if not isinstance(dsc, Mapping):
        problems.append(Problem("eval.data_source_config", "is missing or not an object", _EXPORT_FIX))
        return None, None
    kind = dsc.get("type")
    if kind in ("logs", "stored_completions"):
        problems.append(
            Problem(
                "eval.data_source_config.type",
                f"is {kind!r}: its rows were your stored traffic at OpenAI, which cannot be read after the shutdown",
                _LOGS_FIX,
            )
        )
        return None, None
    if kind != "custom":
        problems.append(
            Problem(
                "eval.data_source_config.type",
                f"is {kind!r}",
                "an eval's data source config is 'custom', 'logs' or 'stored_completions'",
            )
        )
        return None, None
    schema = dsc.get("schema")
    if isinstance(schema, Mapping):  # the stored form: {"properties": {"item": ..., "sample": ...}}
        props = _obj(schema.get("properties"))
        item = _obj(props.get("item")) or None
        sample = _obj(props.get("sample")) or None
        if item is None:
            notes.append("data_source_config.schema has no properties.item: items are not checked against a schema")
        return item, sample
    item = dsc.get("item_schema")
    if isinstance(item, Mapping):  # the create request's form
        notes.append("data_source_config has item_schema (a create request's form) rather than schema: read as the item schema")
        return item, ({"type": "object"} if dsc.get("include_sample_schema") else None)
    problems.append(
        Problem(
            "eval.data_source_config.schema",
            "is missing",
            "export the eval with GET /evals/{eval_id}: its config holds the schema",
        )
    )
    return None, None


def _grader_type(kind: str) -> Any:
    """openai-python's pydantic type for an eval's criterion of this type."""
    from openai.types import eval_retrieve_response as r
    from openai.types.graders.label_model_grader import LabelModelGrader
    from openai.types.graders.string_check_grader import StringCheckGrader

    return {
        "string_check": StringCheckGrader,
        "text_similarity": r.TestingCriterionEvalGraderTextSimilarity,
        "label_model": LabelModelGrader,
        "score_model": r.TestingCriterionEvalGraderScoreModel,
        "python": r.TestingCriterionEvalGraderPython,
    }[kind]


def _criterion(j: int, raw: Any, problems: list[Problem], notes: list[str], allow_python: bool) -> Criterion | None:
    import pydantic

    at = f"testing_criteria[{j - 1}]"
    if not isinstance(raw, Mapping):
        problems.append(Problem(at, f"is a JSON {type(raw).__name__}, not an object", _EXPORT_FIX))
        return None
    kind = raw.get("type")
    name = raw.get("name") if isinstance(raw.get("name"), str) else f"criterion {j}"
    at = f"{at} ({name!r})"
    if kind not in CRITERION_TYPES:
        extra = (
            "multi graders exist only in the graders and fine-tuning APIs, not in evals"
            if kind == "multi"
            else f"the criterion types of an eval are {', '.join(CRITERION_TYPES)}"
        )
        problems.append(Problem(f"{at}.type", f"unknown grader type {kind!r}", f"use a supported type ({extra})"))
        return None
    model_type = _grader_type(kind)
    try:
        model_type.model_validate(dict(raw))
    except pydantic.ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "union[")))
            problems.append(
                Problem(f"{at}.{loc}" if loc else at, err["msg"], f"give {kind}'s fields as the API's schema has them")
            )
        return None
    known = set(model_type.model_fields) | _CRITERION_EXTRA
    for key in sorted(set(raw) - known):
        notes.append(f"{at}.{key} is not a field of {kind}: ignored")
    ident = raw.get("id") if isinstance(raw.get("id"), str) else name
    before = len(problems)
    threshold: float | None = None
    rule = ""
    messages: tuple[Message, ...] = ()
    if kind == "string_check":
        rule = f"passed when the score is 1 ({raw['operation']}: " + _OPERATION_RULE[raw["operation"]] + ")"
    elif kind == "text_similarity":
        metric = raw["evaluation_metric"]
        threshold = float(raw["pass_threshold"])
        if metric in REFUSED_METRICS:
            problems.append(
                Problem(
                    f"{at}.evaluation_metric", f"{metric}: {REFUSED_METRICS[metric]}", "use another metric for this criterion"
                )
            )
        if not 0 <= threshold <= 1:
            problems.append(
                Problem(
                    f"{at}.pass_threshold", f"{threshold:g} is outside [0, 1], the range of {metric}", "use a threshold in [0, 1]"
                )
            )
        rule = f"passed when the {metric} score >= pass_threshold {threshold:g}"
    elif kind in MODEL_TYPES:
        messages = _messages(at, raw.get("input") or [], problems)
        if kind == "label_model":
            labels = list(raw["labels"])
            passing = list(raw["passing_labels"])
            if not labels:
                problems.append(Problem(f"{at}.labels", "is empty", "list the labels the model may choose"))
            if len(set(labels)) != len(labels):
                problems.append(Problem(f"{at}.labels", "lists a label twice", "list each label once"))
            stray = [p for p in passing if p not in labels]
            if stray:
                problems.append(
                    Problem(
                        f"{at}.passing_labels",
                        f"{', '.join(map(repr, stray))} not among labels {labels}",
                        "make passing_labels a subset of labels",
                    )
                )
            if not passing:
                problems.append(Problem(f"{at}.passing_labels", "is empty: no item could pass", "name the labels that pass"))
            rule = f"passed when the label is one of {passing}"
        else:
            rng = raw.get("range") or [0, 1]
            if len(rng) != 2 or not rng[0] < rng[1]:
                problems.append(
                    Problem(f"{at}.range", f"{rng} is not [low, high] with low < high", "give two numbers, low first")
                )
                rng = [0, 1]
            lo, hi = float(rng[0]), float(rng[1])
            if raw.get("pass_threshold") is None:
                threshold = (lo + hi) / 2
                rule = (
                    f"pass_threshold absent: passed when the score >= {threshold:g}, the midpoint of range [{lo:g}, {hi:g}] "
                    "(the rule of Azure's evaluation SDK; OpenAI's spec states none)"
                )
                notes.append(f"{at}: no pass_threshold, so the midpoint of its range ({threshold:g}) is used")
            else:
                threshold = float(raw["pass_threshold"])
                if not lo <= threshold <= hi:
                    problems.append(
                        Problem(
                            f"{at}.pass_threshold",
                            f"{threshold:g} is outside range [{lo:g}, {hi:g}]",
                            "use a threshold inside range",
                        )
                    )
                rule = (
                    f"passed when the score >= pass_threshold {threshold:g}; a score outside [{lo:g}, {hi:g}] is invalid_output"
                )
            sp = raw.get("sampling_params") or {}
            for key in ("top_p", "seed"):
                if sp.get(key) is not None:
                    notes.append(
                        f"{at}.sampling_params.{key} = {sp[key]!r} is not sent: BatchGrader has no per-request {key} setting"
                    )
    elif kind == "python":
        threshold = float(raw["pass_threshold"]) if raw.get("pass_threshold") is not None else None
        if not allow_python:
            problems.append(
                Problem(
                    f"{at}.type",
                    "a python grader runs your code: BatchGrader runs it only when asked (in a subprocess without network, "
                    "with OpenAI's time and memory limits)",
                    "pass --allow-python if you trust this code, or remove the criterion",
                )
            )
        if len(str(raw.get("source", "")).encode()) > 256 * 1024:
            problems.append(Problem(f"{at}.source", "is larger than 256 kB (OpenAI's limit)", "shorten the code"))
        if raw.get("image_tag"):
            notes.append(f"{at}.image_tag {raw['image_tag']!r} is not used: the code runs with this Python's installed packages")
        rule = (
            f"passed when grade() >= pass_threshold {threshold:g}"
            if threshold is not None
            else "passed when grade() >= 1 (no pass_threshold given)"
        )
    crit = Criterion(j, str(name), str(ident), kind, dict(raw), threshold, rule, messages)
    for fld, tmpl in crit.template_fields().items():
        for bad in templates.bad_variables(tmpl):
            problems.append(
                Problem(
                    f"{at}.{fld}",
                    f"template variable {{{{{bad}}}}} is in no namespace (only item.* and sample.* exist)",
                    "write {{item.FIELD}} or {{sample.output_text}}",
                )
            )
    return crit if len(problems) == before else None


_OPERATION_RULE = {
    "eq": "input equals reference, case-sensitive",
    "ne": "input differs from reference, case-sensitive",
    "like": "input contains reference, case-sensitive",
    "ilike": "input contains reference, case ignored",
}


def _messages(at: str, raw: Sequence[Any], problems: list[Problem]) -> tuple[Message, ...]:
    out: list[Message] = []
    for i, m in enumerate(raw):
        role = m.get("role") if isinstance(m, Mapping) else None
        if role not in ROLES:
            problems.append(Problem(f"{at}.input[{i}].role", f"is {role!r}", f"use one of {', '.join(ROLES)}"))
            continue
        content = m.get("content")
        blocks = content if isinstance(content, list) else [content]
        parts: list[str] = []
        for b in blocks:
            if isinstance(b, str):
                parts.append(b)
            elif isinstance(b, Mapping) and b.get("type") in ("input_text", "output_text") and isinstance(b.get("text"), str):
                parts.append(b["text"])
            else:
                kind = b.get("type") if isinstance(b, Mapping) else type(b).__name__
                problems.append(
                    Problem(
                        f"{at}.input[{i}].content",
                        f"a {kind} block: BatchGrader sends text only (no images or audio)",
                        "replace the block with text, or grade this criterion elsewhere",
                    )
                )
        out.append(Message(role, "".join(parts)))
    if not any(m.role == "user" for m in out) and not problems:
        problems.append(Problem(f"{at}.input", "has no user message", "add the user message the grader model answers"))
    return tuple(out)


@dataclass(frozen=True)
class RunSpec:
    """What an exported run adds: its id and name, the rows of an inline ``file_content``
    source, and for a ``completions`` or ``responses`` run the sampling that comes first."""

    id: str
    name: str
    data_source_type: str
    rows: list[dict[str, Any]] | None
    raw: Mapping[str, Any]
    notes: tuple[str, ...] = ()
    generation: Generation | None = None  # a completions / responses run: sample, then grade


def parse_run(data: Any) -> RunSpec:
    """An exported run (``GET /evals/{id}/runs/{run_id}``)."""
    if not isinstance(data, Mapping) or data.get("object") not in (None, "eval.run"):
        got = data.get("object") if isinstance(data, Mapping) else type(data).__name__
        raise EvalInputError(
            [Problem("run.object", f"is {got!r}, not 'eval.run'", "export the run with GET /evals/{id}/runs/{run_id}")]
        )
    ds = data.get("data_source")
    if not isinstance(ds, Mapping):
        raise EvalInputError([Problem("run.data_source", "is missing", "export the run with GET /evals/{id}/runs/{run_id}")])
    kind = ds.get("type")
    src = _obj(ds.get("source"))
    notes: list[str] = []
    rows: list[dict[str, Any]] | None = None
    generation: Generation | None = None
    if kind in ("completions", "responses"):
        if src.get("type") in ("stored_completions", "responses"):
            raise EvalInputError(
                [
                    Problem(
                        "run.data_source.source.type",
                        f"is {src.get('type')!r}: the run read your stored traffic at OpenAI",
                        _LOGS_FIX,
                    )
                ]
            )
        generation = _generation(ds, notes)
    elif kind != "jsonl":
        raise EvalInputError(
            [Problem("run.data_source.type", f"is {kind!r}", "a run's data source is jsonl, completions or responses")]
        )
    if src.get("type") == "file_content":
        content = src.get("content")
        if not isinstance(content, list):
            raise EvalInputError(
                [Problem("run.data_source.source.content", "is not a list", "export the run as the API returns it")]
            )
        rows = [dict(r) for r in content if isinstance(r, Mapping)]
    elif src.get("type") == "file_id":
        notes.append(
            f"run.data_source.source.file_id {src.get('id')!r}: the items are in an OpenAI file; pass its content with --data "
            "(client.files.content(id))"
        )
    return RunSpec(
        id=str(data.get("id") or "run"),
        name=str(data.get("name") or data.get("id") or "run"),
        data_source_type=str(kind),
        rows=rows,
        raw=data,
        notes=tuple(notes),
        generation=generation,
    )


@dataclass(frozen=True)
class Generation:
    """A ``completions`` or ``responses`` run's sampling (generate-then-grade): the model, the
    input messages (a template over ``item``, or ``item_reference``: a list of messages in each
    item), the profile settings its sampling parameters become, and the data source as given
    (without its items) for run.json."""

    kind: str
    model: str
    messages: tuple[Message, ...]
    item_reference: str | None
    settings: Mapping[str, Any]
    data_source: Mapping[str, Any]

    def template_fields(self) -> dict[str, str]:
        return {f"run.data_source.input_messages.template[{i}].content": m.content for i, m in enumerate(self.messages)}


_SAMPLING_SENT = {"temperature", "max_completion_tokens", "reasoning_effort", "response_format", "text"}


def _generation(ds: Mapping[str, Any], notes: list[str]) -> Generation:
    """The sampling of a ``completions`` / ``responses`` data source, or every problem with it."""
    problems: list[Problem] = []
    at = "run.data_source"
    kind = str(ds.get("type"))
    model = ds.get("model")
    if not isinstance(model, str) or not model:
        problems.append(Problem(f"{at}.model", "is missing", "name the model that samples the answers (e.g. gpt-5.4-mini)"))
    im = _obj(ds.get("input_messages"))
    messages: tuple[Message, ...] = ()
    reference: str | None = None
    if im.get("type") == "template":
        messages = _messages(f"{at}.input_messages.template", im.get("template") or [], problems)
        for i, m in enumerate(messages):
            for var in templates.variables(m.content):
                if not var.startswith("item"):
                    problems.append(
                        Problem(
                            f"{at}.input_messages.template[{i}].content",
                            f"uses {{{{{var}}}}}: the messages that sample the answer can read only the item",
                            "write {{item.FIELD}}",
                        )
                    )
    elif im.get("type") == "item_reference" and isinstance(im.get("item_reference"), str):
        reference = im["item_reference"]
        if not reference.startswith("item."):
            problems.append(
                Problem(f"{at}.input_messages.item_reference", f"is {reference!r}", "name a field of the item: item.FIELD")
            )
    else:
        problems.append(
            Problem(
                f"{at}.input_messages",
                "is missing, or neither a template nor an item_reference",
                'give {"type": "template", "template": [messages]} as the run had it',
            )
        )
    sp = _obj(ds.get("sampling_params"))
    settings: dict[str, Any] = {"model": model}
    for key in ("temperature", "reasoning_effort"):
        if sp.get(key) is not None:
            settings[key] = sp[key]
    if sp.get("max_completion_tokens") is not None:
        settings["max_completion_tokens"] = int(sp["max_completion_tokens"])
    fmt: Any = sp.get("response_format")
    if kind == "responses" and isinstance(_obj(sp.get("text")).get("format"), Mapping):
        f = dict(sp["text"]["format"])  # Responses' text.format -> a chat completion's response_format
        fmt = (
            {"type": "json_schema", "json_schema": {k: v for k, v in f.items() if k != "type"}}
            if f.get("type") == "json_schema"
            else f
        )
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        settings["response_format"] = dict(fmt)
    elif isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
        notes.append(
            f"{at}.sampling_params: response_format json_object is not sent (a schema is needed for structured output); "
            "sample.output_json is read whenever the answer is JSON"
        )
    if sp.get("tools"):
        problems.append(
            Problem(
                f"{at}.sampling_params.tools",
                "the run let the model call tools: BatchGrader sends no tools and cannot return tool calls (sample.output_tools)",
                "remove the tools from the run, or grade this run's exported output items (--output-items)",
            )
        )
    for key in ("top_p", "seed"):
        if sp.get(key) is not None:
            notes.append(f"{at}.sampling_params.{key} = {sp[key]!r} is not sent: BatchGrader has no per-request {key} setting")
    for key in sorted(set(sp) - _SAMPLING_SENT - {"top_p", "seed", "tools"}):
        notes.append(f"{at}.sampling_params.{key} is not used")
    if problems:
        raise EvalInputError(problems)
    raw = {k: v for k, v in ds.items() if k != "source"}
    return Generation(kind, str(model), messages, reference, settings, raw)
