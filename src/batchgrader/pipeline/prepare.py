"""Request preparation: one request per row (a chat completion or a response), exact token counts, the chunk plan.

The file is streamed once: rows are read in blocks, each block's requests are built,
counted with tiktoken's batch encoder on all cores, serialised to their JSONL line, and only
two integers per request (tokens, bytes) are kept in memory.  Row position ``i`` is data row
``i + 1``; every row keeps its position even when its request cannot be sent.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from batchgrader.core.configuration.config import Profile
from batchgrader.core.host.home import Home
from batchgrader.pipeline.catalogue import shipped_spec
from batchgrader.pipeline.input_checks import missing_column_advice, open_checked
from batchgrader.pipeline.labels import label_checker, label_error
from batchgrader.pipeline.pricing import PriceTable, PricingError, estimate
from batchgrader.pipeline.prompts import PromptSpec, resolve_prompts
from batchgrader.pipeline.requests import (
    LineTemplate,
    RequestBuilder,
    default_custom_id,
    dumps_line,
    schema_info,
    schema_sha256,
)
from batchgrader.pipeline.rowschema import row_formats, schema_info_of
from batchgrader.pipeline.samples import id_problem, sample_id, sample_ids
from batchgrader.pipeline.splitting import Chunk, Limits, plan_chunks, write_chunk_files
from batchgrader.pipeline.tables import InputError, MissingColumn, text_of
from batchgrader.pipeline.tokens import ChatTokenCounter, ModelTokenizer, ParallelTextCounter, tokenizer_for_model

BLOCK_ROWS = 4096


class ReuseProbeLike(Protocol):
    """What :func:`prepare` needs of :class:`batchgrader.pipeline.reuse.ReuseProbe`."""

    def block(
        self, lines: Sequence[bytes], cids: Sequence[str] | None = None, contents: Sequence[str] | None = None
    ) -> list[bool]: ...

    def leader_position(self, pos: int) -> int | None: ...


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class RowProblem:
    row: int
    line: int | None
    custom_id: str | None
    code: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "line": self.line, "custom_id": self.custom_id, "code": self.code, "message": self.message}


@dataclass
class Preparation:
    path: Path
    fmt: str
    sha256: str
    profile: str
    model: str
    tokenizer: ModelTokenizer
    columns: list[str]
    rows: int = 0
    tokens: array = field(default_factory=lambda: array("Q"))
    sizes: array = field(default_factory=lambda: array("Q"))
    chunks: list[Chunk] = field(default_factory=list)
    problems: list[RowProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    max_completion_tokens: int = 0
    response_format: dict[str, Any] | None = None
    duplicate_rows: int = 0  # rows left out of split's chunk files: identical to an earlier row (sent once)
    samples: int = 1  # requests per row (``samples: k``): positions in tokens/sizes are requests, k per row
    empty_problems: list[RowProblem] = field(default_factory=list)  # the skipped rows' empty_input problems
    text_encoding: str | None = None  # the encoding a text input was read in (None: Excel, Parquet)
    empty_rows: int = 0  # rows whose response_field is empty (or only spaces)
    response_field: str = ""  # the graded column those rows are empty in
    skipped: set[int] = field(default_factory=set)  # request positions never sent: empty rows under skip_empty
    # with ``schema_column``: each schema the rows' requests carry (sha256 -> response_format), and its requests
    row_formats: dict[str, dict[str, Any]] = field(default_factory=dict)
    format_requests: dict[str, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return sum(c.requests for c in self.chunks)

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.chunks)

    @property
    def max_request_tokens(self) -> int:
        return max(self.tokens, default=0)

    def summary(self, prices: PriceTable | None, schema_overhead: float | None = None) -> dict[str, Any]:
        """The plan and the estimate.  With a JSON schema, ``input_tokens`` stays the exact local
        count and ``input_tokens_estimate`` adds the schema's overhead per request: the learned
        ``schema_overhead`` (calibrated, from a ``SchemaOverheadLearned`` event) or else the
        stated allowance (:func:`schema_allowance`); the cost estimate uses that figure.  With
        ``schema_column`` each request's own schema counts (:func:`schema_info_of`)."""
        requests, tokens = self.requests, self.input_tokens
        if self.row_formats:
            schema = schema_info_of(self.row_formats, self.format_requests, self.tokenizer.encoding)
        else:
            schema = schema_info(self.response_format, self.tokenizer.encoding, schema_overhead)
        if schema and "row_schemas" in schema:  # each request's own schema's tokens, over the requests sent
            built = sum(r["requests"] for r in schema["row_schemas"])
            billed_tokens = tokens + round(
                sum(r["allowance_tokens"] * r["requests"] for r in schema["row_schemas"]) * requests / built
            )
        else:
            billed_tokens = tokens + round(schema["per_request"] * requests) if schema else tokens
        out: dict[str, Any] = {
            "file": str(self.path),
            "format": self.fmt,
            "text_encoding": self.text_encoding,
            "empty_rows": self.empty_rows,
            "response_field": self.response_field,
            "sha256": self.sha256,
            "profile": self.profile,
            "model": self.model,
            "encoding": self.tokenizer.encoding,
            "rows": self.rows,
            "requests": requests,
            "input_tokens": tokens,
            "mean_request_tokens": round(tokens / requests, 1) if requests else 0,
            "max_request_tokens": self.max_request_tokens,
            "chunks": [
                {"index": c.index, "requests": c.requests, "input_tokens": c.input_tokens, "bytes": c.bytes} for c in self.chunks
            ],
            "row_errors": [p.as_dict() for p in self.problems],
            "warnings": list(self.warnings),
            "estimated_cost_usd": None,
            "pricing_error": None,
        }
        if schema:
            out["schema"] = schema
            out["input_tokens_estimate"] = billed_tokens
        if prices is not None:
            try:
                price = prices.get(self.model)
            except PricingError as exc:
                out["pricing_error"] = str(exc)
            else:
                est = estimate(price, billed_tokens, requests, self.max_completion_tokens)
                out["estimated_cost_usd"] = {
                    "input": float(est.input_usd),
                    "max_output": float(est.max_output_usd),
                    "max_total": float(est.max_total_usd),
                    "output_bound": self.max_completion_tokens,
                    "output_note": (
                        f"upper bound: every request spends its whole output bound of {self.max_completion_tokens:,} "
                        "tokens, reasoning tokens included"
                    ),
                }
        return out


def limits_for(profile: Profile, context_window: int | None) -> Limits:
    return Limits.from_settings(profile, context_window)


class _Counting:
    """The token counter's pool and the constant part of every request's count (reply priming,
    per-message overhead, roles, system prompt), made on first use: with reuse, a job whose
    every row is answered already never loads the tokenizer's ranks."""

    def __init__(self, profile: Profile, spec: PromptSpec):
        self.profile, self.spec = profile, spec
        # an Azure deployment is counted with the tokenizer of the model it runs (``azure_model``)
        self.model = profile.get("azure_model") or profile.model
        self.tokenizer = tokenizer_for_model(self.model, profile.default_encoding)
        self.const = 0
        self._pool: ParallelTextCounter | None = None

    def pool(self) -> ParallelTextCounter:
        if self._pool is None:
            counter = ChatTokenCounter(self.model, self.profile.default_encoding)
            for s in ("system", "user") + ((self.spec.system,) if self.spec.system else ()):
                counter.remember(s)
            # an embedding request is billed its text's tokens alone (no message overhead)
            embeddings = shipped_spec(str(self.model)).embeddings
            self.const = 0 if embeddings else counter.count(self.spec.chat(""))
            self._pool = counter.parallel()
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def request_lines(path: Path, profile: Profile, builder: RequestBuilder, reader: Any, file_hash: str) -> Iterator[bytes]:
    """Every request line of ``reader``'s rows, in order, exactly as :func:`prepare` writes them
    (``samples`` requests per row), each row checked as prepare checks it (its id, its label):
    the same :class:`InputError` for the same row."""
    samples = int(profile.get("samples") or 1)
    of = _row_reader(Path(path), profile, builder, file_hash, samples)
    chat = builder.spec.chat
    templates = _Templates(builder)  # the same bytes as dumps_line, without building each request
    formats = row_formats(profile)
    skip_empty = bool(profile.get("skip_empty"))
    for row in reader:
        user, cids = of(row)
        rf = formats.of(row, path) if formats is not None else None
        if skip_empty and is_empty(row, profile.response_field):
            continue  # never sent (prepare fails it with empty_input)
        _sha, template = templates.of(rf)
        for scid in cids:
            yield template.line(scid, user) if template is not None else dumps_line(builder.request(scid, chat(user), rf))


class _Templates:
    """The line template of each response_format a job's rows carry (one without ``schema_column``)."""

    def __init__(self, builder: RequestBuilder):
        self.builder = builder
        self.made: dict[int, tuple[str, LineTemplate | None]] = {}  # id of the response_format -> (its sha256, template)

    def of(self, rf: dict[str, Any] | None) -> tuple[str, LineTemplate | None]:
        found = self.made.get(id(rf))
        if found is None:
            found = self.made[id(rf)] = (schema_sha256(rf) or "", self.builder.line_template(rf))
        return found


def prepare(
    path: Path,
    profile: Profile,
    home: Home,
    *,
    requests_out: IO[bytes] | None = None,
    prices: PriceTable | None = None,
    file_hash: str | None = None,
    limits: Limits | None = None,
    reuse: ReuseProbeLike | None = None,
) -> Preparation:
    """Stream ``path`` once; count every request exactly; plan the chunks (:func:`_prepare`).  A
    required column missing from the file names the setting that asks for it and the closest
    column (:func:`missing_column_advice`)."""
    try:
        return _prepare(
            path, profile, home, requests_out=requests_out, prices=prices, file_hash=file_hash, limits=limits, reuse=reuse
        )
    except MissingColumn as exc:
        raise missing_column_advice(exc, profile, resolve_prompts(profile, home)) from None


class _RowIds:
    """Each row's custom_id: ``<prefix><row number>``, or the ``id_column``'s value checked
    (not empty, not repeated, and with samples no sample suffix of its own)."""

    def __init__(self, path: Path, id_column: str | None, id_prefix: str, samples: int):
        self.path, self.id_column, self.id_prefix, self.samples = path, id_column, id_prefix, samples
        self.first_row: dict[str, int] = {}  # id -> the row it was first seen in

    def of(self, row: Any) -> str:
        id_column = self.id_column
        if id_column is None:
            return self.id_prefix + str(row.number)
        cid = text_of(row.values[id_column])
        if not cid:
            raise InputError(self.path, f"id column {id_column!r} is empty in row {row.number}", line=row.line, column=id_column)
        first = self.first_row.setdefault(cid, row.number)
        if first != row.number:
            raise InputError(
                self.path,
                f"id column {id_column!r} value {cid!r} repeats (first seen in row {first}); ids must be unique",
                line=row.line,
                column=id_column,
            )
        if self.samples > 1 and (why := id_problem(cid, self.samples)):
            raise InputError(self.path, f"id column {id_column!r} value {cid!r} {why}", line=row.line, column=id_column)
        return cid


class _Blocks:
    """The requests of a block of rows: their lines written (and shown to ``reuse`` first), their
    user messages counted on the counting pool while the next block is read, the counts
    collected into ``prep.tokens`` one block later."""

    def __init__(
        self,
        prep: Preparation,
        counting: _Counting,
        reuse: ReuseProbeLike | None,
        requests_out: IO[bytes] | None,
        with_cids: bool,
    ):
        self.prep, self.counting, self.reuse, self.requests_out, self.with_cids = prep, counting, reuse, requests_out, with_cids
        self.texts: list[str] = []  # the block's user messages
        self.lines: list[bytes] = []
        self.cids: list[str] = []  # the block's custom_ids (only with ``reuse``)
        self.pending: tuple[Callable[[], list[int]], list[bool] | None, int] | None = None
        self.block_start = 0

    def flush(self) -> None:
        texts, reuse = self.texts, self.reuse
        send: list[bool] | None = None
        todo = texts
        if reuse is not None:
            send = reuse.block(self.lines, self.cids, texts) if self.with_cids else reuse.block(self.lines)
            self.cids.clear()
            todo = [t for t, s in zip(texts, send) if s]
        if self.requests_out is not None:
            self.requests_out.write(b"".join(self.lines))
            self.lines.clear()
        started = self.counting.pool().submit(todo) if todo else list  # works on copies: the block can be reused at once
        start, self.block_start = self.block_start, self.block_start + len(texts)
        texts.clear()
        if self.pending is not None:
            self._collect(*self.pending)
        self.pending = (started, send, start)

    def finish(self) -> None:
        if self.texts:
            self.flush()
        if self.pending is not None:
            self._collect(*self.pending)
            self.pending = None

    def _collect(self, result: Callable[[], list[int]], send: list[bool] | None, start: int) -> None:
        const_tokens = self.counting.const
        prep = self.prep
        if send is None:
            prep.tokens.extend([const_tokens + n for n in result()])
            return
        counts = iter(result())
        tokens = prep.tokens
        for pos, sent in enumerate(send, start):
            if sent:
                tokens.append(const_tokens + next(counts))
                continue
            leader = self.reuse.leader_position(pos)  # type: ignore[union-attr]
            if leader is None:  # answered from the cache: never planned into a chunk
                tokens.append(0)
                prep.sizes[pos] = 0
            else:
                tokens.append(tokens[leader])


def _context_window(profile: Profile, prices: PriceTable | None) -> int | None:
    if profile.context_window is not None or prices is None:
        return profile.context_window
    try:
        return prices.get(profile.model).context_window
    except PricingError:
        return None


def _row_reader(
    path: Path, profile: Profile, builder: RequestBuilder, file_hash: str, samples: int
) -> Callable[[Any], tuple[str, Sequence[str]]]:
    """What prepare makes of each row, in file order: its user message and the custom_ids of its
    requests (``samples`` of them), after the checks of the row (its label; its id: not empty,
    not repeated), which raise :class:`InputError`."""
    user_message = builder.spec.user_message
    ids = _RowIds(path, builder.id_column, default_custom_id(file_hash, 0)[:-1], samples)
    check_label = label_checker(profile)
    label_column = profile.get("reference_column")

    def of(row: Any) -> tuple[str, Sequence[str]]:
        user = user_message(row.values, text_of)
        if check_label is not None:
            label = text_of(row.values.get(label_column))
            problem = check_label(label) if label.strip() else None
            if problem:
                raise label_error(path, profile, label, problem, row.number, row.line)
        cid = ids.of(row)
        return user, (sample_ids(cid, samples) if samples > 1 else (cid,))

    return of


def _read_rows(
    reader: Any,
    prep: Preparation,
    builder: RequestBuilder,
    template: LineTemplate | None,
    blocks: _Blocks,
    requests_out: IO[bytes] | None,
    file_hash: str,
) -> int:
    """Every row's requests (k with samples) built, sized, and handed to ``blocks``; the rows read."""
    spec = builder.spec
    # Every request of the job is the same but for its user message (and, with schema_column,
    # its schema, whose tokens the summary adds per request), so its tokens are a constant
    # (``counting.const``) plus the user text's.
    of = _row_reader(prep.path, builder.profile, builder, file_hash, prep.samples)
    formats, templates = row_formats(builder.profile), _Templates(builder)
    if template is not None:
        templates.made[id(None)] = ("", template)
    rf: dict[str, Any] | None = None
    texts, lines, cids, keep_cids = blocks.texts, blocks.lines, blocks.cids, blocks.reuse is not None
    sizes_append = prep.sizes.append
    rows = 0
    empty_field, skip_empty = builder.profile.response_field, bool(builder.profile.get("skip_empty"))
    prep.response_field = empty_field
    for row in reader:
        user, row_cids = of(row)
        if formats is not None:  # the row's own schema (pipeline/rowschema.py)
            rf = formats.of(row, prep.path)
            sha, template = templates.of(rf)
            if rf is not None:
                prep.row_formats.setdefault(sha, rf)
                prep.format_requests[sha] = prep.format_requests.get(sha, 0) + len(row_cids)
        if is_empty(row, empty_field):
            prep.empty_rows += 1
            if skip_empty:  # never sent: each of its requests fails with empty_input
                base = len(prep.sizes)
                prep.skipped.update(range(base, base + len(row_cids)))
                why = f"the `{empty_field}` cell is empty: not sent (skip_empty: true)"
                prep.empty_problems += [RowProblem(rows + 1, row.line, scid, "empty_input", why) for scid in row_cids]
        for scid in row_cids:  # k requests per row with samples (pipeline/samples.py)
            if template is None:
                data = dumps_line(builder.request(scid, spec.chat(user), rf))
                sizes_append(len(data))
                if requests_out is not None:
                    lines.append(data)
            elif requests_out is None:
                try:
                    sizes_append(template.size(scid, user))
                except UnicodeEncodeError:  # lone surrogates: fail exactly as serialising the line does
                    template.line(scid, user)
                    raise
            else:
                data = template.line(scid, user)
                sizes_append(len(data))
                lines.append(data)
            texts.append(user)
            if keep_cids:
                cids.append(scid)
        rows += 1
        if len(texts) >= BLOCK_ROWS:
            blocks.flush()
    return rows


def _prepare(
    path: Path,
    profile: Profile,
    home: Home,
    *,
    requests_out: IO[bytes] | None = None,
    prices: PriceTable | None = None,
    file_hash: str | None = None,
    limits: Limits | None = None,
    reuse: ReuseProbeLike | None = None,
) -> Preparation:
    """Stream ``path`` once; count every request exactly; plan the chunks.

    When ``requests_out`` is given every request's JSONL line is written to it, in row order
    (including rows that turn out oversized: positions must line up with the plan).
    With ``reuse`` (a :class:`~batchgrader.pipeline.reuse.ReuseProbe`; needs ``requests_out``)
    each block's lines are shown to it first and only the rows it still sends are counted: a
    row answered from the cache counts 0 tokens and 0 bytes, a duplicate its leader's tokens.
    Raises :class:`InputError` for malformed input and :class:`ConfigError` for bad prompts.
    """
    path = Path(path)
    if reuse is not None and requests_out is None:
        raise ValueError("prepare(reuse=...) needs requests_out")
    file_hash = file_hash or file_sha256(path)
    builder = RequestBuilder(profile, home, file_hash)
    counting = _Counting(profile, builder.spec)
    if reuse is None:
        counting.pool()  # every row is counted
    context_window = _context_window(profile, prices)

    with open_checked(path, profile, builder) as reader, contextlib.closing(counting):
        prep = Preparation(
            path=path,
            fmt=reader.fmt,
            sha256=file_hash,
            profile=profile.name,
            model=profile.model,
            tokenizer=counting.tokenizer,
            columns=list(reader.columns),
            max_completion_tokens=profile.max_completion_tokens,
            response_format=profile.response_format,
        )
        prep.warnings.extend(getattr(reader, "warnings", ()))  # e.g. a workbook's charts the result may lose
        prep.text_encoding = getattr(reader, "encoding", None)  # text formats: UTF-8 or the configured fallback
        if not counting.tokenizer.known:
            prep.warnings.append(
                f"model {profile.model!r} is not known to tiktoken; counting with the default encoding "
                f"{counting.tokenizer.encoding} (counts may differ from what the provider bills)"
            )
        prep.samples = int(profile.get("samples") or 1)
        template = builder.line_template()
        # reuse keys each line from its custom_id and user message when the rest is the job's
        # template; with a schema per row, from the whole line
        with_cids = template is not None and row_formats(profile) is None
        blocks = _Blocks(prep, counting, reuse, requests_out, with_cids=with_cids)
        prep.rows = _read_rows(reader, prep, builder, template, blocks, requests_out, file_hash)
        blocks.finish()

    chunks, oversized = plan_chunks(prep.tokens, prep.sizes, limits or limits_for(profile, context_window), skip=prep.skipped)
    prep.chunks = chunks
    prep.problems = [
        RowProblem(row=o.position + 1, line=None, custom_id=None, code="request_too_large", message=o.reason) for o in oversized
    ]
    if builder.id_column is None:
        prep.problems = [RowProblem(p.row, p.line, default_custom_id(file_hash, p.row), p.code, p.message) for p in prep.problems]
    if prep.samples > 1:
        prep.problems = [sample_problem(p, prep.samples, file_hash) for p in prep.problems]
    if prep.empty_problems:
        prep.problems = sorted(prep.problems + prep.empty_problems, key=lambda p: p.row)
    return prep


def is_empty(row: Any, field: str) -> bool:
    """Whether ``row``'s ``field`` (the graded column, ``response_field``) is empty or only spaces."""
    return not text_of(row.values.get(field)).strip()


def sample_problem(p: RowProblem, k: int, file_hash: str) -> RowProblem:
    """A problem found at request position ``p.row - 1`` of a job with ``k`` samples per row, as
    the problem of that row's sample (its row number and, with default ids, the sample's id)."""
    row, j = divmod(p.row - 1, k)
    cid = sample_id(default_custom_id(file_hash, row + 1), j + 1) if p.custom_id else None
    return RowProblem(row + 1, p.line, cid, p.code, p.message)


def iter_lines(requests_file: Path) -> Iterator[bytes]:
    with open(requests_file, "rb") as f:
        yield from f


def oversized_positions(prep: Preparation) -> set[int]:
    return {p.row - 1 for p in prep.problems if p.code == "request_too_large"}


def unsent_positions(prep: Preparation) -> set[int]:
    """The request positions that are never sent: oversized, and empty rows under ``skip_empty``."""
    return oversized_positions(prep) | prep.skipped


def split_file(
    path: Path, profile: Profile, home: Home, out_dir: Path, prices: PriceTable | None = None
) -> tuple[Preparation, list[Path]]:
    """`bgctl split`: prepare, then write batch-ready chunk files into ``out_dir``: what the
    daemon would send for this file, so identical rows are written once (unless the profile
    turns reuse off), as ``bgctl count`` counts them.  Stored answers of earlier jobs are not
    consulted (a split is for the file alone); ``prep.duplicate_rows`` counts the rows left out.
    Files are numbered as the tables number chunks: ``NAME-chunk-0000.jsonl`` is chunk 0."""
    from batchgrader.core.rules.decide import reuse_allowed
    from batchgrader.pipeline.reuse import plan_reuse, replan

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{path.name}.requests.tmp"
    try:
        with open(tmp, "wb") as f:
            prep = prepare(path, profile, home, requests_out=f, prices=prices)
        skip = unsent_positions(prep)
        plan = plan_reuse(iter_lines(tmp), "split", skip, None, dedupe=True) if reuse_allowed(profile) else None
        if plan is not None and plan.followers:
            window = profile.context_window
            if window is None and prices is not None:
                price = prices.find(profile.model)
                window = price.context_window if price else None
            prep.chunks = replan(prep.tokens, prep.sizes, plan.keep, limits_for(profile, window))
            prep.duplicate_rows = len(plan.followers)
            keep = set(plan.keep)
            lines = (line for pos, line in enumerate(iter_lines(tmp)) if pos in keep)
            files = write_chunk_files(lines, prep.chunks, (), out_dir, Path(path).stem)
        else:
            files = write_chunk_files(iter_lines(tmp), prep.chunks, skip, out_dir, Path(path).stem)
    finally:
        if tmp.exists():
            os.unlink(tmp)
    return prep, files
