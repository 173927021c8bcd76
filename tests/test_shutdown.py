"""Model shutdown dates (the catalogue's ``shutdown`` and ``successor`` columns): a profile on a
model past its date does not load (nothing is sent), and doctor, count and status warn in the 30
days before, naming the replacement."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

from batchgrader.core.configuration.config import ConfigError, load_config
from batchgrader.core.host.home import Home
from batchgrader.pipeline.catalogue import load_checked, shutdown_warnings
from batchgrader.pipeline.pricing import PricingError, load_pricing

D = datetime.date


def test_the_catalogue_holds_openais_shutdown_dates() -> None:
    t = load_pricing()
    for model in ("gpt-5", "gpt-5-mini", "gpt-5-nano", "o3"):
        assert t.get(model).spec.shutdown == "2026-12-11", model
    for model in ("gpt-4o", "gpt-4o-mini", "gpt-4.1", "gpt-4.1-mini"):
        assert (t.get(model).spec.shutdown, t.get(model).spec.successor) == ("2027-01-14", "gpt-6-luna"), model
    assert t.get("gpt-5.1").spec.shutdown is None


def test_a_model_past_its_shutdown_does_not_load(home: Home) -> None:
    home.config_file.write_text("model: gpt-4o\nprofiles:\n  new:\n    model: gpt-6-luna\n", encoding="utf-8")
    config = load_config(home, environ={})
    with pytest.raises(ConfigError) as exc:
        load_checked(config, today=D(2027, 1, 14))
    msg = str(exc.value)
    assert msg.startswith("the default profile: key 'model' is 'gpt-4o', which openai shut down on 2027-01-14")
    assert "nothing is sent" in msg and "set 'model' to 'gpt-6-luna'" in msg
    load_checked(config, today=D(2027, 1, 13))  # the day before it still loads
    home.config_file.write_text("model: gpt-5\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="a current model"):  # no replacement named: `bgctl models`
        load_checked(load_config(home, environ={}), today=D(2026, 12, 11))


def test_warnings_in_the_30_days_before(home: Home) -> None:
    home.config_file.write_text("model: gpt-4.1-mini\nprofiles:\n  fast:\n    model: gpt-5-nano\n", encoding="utf-8")
    config, table = load_checked(load_config(home, environ={}), today=D(2026, 11, 28))
    [w] = shutdown_warnings(config, table, D(2026, 11, 28))
    assert w.startswith("profile 'fast': model 'gpt-5-nano' shuts down on 2026-12-11 (13 days)")
    both = shutdown_warnings(config, table, D(2026, 12, 15))
    assert len(both) == 1 and "gpt-4.1-mini' shuts down on 2027-01-14 (30 days)" in both[0] and "'gpt-6-luna'" in both[0]
    assert shutdown_warnings(config, table, D(2026, 11, 10)) == []  # 31 days before: not yet


def test_an_azure_deployment_is_not_held_to_openais_date(home: Home) -> None:
    home.config_file.write_text("provider: azure\nmodel: grader\nazure_model: gpt-4o\n", encoding="utf-8")
    config, table = load_checked(
        load_config(home, environ={"AZURE_OPENAI_ENDPOINT": "https://x.openai.azure.com"}), today=D(2027, 2, 1)
    )
    assert shutdown_warnings(config, table, D(2027, 1, 1)) == []


def test_a_users_row_may_set_a_date_and_a_bad_one_is_named(home: Home) -> None:
    home.pricing_file.write_text(
        "model,input_per_1m,output_per_1m,provider,shutdown,successor\nacme-1,1,2,openai,2027-03-01,acme-2\n", encoding="utf-8"
    )
    assert load_pricing(home.pricing_file).get("acme-1").spec.successor == "acme-2"
    home.pricing_file.write_text("model,input_per_1m,output_per_1m,shutdown\nacme-1,1,2,March 1\n", encoding="utf-8")
    with pytest.raises(PricingError, match="line 2, column 'shutdown': 'March 1' must be a date YYYY-MM-DD"):
        load_pricing(home.pricing_file)


def test_count_status_and_doctor_warn_and_count_refuses_after(home: Home, tmp_path: Path) -> None:
    from batchgrader.ops.doctor import WARN, run_checks
    from cli_fixtures import run  # BGCTL_NOW: 2026-11-21

    data = tmp_path / "a.csv"
    data.write_text("id,response\n1,fine\n", encoding="utf-8")
    home.config_file.write_text("model: gpt-5-mini\n", encoding="utf-8")
    res = run("count", str(data))
    assert res.exit_code == 0
    assert "warning: the default profile: model 'gpt-5-mini' shuts down on 2026-12-11 (20 days)" in res.stderr
    [w] = json.loads(run("count", str(data), "--json").output)["warnings"]
    assert w.startswith("the default profile: model 'gpt-5-mini' shuts down on 2026-12-11")
    assert "shuts down on 2026-12-11" in run("status").stderr
    after = run("count", str(data), env={"BGCTL_NOW": "2026-12-11T00:00:00+00:00"})
    assert after.exit_code == 78 and "shut down on 2026-12-11: nothing is sent" in after.output
    checks = run_checks(home, environ={}, today=D(2026, 11, 21))
    [soon] = [c for c in checks if c.name == "model shutdown"]
    assert soon.status == WARN and "gpt-5-mini' shuts down on 2026-12-11" in soon.detail


@pytest.mark.slow  # a real daemon process, on today's date
def test_the_daemon_exits_78_on_a_model_past_its_shutdown(home: Home) -> None:
    from harness import bgctl

    yesterday = (datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(days=1)).isoformat()
    home.pricing_file.write_text(
        f"model,input_per_1m,output_per_1m,provider,shutdown,successor\nacme-old,1,2,openai,{yesterday},gpt-6-luna\n",
        encoding="utf-8",
    )
    home.config_file.write_text("model: acme-old\n", encoding="utf-8")
    res = bgctl(home.root, "daemon", "--once", "--sandbox", timeout=60)
    assert res.returncode == 78, res.stderr
    assert f"shut down on {yesterday}" in res.stderr and "'gpt-6-luna'" in res.stderr
