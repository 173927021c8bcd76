"""Above ``DAEMON_MAX_UNCACHED`` uncached requests the daemon does not count a job itself: the
whole job keeps tiktoken estimates, and says so (``InputTokensCounted.reason`` names the cap and
the remedy, ``bgctl status`` marks the estimate, the log warns).  The remedy works: after
``bgctl count`` the same requests are planned on exact counts, found in the cache."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from batchgrader.emulator import Emulator, EmulatorConfig
from batchgrader.provider.counting import DAEMON_MAX_UNCACHED
from harness import FAST_CONFIG, events_of
from test_anthropic_daemon import ANTHROPIC_KEY, MODEL, run

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

COUNT = ("POST", "/v1/messages/count_tokens")


def test_a_job_over_the_daemons_counting_cap_is_labelled_and_bgctl_count_lifts_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "inbox").mkdir(parents=True)
    (home / "config.yaml").write_text(FAST_CONFIG + f"provider: anthropic\nmodel: {MODEL}\nsplit_row_limit: 1000\n")
    n = DAEMON_MAX_UNCACHED + 1
    data = tmp_path / "big.csv"
    data.write_text("response\n" + "".join(f"essay number {i}\n" for i in range(n)))
    with Emulator(EmulatorConfig(api_key=ANTHROPIC_KEY, seed=2)) as emu:
        assert run(home, emu, "submit", str(data)).returncode == 0
        assert run(home, emu, "daemon", "--once").returncode == 0
        assert emu.request_count(*COUNT) == 0  # nothing counted one by one: over the cap
        (job,) = json.loads(run(home, emu, "status", "--json").stdout)
        detail = run(home, emu, "status", job["job_id"]).stdout
        (capped,) = events_of(home, "InputTokensCounted")
        assert capped["exact"] is False and capped["source"] == "estimate"
        assert f"{n:,} requests not counted yet" in capped["reason"]
        assert f"at most {DAEMON_MAX_UNCACHED:,} uncached requests" in capped["reason"] and "bgctl count" in capped["reason"]
        assert job["input_tokens_exact"] is False and job["state"] == "completed" and "ESTIMATE" in detail
        assert "stay estimates" in (home / "logs" / "daemon.log").read_text()

        # the remedy: bgctl count a new file before submitting it; the daemon finds the counts cached
        other = tmp_path / "other.csv"
        other.write_text("response\n" + "".join(f"another essay {i}\n" for i in range(n)))
        summary = json.loads(run(home, emu, "count", str(other), "--json").stdout)
        assert summary["input_tokens_exact"] is True and emu.request_count(*COUNT) == n
        assert run(home, emu, "submit", str(other)).returncode == 0
        assert run(home, emu, "daemon", "--once").returncode == 0
        assert emu.request_count(*COUNT) == n  # the daemon found every count in the cache
    first, second = events_of(home, "InputTokensCounted")
    assert second["exact"] is True and second["input_tokens"] == summary["input_tokens"]
    assert first == capped
