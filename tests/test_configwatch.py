"""Issue 27, item 3: the daemon notices an edited config.yaml or pricing.csv and reloads it."""

from __future__ import annotations

import os
import signal

import pytest

from batchgrader.core.configuration.watch import ConfigWatch


def test_each_change_is_reported_once(tmp_path):
    config, pricing = tmp_path / "config.yaml", tmp_path / "pricing.csv"
    config.write_text("model: gpt-5.4-mini\n")
    watch = ConfigWatch([config, pricing])
    assert watch.changed() == []
    config.write_text("model: gpt-5.4-mini\npoll_interval_seconds: 5\n")  # edited (size and time)
    assert watch.changed() == [config]
    assert watch.changed() == []  # once
    pricing.write_text("model,input_per_1m\n")  # created
    assert watch.changed() == [pricing]
    tmp = tmp_path / "new.yaml"
    tmp.write_text("model: gpt-4.1-nano\n")
    os.replace(tmp, config)  # written to a temporary file and renamed (a new inode)
    assert watch.changed() == [config]
    config.unlink()
    assert watch.changed() == [config]


@pytest.mark.slow  # a real daemon process
def test_an_edited_config_is_reloaded_without_sighup(home):
    from batchgrader.emulator import Emulator, EmulatorConfig
    from harness import FAST_CONFIG, TEST_KEY, event_types, start_daemon, wait_for

    home.config_file.write_text(FAST_CONFIG)
    with Emulator(EmulatorConfig(api_key=TEST_KEY)) as emu:
        proc = start_daemon(home.root, emu.base_url)
        try:
            wait_for(lambda: home.db.exists(), what="daemon up")
            home.config_file.write_text(FAST_CONFIG + "max_cost_per_job_usd: 0.0000001\n")
            log = home.logs / "daemon.log"
            wait_for(lambda: "configuration reloaded" in log.read_text(), what="reload")
            assert "config.yaml changed: reloading the configuration" in log.read_text()
            (home.inbox / "a.csv").write_text("id,response\n0,review 0\n1,review 1\n")
            wait_for(lambda: "JobHeld" in event_types(home.db), what="held by the edited limit")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0


def test_a_reload_names_the_changes_only_a_restart_applies(tmp_path):
    from batchgrader.core.configuration.config import load_config
    from batchgrader.core.configuration.watch import restart_only_changes
    from batchgrader.core.host.home import Home

    home = Home(tmp_path)
    home.ensure()
    home.config_file.write_text("model: gpt-5.4-mini\npoll_interval_seconds: 30\n")
    old = load_config(home)
    home.config_file.write_text(
        "model: gpt-5.4-mini\npoll_interval_seconds: 30\nmax_row_retries: 5\n"
        "profiles:\n  claude:\n    provider: anthropic\n    model: claude-haiku-4-5\n"
    )
    assert restart_only_changes(old, load_config(home)) == ["provider anthropic"]
    home.config_file.write_text("model: gpt-5.4-mini\npoll_interval_seconds: 5\napi_key: sk-new-secret-value\n")
    changed = restart_only_changes(old, load_config(home))
    assert sorted(changed) == ["api_key", "poll_interval_seconds"]  # names only: a key's value is never shown
    assert restart_only_changes(old, old) == []
