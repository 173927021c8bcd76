"""The combination matrix's driver: one job (or the two a resubmission needs) of a combination of
features, run tick by tick through the real engine with the in-memory provider and a fake clock,
and the figures every reader shows of it, gathered for the invariants of
``tests/test_combinations.py``.

A combination names a value of each feature (:data:`FEATURES`); :func:`valid` says which
combinations a configuration can hold (the others are refused at load, which
``tests/test_routes.py`` checks).  :func:`run_combo` writes the configuration, drops the files,
ticks until every job has ended (answering every batch as it is created) and returns a
:class:`Outcome`: the provider's record of what was asked and paid, the jobs, and what `status`,
`report --json`, `costs --json`, `count --json` and the result file say.
"""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from allpairspy import AllPairs

from batchgrader.cli.render_status import duplicate_rows, reused_rows
from batchgrader.core.configuration.config import load_config
from batchgrader.core.host.control_files import pending_controls
from batchgrader.core.host.home import Home
from batchgrader.core.log.state import JobState
from batchgrader.daemon.control import apply_control
from batchgrader.daemon.engine import Engine
from batchgrader.daemon.shared import SharedWork
from batchgrader.pipeline.pricing import load_pricing
from batchgrader.provider.memory import MemoryProvider
from batchgrader.store.figures import figures_of
from batchgrader.store.leases import Leases
from batchgrader.store.readmodels import rebuild
from batchgrader.store.snapshot import take
from cli_fixtures import run
from ticks import SHARED_CONFIG, Rig, config_text, shared_engines

#: every feature of the matrix and its values
FEATURES: dict[str, list[Any]] = {
    "route": ["batch", "online", "flex", "auto"],
    "samples": [1, 3],
    "judges": [False, True],
    "preflight": [0, 3],
    "reuse": ["fresh", "resubmit", "changed", "duplicates"],
    "schema": [
        "none",
        "profile",
        "column",
    ],  # structured output: none, the profile's response_format, or each row's own (schema_column)
    "provider": ["openai", "anthropic", "gemini"],
    "edit": [False, True],  # the system prompt edited in config.yaml while the first job runs
    "fault": [
        False,
        True,
    ],  # the provider refuses one row's (first sample's) request: a failed row, or a sample left out of the vote
    "endpoint": ["chat", "responses"],  # an OpenAI profile's requests: chat completions, or the Responses API
    # the home's SQLite log and one daemon, or two daemons on one PostgreSQL store (store_url), each job
    # and the provider account under a lease (daemon/shared.py)
    "store": ["sqlite", "shared"],
}

# openai: a reasoning model with flex and no announced shutdown (gpt-5-mini shuts down on 2026-12-11)
MODELS = {"openai": "o4-mini", "anthropic": "claude-haiku-4-5", "gemini": "gemini-2.5-flash"}
# the other judge of a panel: on another provider than the combination's
OTHER = {"openai": "anthropic", "anthropic": "gemini", "gemini": "openai"}

ROWS = 6
SCHEMA = (
    "  type: object\n  properties:\n    reason: {type: string}\n    score: {type: integer}\n"
    "  required: [reason, score]\n  additionalProperties: false\n"
)
#: a row's own schema in a ``column`` combination: the same properties, the score a label
LABEL = "LABEL-SCHEMA"
LABEL_SCHEMA = {
    "type": "object",
    "description": LABEL,
    "properties": {"reason": {"type": "string"}, "score": {"type": "string", "enum": ["low", "high"]}},
    "required": ["reason", "score"],
    "additionalProperties": False,
}
SCHEMA_COLUMN = "schema"


@dataclass(frozen=True)
class Combo:
    route: str
    samples: int
    judges: bool
    preflight: int
    reuse: str
    schema: str
    provider: str
    edit: bool = False
    fault: bool = False
    endpoint: str = "chat"
    store: str = "sqlite"

    def __str__(self) -> str:
        return "-".join(
            f"{v}"
            for v in (
                self.route,
                f"k{self.samples}",
                "panel" if self.judges else "solo",
                f"pf{self.preflight}",
                self.reuse,
                {"none": "text", "profile": "schema", "column": "rowschema"}[self.schema],
                self.provider,
                *(["edited"] if self.edit else []),
                *(["fault"] if self.fault else []),
                *(["responses"] if self.endpoint == "responses" else []),
                *(["shared"] if self.store == "shared" else []),
            )
        )

    @property
    def providers(self) -> list[str]:
        return [self.provider, OTHER[self.provider]] if self.judges else [self.provider]


def valid(values: list[Any]) -> bool:
    """Whether a (partial, in :data:`FEATURES` order) combination can be configured: flex is
    OpenAI's alone, so neither another provider nor a panel (whose other judge is elsewhere)
    can take it; the Responses API needs an OpenAI profile."""
    names = list(FEATURES)[: len(values)]
    c = dict(zip(names, values))
    if c.get("route") == "flex" and (c.get("provider", "openai") != "openai" or c.get("judges")):
        return False
    if c.get("endpoint") == "responses":  # only an OpenAI profile has an endpoint to choose
        return c["provider"] == "openai" or (bool(c["judges"]) and OTHER[c["provider"]] == "openai")
    return True


def pairs_of(values: dict[str, Any]) -> set[tuple[str, Any, str, Any]]:
    names = list(FEATURES)
    return {(a, values[a], b, values[b]) for i, a in enumerate(names) for b in names[i + 1 :]}


def wanted_pairs() -> set[tuple[str, Any, str, Any]]:
    """Every pair of values of two features that some valid combination holds."""
    return set().union(*(pairs_of(dict(zip(FEATURES, v))) for v in itertools.product(*FEATURES.values()) if valid(list(v))))


#: combinations the issue reported broken, whose faults need three features at once (pairs alone may miss them)
REPORTED = [
    {
        "route": "batch",
        "samples": 1,
        "judges": False,
        "preflight": 3,
        "reuse": "fresh",
        "schema": "none",
        "provider": "openai",
        "edit": True,
    },
    {
        "route": "online",
        "samples": 1,
        "judges": False,
        "preflight": 0,
        "reuse": "fresh",
        "schema": "none",
        "provider": "openai",
        "edit": True,
    },
    {
        "route": "batch",
        "samples": 1,
        "judges": False,
        "preflight": 3,
        "reuse": "resubmit",
        "schema": "none",
        "provider": "openai",
        "edit": False,
    },
    {
        "route": "batch",
        "samples": 1,
        "judges": False,
        "preflight": 3,
        "reuse": "changed",
        "schema": "profile",
        "provider": "openai",
        "edit": False,
    },
    {
        "route": "batch",
        "samples": 3,
        "judges": True,
        "preflight": 0,
        "reuse": "fresh",
        "schema": "profile",
        "provider": "openai",
        "edit": False,
    },
    {
        "route": "online",
        "samples": 3,
        "judges": False,
        "preflight": 0,
        "reuse": "fresh",
        "schema": "none",
        "provider": "openai",
        "edit": False,
    },
    {
        "route": "batch",
        "samples": 1,
        "judges": False,
        "preflight": 3,
        "reuse": "duplicates",
        "schema": "none",
        "provider": "anthropic",
    },
    {  # a panel whose judges tie on some rows and one of whose rows a judge fails: every reader counts the same failures
        "route": "batch",
        "samples": 1,
        "judges": True,
        "preflight": 0,
        "reuse": "fresh",
        "schema": "none",
        "provider": "openai",
        "fault": True,
    },
]


def matrix() -> list[Combo]:
    """The all-pairs combinations: allpairspy's, then (its filter can leave pairs out) for each pair
    still missing, the valid combination that holds the most missing pairs; then :data:`REPORTED`."""
    combos = [dict(zip(FEATURES, v)) for v in AllPairs(list(FEATURES.values()), filter_func=valid)]
    missing = wanted_pairs() - set().union(*(pairs_of(c) for c in combos))
    candidates = [dict(zip(FEATURES, v)) for v in itertools.product(*FEATURES.values()) if valid(list(v))]
    while missing:
        best = max(candidates, key=lambda c: len(pairs_of(c) & missing))
        combos.append(best)
        missing -= pairs_of(best)
    return [Combo(**c) for c in combos + [r for r in REPORTED if r not in combos]]


def combo_config(c: Combo) -> str:
    """The config.yaml of a combination: profile ``p`` answers it (a panel ``p`` of two judges)."""
    route = "auto" if c.route == "auto" else c.route
    common = [f"    route: {route}"]
    if c.route == "auto":
        common.append("    deadline: 30m")  # sooner than a batch is expected to take: the route goes online
    lines = [f"preflight_rows: {c.preflight}", "max_row_retries: 0"]
    if c.schema != "none":
        lines.append("response_format:\n" + SCHEMA.rstrip("\n"))
    if c.schema == "column":
        lines.append(f"schema_column: {SCHEMA_COLUMN}")
    lines.append("profiles:")
    if c.judges:
        lines += ["  p:", "    judges: [j1, j2]", f"    samples: {c.samples}"]
        for i, prov in enumerate(c.providers, 1):
            lines += [f"  j{i}:", *_profile(c, prov), *common]
    else:
        lines += ["  p:", *_profile(c, c.provider), *common]
    return "\n".join(lines) + "\n"


def _profile(c: Combo, provider: str) -> list[str]:
    """A profile's provider, model, samples and (an OpenAI one's) endpoint."""
    endpoint = [f"    openai_endpoint: {c.endpoint}"] if provider == "openai" and c.endpoint == "responses" else []
    return [f"    provider: {provider}", f"    model: {MODELS[provider]}", f"    samples: {c.samples}", *endpoint]


def texts_of(c: Combo) -> tuple[list[str], list[str] | None]:
    """The rows of the first file and, for a resubmission, of the second."""
    first = [f"essay number {i}" for i in range(ROWS)]
    if c.reuse == "duplicates":
        first[4], first[5] = first[0], first[1]
        return first, None
    if c.reuse == "resubmit":
        return first, list(first)
    if c.reuse == "changed":
        second = list(first)
        second[2] = "essay number 2 rewritten"
        return first, second
    return first, None


#: the row whose first sample's request the provider refuses (the 4th: after a preflight's 3, not a duplicate)
FAULTY_ROW = 4


class RowFault(dict):
    """The memory provider's ``row_errors`` of a combination with a fault: the request of the
    4th row of any file (its custom id ends ``-4``; a row's other samples end ``-4-s<j>``) fails
    with a server error in a batch, and as a definite refusal on a synchronous route."""

    def __contains__(self, cid: object) -> bool:
        return isinstance(cid, str) and cid.endswith(f"-{FAULTY_ROW}")

    def __getitem__(self, cid: str) -> tuple[str, str]:
        if cid not in self:
            raise KeyError(cid)
        return ("invalid_request", "the provider refused this row")


def answer(schema: str):
    """The memory provider's answer to a request: text, or JSON that fits the schema the request
    carried (a row of a ``column`` combination may carry :data:`LABEL_SCHEMA`)."""

    def _answer(cid: str, body: Any) -> str:
        text = json.dumps(body, sort_keys=True)
        score = int(hashlib.sha256(text.encode()).hexdigest(), 16) % 5 + 1
        if schema == "none":
            return f"grade {score}"
        if LABEL in text:  # the row's own schema: a label
            return json.dumps({"reason": f"because {score}", "score": "high" if score > 2 else "low"})
        return json.dumps({"reason": f"because {score}", "score": score})

    return _answer


@dataclass
class Outcome:
    combo: Combo
    rig: Rig
    driver: Driver
    jobs: list[JobState] = field(default_factory=list)  # the top jobs (a panel, not its judges), in order
    status: list[dict[str, Any]] = field(default_factory=list)  # `status JOB --json` (the job's fold)
    listed: list[dict[str, Any]] = field(default_factory=list)  # its row in `status --json` (the read model)
    report: list[dict[str, Any]] = field(default_factory=list)
    costs: dict[str, Any] = field(default_factory=dict)
    count: dict[str, Any] = field(default_factory=dict)
    results: list[list[dict[str, str]]] = field(default_factory=list)


def request_key(cid: str, body: dict[str, Any]) -> str:
    """What makes a request distinct: its body and, for a row's k samples (identical bodies), the sample."""
    m = re.search(r"-s([0-9]+)$", cid)
    return hashlib.sha256(json.dumps([body, m.group(1) if m else "1"], sort_keys=True).encode()).hexdigest()


def file_text(c: Combo, texts: list[str]) -> str:
    """A CSV of ``texts``; a ``column`` combination's has each row's schema (every odd row a label's,
    the others empty: the profile's ``response_format``)."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    column = c.schema == "column"
    w.writerow(["id", "response", *([SCHEMA_COLUMN] if column else [])])
    for i, t in enumerate(texts):
        w.writerow([i, t, *([json.dumps(LABEL_SCHEMA) if i % 2 else ""] if column else [])])
    return out.getvalue()


def write_file(home: Home, c: Combo, name: str, texts: list[str]) -> None:
    folder = home.inbox / "p"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(file_text(c, texts))


class Driver:
    """Ticks a combination's rig, answering every batch as it is created; ``cancel_at``: at that
    tick, `bgctl cancel` the job then running (what was billed then is kept in ``billed_at_cancel``)."""

    def __init__(self, rig: Rig, cancel_at: int | None = None, edited: str | None = None) -> None:
        self.rig = rig
        self.edited = edited  # the configuration put in place after the first job's second tick
        self.ticks = 0
        self.cancel_at = cancel_at
        self.cancelled: str | None = None
        self.billed_at_cancel: int | None = None

    def billed_for(self, job_id: str) -> int:
        """The answers billed for job ``job_id`` (and its judges')."""
        return sum(1 for job, _cid, _body in self.rig.provider.billed if job == job_id or job.startswith(f"{job_id}-j"))

    def run_until_ended(self, name: str, limit: int = 80) -> JobState:
        for _ in range(limit):
            self.rig.tick(2.0)
            self.ticks += 1
            if self.ticks == 2 and self.edited is not None:  # a settings change while the job runs
                self.rig.reconfigure(self.edited)
            top = [j for j in self.rig.engine.ctx.state.jobs.values() if j.file == name and j.panel_of is None]
            if self.ticks == self.cancel_at and top and not top[-1].ended:
                res = run("cancel", top[-1].job_id)
                assert res.exit_code == 0, (res.output, res.exception)
                for path in pending_controls(self.rig.home):  # as the daemon applies them before a tick
                    assert apply_control(self.rig.engine, json.loads(path.read_text())) is None
                    path.unlink()
                self.cancelled, self.billed_at_cancel = top[-1].job_id, self.billed_for(top[-1].job_id)
                continue  # the batches in flight are left as they are until the daemon has acted on the cancel
            self.rig.provider.finish_all()
            if top and top[-1].ended:
                return top[-1]
        states = [(j.job_id, j.state) for j in self.rig.engine.ctx.state.jobs.values()]
        raise AssertionError(f"{name} did not end in {limit} ticks: {states}")


class SharedRig(Rig):
    """The matrix's ``shared`` store: two daemons, ``a`` and ``b``, on one PostgreSQL store and one
    home, each on its own connection and under its own leases (decided at the fake clock), with
    one provider account.  A tick is one tick of each, in turn; :attr:`engine` is ``a``, caught up
    with what ``b`` appended, so it shows the log's state."""

    def __init__(self, home: Home, pg_url: str, config: str = "") -> None:
        import psycopg

        from batchgrader.store.leases import RELEASED

        self.home, self.pg_url = home, pg_url
        home.config_file.write_text(self._config(config))
        self.provider = MemoryProvider()
        self.now = 1_000_000.0
        self.provider.now = self.now
        # as a daemon opens its store (store/backend.py open_store): the read models kept in each append
        self.stores, by_name = shared_engines(home, pg_url, self.provider, lambda: self.now, read_models=True)
        self.store = self.stores[0]
        self.engines = list(by_name.values())
        self.engine = self.engines[0]
        self._listen = psycopg.connect(pg_url, autocommit=True)  # announced releases (_handed_over)
        self._listen.execute(f"LISTEN {RELEASED}")

    def _config(self, config: str) -> str:
        return config_text(config) + f"store_url: {self.pg_url}\n" + SHARED_CONFIG

    def close(self) -> None:
        self._listen.close()
        for store in self.stores:
            store.close()

    def reconfigure(self, config: str) -> None:
        self.home.config_file.write_text(self._config(config))
        for engine in self.engines:
            engine.reload(load_config(self.home, environ={}), load_pricing())

    def tick(self, seconds: float = 1.0) -> list[str]:
        """One tick of each daemon; again, at the same time, while a tick handed a job over (an
        announced release wakes the daemons it is for: daemon/shared.py ``ReleaseWatch``; here
        both tick again), at most 4 rounds."""
        before = self.store.last_seq()
        self.now += seconds
        self.provider.now = self.now
        for _ in range(4):
            for engine in self.engines:
                engine.scan_requested = True  # as each daemon's inbox watcher would
                engine.tick(self.now)
            if not self._handed_over():
                break
        self.engine.ctx.catch_up()
        return [e.type for e in self.store.read(after=before)]

    def _handed_over(self) -> bool:
        """Whether a release was announced since the last call (``NOTIFY bg_leases``)."""
        return bool(list(self._listen.notifies(timeout=0.05, stop_after=100)))


def run_combo(home: Home, c: Combo, cancel_at: int | None = None, pg_url: str | None = None) -> Outcome:
    """Run combination ``c`` to its end and gather what every reader says of it (``pg_url``: an
    empty PostgreSQL database, for a ``shared`` store)."""
    if c.store == "shared":
        assert pg_url is not None, "a shared store needs a PostgreSQL database"
        rig: Rig = SharedRig(home, pg_url, combo_config(c))
    else:
        rig = Rig(home, combo_config(c))
    rig.provider.answer = answer(c.schema)
    if c.fault:
        rig.provider.row_errors = RowFault()
    edited = combo_config(c) + "system_prompt: Grade the answer strictly.\n" if c.edit else None
    out = Outcome(c, rig, Driver(rig, cancel_at, edited))
    first, second = texts_of(c)
    write_file(home, c, "a.csv", first)
    out.jobs.append(out.driver.run_until_ended("a.csv"))
    if second is not None:
        write_file(home, c, "b.csv", second)
        out.jobs.append(out.driver.run_until_ended("b.csv"))
    if c.store == "sqlite":
        rebuild(
            home.db
        )  # the read model, as the daemon's projector keeps it: `status` reads it (PostgreSQL's: kept in each append)
    listed = {r["job_id"]: r for r in json.loads(run("status", "--json").output)}
    for job in out.jobs:
        out.status.append(json.loads(run("status", job.job_id, "--json").output))
        out.listed.append(listed[job.job_id])
        out.report.append(json.loads(run("report", job.job_id, "--json").output))
        path = home.outbox / f"{job.file[:-4]}_results.csv"
        out.results.append(list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8")))) if path.exists() else [])
    out.costs = json.loads(run("costs", "--by", "job", "--json").output)
    return out


def count_of(home: Home, c: Combo, texts: list[str]) -> dict[str, Any]:
    """`bgctl count FILE --profile p --json` of a file of ``texts``, before it is sent."""
    path = home.root / "count.csv"
    path.write_text(file_text(c, texts))
    res = run("count", str(path), "--profile", "p", "--json")
    return json.loads(res.output)


#: the invariants every combination holds, by the name :func:`violations` reports a break under
INVARIANTS = {
    "paid once": "every distinct request answered and paid at most once, across all jobs, and each row's request once per job (a settings edit included)",
    "result tokens = bill": "the token columns of the results sum to the usage the provider billed",
    "figures agree": "status (the read model's row and the job's fold), report --json, costs, the result file, the daemon's summary and store/figures.py agree on rows answered and failed, tokens, cost and models",
    "count names the models": "count names every model that ran",
    "count bounds the bill": "count's estimate is an upper bound of the bill",
    "sources agree": "the result's answered_by and status count the same requests reused, duplicate, preflight, online and flex",
}


def billed_tokens(out: Outcome) -> tuple[int, int]:
    p = out.rig.provider
    return len(p.billed) * p.prompt_tokens, len(p.billed) * p.completion_tokens


def result_tokens(rows: list[dict[str, str]]) -> tuple[int, int]:
    """The sums of a result's token columns (a panel's: each judge's, ``input_tokens_<judge>``)."""

    def col(row: dict[str, str], name: str) -> int:
        return sum(int(v or 0) for k, v in row.items() if k == name or k.startswith(name + "_"))

    return sum(col(r, "input_tokens") for r in rows), sum(col(r, "output_tokens") for r in rows)


def costs_of(costs: dict[str, Any], job_id: str) -> dict[str, Any]:
    """``bgctl costs --by job``'s figures of a job: a panel's are its judges' rows, summed."""
    rows = [r for r in costs["rows"] if r["key"] == job_id or r["key"].startswith(f"{job_id}-j")]
    return {k: sum(r[k] for r in rows) for k in ("prompt_tokens", "completion_tokens", "cost_usd")}


def violations(out: Outcome, estimate: dict[str, Any]) -> dict[str, str]:
    """Each invariant (:data:`INVARIANTS`) the combination's run breaks, with what was seen."""
    broken: dict[str, str] = {}
    p = out.rig.provider
    paid = Counter(request_key(cid, body) for _job, cid, body in p.billed)
    twice = [cid for _job, cid, body in p.billed if paid[request_key(cid, body)] > 1]
    if twice:
        broken["paid once"] = f"requests paid more than once: {sorted(set(twice))}"
    per_row = Counter((job, cid) for job, cid, _body in p.billed)  # a row's (sample's) request, in its job
    again = sorted(f"{job}:{cid}" for (job, cid), n in per_row.items() if n > 1)
    if again:
        broken.setdefault("paid once", "")
        broken["paid once"] += f" rows paid more than once in their job: {again}"
    billed = billed_tokens(out)
    got = [result_tokens(rows) for rows in out.results]
    summed = (sum(g[0] for g in got), sum(g[1] for g in got))
    if summed != billed:
        broken["result tokens = bill"] = f"result token columns {summed}, billed {billed}"
    state = out.rig.engine.ctx.state
    for job, status, listed, report, rows in zip(out.jobs, out.status, out.listed, out.report, out.results):
        tin, tout = result_tokens(rows)
        failed = sum(1 for r in rows if r.get("error"))
        c = costs_of(out.costs, job.job_id)
        f = figures_of(state, state.jobs[job.job_id])  # store/figures.py: what every reader shows
        seen = {
            "rows": (listed["rows"], status["rows"], report["rows"]["total"], len(rows), f.rows),
            "failed": (listed["failed"], status["failed"], report["rows"]["failed"], failed, f.failed),
            "answered": (listed["succeeded"], status["succeeded"], report["rows"]["answered"], len(rows) - failed, f.answered),
            "tokens in": (
                listed["prompt_tokens"],
                status["prompt_tokens"],
                report["tokens"]["prompt"],
                c["prompt_tokens"],
                tin,
                f.billed.prompt_tokens,
            ),
            "tokens out": (
                listed["output_tokens"],
                status["output_tokens"],
                report["tokens"]["completion"],
                c["completion_tokens"],
                tout,
                f.billed.completion_tokens,
            ),
            "cost": tuple(
                round(x, 9)
                for x in (listed["cost_usd"], status["cost_usd"], report["cost_usd"]["billed"], c["cost_usd"], f.cost_usd)
            ),
            "models": (listed["model"], status["model"], report["job"]["model"], ", ".join(f.models)),
        }
        for what, values in seen.items():
            if len(set(values)) > 1:
                broken.setdefault("figures agree", "")
                broken["figures agree"] += f" {job.job_id} {what} (status, status JOB, report, costs/result, figures) = {values};"
    for job, status, rows in zip(out.jobs, out.status, out.results):
        if job.panel is not None:
            continue  # a panel's rows are answered by its judges' jobs (answered_by_<judge>)
        said = Counter(s for r in rows for s in (r.get("answered_by") or "").split("+") if s)
        sources = (status.get("route_summary") or {}).get("sources")
        shown = {"reused": reused_rows(status), "duplicate": duplicate_rows(status)}
        if sources is not None:
            shown.update({k: sources[k] for k in ("preflight", "online", "flex")})
        if out.combo.samples > 1:  # a row's answered_by lists how its samples were answered, once each
            said = Counter({name: 1 for name in said})
            shown = {name: min(n, 1) for name, n in shown.items()}
        for name, n in shown.items():
            if said.get(name, 0) != n:
                broken.setdefault("sources agree", "")
                broken["sources agree"] += f" {job.job_id} {name}: result {said.get(name, 0)}, status {n};"
    summary = {r.job_id: r for r in take(out.rig.engine.ctx.state).jobs}  # the daemon's summary (daemon --once)
    for job, status in zip(out.jobs, out.status):
        if abs(summary[job.job_id].cost_usd - status["cost_usd"]) > 1e-9 or summary[job.job_id].rows != status["rows"]:
            broken.setdefault("figures agree", "")
            broken["figures agree"] += f" {job.job_id} the daemon's summary: {summary[job.job_id]} against status;"
    models = {body["model"] for _job, _cid, body in p.billed}
    named = json.dumps(estimate)
    if not all(m in named for m in models):
        broken["count names the models"] = f"ran {sorted(models)}, count priced {estimate.get('model')}"
    bound = estimate.get("estimated_cost_usd", {}).get("max_total") or 0.0
    if bound < out.status[0]["cost_usd"] - 1e-12:
        broken["count bounds the bill"] = f"count's upper bound {bound} < billed {out.status[0]['cost_usd']}"
    return broken
