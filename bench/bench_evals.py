"""`bgctl evals` figures: the local graders' throughput, and what an eval with two model criteria
(and a cosine criterion, embedded through OpenAI's Batch API) costs at batch price next to the
same eval sent synchronously.

1. Throughput: each metric's default variant (and string_check) over ``--rows`` generated
   (answer, reference) pairs of 8 to 30 words, rows per second.  A metric still running after
   ``--max-seconds`` stops there and its rate is over the rows it did (the table says how many).
2. Cost: the worked example's eval (tests/fixtures/evals/ticket_eval.json: a ``label_model`` and
   a ``score_model`` criterion on gpt-5.4-mini) imported over ``--items`` items made from its four,
   each job's queued file counted as `bgctl count` counts it (tiktoken, exact, plus each request's
   own schema's stated allowance), priced with the shipped catalogue at the Batch price and at the standard
   (synchronous) price, with the answers' output tokens taken as the length of the JSON answer.
   The two criteria are one job (an eval's model criteria on one model share a batch job).
3. Cosine: the same eval with its ``text_similarity`` criterion's metric set to ``cosine``: its
   embedding job (the input and the reference of every item, text-embedding-3-large) counted the
   same way, priced at the Batch and the standard price (embeddings bill input tokens only).

    .venv/bin/python bench/bench_evals.py [--rows 100000] [--max-seconds 120] [--items 10000] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from benchdocs import machine, publish  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "evals"
HEADING = "## OpenAI evals: local graders and the batch price"
WORDS = (
    "the a cat dog sat was sitting on mat laptop screen flickers please bring service desk replace display cable "
    "excel crashes report update office version open again monitor portal week vpn client password minutes reinstall"
).split()


def pairs(n: int, seed: int = 7) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ref = [rng.choice(WORDS) for _ in range(rng.randint(8, 30))]
        hyp = [w if rng.random() < 0.7 else rng.choice(WORDS) for w in ref]
        out.append((" ".join(hyp).capitalize() + ".", " ".join(ref).capitalize() + "."))
    return out


def throughput(rows: int, max_seconds: float) -> list[dict]:
    from batchgrader.pipeline.evals import graders

    data = pairs(rows)
    metrics = ["string_check", "fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_l"]
    out = []
    for m in metrics:
        if m == "string_check":
            fn = lambda a, b: graders.string_check("ilike", a, b)  # noqa: E731
            variant = "ilike"
        else:
            fn = graders.scorer(m)
            fn(*data[0])  # load the library (and WordNet) outside the timing
            variant = graders.DEFAULT_VARIANT[m]
        start = time.perf_counter()
        done = 0
        for a, b in data:
            fn(a, b)
            done += 1
            if done % 1000 == 0 and time.perf_counter() - start > max_seconds:
                break
        secs = time.perf_counter() - start
        out.append({"metric": m, "variant": variant, "rows": done, "seconds": secs, "rows_per_s": done / secs})
        print(f"{m:13} {variant:16} {done:>7} rows {secs:7.2f} s {done / secs:>10,.0f} rows/s", flush=True)
    return out


def _variant(rec: dict, i: int) -> dict:
    """Item ``i``: a fixture item whose ticket and reply carry its number (no two requests alike)."""
    out = json.loads(json.dumps(rec))
    out["item"]["ticket"] += f" (ticket {i})"
    answer = json.loads(out["sample"]["output_text"])
    answer["reply"] += f" Reference {i}."
    out["sample"]["output_text"] = json.dumps(answer)
    out["sample"]["choices"][0]["message"]["content"] = out["sample"]["output_text"]
    return out


def _items_file(path: Path, items: int) -> None:
    base = [json.loads(line) for line in (FIX / "ticket_items.jsonl").read_text().splitlines()]
    path.write_text("".join(json.dumps(_variant(base[i % len(base)], i)) + "\n" for i in range(items)))


def cost(items: int, cosine: bool = False) -> dict:
    from batchgrader.core.configuration.config import load_config
    from batchgrader.core.host.home import Home
    from batchgrader.evals import importer
    from batchgrader.ops.count import count_file
    from batchgrader.pipeline.pricing import billed_cost, load_pricing, standard_price
    from batchgrader.pipeline.tokens import get_encoding, tokenizer_for_model

    with tempfile.TemporaryDirectory(prefix="bench-evals-") as tmp:
        home = Home.resolve(Path(tmp) / "home").ensure()
        data = Path(tmp) / "items.jsonl"
        _items_file(data, items)
        ev_path = FIX / "ticket_eval.json"
        if cosine:
            ev = json.loads(ev_path.read_text())
            for c in ev["testing_criteria"]:
                if c["type"] == "text_similarity":
                    c["evaluation_metric"] = "cosine"
            ev_path = Path(tmp) / "cosine_eval.json"
            ev_path.write_text(json.dumps(ev))
        prepared = importer.prepare_import(home, ev_path, data_path=data, name="bench")
        kinds = {c.name: c.type for c in prepared.spec.criteria}
        written = importer.install(home, prepared, lambda: load_config(home, environ={}))
        config = load_config(home, environ={})
        prices = load_pricing()
        out = {"items": items, "jobs": []}
        for job, profile, path in zip(prepared.jobs, written["profiles"], written["queued"]):
            prof = config.profile(profile)
            summary = count_file(home, Path(path), prof, prices, sandbox=False)
            prompt = int(summary.get("input_tokens_estimate") or summary["input_tokens"])
            enc = get_encoding(tokenizer_for_model(prof.model, prof.default_encoding).encoding)
            label, score = len(enc.encode('{"result":"polite"}')), len(enc.encode('{"result":6}'))
            completion = (
                0
                if job.kind == "embeddings"
                else sum(label if kinds[r["criterion"]] == "label_model" else score for r in job.rows)
            )
            price = prices.get(prof.model)
            out["jobs"].append(
                {
                    "model": prof.model,
                    "kind": job.kind,
                    "criteria": [c.name for c in prepared.spec.criteria if c.index in job.criteria],
                    "requests": len(job.rows),
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "batch_usd": billed_cost(price, prompt, 0, completion),
                    "sync_usd": billed_cost(standard_price(price), prompt, 0, completion),
                }
            )
    out["batch_usd"] = sum(j["batch_usd"] for j in out["jobs"])
    out["sync_usd"] = sum(j["sync_usd"] for j in out["jobs"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--max-seconds", type=float, default=120.0)
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    import nltk
    import rapidfuzz
    import rouge_score  # noqa: F401
    import sacrebleu

    env = machine(
        f"rapidfuzz {rapidfuzz.__version__}, nltk {nltk.__version__}, sacrebleu {sacrebleu.__version__}, rouge-score 0.1.2"
    )
    rates = throughput(args.rows, args.max_seconds)
    c = cost(args.items)
    cc = cost(args.items, cosine=True)
    emb = next(j for j in cc["jobs"] if j["kind"] == "embeddings")
    lines = [
        HEADING,
        "",
        f"Command: `.venv/bin/python bench/bench_evals.py --rows {args.rows} --max-seconds {args.max_seconds:g} --items {args.items}`. "
        f"Machine: {env}. One process, one core.",
        "",
        f"**Local graders** (no model call): rows per second of each metric's default variant over {args.rows:,} generated "
        f"(answer, reference) pairs of 8 to 30 words; a metric still running after {args.max_seconds:g} s was stopped there, "
        "and its rate is over the rows it did.",
        "",
        "| metric | variant | rows | seconds | rows/s |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rates:
        lines.append(f"| `{r['metric']}` | `{r['variant']}` | {r['rows']:,} | {r['seconds']:.1f} | {r['rows_per_s']:,.0f} |")
    ratio = c["sync_usd"] / c["batch_usd"] if c["batch_usd"] else float("nan")
    lines += [
        "",
        f"**Two model criteria at batch price**: the worked example's eval (docs/howto-openai-evals.md: `label_model` Polite "
        f"and `score_model` Helpful, gpt-5.4-mini) over {c['items']:,} items (the fixture's four, each numbered), each job's queued file counted as `bgctl count` "
        "counts it (exact prompt tokens, plus the stated allowance of each request's own schema: its criterion's) and priced "
        "with the shipped catalogue; output "
        'tokens are the JSON answer\'s (`{"result":"polite"}`, `{"result":6}`).',
        "",
        "| job | criteria | requests | prompt tokens | output tokens | batch | synchronous |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for j in c["jobs"]:
        lines.append(
            f"| {j['model']} | {', '.join(j['criteria'])} | {j['requests']:,} | {j['prompt_tokens']:,} | {j['completion_tokens']:,} "
            f"| ${j['batch_usd']:.4f} | ${j['sync_usd']:.4f} |"
        )
    lines += [
        f"| **total** | | | | | **${c['batch_usd']:.4f}** | **${c['sync_usd']:.4f}** |",
        "",
        f"The same eval sent synchronously (as OpenAI's hosted graders, promptfoo or Langfuse run it) costs {ratio:.2f}x the batch price.",
        "",
        f"**A cosine criterion**: the same eval with its `text_similarity` criterion's metric set to `cosine` adds an "
        f"embedding job: {emb['requests']:,} `/v1/embeddings` requests (each item's input and reference) on {emb['model']}, "
        f"{emb['prompt_tokens']:,} input tokens counted as `bgctl count` counts them (no output tokens): "
        f"**${emb['batch_usd']:.4f}** at the Batch price, ${emb['sync_usd']:.4f} synchronously; with it the eval costs "
        f"${cc['batch_usd']:.4f} at batch price.",
    ]
    publish(HEADING, lines, args.write_docs)


if __name__ == "__main__":
    main()
