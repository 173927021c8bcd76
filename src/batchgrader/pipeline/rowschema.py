"""Each row's own response schema: the ``schema_column`` setting.

A job's requests are one template but for their ``custom_id`` and user message
(:class:`~batchgrader.pipeline.requests.LineTemplate`); with ``schema_column`` each row's
request also carries the JSON schema its cell holds (an empty cell: the profile's
``response_format``), so one job can hold requests whose answers are of different kinds (an
imported eval's label and score criteria) and structured output still rules out the wrong kind
for each.  :class:`RowFormats` reads a row's cell: parsed and checked as the profile's
``response_format`` is (the strict-mode rules of ``core/configuration/strict_schema.py``), with
the same top-level properties as the profile's schema (which names the result's columns); a bad
cell is an :class:`InputError` naming the row, before anything is sent.  Each distinct cell is
parsed once.  The answers are checked against the schema their own request line carried
(:func:`~batchgrader.pipeline.outputschema.body_schema`), and each schema's tokens are counted
per request (:func:`schema_info_of`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from batchgrader.core.configuration.config_values import _response_format
from batchgrader.pipeline.formats.common import InputError
from batchgrader.pipeline.outputschema import body_schema, schema_of
from batchgrader.pipeline.requests import schema_allowance
from batchgrader.pipeline.tables import text_of


def _fields(response_format: Mapping[str, Any] | None) -> list[str]:
    schema = schema_of(response_format)
    props = (schema or {}).get("properties")
    return list(props) if isinstance(props, Mapping) else []


class RowFormats:
    """The response_format of each row of one file under a profile with ``schema_column``."""

    def __init__(self, column: str, default: dict[str, Any] | None):
        self.column, self.default = column, default
        self.fields = _fields(default)
        self._seen: dict[str, dict[str, Any] | None] = {}  # cell text -> its response_format

    def of(self, row: Any, path: Any) -> dict[str, Any] | None:
        """Row ``row``'s response_format; raises :class:`InputError` for a cell that is not one."""
        text = text_of(row.values.get(self.column)).strip()
        if not text:
            return self.default
        if text in self._seen:
            return self._seen[text]
        where = f"schema column {self.column!r} in row {row.number}"
        try:
            rf = _response_format(text)
        except ValueError as exc:
            raise InputError(path, f"{where}: expected {exc}", line=row.line, column=self.column) from None
        if rf is None or rf.get("type") != "json_schema":
            raise InputError(path, f"{where}: expected a JSON schema object", line=row.line, column=self.column)
        if _fields(rf) != self.fields:
            raise InputError(
                path,
                f"{where}: the schema's properties {_fields(rf)!r} are not the response_format's {self.fields!r} "
                "(they name the result's columns; give every row's schema the same top-level properties)",
                line=row.line,
                column=self.column,
            )
        self._seen[text] = rf
        return rf


def row_formats(profile: Any) -> RowFormats | None:
    """The profile's :class:`RowFormats`, or None without ``schema_column``."""
    column = profile.get("schema_column")
    return RowFormats(str(column), profile.response_format) if column else None


def schema_info_of(formats: Mapping[str, dict[str, Any]], requests: Mapping[str, int], encoding: str) -> dict[str, Any] | None:
    """``bgctl count``'s ``schema`` entry for a job whose requests carry several schemas
    (``formats``: sha256 -> response_format, ``requests``: sha256 -> its requests): each
    schema's allowance (its tokens, counted per request as the provider bills them: see
    :func:`~batchgrader.pipeline.requests.schema_allowance`), and ``per_request`` their mean
    over the requests.  A learned overhead is not used: it is the lesson of one schema."""
    total = sum(requests.values())
    if not formats or not total:
        return None
    counted = [(sha, schema_allowance(rf, encoding), requests.get(sha, 0)) for sha, rf in formats.items()]
    rows = [{"sha256": sha, "allowance_tokens": n, "requests": k} for sha, n, k in counted]
    allowance = sum(n * k for _sha, n, k in counted)
    return {
        "sha256": None,
        "allowance_tokens": round(allowance / total),
        "per_request": round(allowance / total, 2),
        "source": "allowance",
        "row_schemas": rows,
    }


def request_schema(profile: Any, body: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON schema an answer to the request ``body`` is checked against: the one the request
    carried under ``schema_column``, else the profile's."""
    if profile.get("schema_column"):
        return body_schema(body)
    return schema_of(profile.response_format)
