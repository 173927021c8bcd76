"""Azure OpenAI's Batch API through the official SDK's ``openai.AzureOpenAI`` client, unchanged.

Azure serves the OpenAI Files and Batches API under the resource endpoint: ``/openai/files``
and ``/openai/batches`` with an ``api-version`` query parameter and the key in an ``api-key``
header (the SDK does all of that).  The objects, the statuses, the ``metadata`` and the
create/upload/reconcile-by-listing contract are OpenAI's, so :class:`AzureOpenAIProvider` *is*
an :class:`~batchgrader.provider.openai_api.OpenAIProvider` (the same sent-once writes, retried
reads, listing to reconcile) with two differences:

* **ids are Azure's own**: a job's calls reach Azure because the job records its provider, so an
  id needs no mark.  Earlier versions handed out ``azure:<Azure's id>``; such an id, recorded in
  an event log before the upgrade, is still read: the prefix is removed before the call, and what
  a call given one returns names its ids the same way (:func:`old_form`), so a job in flight
  compares like with like.  One Azure resource (endpoint) per daemon.
* **model names are deployment names**: the request lines' ``model`` carries the deployment,
  and the queue quota (enqueued tokens) is per deployment, so a learned queue limit is kept per
  endpoint and deployment (see :attr:`base_url`).  Prices come from the profile's
  ``azure_model`` (the model the deployment runs) or a price row named after the deployment.

* **the api-version surface's paths**: on ``AzureOpenAI(api_version=...)`` Azure documents the
  request lines' ``url`` and the create ``endpoint`` as ``/chat/completions`` (its v1 surface uses
  ``/v1/chat/completions`` lines with ``endpoint=/chat/completions``); a line whose ``url`` is not
  the endpoint fails validation with ``url_mismatch``.  The pipeline writes Azure lines with
  :data:`AZURE_ENDPOINT` (Azure's ``request_url`` in :mod:`batchgrader.core.configuration.providers`) and :meth:`AzureOpenAIProvider.create_batch` sends it.
* **no Responses API**: Azure documents Global Batch lines for ``/v1/responses`` only on its v1
  surface (``OpenAI(base_url=".../openai/v1/")``, ``includes/batch/batch-python.md`` @1813309,
  where the create's ``endpoint`` is ignored: "the system will read your input file to determine
  if the chat completions or responses API is needed"); nothing documents them on this
  api-version surface, so a profile whose requests would go through the Responses API is refused
  when the configuration loads (``pipeline/catalogue.py``, docs/providers.md).
* **uploads expire**: every upload carries ``expires_after`` (:data:`FILE_EXPIRY_S`): without it
  Azure caps a resource at 500 batch files, with it at 10,000.

Facts (learn.microsoft.com, MicrosoftDocs/azure-ai-docs ``how-to/batch.md`` @0880196 and
``includes/batch/batch-python.md`` @068add6/@1813309, checked 2026-11-25): input files are JSONL
uploaded with purpose ``batch``; ``expires_after`` takes 14 to 30 days (1,209,600 to 2,592,000 s);
a failed batch may report ``request_counts`` of ``null`` (read as 0); a batch holds up to 50,000 requests and 200 MB; ``completion_window`` is
``24h`` only; ``metadata`` up to 16 pairs; enqueued-token quota per deployment, refused with
``token_limit_exceeded`` ("... configured limit of 30K for the deployment ..."); the latest
data-plane authoring api-version is ``2025-04-01-preview`` (GA ``2024-10-21``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import openai

from batchgrader.core.configuration.config import AZURE_DEFAULT_API_VERSION
from batchgrader.core.configuration.providers import PROVIDER_FACTS
from batchgrader.core.host.secrets import mask_secret
from batchgrader.provider.openai_api import (
    DEFAULT_ENDPOINT,
    BatchInfo,
    BatchPage,
    OpenAIProvider,
    ProviderConfigError,
)

ID_PREFIX = "azure:"
#: the request lines' ``url`` (the pipeline writes its ``request_url``, core/configuration/providers.py) and the
#: create ``endpoint`` on the api-version surface
AZURE_ENDPOINT = PROVIDER_FACTS["azure"].request_url
#: ``expires_after.seconds`` of every upload: 14 days, the shortest Azure takes (results are
#: collected and the files deleted long before; the expiry only lifts the 500-file cap)
FILE_EXPIRY_S = 14 * 86_400
MAX_REQUESTS = 50_000
MAX_BATCH_BYTES = 200 * 1024 * 1024


def raw_id(object_id: str) -> str:
    """The id Azure knows: an id recorded by an earlier version (``azure:<id>``) without its prefix."""
    return object_id[len(ID_PREFIX) :] if object_id.startswith(ID_PREFIX) else object_id


def old_form(given: str | None) -> bool:
    """Whether an id the caller gave is in the earlier versions' form (``azure:<id>``): what the
    call returns is then named that way too."""
    return bool(given) and str(given).startswith(ID_PREFIX)


def _prefixed(raw: str | None) -> str | None:
    return None if raw is None else ID_PREFIX + raw


def _batch(b: BatchInfo, old: bool) -> BatchInfo:
    """A batch as the caller names its ids: Azure's own, or the earlier versions' form."""
    if not old:
        return b
    return dataclasses.replace(
        b,
        id=ID_PREFIX + b.id,
        input_file_id=ID_PREFIX + b.input_file_id,
        output_file_id=_prefixed(b.output_file_id),
        error_file_id=_prefixed(b.error_file_id),
    )


class AzureOpenAIProvider(OpenAIProvider):
    """:class:`~batchgrader.provider.openai_api.Provider` on Azure OpenAI (``openai.AzureOpenAI``)."""

    def __init__(
        self,
        api_key: str | None,
        endpoint: str | None,
        api_version: str | None = None,
        timeout: float = 60.0,
        **kwargs: Any,
    ):
        if not api_key:
            raise ProviderConfigError("no Azure OpenAI API key: set AZURE_OPENAI_API_KEY in the environment or secrets.env")
        if not endpoint:
            raise ProviderConfigError(
                "no Azure OpenAI endpoint: set AZURE_OPENAI_ENDPOINT (or azure_endpoint in config.yaml), "
                "e.g. https://NAME.openai.azure.com"
            )
        self.endpoint = endpoint.rstrip("/")
        self.api_version = api_version or AZURE_DEFAULT_API_VERSION
        super().__init__(api_key=api_key, base_url=None, timeout=timeout, **kwargs)
        # whose queue a learned limit belongs to: the resource endpoint (the model is the deployment)
        self.base_url = self.endpoint

    def _make_client(self, **kwargs: Any) -> openai.OpenAI:
        return openai.AzureOpenAI(
            api_key=kwargs["api_key"],
            azure_endpoint=self.endpoint,
            api_version=self.api_version,
            timeout=kwargs["timeout"],
            http_client=kwargs["http_client"],
            max_retries=0,  # writes are sent once; reads use a copy with max_retries
        )

    def __repr__(self) -> str:
        return f"AzureOpenAIProvider(endpoint={self.endpoint!r}, api_version={self.api_version!r}, api_key={mask_secret(self._secret)!r})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("AzureOpenAIProvider cannot be pickled")

    # --- files ---------------------------------------------------------------------------------

    def _upload_options(self) -> dict[str, Any]:
        return {"expires_after": {"anchor": "created_at", "seconds": FILE_EXPIRY_S}}

    def delete_file(self, file_id: str) -> bool:
        return super().delete_file(raw_id(file_id))

    def download(self, file_id: str, dest_path: str | os.PathLike[str]) -> int:
        return super().download(raw_id(file_id), dest_path)

    # --- batches (find_batches and iter_batches page through list_batches) -----------------------

    def create_batch(
        self,
        input_file_id: str,
        endpoint: str | None = None,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
    ) -> BatchInfo:
        """``endpoint`` None: the ``url`` of the file's lines (:data:`AZURE_ENDPOINT`, as the
        pipeline writes them); OpenAI's chat endpoint is named as the api-version surface's."""
        endpoint = AZURE_ENDPOINT if endpoint == DEFAULT_ENDPOINT else endpoint
        b = super().create_batch(raw_id(input_file_id), endpoint, completion_window, metadata)
        return _batch(b, old_form(input_file_id))

    def retrieve(self, batch_id: str) -> BatchInfo:
        return _batch(super().retrieve(raw_id(batch_id)), old_form(batch_id))

    def cancel(self, batch_id: str) -> BatchInfo:
        return _batch(super().cancel(raw_id(batch_id)), old_form(batch_id))

    def find_batches(
        self, input_file_id: str | None = None, metadata: Mapping[str, str] | None = None, created_after: int | None = None
    ) -> list[BatchInfo]:
        found = super().find_batches(raw_id(input_file_id) if input_file_id else None, metadata, created_after)
        return [_batch(b, old_form(input_file_id)) for b in found]

    def list_batches(self, limit: int = 20, after: str | None = None) -> BatchPage:
        return super().list_batches(limit, raw_id(after) if after else None)
