"""A learned schema overhead below 0 (the provider billed fewer prompt tokens than the offline
count, an estimate for Gemini or Anthropic) made the next job's estimate negative: its prepare
raised at every tick ("input_tokens must be an integer >= 0") until the job was held.  Found by
the combination matrix with a settings edit; the overhead now adds nothing below 0."""

from __future__ import annotations

from batchgrader.pipeline.requests import schema_info

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "grade",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "integer"}},
            "required": ["score"],
            "additionalProperties": False,
        },
    },
}


def test_a_negative_learned_overhead_adds_nothing_and_a_positive_one_is_kept() -> None:
    assert schema_info(SCHEMA, "o200k_base", -12.5)["per_request"] == 0.0
    assert schema_info(SCHEMA, "o200k_base", 7.0)["per_request"] == 7.0
    assert schema_info(SCHEMA, "o200k_base", -12.5)["source"] == "calibrated"


def test_a_job_after_a_negative_lesson_is_prepared(home) -> None:
    from ticks import Rig

    rig = Rig(
        home,
        "provider: gemini\nmodel: gemini-2.5-flash\nresponse_format:\n  type: object\n"
        "  properties:\n    score: {type: integer}\n  required: [score]\n  additionalProperties: false\n",
    )
    try:
        rig.provider.prompt_tokens = 1  # billed far below the offline count: a negative overhead
        rig.provider.answer = lambda cid, body: '{"score": 3}'
        rig.drop(3, name="a.csv", text="a long review " * 60)  # the lesson: about -180 tokens a request
        for _ in range(6):
            rig.tick()
            rig.provider.finish_all()
        (first,) = rig.engine.ctx.state.jobs.values()
        assert first.ended == "completed" and rig.events("SchemaOverheadLearned")[0]["per_request"] < 0
        rig.engine.scan_requested = True  # as the inbox watcher does
        (rig.home.inbox / "b.csv").write_text("id,response\n" + "".join(f"{i},short {i}\n" for i in range(3)))
        for _ in range(6):
            rig.tick()
            rig.provider.finish_all()
        (second,) = [j for j in rig.engine.ctx.state.jobs.values() if j.file == "b.csv"]
        assert second.ended == "completed" and not second.held
    finally:
        rig.close()
