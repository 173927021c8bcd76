"""Several samples per row (``samples: k``), tick by tick with the in-memory provider: k requests
per row under ids derived from the row's, each sample retried and reused on its own, and the
vote in the result file (majority, median, ties and unanswerable samples fail closed)."""

from __future__ import annotations

import json

import pytest

from batchgrader.cli.render_status import rows_cell
from batchgrader.core.log.state import JobState
from batchgrader.store.readmodels import job_row
from ticks import Rig

TEXTS = ["first essay", "second essay", "third essay", "fourth essay"]
SCORE_SCHEMA = (
    "response_format:\n  type: object\n  properties:\n    reason: {type: string}\n"
    "    score: {type: integer}\n  required: [reason, score]\n  additionalProperties: false\n"
)


def _batch_inputs(rig: Rig) -> list[list[dict]]:
    files = [f for f in rig.provider.files.values() if f.info.purpose == "batch"]
    return [rig.provider.requests_in(f.info.id) for f in files]


def sent(rig: Rig) -> int:
    return sum(b.request_counts.total for b in rig.provider.batches.values())


def test_each_row_is_sent_k_times_under_ids_derived_from_its_own(home):
    rig = Rig(home, "samples: 3\n")
    rig.provider.answer = lambda cid, body: "4"  # samples that agree: each row's vote has a majority
    job = rig.drop(2)
    assert job.rows == 2 and job.requests == 6
    rig.tick()
    (lines,) = _batch_inputs(rig)
    ids = [r["custom_id"] for r in lines]
    row0 = ids[0]
    assert ids[:3] == [row0, f"{row0}-s2", f"{row0}-s3"] and len(ids) == 6
    assert lines[0]["body"] == lines[1]["body"] == lines[2]["body"]  # k identical requests: independent answers
    assert rows_cell(job_row(rig.job())) == "0 ok/2\n6 req"  # bgctl status: rows answered of rows, and the requests (rows x k)
    rig.provider.finish_all()
    for _ in range(5):
        rig.tick()
    assert rows_cell(job_row(rig.job())) == "2 ok/2\n6 req"
    rig.close()


def test_a_failed_sample_is_retried_alone_and_answers_are_reused_per_sample(home):
    rig = Rig(home, "samples: 3\nmax_row_retries: 2\n")
    rig.provider.answer = lambda cid, body: "4"  # samples that agree: each row's vote has a majority
    rig.drop(2)
    rig.tick()
    (lines,) = _batch_inputs(rig)
    failing = lines[4]["custom_id"]  # the second sample of the second row
    rig.provider.row_errors = {failing: ("server_error", "try again")}
    rig.provider.finish_all()
    assert rig.tick()[-1] == "RetryPlanned"
    (retry,) = rig.events("RetryPlanned")
    assert retry["custom_ids"] == [failing] and retry["requests"] == 1
    rig.provider.row_errors = {}
    for _ in range(10):
        rig.tick()
        rig.provider.finish_all()
        if rig.job().ended:
            break
    job = rig.job()
    assert job.ended == "completed" and job.succeeded_rows == 6 and not job.failed_rows
    assert sent(rig) == 7  # 6 samples, one of them twice
    # the same rows again: every sample has a stored answer of its own, nothing is sent
    second = rig.run_file("b.csv", [f"review {i}" for i in range(2)])
    assert second.cached_rows == 6 and second.requests == 0 and sent(rig) == 7
    rig.close()


def test_more_samples_later_send_only_the_new_ones(home):
    rig = Rig(home, "samples: 2\n")
    rig.run_file("a.csv", TEXTS)
    assert sent(rig) == 8
    rig.reconfigure("samples: 3\n")
    job = rig.run_file("b.csv", TEXTS)
    assert job.cached_rows == 8 and job.requests == 4 and sent(rig) == 12
    rig.close()


def _scores(per_sample: dict[str, object]):
    """An answer function: the score of each custom id (a missing one answers 3)."""

    def answer(cid: str, body) -> str:
        s = per_sample.get(cid, 3)
        return s if isinstance(s, str) else json.dumps({"reason": f"because {cid}", "score": s})

    return answer


def test_the_result_holds_the_vote_and_ties_fail_closed(home):
    rig = Rig(home, "samples: 3\nmax_row_retries: 0\n" + SCORE_SCHEMA)
    job = rig.drop(4)
    row = [f"bg-{job.sha256[:16]}-{n}" for n in range(1, 5)]
    rig.provider.answer = _scores(
        {
            row[0]: 4,
            f"{row[0]}-s2": 5,
            f"{row[0]}-s3": 4,  # majority 4 (2 of 3)
            row[1]: 1,
            f"{row[1]}-s2": 5,
            f"{row[1]}-s3": 2,  # median 2
            row[2]: "not json",
            f"{row[2]}-s2": 2,  # one sample unparseable: 2 against 3, a tie
            row[3]: "not json",
            f"{row[3]}-s2": 5,
            f"{row[3]}-s3": 5,  # one sample unparseable: 5 by the two valid
        }
    )
    for _ in range(10):
        rig.tick()
        rig.provider.finish_all()
        if rig.job().ended:
            break
    out = rig.result_rows()
    assert [r["score"] for r in out] == ["4", "2", "", "5"]
    assert [json.loads(r["samples"]) for r in out] == [[4, 5, 4], [1, 5, 2], [None, 2, 3], [None, 5, 5]]
    assert [r["sample_agreement"] for r in out] == ["0.6667", "0.3333", "", "0.6667"]
    assert [r["samples_valid"] for r in out] == ["3", "3", "2", "2"]
    assert out[2]["error"].startswith("no_majority: the samples tie (2 of 3 valid: 2, 3)")
    assert json.loads(out[0]["grade"])["reason"] == f"because {row[0]}"  # the first sample with the vote
    assert out[3]["error"] == ""
    billed = sum(int(r["input_tokens"] or 0) for r in out)
    assert billed == rig.job().prompt_tokens  # every sample's tokens, the failed vote's too
    rig.close()
