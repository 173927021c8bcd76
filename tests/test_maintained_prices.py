"""Prices from genai-prices between our releases (pipeline/maintained.py): the override order
(genai-prices < shipped rule columns < the user's pricing.csv), a model it lacks, each figure's
source, `bgctl models --check`, the declared deliberate differences, and no network."""

from __future__ import annotations

import datetime
import json
import socket
from pathlib import Path

import pytest

from batchgrader.core.host.home import Home
from batchgrader.pipeline import maintained, pricing
from batchgrader.pipeline.maintained import (
    DELIBERATE_DIFFERENCES,
    SHIPPED_SOURCE,
    USER_SOURCE,
    Deliberate,
    differences,
    doc_table,
    genai_prices_source,
    maintained_prices,
)
from batchgrader.pipeline.pricing import load_pricing, shipped_prices

#: the day the shipped catalogue was last compared with genai-prices (its dated prices change later:
#: gemini-4-argon on 2026-12-01, gemini-3.6/3.7/3.8-flash on 2027-01-01)
CHECKED = datetime.date(2026, 11, 29)
GP = genai_prices_source()
ROOT = Path(__file__).parent.parent


def fake_gp(monkeypatch: pytest.MonkeyPatch, figures: dict[str, dict[str, float | None] | None]) -> None:
    """genai-prices as ``figures`` by model (a model left out: genai-prices lacks it)."""
    monkeypatch.setattr(pricing, "maintained_prices", lambda provider, model, day: figures.get(model))


def test_override_order_genai_prices_then_rule_columns_then_the_users_file(monkeypatch, home: Home):
    fake_gp(
        monkeypatch,
        {
            "gpt-5-mini": {"input_per_1m": 0.3, "cached_input_per_1m": 0.03, "output_per_1m": 2.4, "standard_input_per_1m": 0.6},
            "claude-haiku-4-5": {"input_per_1m": 0.7, "output_per_1m": 3.5, "cache_write_per_1m": 0.9},
        },
    )
    shipped = shipped_prices()
    table = load_pricing(day=CHECKED)
    mini = table.get("gpt-5-mini")
    # prices from genai-prices ...
    assert (mini.input_per_1m, mini.cached_input_per_1m, mini.output_per_1m, mini.spec.standard_input_per_1m) == (
        0.3,
        0.03,
        2.4,
        0.6,
    )
    # ... a figure it does not give stays the shipped row's ...
    assert mini.spec.standard_output_per_1m == shipped["gpt-5-mini"].spec.standard_output_per_1m
    # ... and the rule columns are the shipped row's
    assert (
        mini.spec.reasoning == shipped["gpt-5-mini"].spec.reasoning
        and mini.spec.max_output == shipped["gpt-5-mini"].spec.max_output
    )
    assert mini.spec.temperature == shipped["gpt-5-mini"].spec.temperature and mini.origin == "shipped"
    src = dict(mini.sources)
    assert src["input_per_1m"] == src["cached_input_per_1m"] == src["standard_input_per_1m"] == GP
    assert src["standard_output_per_1m"] == SHIPPED_SOURCE and mini.price_source == f"{GP} + {SHIPPED_SOURCE}"

    # the user's row replaces both; a price column its header leaves out keeps the row below it
    home.pricing_file.write_text(
        "model,input_per_1m,output_per_1m,reasoning_default\ngpt-5-mini,0.5,4,low\nclaude-haiku-4-5,0.4,2\n", encoding="utf-8"
    )
    table = load_pricing(home.pricing_file, day=CHECKED)
    mini = table.get("gpt-5-mini")
    assert (mini.input_per_1m, mini.output_per_1m, mini.spec.reasoning_default) == (0.5, 4.0, "low")
    src = dict(mini.sources)
    assert src["input_per_1m"] == src["output_per_1m"] == USER_SOURCE
    assert src["standard_input_per_1m"] == GP and mini.spec.standard_input_per_1m == 0.6
    haiku = table.get("claude-haiku-4-5")
    assert (haiku.input_per_1m, haiku.spec.cache_write_per_1m) == (0.4, 0.9)
    assert dict(haiku.sources)["cache_write_per_1m"] == GP and dict(haiku.sources)["input_per_1m"] == USER_SOURCE
    assert haiku.price_source == f"{USER_SOURCE} + {SHIPPED_SOURCE} + {GP}"  # each source once, in field order


def test_a_model_genai_prices_lacks_keeps_the_shipped_prices(monkeypatch, home: Home):
    fake_gp(monkeypatch, {})
    shipped = shipped_prices()["gpt-5-mini"]
    p = load_pricing(day=CHECKED).get("gpt-5-mini")
    assert (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m) == (
        shipped.input_per_1m,
        shipped.cached_input_per_1m,
        shipped.output_per_1m,
    )
    assert p.price_source == SHIPPED_SOURCE and {s for _, s in p.sources} == {SHIPPED_SOURCE}
    # a model only the user's file has is the user's, whatever genai-prices knows
    home.pricing_file.write_text("model,input_per_1m,output_per_1m,provider\nacme-1,1,2,openai\n", encoding="utf-8")
    assert load_pricing(home.pricing_file, day=CHECKED).get("acme-1").price_source == USER_SOURCE


def test_real_lookups_map_provider_and_model_and_batch_rule():
    # Anthropic: the batch variant, with a cache-write price
    haiku = maintained_prices("anthropic", "claude-haiku-4-5", CHECKED)
    assert haiku is not None and haiku["input_per_1m"] == 0.5 and haiku["cache_write_per_1m"] == 0.625
    # an Azure deployment's model is priced as OpenAI's
    assert maintained_prices("azure", "gpt-5.4-mini", CHECKED) == maintained_prices("openai", "gpt-5.4-mini", CHECKED)
    # no batch variant (gemini-3.7-flash): 50% of standard, a Batch cache hit at Gemini's standard caching rate
    g = maintained_prices("gemini", "gemini-3.7-flash", CHECKED)
    assert g is not None and (g["input_per_1m"], g["output_per_1m"], g["cached_input_per_1m"]) == (0.375, 1.875, 0.075)
    # a dated price: genai-prices knows gemini-4-argon's introductory rate ends on 2026-11-30
    before = maintained_prices("gemini", "gemini-4-argon", CHECKED)
    after = maintained_prices("gemini", "gemini-4-argon", datetime.date(2026, 12, 1))
    assert before and after and (before["input_per_1m"], after["input_per_1m"]) == (1.0, 2.0)
    # unknown provider or model: None
    assert (
        maintained_prices("acme", "gpt-4o", CHECKED) is None and maintained_prices("openai", "no-such-model-x", CHECKED) is None
    )


def test_every_shipped_row_is_in_genai_prices_and_no_difference_is_undeclared():
    shipped = shipped_prices()
    assert all(maintained_prices(p.spec.provider or "", p.model, CHECKED) is not None for p in shipped.values())
    diffs = differences(shipped, CHECKED)
    undeclared = [(d.model, d.field, d.ours, d.theirs) for d in diffs if d.deliberate is None]
    assert not undeclared, f"declare these in DELIBERATE_DIFFERENCES (with the first-party source) or fix the rows: {undeclared}"
    # and every declared difference is still one (a stale entry would hide a later change)
    assert {(d.model, d.field) for d in diffs} == set(DELIBERATE_DIFFERENCES)
    for d in DELIBERATE_DIFFERENCES.values():
        assert d.source_url.startswith("https://") and datetime.date.fromisoformat(d.checked_on) and d.why


def test_a_deliberate_difference_keeps_the_shipped_figure_at_run_time():
    p = load_pricing(day=CHECKED).get("gpt-4.1")
    assert p.cached_input_per_1m is None and p.effective_cached_per_1m == p.input_per_1m  # ours: the upper bound
    assert dict(p.sources)["cached_input_per_1m"] == SHIPPED_SOURCE and dict(p.sources)["input_per_1m"] == GP


def test_a_declared_entry_about_other_figures_does_not_cover_a_new_difference(monkeypatch):
    key = ("gpt-4.1", "cached_input_per_1m")
    old = DELIBERATE_DIFFERENCES[key]
    monkeypatch.setitem(DELIBERATE_DIFFERENCES, key, Deliberate(old.ours, 0.4, old.source_url, old.checked_on, old.why))
    diffs = {(d.model, d.field): d for d in differences(shipped_prices(), CHECKED)}
    assert diffs[key].deliberate is None


def test_models_check_lists_differences_and_its_exit_code(monkeypatch, home: Home):
    from cli_fixtures import run

    env = {"BGCTL_NOW": f"{CHECKED}T12:00:00+00:00"}
    ok = run("models", "--check", columns=120, env=env)
    assert ok.exit_code == 0, ok.output
    assert "gpt-4.1-mini" in ok.output and "0 not declared deliberate" in " ".join(ok.output.split())
    data = json.loads(run("models", "--check", "--json", env=env).output)
    assert data["undeclared"] == 0 and data["genai_prices"] == maintained.genai_prices_version()
    assert {"model": "o3", "field": "cached_input_per_1m", "ours": 1.0, "theirs": 0.5, "day": str(CHECKED)} == {
        k: v for k, v in next(d for d in data["differences"] if d["model"] == "o3").items() if k != "deliberate"
    }
    # compared today and on each later day a dated price changes
    assert data["days"] == [str(CHECKED), "2026-12-01", "2027-01-01"]

    monkeypatch.delitem(DELIBERATE_DIFFERENCES, ("o3", "cached_input_per_1m"))
    bad = run("models", "--check", columns=120, env=env)
    assert bad.exit_code == 1
    line = next(ln for ln in bad.output.splitlines() if "│ o3 " in ln)
    assert "cached_input_per_1m" in line and "│ 1 " in line and "0.5" in line and "NO" in line
    assert "1 not declared deliberate" in " ".join(bad.output.split())


#: the dated prices of the shipped catalogue: model -> (first day, Batch in/cached/out and standard in/out before, from)
DATED = {
    "gemini-4-argon": ("2026-12-01", (1, 0.05, 5, 2, 10), (2, 0.1, 10, 4, 20)),
    "gemini-3.6-flash": ("2027-01-01", (0.375, 0.0375, 1.875, 0.75, 3.75), (0.75, 0.075, 3.75, 1.5, 7.5)),
    "gemini-3.7-flash": ("2027-01-01", (0.375, 0.075, 1.875, 0.75, 3.75), (0.75, 0.15, 3.75, 1.5, 7.5)),
    "gemini-3.8-flash": ("2027-01-01", (0.375, 0.0375, 1.875, 0.75, 3.75), (0.75, 0.075, 3.75, 1.5, 7.5)),
}


def _figures(p: pricing.Price) -> tuple[float | None, ...]:
    return (p.input_per_1m, p.cached_input_per_1m, p.output_per_1m, p.spec.standard_input_per_1m, p.spec.standard_output_per_1m)


@pytest.mark.parametrize("model", sorted(DATED))
@pytest.mark.parametrize("maintained_too", [True, False], ids=["with-genai-prices", "shipped-rows-alone"])
def test_dated_prices_apply_on_each_side_of_the_change(model, maintained_too):
    start, before, after = DATED[model]
    first = datetime.date.fromisoformat(start)
    eve = first - datetime.timedelta(days=1)
    table = load_pricing(maintained=maintained_too)  # resolved per lookup day; pinned with .on(day)
    for day, want in ((CHECKED, before), (eve, before), (first, after), (first + datetime.timedelta(days=40), after)):
        p = table.on(day).get(model)
        assert _figures(p) == want, (day, p)
        assert p.price_from == (start if want is after else None)
        assert load_pricing(day=day, maintained=maintained_too).get(model) == p  # the same as a table loaded on that day
    # a job is billed by the prices in force: 1M input and 1M output tokens cost twice as much from the change
    usage = (1_000_000, 0, 1_000_000)
    cost_before = pricing.billed_cost(table.on(eve).get(model), *usage)
    assert pricing.billed_cost(table.on(first).get(model), *usage) == pytest.approx(2 * cost_before)
    assert [d.isoformat() for d in table.on(eve).get(model).changes_after(eve)] == [start]
    assert table.on(first).get(model).changes_after(first) == []


@pytest.mark.parametrize("day", ["2026-11-30", "2026-12-01", "2026-12-31", "2027-01-01", "2027-06-01"])
def test_models_check_stays_right_across_the_dated_changes(home: Home, day: str):
    from cli_fixtures import run

    result = run("models", "--check", "--json", env={"BGCTL_NOW": f"{day}T00:00:00+00:00"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["undeclared"] == 0
    rows = {
        r["model"]: r for r in json.loads(run("models", "--json", env={"BGCTL_NOW": f"{day}T12:00:00+00:00"}).output)["models"]
    }
    for model, (start, before, after) in DATED.items():
        assert rows[model]["batch"]["input_per_1m"] == (after if day >= start else before)[0]
        assert rows[model]["price_from"] == (start if day >= start else None)
        assert rows[model]["price_changes"] == ([] if day >= start else [start])


def test_the_check_finds_a_dated_change_the_rows_lack():
    """A row without the dated price genai-prices knows is listed today, with the day it starts to differ."""
    import dataclasses

    shipped = shipped_prices()
    shipped["gemini-4-argon"] = dataclasses.replace(shipped["gemini-4-argon"], periods=())
    assert differences(shipped, CHECKED) == [d for d in differences(shipped_prices(), CHECKED)]  # equal today
    later = [d for d in maintained.differences_from(shipped, CHECKED) if d.model == "gemini-4-argon"]
    assert {(d.field, d.ours, d.theirs, d.day) for d in later} >= {
        ("input_per_1m", 1.0, 2.0, "2026-12-01"),
        ("output_per_1m", 5.0, 10.0, "2026-12-01"),
        ("standard_input_per_1m", 2.0, 4.0, "2026-12-01"),
    }
    assert all(d.deliberate is None for d in later)
    assert maintained.change_days(shipped, CHECKED) == [datetime.date(2026, 12, 1), datetime.date(2027, 1, 1)]
    assert maintained.change_days(shipped, datetime.date(2027, 1, 1)) == []


def test_models_shows_each_rows_price_source(home: Home):
    from cli_fixtures import run

    home.pricing_file.write_text("model,input_per_1m,output_per_1m,provider\nacme-1,1,2,openai\n", encoding="utf-8")
    rows = {r["model"]: r for r in json.loads(run("models", "--json").output)["models"]}
    assert rows["claude-haiku-4-5"]["price_source"] == GP
    assert rows["gpt-4.1"]["price_source"] == f"{GP} + {SHIPPED_SOURCE}"
    assert rows["gpt-4.1"]["price_sources"]["cached_input_per_1m"] == SHIPPED_SOURCE
    assert rows["acme-1"]["price_source"] == USER_SOURCE
    text = run("models", "--provider", "openai", columns=120).output
    assert "gpt-4.1 °" in text and "gpt-4o " in text and "gpt-4o °" not in text
    assert f"Prices from {GP} unless marked: ° from the shipped row" in " ".join(text.split())


def test_no_network_and_no_custom_snapshot(monkeypatch):
    """Only the bundled data is read: a snapshot set by genai-prices' updater is ignored, and no socket is opened."""
    from genai_prices import data_snapshot

    def no_network(*args, **kwargs):
        raise AssertionError("genai-prices tried the network")

    maintained._model.cache_clear()
    maintained.maintained_prices.cache_clear()
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(data_snapshot, "_custom_snapshot", data_snapshot.DataSnapshot(providers=[], from_auto_update=True))
    try:
        assert load_pricing(day=CHECKED).get("claude-haiku-4-5").price_source == GP
    finally:
        maintained._model.cache_clear()
        maintained.maintained_prices.cache_clear()


def test_the_deliberate_differences_table_is_in_the_docs():
    assert doc_table() in (ROOT / "docs" / "providers.md").read_text(encoding="utf-8")
