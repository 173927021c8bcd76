"""A file's own repeated rows on every route, tick by tick: only the first of identical rows is
sent; the others are ``answered_by: duplicate`` with 0 tokens, so the result's token columns
sum to what the provider billed (issue 32: on a synchronous route the copies were shown as
answered, and billed, by the route)."""

from __future__ import annotations

import pytest

from batchgrader.cli.render_status import duplicate_rows, reused_rows
from batchgrader.store.readmodels import job_row
from ticks import Rig

TEXTS = ["alpha", "beta", "alpha", "gamma", "beta"]


@pytest.mark.parametrize(
    ("config", "sent_by"),
    [
        ("route: online\nonline_concurrency: 1\n", "online"),
        ("route: flex\nmodel: o4-mini\n", "flex"),
        ("preflight_rows: 3\n", "preflight"),
    ],
)
def test_identical_rows_are_sent_once_and_the_copies_say_duplicate_with_no_tokens(home, config, sent_by):
    rig = Rig(home, config)
    try:
        (rig.home.inbox / "a.csv").write_text("id,response\n" + "".join(f"{i},{t}\n" for i, t in enumerate(TEXTS)))
        for _ in range(30):
            rig.tick()
            rig.provider.finish_all()
            if rig.engine.ctx.state.jobs and rig.job().ended:
                break
        assert rig.job().ended == "completed"
        assert len(rig.provider.billed) == 3  # alpha, beta, gamma
        rows = rig.result_rows()
        assert [r["answered_by"] for r in rows][2] == "duplicate" and rows[4]["answered_by"] == "duplicate"
        assert rows[0]["answered_by"] == sent_by
        assert [r["input_tokens"] for r in rows if r["answered_by"] == "duplicate"] == ["0", "0"]
        assert sum(int(r["input_tokens"]) for r in rows) == 3 * rig.provider.prompt_tokens
        assert sum(int(r["output_tokens"]) for r in rows) == 3 * rig.provider.completion_tokens
        shown = job_row(rig.job())  # bgctl status: the file's repeats are duplicates, not reused answers
        assert (reused_rows(shown), duplicate_rows(shown)) == (0, 2)
    finally:
        rig.close()
