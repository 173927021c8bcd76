"""A batch's results: its answers made as requests are processed (drafted in the background on
the real clock, dated when they are due), spooled to disk, and its output and error files (shuffled
when configured) once it ends."""

from __future__ import annotations

import json
import random
from array import array
from pathlib import Path

from batchgrader.emulator import embeddings
from batchgrader.emulator.answers import chat_answer, responses_answer
from batchgrader.emulator.common import _hex, _now_int
from batchgrader.emulator.config import BATCH_EXPIRED_MESSAGE, EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT, THIRTY_DAYS
from batchgrader.emulator.files import Files
from batchgrader.emulator.state import State, _Batch, _empty_usage, _Lines, _Out, _Req
from batchgrader.emulator.validation import Validation, request_of

#: Stands for ``created`` in a drafted output line (the line is made before it is dated).
_CREATED_SLOT = 8_164_093_251_076_543_219
_CREATED_KEY = f'"created": {_CREATED_SLOT}'
_CREATED_AT_KEY = f'"created_at": {_CREATED_SLOT}'  # a Responses body's

_Draft = tuple[str, str | None, tuple[int, int, int, int] | None]


def _encode_draft(d: _Draft | None) -> bytes:
    """A draft as one line of text (JSON text holds no raw tab or newline): ``head`` alone for a
    failed request's line, ``head TAB tail TAB tokens``, or an empty line for none."""
    if d is None:
        return b"\n"
    head, tail, tokens = d
    if tail is None and tokens is not None:  # an undated answer (an embedding has no date)
        return f"{head}\t\t{tokens[0]},{tokens[1]},{tokens[2]},{tokens[3]}\n".encode()
    if tail is None:
        return head.encode() + b"\n"
    assert tokens is not None
    return f"{head}\t{tail}\t{tokens[0]},{tokens[1]},{tokens[2]},{tokens[3]}\n".encode()


def _decode_draft(raw: bytes) -> _Draft | None:
    text = raw.decode().rstrip("\n")
    if not text:
        return None
    parts = text.split("\t")
    if len(parts) == 1:
        return text, None, None
    head, tail, tok = parts
    p, c, o, r = (int(x) for x in tok.split(","))
    return head, (tail or None), (p, c, o, r)


class _Drafts:
    """A running batch's answers drafted in the background, spooled to a file line by line in
    request order; ``ready`` lines are written out (the drafter's thread raises it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready = 0
        self._lines: _Lines | None = None

    def take(self, i: int) -> _Draft | None:
        """Draft ``i`` (below ``ready``; never one before the last taken), None if it was skipped."""
        if self._lines is None:
            self._lines = _Lines(self.path)
        return _decode_draft(self._lines.get(i))

    def discard(self) -> None:
        if self._lines is not None:
            self._lines.close()
        self.path.unlink(missing_ok=True)


#: Drafted lines written out between two raises of ``_Drafts.ready``.
DRAFT_FLUSH = 64


def _shuffled(src: Path, offsets: array[int], order: list[int], dest: Path) -> Path:
    """``src``'s lines (starting at ``offsets``) in ``order``, written to ``dest``."""
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        for k in order:
            fin.seek(offsets[k])
            fout.write(fin.readline())
    src.unlink()
    return dest


class Results:
    """A running batch's answers, made as they are due (drafted in the background on the real
    clock) and spooled to disk, and its output and error files once it ends."""

    def __init__(self, state: State, validation: Validation, files: Files) -> None:
        self.state = state
        self.validation = validation
        self.files = files

    def draft(self, req: _Req, model: str, bid: str, endpoint: str = "") -> _Draft:
        """A request's output line, undated: ``(head, tail, tokens)``; the line dated ``created`` is
        ``head + str(created) + tail`` (a failed request's line has no date: ``(line, None, None)``).
        ``tokens`` is (input, cached, output, reasoning)."""
        line_id = "batch_req_" + _hex(bid, req.custom_id, n=32)
        request_id = "req_" + _hex("req", bid, req.custom_id, n=32)
        if req.fail_status is not None:
            line = json.dumps(
                {
                    "id": line_id,
                    "custom_id": req.custom_id,
                    "response": {"status_code": req.fail_status, "request_id": request_id, "body": req.fail_body},
                    "error": None,
                }
            )
            return line, None, None
        if endpoint == EMBEDDINGS_ENDPOINT:
            body = embeddings.answer(req, model)
            line = json.dumps(
                {
                    "id": line_id,
                    "custom_id": req.custom_id,
                    "response": {"status_code": 200, "request_id": request_id, "body": body},
                    "error": None,
                }
            )
            return line, None, (req.prompt_tokens, 0, 0, 0)  # undated: an embedding has no created
        responses = endpoint == RESPONSES_ENDPOINT
        body = (responses_answer if responses else chat_answer)(self.state.cfg, req, model, _CREATED_SLOT)
        u = body["usage"]
        tokens = (
            (u["input_tokens"], u["input_tokens_details"]["cached_tokens"], u["output_tokens"])
            + (u["output_tokens_details"]["reasoning_tokens"],)
            if responses
            else (
                u["prompt_tokens"],
                u["prompt_tokens_details"]["cached_tokens"],
                u["completion_tokens"],
                u["completion_tokens_details"]["reasoning_tokens"],
            )
        )
        line = json.dumps(
            {
                "id": line_id,
                "custom_id": req.custom_id,
                "response": {"status_code": 200, "request_id": request_id, "body": body},
                "error": None,
            }
        )
        # The first '"created": N' outside a string (a string holds no bare quote) is the body's.
        key = _CREATED_AT_KEY if responses else _CREATED_KEY
        head, tail = line.split(key, 1)
        return head + key.split(" ")[0] + " ", tail, tokens

    def start(self, b: _Batch) -> None:
        """On the real clock, draft the answers of a batch that starts running in the background,
        in request order, so that the look at the batch that finds requests processed only dates
        their lines (``answer_upto``) instead of generating them in a client's request."""
        plan = b.plan
        if not self.state.real_clock or self.state.cfg.answer_fn is not None or not plan or b.input_path is None:
            return  # a test's clock or answer function: answers are made in place, as they are due
        drafts = _Drafts(self.state.scratch / f"{b.obj['id']}.drafts")
        drafts.path.touch()
        b.drafts = drafts
        model = b.obj.get("model") or ""
        bid = b.obj["id"]
        source = b.input_path

        def draft_all() -> None:
            lines = _Lines(source)
            try:
                with open(drafts.path, "wb") as out:
                    for i in range(plan.n):
                        if i % 256 == 0 and (b.drafts is not drafts or b.status not in ("in_progress", "finalizing")):
                            return  # done with, cancelled or expired: the rest is not needed
                        raw = lines.get(i)
                        d = self.draft(request_of(plan, i, raw), model, bid, plan.endpoint) if i >= b.answered else None
                        out.write(_encode_draft(d))
                        if (i + 1) % DRAFT_FLUSH == 0:
                            out.flush()
                            drafts.ready = i + 1
                    out.flush()
                    drafts.ready = plan.n
            finally:
                lines.close()

        self.state.answerer.submit(draft_all)

    def answer_upto(self, b: _Batch, processed: int, t: float, drafted_only: bool = False) -> None:
        """Generate the answers of the first ``processed`` requests that have none yet, as of time
        ``t`` (their ``created``), and spool them to disk (``b.out``).  Called while the batch
        runs, so that, as at a real provider, the answers exist by the time the batch ends and the
        retrieve that finds it done does not generate them all at once.  ``drafted_only`` (a look
        at a running batch): only the answers drafted in the background are dated, none is made in
        the client's request; the rest are dated by a later look, or made when the batch ends."""
        plan = self.validation.ensure_plan(b)
        processed = min(processed, plan.n)
        drafts = b.drafts
        if drafted_only and drafts is not None:
            processed = max(b.answered, min(processed, drafts.ready))
        if processed <= b.answered:
            return
        if b.out is None:
            b.out = _Out(self.state.scratch, b.obj["id"])
        model = b.obj.get("model") or ""
        created = str(_now_int(t))
        bid = b.obj["id"]
        for i in range(b.answered, processed):
            # drafted in the background (real clock), or made now: the same line either way
            d = drafts.take(i) if drafts is not None and i < drafts.ready else None
            head, tail, tokens = d if d is not None else self.draft(self.validation.request(b, i), model, bid, b.obj["endpoint"])
            b.out.add(head if tail is None else head + created + tail, tokens)
        b.answered = processed
        if drafts is not None and processed >= plan.n:
            drafts.discard()
            b.drafts = None  # all used

    def write(self, b: _Batch, processed: int, t: float, *, expired: bool) -> None:
        plan = self.validation.ensure_plan(b)
        created = _now_int(t)
        self.answer_upto(b, processed, t)
        if b.out is None:
            b.out = _Out(self.state.scratch, b.obj["id"])
        out = b.out
        if expired:
            for i in range(processed, plan.n):
                req = self.validation.request(b, i)
                line = json.dumps(
                    {
                        "id": "batch_req_" + _hex(b.obj["id"], req.custom_id, n=32),
                        "custom_id": req.custom_id,
                        "response": None,
                        "error": {"code": "batch_expired", "message": BATCH_EXPIRED_MESSAGE},
                    }
                )
                out.add(line, None)
        out.close()
        prompt, cached, completion, reasoning = out.usage
        usage = _empty_usage()
        usage["input_tokens"] = prompt
        usage["input_tokens_details"]["cached_tokens"] = cached
        usage["output_tokens"] = completion
        usage["output_tokens_details"]["reasoning_tokens"] = reasoning
        usage["total_tokens"] = prompt + completion
        rng = random.Random(f"shuffle:{self.state.cfg.seed}:{b.obj['id']}")
        bid = b.obj["id"]
        counts = []
        for (path, offsets), (suffix, key) in zip(
            zip(out.paths, out.offsets), (("output", "output_file_id"), ("error", "error_file_id"))
        ):
            counts.append(len(offsets))
            if not offsets:
                continue
            if self.state.cfg.shuffle_output:
                order = list(range(len(offsets)))
                rng.shuffle(order)
                if len(order) > 1 and all(k == i for i, k in enumerate(order)):  # never hand back input order by luck
                    order.append(order.pop(0))
                path = _shuffled(path, offsets, order, path.with_suffix(".shuffled"))
            f = self.files.add_file(f"{bid}_{suffix}.jsonl", path, "batch_output", created, created + THIRTY_DAYS)
            b.obj[key] = f.obj["id"]
        b.obj["request_counts"] = {"total": b.n, "completed": counts[0], "failed": counts[1]}
        b.obj["usage"] = usage
        out.discard()
        b.out = None
        if b.drafts is not None:
            b.drafts.discard()
        b.drafts = None
        if b.inputs is not None:
            b.inputs.close()
            b.inputs = None
        b.plan = None  # ended: its counts are in its object; the plan is only needed while it runs
