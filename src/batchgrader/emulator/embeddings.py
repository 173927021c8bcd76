"""Answers to OpenAI ``/v1/embeddings`` requests in a batch, and what the real API refuses in them.

openai-python's ``batch_create_params.endpoint`` lists ``/v1/embeddings`` among a batch's
endpoints; each line's body is an ``EmbeddingCreateParams`` (``model``, ``input``: a string or a
list of strings or token arrays, ``encoding_format`` ``float``/``base64``, ``dimensions`` for the
``text-embedding-3`` models).  The emulator answers with a ``CreateEmbeddingResponse``
(``object: list``, ``data[{object: embedding, index, embedding}]``, ``model``, ``usage
{prompt_tokens, total_tokens}``) whose vectors are deterministic and meaningful enough to test
with: each text's lowercased words and character trigrams hashed into the model's dimensions,
the vector L2-normalised, so the same text has cosine 1 and texts sharing words score higher
than texts sharing none.  They are not OpenAI's vectors (``SIMULATED``).

Refused as the real API refuses them: a model that is not an embedding model (a line error of
the batch: the model is not served there), an ``input`` that is missing, empty or not text (400,
OpenAI's ``'$.input' is invalid`` message), an input above the model's 8,192 tokens (400, its
context-length message), ``dimensions`` on a model without them or outside ``1..native`` (400).
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from array import array
from typing import TYPE_CHECKING, Any

from batchgrader.emulator.common import _error_body

if TYPE_CHECKING:
    from batchgrader.emulator.state import _Req

#: the native dimensions of OpenAI's embedding models (OpenAI's embeddings guide)
DIMENSIONS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
#: the input bound of every current embedding model (OpenAI's embeddings guide: "max input 8192 tokens")
MAX_INPUT_TOKENS = 8192
#: OpenAI's 400 for an input that is empty or not text, as widely quoted (openai-python and
#: LangChain issues, 2023-2025): type invalid_request_error, param and code null
INVALID_INPUT = "'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference."
_WORD = re.compile(r"\w+")


def is_embedding_model(model: str) -> bool:
    from batchgrader.pipeline.catalogue import shipped_spec

    return shipped_spec(model.strip().lower()).embeddings or model.strip().lower() in DIMENSIONS


def _inputs(body: dict[str, Any]) -> list[str | list[int]] | None:
    """The texts (or token arrays) of a body, or None when OpenAI refuses its ``input``."""
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or len(items) > 2048:
        return None
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [items]  # one token array
    out: list[str | list[int]] = []
    for t in items:
        if isinstance(t, str) and t:
            out.append(t)
        elif isinstance(t, list) and t and all(isinstance(x, int) and not isinstance(x, bool) for x in t):
            out.append(t)
        else:
            return None
    return out


def input_tokens(model: str, body: dict[str, Any]) -> int:
    """The prompt tokens OpenAI bills for an embeddings body (each text's tokens, no overhead)."""
    from batchgrader.emulator.answers import _counter_for

    inputs = _inputs(body) or []
    texts = [t for t in inputs if isinstance(t, str)]
    counted = _counter_for(model).text_tokens(texts) if texts else []
    return sum(counted) + sum(len(t) for t in inputs if isinstance(t, list))


def request_error(body: dict[str, Any], model: str) -> tuple[int, dict[str, Any]] | None:
    """The HTTP status and error body OpenAI answers for this embeddings body, or None."""
    inputs = _inputs(body)
    if inputs is None:
        return 400, _error_body(INVALID_INPUT, "invalid_request_error", None, None)
    native = DIMENSIONS.get(model.strip().lower())
    dims = body.get("dimensions")
    if dims is not None:
        if not model.startswith("text-embedding-3"):
            return 400, _error_body(
                "This model does not support specifying dimensions.", "invalid_request_error", "dimensions", None
            )
        if not isinstance(dims, int) or isinstance(dims, bool) or not 1 <= dims <= (native or 0):
            return 400, _error_body(
                f"Invalid value for 'dimensions' = {dims}. Must be between 1 and {native}.",
                "invalid_request_error",
                "dimensions",
                None,
            )
    if body.get("encoding_format") not in (None, "float", "base64"):
        return 400, _error_body(
            f"Invalid value for 'encoding_format': {body.get('encoding_format')!r}. Supported values are: 'float' and 'base64'.",
            "invalid_request_error",
            "encoding_format",
            "invalid_value",
        )
    from batchgrader.emulator.answers import _counter_for

    for t in inputs:
        n = len(t) if isinstance(t, list) else (_counter_for(model).text_tokens([t])[0] if len(t) > MAX_INPUT_TOKENS else 0)
        if n > MAX_INPUT_TOKENS:
            return 400, _error_body(
                f"This model's maximum context length is {MAX_INPUT_TOKENS} tokens, however you requested {n} tokens "
                f"({n} in your prompt; 0 for the completion). Please reduce your prompt; or completion length.",
                "invalid_request_error",
                None,
                None,
            )
    return None


def vector(text: str, dims: int) -> list[float]:
    """The simulated embedding of ``text``: its lowercased words (weight 2) and character
    trigrams (weight 1) hashed into ``dims`` signed buckets, L2-normalised."""
    v = [0.0] * dims
    low = text.lower()
    feats = [(w, 2.0) for w in _WORD.findall(low)] + [(low[i : i + 3], 1.0) for i in range(max(0, len(low) - 2))]
    for f, weight in feats:
        h = int.from_bytes(hashlib.blake2b(f.encode("utf-8"), digest_size=8).digest(), "little")
        v[h % dims] += weight if (h >> 63) & 1 else -weight
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [round(x / norm, 7) for x in v]


def answer(req: _Req, model: str) -> dict[str, Any]:
    """The ``CreateEmbeddingResponse`` answering ``req``."""
    body = req.body
    given = body.get("dimensions")
    dims: int = given if isinstance(given, int) else DIMENSIONS.get(model, 1536)
    data = []
    for i, t in enumerate(_inputs(body) or []):
        vec = vector(t if isinstance(t, str) else " ".join(map(str, t)), dims)
        emb: Any = vec
        if body.get("encoding_format") == "base64":
            emb = base64.b64encode(array("f", vec).tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": emb})
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens},
    }
