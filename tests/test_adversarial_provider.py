"""Issue 10, provider side: a provider that drops metadata, ignores the ``after`` cursor, or
compresses file content (a proxy), against the real client over real HTTP."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from batchgrader.emulator import Fault
from batchgrader.provider.openai_api import ProviderRejected, reconcile_batch
from emulator_fixtures import (  # noqa: F401 - fixtures
    CHAT,
    RecordingSleep,
    clock,
    emu_factory,
    make_provider,
    simple_input,
    write_input,
)

pytestmark = pytest.mark.timeout(60)


def _batch(provider, tmp_path: Path, key: str, name: str = "in.jsonl"):
    f = provider.upload(write_input(tmp_path, simple_input(2), name), name)
    return f, provider.create_batch(f.id, CHAT, "24h", {"bg_key": key})


def test_dropped_metadata_still_finds_the_batch_by_its_input_file(emu_factory, tmp_path, clock):
    emu = emu_factory(drop_metadata=True)
    provider = make_provider(emu)
    f, b = _batch(provider, tmp_path, "job:0:1")
    assert dict(provider.retrieve(b.id).metadata) == {}  # the quirk is real
    found = reconcile_batch(provider, f.id, {"bg_key": "job:0:1"})
    assert found.outcome == "adopted" and found.batch is not None and found.batch.id == b.id
    # another chunk's file never matches, metadata or not
    g, _ = _batch(provider, tmp_path, "job:1:1", "other.jsonl")
    assert [x.id for x in provider.find_batches(input_file_id=f.id, metadata={"bg_key": "job:0:1"})] == [b.id]
    assert g.id != f.id


def test_metadata_still_decides_when_the_provider_keeps_it(emu_factory, tmp_path, clock):
    emu = emu_factory()
    provider = make_provider(emu)
    f, _ = _batch(provider, tmp_path, "job:0:1")
    assert reconcile_batch(provider, f.id, {"bg_key": "job:0:2"}).outcome == "not_created"


def _with_deadline(fn, seconds: float):
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported below
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "paging never stopped (the cursor did not advance)"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_paging_stops_when_the_provider_ignores_the_cursor(emu_factory, tmp_path, clock):
    emu = emu_factory(ignore_after_cursor=True)
    provider = make_provider(emu, list_page_size=2)
    files = [provider.upload(write_input(tmp_path, simple_input(1), f"f{i}.jsonl"), f"f{i}.jsonl") for i in range(5)]
    for i, f in enumerate(files):
        provider.create_batch(f.id, CHAT, "24h", {"bg_key": f"k{i}"})
    listed = _with_deadline(lambda: list(provider.iter_batches()), 10)
    assert len(listed) == 2  # the first page, once
    found = _with_deadline(lambda: provider.find_files("f0.jsonl"), 10)
    assert isinstance(found, list)


def test_download_through_a_compressing_proxy_checks_the_raw_size(emu_factory, tmp_path, clock):
    emu = emu_factory(gzip_content=True)
    provider = make_provider(emu)
    data = simple_input(40)
    f = provider.upload(write_input(tmp_path, data), "in.jsonl")
    dest = tmp_path / "out.jsonl"
    provider.download(f.id, dest)
    assert dest.read_bytes() == data


def test_download_of_an_expired_file_is_a_definite_404(emu_factory, tmp_path, clock):
    emu = emu_factory()
    provider = make_provider(emu)
    f = provider.upload(write_input(tmp_path, simple_input(1)), "in.jsonl")
    emu.script_fault("GET", "/v1/files/{id}/content", Fault("status", status=404, message="No such File object"))
    with pytest.raises(ProviderRejected) as info:
        provider.download(f.id, tmp_path / "x.jsonl")
    assert info.value.status_code == 404
