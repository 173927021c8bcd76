"""Price table: shipped CSV, user overrides, lookups, estimates and billed cost."""

from __future__ import annotations

import csv
import json
from datetime import date
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgrader.pipeline.pricing import (
    COLUMNS,
    Estimate,
    Price,
    PricingError,
    billed_cost,
    estimate,
    load_pricing,
)
from harness import merged

HEADER = ",".join(COLUMNS) + "\n"
DATED_HEADER = "model,input_per_1m,output_per_1m,price_from\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- the shipped table --------------------------------------------------------------------------


# Chat models the Batch API accepts that the 2026-09-26 capture of the pricing page does not list
# (issue 15, item 10); checked on 2026-11-23.
LEGACY_CHAT_MODELS = {
    "gpt-3.5-turbo": (0.25, 0.75, 16_385, "https://developers.openai.com/api/docs/pricing (alias of gpt-3.5-turbo-0125)"),
    "gpt-4-turbo": (5.00, 15.00, 128_000, "https://developers.openai.com/api/docs/models/gpt-4-turbo"),
    "gpt-4": (15.00, 30.00, 8_192, "https://developers.openai.com/api/docs/models/gpt-4"),
}


def test_legacy_chat_models_have_prices_with_source_and_date():
    table = load_pricing()
    for model, (inp, out, ctx, source) in LEGACY_CHAT_MODELS.items():
        p = table.get(model)
        assert (p.input_per_1m, p.output_per_1m, p.context_window) == (inp, out, ctx)
        assert p.taken_on == "2026-11-23" and p.source.startswith(source)
    # a dated snapshot of an alias finds its base's price
    assert table.get("gpt-4-turbo-2024-04-09").output_per_1m == 15.00


def test_unknown_model_suggests_a_name_and_the_docs_never_a_price_line():
    with pytest.raises(PricingError) as info:
        load_pricing().get("gpt-4o-mni")
    msg = str(info.value)
    assert "Did you mean 'gpt-4o-mini'" in msg and "https://developers.openai.com/api/docs/pricing" in msg
    assert "gpt-4o-mni," not in msg  # no made-up price line to paste


def test_shipped_table_has_the_reference_batch_prices():
    table = load_pricing(day=date(2026, 11, 29))  # before the dated prices of gemini-4-argon and 3.6-3.8 Flash change
    expected = {  # model: (input, cached, output) per 1M tokens, Batch API (reference §7)
        "gpt-4o": (1.25, None, 5.00),
        "gpt-4o-2024-05-13": (2.50, None, 7.50),
        "gpt-4o-mini": (0.075, None, 0.30),
        "gpt-4.1": (1.00, None, 4.00),
        "gpt-4.1-mini": (0.20, None, 0.80),
        "gpt-4.1-nano": (0.05, None, 0.20),
        "o3": (1.00, None, 4.00),
        "o4-mini": (0.55, None, 2.20),
        "o3-mini": (0.55, None, 2.20),
        "o1": (7.50, None, 30.00),
        "o3-pro": (10.00, None, 40.00),
        "gpt-5": (0.625, 0.0625, 5.00),
        "gpt-5-mini": (0.125, 0.0125, 1.00),
        "gpt-5-nano": (0.025, 0.0025, 0.20),
        "gpt-5.1": (0.625, 0.0625, 5.00),
        "gpt-5.2": (0.875, 0.0875, 7.00),
        "gpt-5.4": (1.25, 0.13, 7.50),
        "gpt-5.4-mini": (0.375, 0.0375, 2.25),
        "gpt-5.4-nano": (0.10, 0.01, 0.625),
        "gpt-5.5": (2.50, 0.25, 15.00),
        "gpt-5-pro": (7.50, None, 60.00),
        "gpt-3.5-turbo-0125": (0.25, None, 0.75),
        "gpt-3.5-turbo-1106": (1.00, None, 2.00),
    }
    claude = {  # Anthropic Message Batches: 50% of the standard prices (docs/providers.md)
        "claude-opus-5-5": (2.00, 0.10, 10.00),  # batch cache reads: 50% of the standard rate (catalogue check 2026-11-28)
        "claude-opus-5": (2.50, 0.25, 12.50),
        "claude-sonnet-5-5": (1.00, 0.05, 5.00),
        "claude-sonnet-5": (1.00, 0.10, 5.00),
        "claude-haiku-4-5": (0.50, 0.05, 2.50),
        "claude-haiku-5-5": (0.05, 0.005, 0.25),
        "claude-fable-5-1": (5.00, 0.125, 25.00),
    }
    gemini = {  # Gemini Batch API: 50% of the standard prices; cache hits at the standard caching rate (docs/providers.md)
        "gemini-2.5-pro": (0.625, 0.125, 5.00),
        "gemini-2.5-flash": (0.15, 0.03, 1.25),
        "gemini-2.5-flash-lite": (0.05, 0.01, 0.20),
        "gemini-3.5-flash": (0.75, 0.15, 4.50),
        "gemini-3.1-pro-preview": (1.00, 0.2, 6.00),
    }
    assert set(table) >= set(expected) | set(LEGACY_CHAT_MODELS) | set(claude) | set(gemini)
    for model, (inp, cached, out) in gemini.items():
        p = table.get(model)
        assert (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m) == (inp, cached, out)
        assert p.taken_on == "2026-11-28" and p.source.startswith("https://ai.google.dev/gemini-api/docs/pricing")
    for model, (inp, cached, out) in claude.items():
        p = table.get(model)
        assert (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m) == (inp, cached, out)
        assert p.taken_on in ("2026-11-23", "2026-11-28") and p.source.startswith("https://platform.claude.com/docs/")
    for model, (inp, cached, out) in expected.items():
        p = table.get(model)
        assert (p.model, p.input_per_1m, p.cached_input_per_1m, p.output_per_1m) == (model, inp, cached, out)
        assert p.taken_on == "2026-09-26"
        assert p.source == "https://developers.openai.com/api/docs/pricing"
        assert p.origin == "shipped"
    assert table.get("gpt-4o-mini").context_window == 128_000
    assert table.get("gpt-4.1-nano").context_window == 1_047_576
    assert table.get("o4-mini").context_window == 200_000
    assert table.get("gpt-5-mini").context_window == 400_000
    assert table.get("gpt-3.5-turbo-0125").context_window == 16_385
    assert table.get("gpt-5.4").context_window == 1_050_000  # models.dev and genai-prices agree
    # catalogue check 2026-11-28: the current period's Gemini 3.8 Flash standard price, limits, new rows
    g38 = table.get("gemini-3.8-flash")
    assert (g38.spec.standard_input_per_1m, g38.spec.standard_output_per_1m, g38.input_per_1m) == (0.75, 3.75, 0.375)
    assert (g38.context_window, g38.spec.max_output) == (1_048_576, 65_536)
    assert table.get("claude-sonnet-4-6").spec.max_output == 128_000
    new = {"gpt-6.1-sol": (1, 5, 2, 10), "gpt-6.1-terra": (0.5, 2.5, 1, 5), "gemini-3.5-flash-lite": (0.15, 1.25, 0.3, 2.5)}
    new |= {"gemini-3.6-flash": (0.375, 1.875, 0.75, 3.75), "gemini-3.7-flash": (0.375, 1.875, 0.75, 3.75)}
    new |= {"gemini-4-argon": (1, 5, 2, 10)}
    for model, (bi, bo, si, so) in new.items():
        p = table.get(model)
        assert (p.input_per_1m, p.output_per_1m, p.spec.standard_input_per_1m, p.spec.standard_output_per_1m) == (bi, bo, si, so)


def test_shipped_csv_has_exactly_the_documented_columns():
    text = resources.files("batchgrader").joinpath("data/pricing.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(text.splitlines()))
    assert tuple(rows[0]) == COLUMNS
    assert all(len(r) == len(COLUMNS) for r in rows[1:])


# --- arithmetic ---------------------------------------------------------------------------------


def test_exact_figures_for_known_models():
    t = load_pricing()
    mini = t.get("gpt-4o-mini")
    assert estimate(mini, 1_000_000, 0, 0) == Estimate(0.075, 0.0, 0.075)
    # 2,000 requests x 1,000 output tokens = 2M output tokens at $0.30 = $0.60
    e = estimate(mini, 1_000_000, 2_000, 1_000)
    assert (e.input_usd, e.max_output_usd, e.max_total_usd) == (0.075, 0.6, 0.675)
    assert estimate(t.get("gpt-4.1"), 500_000, 1, 1) == Estimate(0.5, 0.000004, 0.500004)
    assert billed_cost(mini, 1_000_000, 0, 1_000_000) == 0.375
    # gpt-5: cached input has its own rate
    g5 = t.get("gpt-5")
    assert billed_cost(g5, 1_000_000, 400_000, 100_000) == 0.6 * 0.625 + 0.4 * 0.0625 + 0.5  # 0.9
    assert billed_cost(g5, 1_000_000, 400_000, 100_000) == 0.9
    # gpt-4o has no cached batch price: cached tokens are billed at the input price
    assert billed_cost(t.get("gpt-4o"), 1_000_000, 1_000_000, 0) == 1.25
    # decimal arithmetic: 3 tokens of gpt-4o-mini is exactly 2.25e-7, not a float-sum artefact
    assert billed_cost(mini, 3, 0, 0) == 2.25e-07
    assert billed_cost(mini, 0, 0, 0) == 0.0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9))
def test_billed_cost_never_exceeds_the_uncached_price_and_is_monotone(prompt, cached, completion):
    cached = min(cached, prompt)
    p = load_pricing().get("gpt-5-mini")
    cost = billed_cost(p, prompt, cached, completion)
    worst = estimate(p, prompt, 1, completion).max_total_usd
    assert 0 <= cost <= worst * (1 + 1e-12)
    assert billed_cost(p, prompt, cached, completion + 1) >= cost


def test_bad_counts_are_rejected():
    p = load_pricing().get("gpt-4o-mini")
    with pytest.raises(ValueError, match="cached_tokens"):
        billed_cost(p, 10, 11, 0)
    with pytest.raises(ValueError, match="prompt_tokens"):
        billed_cost(p, -1, 0, 0)
    with pytest.raises(ValueError, match="requests"):
        estimate(p, 1, -1, 1)


# --- lookups ------------------------------------------------------------------------------------


def test_dated_snapshot_falls_back_to_its_base_model():
    t = load_pricing()
    assert t.get("gpt-4.1-mini-2025-04-14").model == "gpt-4.1-mini"
    assert t.get("gpt-4o-mini-2024-07-18") == t.get("gpt-4o-mini")
    # a listed snapshot keeps its own price
    assert t.get("gpt-4o-2024-05-13").input_per_1m == 2.50
    assert t.get("gpt-4o-2024-08-06").input_per_1m == 1.25
    # case and surrounding spaces do not matter
    assert t.get(" GPT-4o-Mini ").model == "gpt-4o-mini"
    assert "gpt-5-2025-08-07" in t and "nope" not in t


@pytest.mark.parametrize(
    "model",
    ["gpt-4.1-mini-preview", "gpt-4.1-mini-0414", "gpt-4.1-mini-2025-13-45", "gpt-4o-mini-2024-07", "ft:gpt-4o-mini:acme::abc"],
)
def test_only_a_real_date_suffix_falls_back(model):
    with pytest.raises(PricingError):
        load_pricing().get(model)


def test_unknown_model_error_says_how_to_fix_it(home):
    with pytest.raises(PricingError) as exc:
        load_pricing().get("acme-large")
    msg = str(exc.value)
    assert "'acme-large'" in msg and "nothing is submitted" in msg
    assert "pricing.csv" in msg and ",".join(COLUMNS) in msg
    assert "acme-large,0.50" not in msg  # never a made-up price to paste (issue 15)
    # with a user file, the message names that file
    user = write(home.pricing_file, HEADER)
    with pytest.raises(PricingError, match=str(user)):
        load_pricing(user).get("acme-large")
    assert load_pricing(user).find("acme-large") is None


# --- user files ---------------------------------------------------------------------------------


def test_user_file_overrides_and_extends(home):
    user = write(
        home.pricing_file,
        HEADER + "gpt-4o-mini,0.05,0.01,0.20,,2026-10-01,my contract\n" + "acme-large,$1.50,,6,32000,,\n",
    )
    t = load_pricing(user)
    mini = t.get("gpt-4o-mini")
    # a user row replaces the shipped row as a whole
    assert (mini.input_per_1m, mini.cached_input_per_1m, mini.output_per_1m, mini.context_window) == (0.05, 0.01, 0.20, None)
    assert (mini.taken_on, mini.source, mini.origin) == ("2026-10-01", "my contract", str(user))
    assert estimate(mini, 1_000_000, 0, 0).input_usd == 0.05
    acme = t.get("acme-large")
    assert (acme.input_per_1m, acme.output_per_1m, acme.context_window, acme.taken_on, acme.source) == (
        1.5,
        6.0,
        32_000,
        None,
        None,
    )
    assert t.get("acme-large-2026-01-02") == acme
    # untouched shipped rows remain
    assert t.get("gpt-4o").origin == "shipped"
    assert len(t) == len(load_pricing()) + 1


def test_user_file_may_leave_out_optional_columns_and_have_a_bom(home):
    user = home.pricing_file
    user.write_bytes("\ufeffmodel,output_per_1m,input_per_1m\nGPT-4O,4,1\n\n".encode())
    p = load_pricing(user).get("gpt-4o")
    assert (p.model, p.input_per_1m, p.output_per_1m, p.cached_input_per_1m) == ("GPT-4O", 1.0, 4.0, None)


@pytest.mark.parametrize(
    "text, where",
    [
        ("model,input_per_1m\nx,1\n", "line 1 (header): missing column(s) output_per_1m"),
        ("model,input_per_1m,output_per_1m,cached_input\nx,1,2,3\n", "line 1 (header): unknown column(s) 'cached_input'"),
        ("model,input_per_1m,output_per_1m,input_per_1m\nx,1,2,3\n", "appear more than once"),
        ("", "empty file"),
        (HEADER + "gpt-4o,1,,2,,,\nx,abc,,2,,,\n", "line 3, column 'input_per_1m': 'abc' is not a number"),
        (HEADER + "x,1,,-2,,,\n", "line 2, column 'output_per_1m': '-2' must be a finite price >= 0"),
        (HEADER + "x,1,,nan,,,\n", "line 2, column 'output_per_1m': 'nan' must be a finite price"),
        (HEADER + "x,1,oops,2,,,\n", "line 2, column 'cached_input_per_1m': 'oops' is not a number"),
        (HEADER + "x,,,2,,,\n", "line 2, column 'input_per_1m': a price is required"),
        (HEADER + "x,1,,2,big,,\n", "line 2, column 'context_window': 'big' must be a whole number"),
        (HEADER + "x,1,,2,0,,\n", "line 2, column 'context_window': '0' must be a whole number"),
        (HEADER + "x,1,,2,,26/09/2026,\n", "line 2, column 'taken_on': '26/09/2026' must be a date"),
        (HEADER + ",1,,2,,,\n", "line 2, column 'model': the model name is empty"),
        (HEADER + "x,1,,2,,,\nX,1,,2,,,\n", "line 3, column 'model': 'X' is already listed on line 2"),
        (HEADER + "x,1,,2" + "," * (len(COLUMNS) - 3) + "extra\n", f"line 2: more fields than the {len(COLUMNS)} columns"),
        (HEADER + 'x,1,,2,,,"a\nb"\ny,1,,z,,,\n', "line 4, column 'output_per_1m'"),  # physical line numbers
        # dated rows (price_from): after the model's own row, prices only, one per day
        (DATED_HEADER + "x,2,4,2027-01-01\nx,1,2,\n", "line 2, column 'price_from': the prices of 'x' from 2027-01-01 need"),
        (DATED_HEADER + "x,1,2,\nx,2,4,01/01/2027\n", "line 3, column 'price_from': '01/01/2027' must be a date"),
        (
            DATED_HEADER + "x,1,2,\nx,2,4,2027-01-01\nx,3,6,2027-01-01\n",
            "line 4, column 'price_from': 'x' has a row from 2027-01-01 on line 3",
        ),
        (
            "model,input_per_1m,output_per_1m,price_from,max_output\nx,1,2,,\nx,2,4,2027-01-01,100\n",
            "line 3, column 'max_output': a dated row",
        ),
    ],
)
def test_bad_user_file_names_file_line_and_column(home, text, where):
    user = write(home.pricing_file, text)
    with pytest.raises(PricingError) as exc:
        load_pricing(user)
    assert str(exc.value).startswith(str(user))
    assert where in str(exc.value)


def test_user_file_dated_rows_price_a_model_by_the_day(home):
    from batchgrader.pipeline.maintained import USER_SOURCE

    user = write(
        home.pricing_file,
        "model,input_per_1m,cached_input_per_1m,output_per_1m,standard_input_per_1m,taken_on,price_from,provider\n"
        "acme-1,1,0.1,2,2,2026-11-01,,openai\n"
        "acme-1,3,,6,,2026-11-02,2027-03-01,\n"  # empty cells: the fallbacks (cached at input, standard at 2x)
        "acme-1,2,0.2,4,4,2026-11-02,2027-02-01,\n",  # in any order
    )
    table = load_pricing(user)
    for day, want in (
        ("2027-01-31", (1, 0.1, 2, 2, None, "2026-11-01")),
        ("2027-02-01", (2, 0.2, 4, 4, "2027-02-01", "2026-11-02")),
        ("2027-03-01", (3, None, 6, None, "2027-03-01", "2026-11-02")),
    ):
        p = table.on(date.fromisoformat(day)).get("acme-1")
        got = (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m, p.spec.standard_input_per_1m, p.price_from, p.taken_on)
        assert got == want, day
        assert p.spec.provider == "openai" and p.price_source == USER_SOURCE  # the rules are the model's row's
    # a user's dated rows replace the shipped row's periods as a whole, and a shipped model may get some
    write(home.pricing_file, DATED_HEADER + "gemini-4-argon,1.5,7.5,\ngemini-4-argon,1.75,8,2027-01-01\n")
    table = load_pricing(home.pricing_file)
    assert table.on(date(2026, 12, 15)).get("gemini-4-argon").input_per_1m == 1.5  # not the shipped 2026-12-01 price
    assert table.on(date(2027, 1, 1)).get("gemini-4-argon").input_per_1m == 1.75
    assert table.on(date(2027, 1, 1)).get("gemini-4-argon").spec.provider == "gemini"  # the shipped rules stay


def test_missing_or_unreadable_user_file(home):
    with pytest.raises(PricingError, match="not found"):
        load_pricing(home.root / "nope.csv")
    bad = home.root / "latin1.csv"
    bad.write_bytes(HEADER.encode() + b"caf\xe9,1,,2,,,\n")
    with pytest.raises(PricingError, match="not UTF-8"):
        load_pricing(bad)


def test_price_is_immutable():
    p = Price("m", 1.0, None, 2.0)
    with pytest.raises(AttributeError):
        p.input_per_1m = 0  # type: ignore[misc]
    assert p.effective_cached_per_1m == 1.0


def test_cache_writes_cost_one_and_a_quarter_times_the_input_price():
    """Anthropic's 5-minute cache writes (``cache_creation_input_tokens``) are billed at 1.25x
    the input price; cache reads at the cached price; the rest of the prompt at the input price."""
    p = load_pricing().get("claude-sonnet-5-5")  # batch: input 1.00, cached 0.05, output 5.00 per 1M
    # 1,000,000 prompt tokens = 600,000 plain + 300,000 cache reads + 100,000 cache writes
    cost = billed_cost(p, 1_000_000, 300_000, 200_000, cache_write_tokens=100_000)
    assert cost == 1.74  # 0.60 + 0.015 + 0.125 (1.25 x 1.00 x 0.1) + 1.00
    assert billed_cost(p, 1_000_000, 300_000, 200_000) == 1.715  # no writes: 0.70 + 0.015 + 1.00
    with pytest.raises(ValueError, match="cannot exceed"):
        billed_cost(p, 100, 60, 0, cache_write_tokens=50)


def test_anthropic_cache_writes_are_parsed_and_costed_from_the_result_line():
    """An Anthropic result's ``cache_creation_input_tokens`` reach the merged chunk's cost at 1.25x input."""
    from batchgrader.pipeline.results import parse_line
    from batchgrader.provider.anthropic_api import to_openai_result_line

    usage = {"input_tokens": 600, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 100, "output_tokens": 200}
    item = {
        "custom_id": "row-1",
        "result": {
            "type": "succeeded",
            "message": {"id": "msg_1", "model": "claude-sonnet-5-5", "content": [{"type": "text", "text": "B"}], "usage": usage},
        },
    }
    outcome = parse_line(json.loads(json.dumps(to_openai_result_line(item))))
    assert (outcome.prompt_tokens, outcome.cached_tokens, outcome.cache_write_tokens) == (1000, 300, 100)
    records, m = merged(["row-1"], [outcome], "completed")
    assert records[0]["cache_write_tokens"] == 100 and m.cache_write_tokens == 100
    price = load_pricing().get("claude-sonnet-5-5")
    assert m.cost(price) == billed_cost(price, 1000, 300, 200, cache_write_tokens=100)
    assert m.cost(price) == (600 * 1.00 + 300 * 0.05 + 100 * 1.25 + 200 * 5.00) / 1_000_000
