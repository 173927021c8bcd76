"""One :class:`~batchgrader.provider.openai_api.Provider` in front of several, so the engine
needs no provider-specific code: each job's calls go to the provider recorded when the job was
accepted (``JobAccepted.provider``; ``provider_of_job``, set by the daemon).

How a call finds its job:

* an upload (and the search for it) names the job in its deterministic upload name
  ``bg-<job>-c<chunk>-a<attempt>.jsonl``; a synchronous ``complete`` is given the job id; a
  recovered job's batch search carries ``bg_job`` in its metadata;
* a call that carries only a file or batch id (create, retrieve, cancel, download, delete) finds
  the job whose chunk holds that id through ``job_of_object`` (set by the daemon: an
  :class:`ObjectJobs` over its state).

Fallback, documented: an id no chunk of any job holds (a batch found by listing that the log never
recorded, an earlier attempt's file deleted at clean-up), or a router without those hooks (tests,
tools), is routed by the id's shape (:func:`provider_of_id`, from each registry spec's
``id_prefixes``: Anthropic staged files and results
start with ``anthropic-``, Anthropic batches with ``msgbatch_``; Gemini files and batches are
resource names, ``files/...`` and ``batches/...``, and inline results ``gemini-inline:``; Azure
OpenAI ids start with ``azure:``; anything else is OpenAI's).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from batchgrader.core.state import State
from batchgrader.provider.protocol import BatchInfo, BatchPage, FileInfo, Provider, ProviderError
from batchgrader.provider.registry import PROVIDERS

log = logging.getLogger(__name__)

_UPLOAD_NAME = re.compile(r"^bg-(?P<job>.+)-c\d+-a\d+\.jsonl$")


def provider_of_id(object_id: str) -> str:
    """The provider whose ids have the shape of ``object_id`` (each spec's ``id_prefixes`` in
    :mod:`batchgrader.provider.registry`); ``openai`` when none does."""
    for name, spec in PROVIDERS.items():
        if spec.id_prefixes and object_id.startswith(spec.id_prefixes):
            return name
    return "openai"


class ObjectJobs:
    """File or batch id -> the job whose chunk holds it (upload, batch, output and error file), read
    from the daemon's state.  The index is brought up to date only when an id is not found and the
    state has moved on since; then only the jobs with new events are read again."""

    def __init__(self, state_of: Callable[[], State]):
        self._state_of = state_of
        self._index: dict[str, str] = {}
        self._job_versions: dict[str, int] = {}  # job id -> its version when its chunks were indexed
        self._built_at = -1

    def __call__(self, object_id: str) -> str | None:
        job = self._index.get(object_id)
        if job is None:
            state = self._state_of()
            if state.last_seq != self._built_at:
                self._update(state)
                job = self._index.get(object_id)
        return job

    def _update(self, state: State) -> None:
        for job_id, job in state.jobs.items():
            if self._job_versions.get(job_id) != job.version:
                for c in job.chunks.values():
                    for object_id in (c.file_id, c.batch_id, c.output_file_id, c.error_file_id):
                        if object_id:
                            self._index[object_id] = job_id
                self._job_versions[job_id] = job.version
        self._built_at = state.last_seq


class ProviderRouter:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        provider_of_job: Callable[[str], str] | None = None,
        job_of_object: Callable[[str], str | None] | None = None,
    ):
        self.providers = dict(providers)
        self.provider_of_job: Callable[[str], str] = provider_of_job or (lambda job_id: "openai")
        self.job_of_object: Callable[[str], str | None] = job_of_object or (lambda object_id: None)
        self._on_page: Callable[[], None] = lambda: None

    @property
    def on_page(self) -> Callable[[], None]:
        """The engine's heartbeat per listing page (``Provider`` protocol), passed on to every
        provider that pages (a provider built later gets it when it is built)."""
        return self._on_page

    @on_page.setter
    def on_page(self, fn: Callable[[], None]) -> None:
        self._on_page = fn
        for p in self.providers.values():
            if hasattr(p, "on_page"):
                p.on_page = fn  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"ProviderRouter({sorted(self.providers)})"

    def __reduce__(self) -> Any:
        raise TypeError("ProviderRouter holds API keys and cannot be pickled")

    def _by_name(self, name: str) -> Provider:
        try:
            return self.providers[name]
        except KeyError:
            raise ValueError(f"provider {name!r} is not configured in this daemon") from None

    def _by_id(self, object_id: str) -> Provider:
        """The provider of the job that holds ``object_id``; else (no job holds it) by its shape."""
        job = self.job_of_object(object_id) if object_id else None
        if job is not None:
            try:
                return self._by_name(self.provider_of_job(job))
            except KeyError:
                pass
        return self._by_name(provider_of_id(object_id))

    def _by_upload_name(self, filename: str) -> Provider:
        m = _UPLOAD_NAME.match(filename)
        return self._by_name(self.provider_of_job(m.group("job")) if m else "openai")

    def upload(self, path: str | os.PathLike[str], filename: str) -> FileInfo:
        return self._by_upload_name(filename).upload(path, filename)

    def find_files(self, filename: str, size: int | None = None, created_after: int | None = None) -> list[FileInfo]:
        return self._by_upload_name(filename).find_files(filename, size, created_after)

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        return self._by_id(input_file_id).create_batch(input_file_id, endpoint, completion_window, metadata)

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]:
        if input_file_id is None and metadata and "bg_job" in metadata:  # a recovered job: its profile's provider
            try:
                name = self.provider_of_job(metadata["bg_job"])
            except KeyError:
                name = "openai"
            return self._by_name(name).find_batches(input_file_id, metadata, created_after)
        return self._by_id(input_file_id or "").find_batches(input_file_id, metadata, created_after)

    def retrieve(self, batch_id: str) -> BatchInfo:
        return self._by_id(batch_id).retrieve(batch_id)

    def cancel(self, batch_id: str) -> BatchInfo:
        return self._by_id(batch_id).cancel(batch_id)

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        """One page from every provider that still has pages, merged (``limit`` per provider).

        The cursor (``last_id``) is a JSON map of provider name to that provider's own cursor, so
        each provider pages on independently and every one gets the same number of pages within
        :func:`~batchgrader.provider.openai_api.list_statuses`' page budget.  A provider whose
        listing fails is left out of this round (its batches are then retrieved one by one, as for
        any batch a listing does not show); when every provider fails the error is raised."""
        cursors: dict[str, str | None] = {name: None for name in sorted(self.providers)}
        if after:
            cursors = {name: (cur or None) for name, cur in json.loads(after).items() if name in self.providers}
        items: list[BatchInfo] = []
        more: dict[str, str] = {}
        failed: list[ProviderError] = []
        for name, cursor in cursors.items():
            try:
                page = self.providers[name].list_batches(limit=limit, after=cursor)
            except ProviderError as exc:
                log.warning("listing %s batches: %s (they are retrieved one by one)", name, exc)
                failed.append(exc)
                continue
            items.extend(page.items)
            if page.has_more and page.last_id is not None:
                more[name] = page.last_id
        if failed and len(failed) == len(cursors):
            raise failed[0]
        return BatchPage(tuple(items), bool(more), json.dumps(more, sort_keys=True) if more else None)

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        return self._by_id(file_id).download(file_id, dest_path)

    def complete(self, line: Mapping[str, Any], job_id: str | None = None) -> dict[str, Any]:
        """One synchronous request, through the provider of ``job_id``'s profile."""
        return self._by_name(self.provider_of_job(job_id) if job_id else "openai").complete(line, job_id)

    def delete_file(self, file_id: str) -> bool:
        return self._by_id(file_id).delete_file(file_id)
