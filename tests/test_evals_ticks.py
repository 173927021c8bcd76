"""An imported eval run to its end through the engine (in-memory provider, fake clock), then its
results written as OpenAI's API gave them: run.json and output items parsed by openai-python's
own types, the item rule (criteria AND-ed), invalid answers, and the comparison with OpenAI's
exported output items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai.types.evals.run_retrieve_response import RunRetrieveResponse
from openai.types.evals.runs.output_item_retrieve_response import OutputItemRetrieveResponse

from batchgrader.core.configuration.config import load_config
from batchgrader.evals import importer, results
from batchgrader.pipeline.pricing import load_pricing
from ticks import Rig

FIX = Path(__file__).parent / "fixtures" / "evals"
# what the grader model answers per (item, criterion): the labels and scores OpenAI's run gave
POLITE = ["polite", "neutral", "polite", "rude"]
HELPFUL = [6, 2, 6, 4]


def answers(polite=POLITE, helpful=HELPFUL):
    def answer(cid: str, body) -> str:
        base = cid.split("-s")[0]
        item, crit = base[1:].split("-c")
        value = polite[int(item)] if crit == "3" else helpful[int(item)]
        return json.dumps({"result": value})

    return answer


def run_eval(home, *, output_items: bool = True, answer=None, samples=None, name="tickets") -> dict:
    rig = Rig(home)
    try:
        prepared = importer.prepare_import(
            home,
            FIX / "ticket_eval.json",
            data_path=FIX / "ticket_items.jsonl",
            output_items_path=FIX / "ticket_output_items.jsonl" if output_items else None,
            name=name,
            samples=samples,
        )
        written = importer.install(home, prepared, lambda: load_config(home, environ={}))
        rig.engine.reload(load_config(home, environ={}), load_pricing())
        rig.provider.answer = answer or answers()
        with pytest.raises(results.NotReady):
            results.finish(home, name)
        for _ in range(60):
            rig.tick()
            rig.provider.finish_all()
            ended = [j for j in rig.engine.ctx.state.jobs.values() if j.ended]
            if len(ended) == len(written["queued"]):
                break
        return results.finish(home, name, now=1_762_400_000)
    finally:
        rig.close()


def test_results_match_openai_run_and_parse_as_its_types(home):
    rep = run_eval(home)
    run = json.loads(Path(rep["paths"]["run"]).read_text())
    RunRetrieveResponse.model_validate(run)
    items = [json.loads(line) for line in Path(rep["paths"]["output_items"]).read_text().splitlines()]
    for it in items:
        OutputItemRetrieveResponse.model_validate(it)
    openai_run = json.loads((FIX / "ticket_run.json").read_text())
    assert run["result_counts"] == openai_run["result_counts"] == {"total": 4, "errored": 0, "failed": 2, "passed": 2}
    assert run["per_testing_criteria_results"] == openai_run["per_testing_criteria_results"]
    assert [it["status"] for it in items] == ["pass", "fail", "pass", "fail"]
    (usage,) = run["per_model_usage"]
    assert usage["model_name"] == "gpt-5.4-mini" and usage["invocation_count"] == 8 and usage["prompt_tokens"] > 0
    # every criterion agrees with OpenAI's verdicts item by item
    assert {
        c["criterion"]: (c["compared"], c["agreement"], c["flips_to_pass"] + c["flips_to_fail"]) for c in rep["comparison"]
    } == {
        "Category correct": (4, 1.0, 0),
        "Reply close to reference": (4, 1.0, 0),
        "Polite": (4, 1.0, 0),
        "Helpful": (4, 1.0, 0),
    }
    # OpenAI's ROUGE-L scores were stemmed: the search finds the variant that reproduces them
    search = rep["variant_search"]["Reply close to reference"]
    assert search["chosen"] == "rouge-score-f-stem" and search["variants"][0]["max_abs_diff"] < 1e-6
    by_name = {c["name"]: c for c in rep["criteria"]}
    assert by_name["Helpful"]["passed"] == 2 and by_name["Helpful"]["failed"] == 2
    lo, hi = by_name["Polite"]["ci95"]
    assert lo < 0.75 < hi
    assert rep["cost_by_model"][0]["model"] == "gpt-5.4-mini" and rep["cost_usd"] > 0


def test_an_answer_outside_the_range_is_invalid_output_and_the_item_errors(home):
    rep = run_eval(home, output_items=False, answer=answers(polite=["polite"] * 4, helpful=[6, 6, 9, 6]))
    by_name = {c["name"]: c for c in rep["criteria"]}
    assert by_name["Helpful"]["errors"] == {"invalid_output": 1}
    items = [json.loads(line) for line in Path(rep["paths"]["output_items"]).read_text().splitlines()]
    # item 2 passed every other criterion: no verdict on one makes it errored, not passed
    assert items[2]["status"] == "error"
    assert items[1]["status"] == "fail"  # a failed criterion decides, whatever else
    assert rep["result_counts"] == {"total": 4, "errored": 1, "failed": 1, "passed": 2}
    assert "variant_search" not in rep and "approximate" in by_name["Reply close to reference"]["variant_basis"]


def test_samples_are_asked_per_row_and_criterion_and_voted(home):
    calls: list[str] = []
    base = answers()

    def answer(cid, body):
        calls.append(cid)
        return base(cid, body)

    rep = run_eval(home, output_items=False, answer=answer, samples=3)
    assert sorted({c.split("-s")[0] for c in calls}) == sorted(f"i{i}-c{c}" for i in range(4) for c in (3, 4))
    assert len(calls) == 24
    assert rep["result_counts"]["passed"] == 2
