"""The panel example of docs/howto-agreement.md loads and runs (issue 32 item 4): its exact YAML
block, through the tick rig with the in-memory provider; and a panel whose judges lack what it
needs is refused with a message naming the key and the fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.reports.report import build_report
from test_docs import fenced_blocks
from ticks import Rig, config_text

HOWTO = Path(__file__).resolve().parent.parent / "docs" / "howto-agreement.md"


def panel_example() -> str:
    section = HOWTO.read_text(encoding="utf-8").split("### Compare two prompts or models with a panel", 1)[1]
    (block,) = [b for b in fenced_blocks(section) if "judges:" in b]
    return block


def test_the_howto_panel_example_loads_and_runs(home):
    rig = Rig(home, panel_example())
    scores = {"gpt-4.1-nano": [4, 2, 5, 1], "claude-haiku-4-5": [4, 2, 5, 2]}

    def answer(cid: str, body) -> str:
        row = int(cid.rsplit("-", 1)[1]) - 1
        return json.dumps({"reason": "because", "score": scores[body["model"]][row]})

    rig.provider.answer = answer
    (rig.home.inbox / "panel").mkdir(exist_ok=True)
    (rig.home.inbox / "panel" / "sample.csv").write_text(
        "id,question,response,human\n" + "".join(f"{i},q{i},r {i},{[4, 2, 5, 2][i]}\n" for i in range(4))
    )
    for _ in range(40):
        rig.tick()
        rig.provider.finish_all()
        panels = [j for j in rig.engine.ctx.state.jobs.values() if j.panel is not None]
        if panels and panels[0].ended:
            break
    (job,) = panels
    assert job.ended == "completed_with_errors" and job.result_counts == (3, 1)  # the judges tie on the last row
    report = build_report(list(rig.store.read(job_id=job.job_id)))
    assert set(report["agreement"]["per_judge"]) == {"mini", "haiku"}
    assert report["agreement"]["per_judge"]["haiku"]["accuracy"] == pytest.approx(1.0)
    rig.close()


def test_a_panel_whose_judges_lack_the_reference_field_names_the_key_and_the_fix(home):
    example = panel_example()
    without = re.sub(r"^response_format:\n(  .*\n)+", "", example, flags=re.M)  # no schema anywhere
    assert "response_format" not in without
    home.config_file.write_text(config_text(without))
    with pytest.raises(ConfigError) as err:
        load_config(home, environ={})
    text = str(err.value)
    assert "profiles.panel: key 'reference_field' is 'score', which is not a field of judge 'mini''s schema" in text
    assert "give every judge a response_format with that field" in text


def test_a_panel_takes_its_judges_shared_schema(home):
    example = panel_example()
    schema = re.search(r"^response_format:\n((  .*\n)+)", example, flags=re.M)
    assert schema
    indented = "".join("    " + line + "\n" for line in ("response_format:\n" + schema.group(1)).splitlines())
    per_judge = re.sub(r"^response_format:\n(  .*\n)+", "", example, flags=re.M)
    per_judge = per_judge.replace("    model: gpt-4.1-nano\n", "    model: gpt-4.1-nano\n" + indented)
    per_judge = per_judge.replace("    model: claude-haiku-4-5\n", "    model: claude-haiku-4-5\n" + indented)
    home.config_file.write_text(config_text(per_judge))
    config = load_config(home, environ={})  # was: exit 78, the panel has no response_format of its own
    panel = config.profile("panel")
    assert panel.response_format == config.profile("mini").response_format and panel.sources["response_format"] == "judges"
