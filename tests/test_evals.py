"""`bgctl evals import`: an eval as the API returns it into profiles, a plan and queued rows;
every bad input refused with its field and fix before anything is written; the local graders."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.home import Home
from batchgrader.evals import importer
from batchgrader.pipeline.evals import graders
from batchgrader.pipeline.evals.results import wilson
from batchgrader.pipeline.evals.spec import EvalInputError, parse_eval

FIX = Path(__file__).parent / "fixtures" / "evals"
EVAL = json.loads((FIX / "ticket_eval.json").read_text())
ITEMS = [json.loads(line) for line in (FIX / "ticket_items.jsonl").read_text().splitlines()]


def write(tmp_path: Path, name: str, obj) -> Path:
    p = tmp_path / name
    if isinstance(obj, list):
        p.write_text("".join(json.dumps(o) + "\n" for o in obj))
    else:
        p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


def do_import(home: Home, tmp_path: Path, ev=EVAL, items=ITEMS, **kw):
    prepared = importer.prepare_import(
        home, write(tmp_path, "eval.json", ev), data_path=write(tmp_path, "items.jsonl", items), **kw
    )
    return prepared, importer.install(home, prepared, lambda: load_config(home))


def snapshot(home: Home) -> dict[str, bytes]:
    """Every file under the home (the event log aside), with its bytes."""
    return {str(p.relative_to(home.root)): p.read_bytes() for p in home.root.rglob("*") if p.is_file()}


def test_import_writes_profile_plan_and_queues_one_request_per_row_and_criterion(home, tmp_path):
    prepared, written = do_import(home, tmp_path)
    assert [load_config(home).profile(p).model for p in written["profiles"]] == ["gpt-5.4-mini"]
    # the label and the score criterion of one model are one job (issue 34: an eval's model criteria, one batch job)
    assert [j.criteria for j in prepared.jobs] == [(3, 4)]
    plan = json.loads((home.root / "evals" / prepared.name / "plan.json").read_text())
    by_name = {c["name"]: c for c in plan["criteria"]}
    assert by_name["Category correct"]["computed"] == "locally, no model call"
    assert by_name["Reply close to reference"]["variant"] == "rouge-score-f"
    assert "midpoint" not in by_name["Helpful"]["pass_rule"] and ">= pass_threshold 5" in by_name["Helpful"]["pass_rule"]
    queued = [Path(p) for p in written["queued"]]
    assert all(p.parent.parent == home.inbox for p in queued)
    rows = [json.loads(line) for p in queued for line in p.read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == sorted(f"i{i}-c{c}" for i in range(4) for c in (3, 4))
    polite = next(r for r in rows if r["id"] == "i3-c3")
    assert "Stop emailing us about this." in polite["prompt"]  # {{sample.output_json.reply}} filled
    assert '"polite", "neutral", "rude"' in polite["prompt"]


def test_each_request_carries_its_criterion_schema_and_the_job_the_union(home, tmp_path):
    prepared, written = do_import(home, tmp_path)
    (job,) = prepared.jobs
    label = {"type": "string", "enum": ["polite", "neutral", "rude"]}
    score = {"type": "number", "minimum": 1.0, "maximum": 7.0}
    # the job's response_format names the result's column: every answer of the job fits it
    assert job.settings["response_format"]["properties"]["result"] == {"anyOf": [label, score]}
    assert job.settings["schema_column"] == "schema" and len(written["queued"]) == 1
    # each row's request carries its own criterion's schema: structured output rules out the other kind
    own = {r["id"]: json.loads(r["schema"])["properties"]["result"] for r in job.rows}
    assert own == {f"i{i}-c{c}": label if c == 3 else score for i in range(4) for c in (3, 4)}
    assert not any("share" in n and "schema" in n for n in prepared.notes)
    # the profile written for the job says so
    (name,) = written["profiles"]
    assert load_config(home).profile(name).get("schema_column") == "schema"
    # each alone: the job's schema is its criterion's
    ev = copy.deepcopy(EVAL)
    ev["testing_criteria"][3]["model"] = "gpt-5.4-nano"  # another model: another batch (one model per batch file)
    prepared, _written = do_import(home, tmp_path, ev, name="other")
    schemas = {j.criteria: j.settings["response_format"]["properties"]["result"] for j in prepared.jobs}
    assert schemas == {(3,): label, (4,): score}


def test_a_label_where_a_score_is_asked_is_invalid_output():
    from batchgrader.pipeline.evals.graders import model_verdict

    polite = _criterion("label_model", labels=["polite", "rude"], passing_labels=["polite"])
    helpful = _criterion("score_model")
    assert model_verdict(helpful, {"result": "polite"}, None).error == "invalid_output"
    assert model_verdict(polite, {"result": 5}, None).error == "invalid_output"


def test_every_model_criterion_of_one_model_shares_one_job(home, tmp_path):
    ev = copy.deepcopy(EVAL)
    second = copy.deepcopy(ev["testing_criteria"][3])
    second.update(name="Accurate", id="Accurate-1", pass_threshold=4)
    ev["testing_criteria"].append(second)
    prepared, written = do_import(home, tmp_path, ev)
    (job,) = prepared.jobs
    assert job.criteria == (3, 4, 5) and len(written["queued"]) == 1
    assert len(job.rows) == 12  # 4 items x 3 criteria, one request each
    assert sorted(r["id"] for r in job.rows) == sorted(f"i{i}-c{c}" for i in range(4) for c in (3, 4, 5))
    # the criteria's system messages differ: each row's message starts with its criterion's instructions
    assert job.settings["system_prompt"] is None and any("different (or templated) system messages" in n for n in prepared.notes)


BAD = {
    "unknown grader type": (
        lambda ev, it: ev["testing_criteria"].append({"type": "endpoint", "name": "x"}),
        "testing_criteria[4] ('x').type",
    ),
    "passing_labels not among labels": (
        lambda ev, it: ev["testing_criteria"][2].update(passing_labels=["polite", "courteous"]),
        "testing_criteria[2] ('Polite').passing_labels",
    ),
    "threshold outside range": (
        lambda ev, it: ev["testing_criteria"][3].update(pass_threshold=9),
        "testing_criteria[3] ('Helpful').pass_threshold",
    ),
    "similarity threshold above 1": (
        lambda ev, it: ev["testing_criteria"][1].update(pass_threshold=40),
        "testing_criteria[1] ('Reply close to reference').pass_threshold",
    ),
    "template variable the items lack": (
        lambda ev, it: (
            it[2]["item"].pop("reference_reply")
            and ev["data_source_config"]["schema"]["properties"]["item"]["required"].remove("reference_reply")
        ),
        "testing_criteria[1] ('Reply close to reference').reference",
    ),
    "items failing item_schema": (lambda ev, it: it[1]["item"].update(category="Printer"), "items"),
    "logs data source": (
        lambda ev, it: ev.update(data_source_config={"type": "logs", "schema": {}, "metadata": {}}),
        "eval.data_source_config.type",
    ),
    "python without opt-in": (
        lambda ev, it: ev["testing_criteria"].append(
            {"type": "python", "name": "py", "source": "def grade(s, i):\n    return 1.0\n"}
        ),
        "testing_criteria[4] ('py').type",
    ),
    "missing required field": (
        lambda ev, it: ev["testing_criteria"][0].pop("operation"),
        "testing_criteria[0] ('Category correct').operation",
    ),
    "bad string_check operation": (
        lambda ev, it: ev["testing_criteria"][0].update(operation="neq"),
        "testing_criteria[0] ('Category correct').operation",
    ),
    "image content": (
        lambda ev, it: ev["testing_criteria"][2]["input"].append(
            {"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}
        ),
        "testing_criteria[2] ('Polite').input[2].content",
    ),
    "unknown namespace": (
        lambda ev, it: ev["testing_criteria"][0].update(input="{{ row.category }}"),
        "testing_criteria[0] ('Category correct').input",
    ),
    "sample missing": (lambda ev, it: it[0].pop("sample"), "testing_criteria[0] ('Category correct').input"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_field_and_fix_and_writes_nothing(home, tmp_path, case):
    ev, items = copy.deepcopy(EVAL), copy.deepcopy(ITEMS)
    change, field = BAD[case]
    change(ev, items)
    home.config_file.write_text("model: gpt-5.4-mini\n")
    before = snapshot(home)
    with pytest.raises(EvalInputError) as err:
        do_import(home, tmp_path, ev, items)
    fields = [p.where for p in err.value.problems]
    assert field in fields, (case, fields)
    assert all(p.fix for p in err.value.problems)
    assert "Fix:" in str(err.value)
    assert snapshot(home) == before


def test_malformed_json_is_refused_with_the_file_named(home, tmp_path):
    with pytest.raises(EvalInputError) as err:
        importer.prepare_import(home, write(tmp_path, "eval.json", '{"object": "eval", "testing_criteria": ['))
    (p,) = err.value.problems
    assert p.where.endswith("eval.json") and "not valid JSON" in p.what


def test_a_run_passed_as_the_eval_says_where_it_goes(tmp_path):
    with pytest.raises(EvalInputError) as err:
        parse_eval({"object": "eval.run", "id": "evalrun_1"})
    assert "--run" in err.value.problems[0].fix


def test_unsupported_fields_are_named_in_the_notes(home, tmp_path):
    ev = copy.deepcopy(EVAL)
    ev["testing_criteria"][3]["sampling_params"] = {"top_p": 0.9, "seed": 7, "temperature": 0.2}
    ev["testing_criteria"][3].pop("pass_threshold")
    ev["testing_criteria"][0]["weight"] = 2
    prepared = importer.prepare_import(home, write(tmp_path, "e.json", ev), data_path=write(tmp_path, "i.jsonl", ITEMS))
    notes = "\n".join(prepared.notes)
    assert "sampling_params.top_p" in notes and "sampling_params.seed" in notes
    assert "testing_criteria[0] ('Category correct').weight is not a field of string_check" in notes
    assert "midpoint" in notes  # the threshold rule used when pass_threshold is absent
    helpful = next(c for c in prepared.spec.criteria if c.name == "Helpful")
    assert helpful.threshold == 4.0
    job = next(j for j in prepared.jobs if 4 in j.criteria)
    assert job.settings["temperature"] == 0.2


def test_a_model_the_catalogue_lacks_leaves_nothing_behind(home, tmp_path):
    ev = copy.deepcopy(EVAL)
    ev["testing_criteria"][2]["model"] = "gpt-nonexistent-9"
    home.config_file.write_text("# mine\nmodel: gpt-5.4-mini\n")
    before = snapshot(home)
    with pytest.raises(EvalInputError) as err:
        do_import(home, tmp_path, ev)
    assert "gpt-nonexistent-9" in str(err.value)
    assert snapshot(home) == before


def test_importing_twice_under_one_name_is_refused(home, tmp_path):
    do_import(home, tmp_path)
    with pytest.raises(EvalInputError) as err:
        do_import(home, tmp_path)
    assert err.value.problems[0].where == "--name"


def test_string_check_operations():
    assert graders.string_check("eq", "Paris", "Paris") == 1.0
    assert graders.string_check("eq", "paris", "Paris") == 0.0
    assert graders.string_check("ne", "paris", "Paris") == 1.0
    assert graders.string_check("like", "It is Paris.", "Paris") == 1.0
    assert graders.string_check("like", "It is paris.", "Paris") == 0.0
    assert graders.string_check("ilike", "It is PARIS.", "paris") == 1.0


def test_similarity_scores_of_the_reference_pair():
    hyp, ref = "A cat was sitting on the mat.", "The cat sat on the mat."
    assert graders.scorer("fuzzy_match")(hyp, ref) == pytest.approx(0.7308, abs=1e-4)
    assert graders.scorer("rouge_1")(hyp, ref) == pytest.approx(0.6154, abs=1e-4)
    assert graders.scorer("rouge_2")(hyp, ref) == pytest.approx(0.3636, abs=1e-4)
    assert graders.scorer("rouge_5")(hyp, ref) == 0.0
    assert 0 < graders.scorer("bleu")(hyp, ref) < 1
    assert 0 < graders.scorer("gleu")(hyp, ref) < 1
    assert graders.scorer("bleu")(ref, ref) == pytest.approx(1.0)
    assert graders.scorer("rouge_l", "rouge-score-r")(hyp, ref) == pytest.approx(4 / 6)


def test_meteor_works_offline_with_wordnet():
    from batchgrader.pipeline.evals.wordnet import WordNetMissing

    try:
        fn = graders.scorer("meteor")
    except WordNetMissing as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))
    # "sitting" and "sat" share a WordNet synset: METEOR counts them, exact-match metrics do not
    assert fn("A cat was sitting on the mat.", "The cat sat on the mat.") == pytest.approx(0.6817, abs=1e-3)


def _criterion(kind: str, **raw):
    base = {"name": "c", "model": "gpt-5.4-mini", "input": [{"role": "user", "content": "x"}], "type": kind}
    return parse_eval(
        {
            "object": "eval",
            "id": "e",
            "name": "e",
            "data_source_config": {"type": "custom", "schema": {}},
            "testing_criteria": [{**base, **raw}],
        }
    ).criteria[0]


def test_model_verdicts_check_labels_and_range():
    label = _criterion("label_model", labels=["yes", "no"], passing_labels=["yes"])
    assert graders.model_verdict(label, {"result": "yes"}, None).passed
    assert not graders.model_verdict(label, {"result": "no"}, None).passed
    assert graders.model_verdict(label, {"result": "maybe"}, None).error == "invalid_output"
    assert graders.model_verdict(label, None, "truncated").error == "truncated"
    score = _criterion("score_model", range=[1, 7], pass_threshold=5)
    assert graders.model_verdict(score, {"result": 5}, None).passed
    assert not graders.model_verdict(score, {"result": 4.9}, None).passed
    out = graders.model_verdict(score, {"result": 8}, None)
    assert out.error == "invalid_output" and not out.passed
    assert graders.model_verdict(score, {"result": True}, None).error == "invalid_output"
    default = _criterion("score_model")
    assert default.threshold == 0.5 and "midpoint" in default.threshold_rule


def test_wilson_interval():
    lo, hi = wilson(3, 4)
    assert (round(lo, 3), round(hi, 3)) == (0.301, 0.954)
    assert wilson(0, 0) is None
    lo, hi = wilson(100, 100)
    assert hi == 1.0 and 0.96 < lo < 0.97


PY_SOURCE = """
import socket, threading

def grade(sample, item):
    if item.get("net"):
        socket.create_connection(("1.1.1.1", 53), timeout=2)
    if item.get("sleep"):
        threading.Event().wait()  # hangs: the time limit must end it
    print("graders may print")
    return 1.0 if sample["output_text"] == item["want"] else 0.25
"""


def test_python_grader_runs_sandboxed_with_opt_in(tmp_path):
    from batchgrader.pipeline.evals.data import Row
    from batchgrader.pipeline.evals.pygrader import grade_rows, unavailable

    if unavailable():
        pytest.skip(unavailable() or "")
    ev = {**EVAL, "testing_criteria": [{"type": "python", "name": "py", "source": PY_SOURCE, "pass_threshold": 0.5}]}
    with pytest.raises(EvalInputError):
        parse_eval(ev)
    (c,) = parse_eval(ev, allow_python=True).criteria
    rows = [
        Row(0, {"want": "a"}, {"output_text": "a"}, "l1"),
        Row(1, {"want": "a", "net": True}, {"output_text": "a"}, "l2"),
        Row(2, {"want": "a", "sleep": True}, {"output_text": "a"}, "l3"),
        Row(3, {"want": "a"}, {"output_text": "b"}, "l4"),
    ]
    v = grade_rows(c, rows, time_limit=3)
    assert (v[0].score, v[0].passed) == (1.0, True)
    assert v[1].error == "python_grader_runtime_error" and "unreachable" in v[1].detail["message"].lower()
    assert v[2].error == "python_grader_timeout"
    assert (v[3].score, v[3].passed) == (0.25, False)  # a fresh child after the timeout
