"""What each criterion says about a row: a score, whether it passed, or why it has no verdict.

``string_check`` and ``text_similarity`` are computed here, with no model call.  OpenAI never
published its similarity implementations, so each metric has named *variants* (library,
tokenisation, smoothing, which of precision/recall/F); the variant used is recorded in every
result, and :mod:`batchgrader.pipeline.evals.compare` picks the one that best reproduces exported scores.
The libraries (rapidfuzz, nltk, sacrebleu, rouge-score: the ``[evals]`` extra) are imported
when a metric is first used.

Model criteria are read from the row's structured answer (``result``): a ``label_model`` label
must be one of its ``labels`` and passes when it is among ``passing_labels``; a ``score_model``
number must lie in its ``range`` (else ``invalid_output``) and passes at ``>= threshold``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from batchgrader.pipeline.evals.spec import Criterion

_TOKEN = re.compile(r"\w+|[^\w\s]")
ANSWER_FIELD = "result"  # the structured answer's field that model criteria read


@dataclass(frozen=True)
class Verdict:
    """A criterion's verdict on one row: ``error`` set means it has none (the row errored)."""

    score: float | None
    passed: bool
    error: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


def tokens(text: str) -> list[str]:
    """Words and punctuation marks (``\\w+|[^\\w\\s]``), case kept."""
    return _TOKEN.findall(text)


def string_check(operation: str, value: str, reference: str) -> float:
    if operation == "eq":
        return 1.0 if value == reference else 0.0
    if operation == "ne":
        return 1.0 if value != reference else 0.0
    if operation == "like":
        return 1.0 if reference in value else 0.0
    if operation == "ilike":
        return 1.0 if reference.casefold() in value.casefold() else 0.0
    raise ValueError(f"unknown string_check operation {operation!r}")


# --- text similarity: metric -> variant -> (description, scorer factory) ---------------------------


def _fuzzy(scorer: str) -> Callable[[str, str], float]:
    from rapidfuzz import fuzz

    fn = getattr(fuzz, scorer)
    return lambda a, b: fn(a, b) / 100.0


def _nltk_bleu(method: int | None) -> Callable[[str, str], float]:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    smooth = getattr(SmoothingFunction(), f"method{method}") if method is not None else None

    def bleu(a: str, b: str) -> float:
        hyp, ref = tokens(a), tokens(b)
        if not hyp or not ref:
            return 0.0
        import warnings

        with warnings.catch_warnings():  # "the hypothesis contains 0 counts of n-gram overlaps"
            warnings.simplefilter("ignore")
            return float(sentence_bleu([ref], hyp, smoothing_function=smooth))

    return bleu


def _sacrebleu() -> Callable[[str, str], float]:
    from sacrebleu.metrics import BLEU

    metric = BLEU(effective_order=True)
    return lambda a, b: metric.sentence_score(a, [b]).score / 100.0


def _gleu() -> Callable[[str, str], float]:
    from nltk.translate.gleu_score import sentence_gleu

    def gleu(a: str, b: str) -> float:
        hyp, ref = tokens(a), tokens(b)
        return float(sentence_gleu([ref], hyp)) if hyp and ref else 0.0

    return gleu


def _meteor() -> Callable[[str, str], float]:
    from nltk.translate.meteor_score import meteor_score

    from batchgrader.pipeline.evals.wordnet import wordnet

    wn = wordnet()

    def meteor(a: str, b: str) -> float:
        hyp, ref = tokens(a.lower()), tokens(b.lower())
        return float(meteor_score([ref], hyp, wordnet=wn)) if hyp and ref else 0.0

    return meteor


def _rouge(kind: str, part: str, stem: bool) -> Callable[[str, str], float]:
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer([kind], use_stemmer=stem)
    attr = {"f": "fmeasure", "p": "precision", "r": "recall"}[part]
    # rouge-score's scores(target, prediction): the reference is the target
    return lambda a, b: float(getattr(scorer.score(b, a)[kind], attr))


def _rouge_variants(kind: str) -> dict[str, tuple[str, Callable[[], Callable[[str, str], float]]]]:
    out: dict[str, tuple[str, Callable[[], Callable[[str, str], float]]]] = {}
    for part, word in (("f", "F-measure"), ("p", "precision"), ("r", "recall")):
        for stem in (False, True):
            name = f"rouge-score-{part}" + ("-stem" if stem else "")
            desc = f"rouge-score {kind} {word}, lowercased, {'Porter stemmer' if stem else 'no stemming'}"
            out[name] = (desc, functools.partial(_rouge, kind, part, stem))
    return out


VariantTable = dict[str, dict[str, tuple[str, Callable[[], Callable[[str, str], float]]]]]

VARIANTS: VariantTable = {
    "fuzzy_match": {
        "rapidfuzz-ratio": ("rapidfuzz fuzz.ratio / 100 (normalised Indel similarity), case kept", lambda: _fuzzy("ratio")),
        "rapidfuzz-wratio": ("rapidfuzz fuzz.WRatio / 100 (best of ratio, partial and token ratios)", lambda: _fuzzy("WRatio")),
        "rapidfuzz-token-sort": (
            "rapidfuzz fuzz.token_sort_ratio / 100 (word order ignored)",
            lambda: _fuzzy("token_sort_ratio"),
        ),
    },
    "bleu": {
        "nltk-method4": (
            "nltk sentence_bleu, 4-grams, smoothing method4, tokens \\w+|[^\\w\\s], case kept",
            lambda: _nltk_bleu(4),
        ),
        "nltk-method1": (
            "nltk sentence_bleu, 4-grams, smoothing method1, tokens \\w+|[^\\w\\s], case kept",
            lambda: _nltk_bleu(1),
        ),
        "nltk-none": ("nltk sentence_bleu, 4-grams, no smoothing, tokens \\w+|[^\\w\\s], case kept", lambda: _nltk_bleu(None)),
        "sacrebleu": ("sacrebleu sentence BLEU / 100, tokenizer 13a, exp smoothing, effective order", _sacrebleu),
    },
    "gleu": {"nltk": ("nltk sentence_gleu (Google BLEU), 1-4-grams, tokens \\w+|[^\\w\\s], case kept", _gleu)},
    "meteor": {"nltk": ("nltk meteor_score (alpha 0.9, beta 3, gamma 0.5), WordNet 3.0, lowercased tokens", _meteor)},
    **{f"rouge_{n}": _rouge_variants(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge_variants("rougeL"),
}
DEFAULT_VARIANT = {
    "fuzzy_match": "rapidfuzz-ratio",
    "bleu": "nltk-method4",
    "gleu": "nltk",
    "meteor": "nltk",
    **{f"rouge_{n}": "rouge-score-f" for n in range(1, 6)},
    "rouge_l": "rouge-score-f",
}


#: ``cosine``: the embedding models its texts may be embedded with, by variant (the model's
#: batch price is the catalogue's); OpenAI's graders guide says its Evals used text-embedding-3-large
EMBEDDING_VARIANTS = {
    "openai-text-embedding-3-large": "text-embedding-3-large",
    "openai-text-embedding-3-small": "text-embedding-3-small",
}
DEFAULT_EMBEDDING_VARIANT = "openai-text-embedding-3-large"


def embedding_variant(model: str) -> str:
    return f"openai-{model}"


def describe_embedding(variant: str) -> str:
    model = EMBEDDING_VARIANTS.get(variant, variant.removeprefix("openai-"))
    return f"cosine of the {model} embeddings (OpenAI Batch API, /v1/embeddings, float) of the input and the reference" + (
        " (the model OpenAI's Evals used)" if model == "text-embedding-3-large" else ""
    )


def cosine(a: Any, b: Any) -> float:
    """The cosine similarity of two vectors (lists of numbers of one length); ``ValueError`` otherwise."""
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b) or not a:
        raise ValueError("the two embeddings are not vectors of one length")
    dot = sum(float(x) * float(y) for x, y in zip(a, b))
    na = math.sqrt(sum(float(x) * float(x) for x in a))
    nb = math.sqrt(sum(float(y) * float(y) for y in b))
    if na == 0 or nb == 0:
        raise ValueError("an embedding is the zero vector")
    return dot / (na * nb)


def embedding_verdict(c: Criterion, a: Any, b: Any, variant: str) -> Verdict:
    """A ``cosine`` criterion's verdict from the embeddings of its rendered input and reference."""
    try:
        s = cosine(a, b)
    except ValueError as exc:
        return Verdict(None, False, "invalid_output", {"message": str(exc), "variant": variant})
    assert c.threshold is not None
    return Verdict(s, s >= c.threshold, detail={"variant": variant})


@functools.lru_cache(maxsize=64)
def scorer(metric: str, variant: str | None = None) -> Callable[[str, str], float]:
    """The scoring function ``(input, reference) -> score in [0, 1]`` of a metric's variant."""
    table = VARIANTS[metric]
    return table[variant or DEFAULT_VARIANT[metric]][1]()


def describe(metric: str, variant: str | None = None) -> str:
    if metric == "cosine":
        return describe_embedding(variant or DEFAULT_EMBEDDING_VARIANT)
    return VARIANTS[metric][variant or DEFAULT_VARIANT[metric]][0]


def default_variant(metric: str) -> str:
    return DEFAULT_EMBEDDING_VARIANT if metric == "cosine" else DEFAULT_VARIANT[metric]


def metric_unavailable(metric: str) -> str | None:
    """Why a metric cannot be computed on this machine (a missing library or WordNet), or None."""
    if metric == "cosine":
        return None  # computed from the embedding job's vectors
    try:
        scorer(metric)
    except ImportError as exc:
        return f"{metric} needs the package {exc.name!r}: pip install 'batchgrader[evals]'"
    except Exception as exc:  # WordNetMissing
        return f"{metric}: {exc}"
    return None


# --- verdicts ------------------------------------------------------------------------------------


def local_verdict(c: Criterion, value: str, reference: str, variant: str | None = None) -> Verdict:
    """A ``string_check`` or ``text_similarity`` criterion's verdict on the rendered texts."""
    if c.type == "string_check":
        s = string_check(c.raw["operation"], value, reference)
        return Verdict(s, s == 1.0)
    metric = c.raw["evaluation_metric"]
    s = scorer(metric, variant)(value, reference)
    assert c.threshold is not None
    return Verdict(s, s >= c.threshold, detail={"variant": variant or DEFAULT_VARIANT[metric]})


def model_verdict(c: Criterion, answer: Any, error: str | None) -> Verdict:
    """A model criterion's verdict from the row's parsed answer (its ``result``) or its error."""
    if error:
        return Verdict(None, False, error)
    value = answer.get(ANSWER_FIELD) if isinstance(answer, Mapping) else None
    if c.type == "label_model":
        if not isinstance(value, str) or value not in c.labels:
            return Verdict(None, False, "invalid_output", {"answer": value, "expected": c.labels})
        passed = value in c.passing_labels
        return Verdict(1.0 if passed else 0.0, passed, detail={"label": value})
    lo, hi = c.range
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return Verdict(None, False, "invalid_output", {"answer": value, "expected": f"a number in [{lo:g}, {hi:g}]"})
    if not lo <= value <= hi:
        return Verdict(None, False, "invalid_output", {"answer": value, "expected": f"a number in [{lo:g}, {hi:g}]"})
    assert c.threshold is not None
    return Verdict(float(value), value >= c.threshold)
