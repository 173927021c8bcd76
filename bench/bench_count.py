"""Request-preparation benchmark (issue 2): `bgctl count` against bare tiktoken, and its memory.

    .venv/bin/python bench/bench_count.py                  # 1,000,000 + 100,000 rows; figures into docs/benchmarks.md
    .venv/bin/python bench/bench_count.py --repeat 2       # each measurement twice, alternating (medians)
    .venv/bin/python bench/bench_count.py --rows 200000 --no-docs   # a quick look, docs untouched

One run:

1. generates (or reuses, when already generated with the same parameters) two CSV files
   ``id,response`` under ``bench/out/``: ``--rows`` rows (default 1,000,000) and ``--small-rows``
   rows (default 100,000, the first rows of the same stream).  Each text is 50-2,000 characters
   (uniform) of mixed ASCII, accented Latin, CJK and emoji, with some commas, quotes and line
   breaks, built from pre-made word pools with a seeded RNG (deterministic);
2. times ``bgctl --home <empty temp home> count FILE --json`` as a real subprocess, wall clock,
   and records its peak RSS (a fresh wrapper process runs the child and reports
   ``getrusage(RUSAGE_CHILDREN).ru_maxrss``, which then covers that one child only);
3. times the baseline: the same texts, read in blocks with the csv module and encoded with
   ``enc.encode_ordinary_batch(block, num_threads=os.cpu_count())`` (o200k_base); only the
   encoding is timed, the reading is reported separately;
4. prints rows/s and MB/s (MB = UTF-8 bytes of the response texts, 10^6) for both, the ratio
   (target >= 0.9) and the peak RSS at both sizes (targets: <= 400 MB at 1M rows and
   <= 1.3x the 100k figure);
5. records the figures in docs/benchmarks.md under "## Request preparation (issue 2)"
   (replacing only that section; other sections, such as "## Event log (issue 3)", are kept).

The generated files stay in bench/out/ (gitignored) and are reused by the next run; --clean
deletes them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchdocs  # noqa: E402
from benchdocs import write_section  # noqa: E402

sys.path.insert(0, str(ROOT / "src"))

from batchgrader.pipeline.prepare import BLOCK_ROWS  # noqa: E402
from batchgrader.pipeline.tokens import get_encoding  # noqa: E402

SECTION = "## Request preparation (`bench/bench_count.py`)"
OUT = ROOT / "bench" / "out"
GEN_VERSION = 1  # bump when the generator changes (the file name carries it)
MIN_CHARS, MAX_CHARS = 50, 2000
TARGET_RATIO = 0.9
TARGET_RSS_MB = 400.0
TARGET_RSS_GROWTH = 1.3
ENCODING = "o200k_base"

# --- data ----------------------------------------------------------------------------------------

ASCII_WORDS = (
    "the of and to in is it that was for on are as with his they at be this from have or by one had "
    "not but what all were when we there can an your which their said if do will each about how up out "
    "them then she many some so these would other into has more her two like him see time could no make "
    "than first been its who now people my made over did down only way find use may water long little "
    "very after words called just where most know get through back much before go good new write our "
    "used me man too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why things help put years different away again "
    "off went old number great tell men say small every found still between name should home big give "
    "air line set own under read last never us left end along while might next sound below saw something "
    "thought both few those always looked show large often together asked house don't world going want "
    "school important until form food keep children feet land side without boy once animals life enough "
    "took sometimes four head above kind began almost live page got earth need far hand high year mother "
    "light parts country father let night following picture being study second eyes soon times story boys "
    "since white days ever paper hard near sentence better best across during today others however sure "
    "means knew it's try told young miles sun ways thing whole hear example heard several change answer "
    "room sea against top turned learn point city play toward five using himself usually response grader "
    "evaluation rubric clarity accuracy score reasoning argument evidence coherent concise verbose "
    "API JSON HTTP v2 GPT-4o 2024 3.14 100% $19.99 e-mail user@example.com https://example.org/a?b=c "
    "C++ i.e. e.g. etc. O(n) x86_64 SQL tf-idf NaN 42 1,000 (see above) [citation needed] #hashtag @mention"
).split()

ACCENTED_WORDS = (
    "élève café naïve façade coöperate déjà-vu crème brûlée résumé fiancée über Straße Mädchen Größe "
    "schön Glück Fräulein müssen können Bär Tür Äpfel Öl Übung añadir niño señor mañana corazón canción "
    "acción pingüino jamón información educación está también después árbol lápiz São João coração "
    "não ação irmã pão órgão você família português Łódź źródło żółw gęś łąka ćma świat zażółć "
    "Dvořák Škoda čeština příliš žluťoučký kůň úpěl ďábelské ódy Tiếng Việt người được những "
    "không phải nhưng điều Đà Nẵng Hà Nội smörgåsbord fjäril Ångström Malmö København Ærø "
    "øl brød İstanbul çocuk güzel ağaç şehir ığdır ĳs œuvre cœur sœur ça où là très forêt hôtel "
    "île août garçon Noël maïs Zürich Genève Besançon Nîmes Mâcon"
).split()

CJK_WORDS = (
    "我们 你好 世界 今天 天气 很好 学习 中文 数据 模型 评估 回答 问题 准确 清楚 逻辑 论证 证据 结论 "
    "因为 所以 但是 如果 就是 已经 可以 没有 这个 那个 什么 怎么 为什么 时候 东西 朋友 老师 学生 "
    "電腦 網路 開發 軟體 資料庫 機器學習 人工智慧 自然語言處理 "
    "日本語 東京 大阪 ありがとう こんにちは すみません わかりました 評価 回答 質問 説明 "
    "カタカナ テスト データ モデル プログラム コンピューター ラーメン "
    "한국어 안녕하세요 감사합니다 서울 부산 평가 답변 질문 설명 데이터 모델 컴퓨터 사랑 "
    "。 ， 、 「 」 ！ ？ ：".replace(" ", " ")
).split()

EMOJI = (
    "😀 😂 🥲 😍 🤔 🙄 😭 😡 👍 👎 👏 🙏 💯 🔥 ✨ 🎉 🚀 ⭐ ❤️ 💔 ✅ ❌ ⚠️ 📈 📉 🤖 🧠 🐍 🦀 🍕 "
    "🍣 ☕ 🌍 🌧️ 🏳️‍🌈 👩‍💻 👨‍👩‍👧‍👦 👍🏽 👋🏿 🇫🇷 🇯🇵 🇧🇷 🇺🇦 🧑🏻‍🔬 🫠 🫶 🪐"
).split()

PUNCT = [".", ".", ".", ",", ",", "!", "?", ";", ":", " -", "..."]


def make_segments(rng: random.Random, n: int) -> list[str]:
    """A pool of ``n`` sentence-like segments, each mostly in one script, some mixed."""
    pools = [ASCII_WORDS, ACCENTED_WORDS, CJK_WORDS]
    segs = []
    for _ in range(n):
        main = rng.choices([0, 1, 2], weights=[5, 3, 2])[0]
        words = []
        for _ in range(rng.randint(3, 30)):
            r = rng.random()
            if r < 0.78:
                w = rng.choice(pools[main])
            elif r < 0.92:
                w = rng.choice(pools[rng.randrange(3)])
            elif r < 0.97:
                w = rng.choice(EMOJI)
            else:
                w = rng.choice(PUNCT)
            words.append(w)
        sep = "" if main == 2 and rng.random() < 0.7 else " "
        s = sep.join(words)
        r = rng.random()
        if r < 0.05:
            s = f'"{s}"'  # quotes: the CSV writer doubles them
        elif r < 0.08:
            s += "\n"  # a line break inside the field
        elif r < 0.1:
            s += "\r\n"
        segs.append(s[:1].upper() + s[1:] + rng.choice(PUNCT))
    return segs


def text_rows(seed: int):
    """Endless deterministic stream of response texts (50-2,000 characters)."""
    rng = random.Random(seed)
    segs = make_segments(rng, 40_000)
    mean = sum(map(len, segs)) / len(segs) + 1
    choices, randint = rng.choices, rng.randint
    while True:
        target = randint(MIN_CHARS, MAX_CHARS)
        text = " ".join(choices(segs, k=int(target / mean) + 2))
        while len(text) < target:
            text += " " + " ".join(choices(segs, k=4))
        # no trailing whitespace or line break (and never a lone CR from cutting a CRLF)
        text = text[:target].rstrip("\r\n ")
        yield text + "." * (target - len(text))


def data_path(rows: int, seed: int) -> Path:
    return OUT / f"count_{rows}_s{seed}_v{GEN_VERSION}.csv"


def generate(sizes: list[int], seed: int) -> dict[int, Path]:
    """Write one CSV per size (the first rows of one stream); reuse complete files."""
    paths = {n: data_path(n, seed) for n in sizes}
    todo = sorted(n for n, p in paths.items() if not p.exists())
    for n in sorted(set(sizes) - set(todo)):
        print(f"  reusing {paths[n].relative_to(ROOT)} ({paths[n].stat().st_size / 1e6:,.0f} MB)", flush=True)
    if not todo:
        return paths
    OUT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    files = {n: open(paths[n].with_suffix(".tmp"), "w", encoding="utf-8", newline="") for n in todo}
    try:
        writers = {n: csv.writer(f, lineterminator="\n") for n, f in files.items()}
        for w in writers.values():
            w.writerow(["id", "response"])
        stream = text_rows(seed)
        done = 0
        top = max(todo)
        while done < top:
            k = min(50_000, top - done)
            block = [(done + i + 1, next(stream)) for i in range(k)]
            for n, w in writers.items():
                if done < n:
                    w.writerows(block[: n - done])
            done += k
    finally:
        for f in files.values():
            f.close()
    for n in todo:
        paths[n].with_suffix(".tmp").rename(paths[n])
        print(f"  wrote {paths[n].relative_to(ROOT)} ({paths[n].stat().st_size / 1e6:,.0f} MB)", flush=True)
    print(f"  (generated in {time.perf_counter() - t0:.1f} s)", flush=True)
    return paths


# --- measurements ---------------------------------------------------------------------------------

# Runs one child and reports its wall time and peak RSS.  A fresh wrapper per measurement, so
# RUSAGE_CHILDREN holds exactly that child (and anything it waited for).
WRAPPER = r"""
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"wall_s": wall, "maxrss_kb": ru.ru_maxrss, "user_s": ru.ru_utime, "sys_s": ru.ru_stime,
           "rc": p.returncode, "stdout": p.stdout.decode("utf-8", "replace"),
           "stderr": p.stderr.decode("utf-8", "replace")[-4000:]}, sys.stdout)
"""


def bgctl() -> str:
    exe = Path(sys.executable).parent / "bgctl"
    if not exe.exists():
        exe = ROOT / ".venv" / "bin" / "bgctl"
    return str(exe)


def measure_count(path: Path, home: Path) -> dict:
    cmd = [bgctl(), "--home", str(home), "count", str(path), "--json"]
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], stdout=subprocess.PIPE, check=True)
    r = json.loads(out.stdout)
    if r["rc"] != 0:
        raise SystemExit(f"bgctl count failed (exit {r['rc']}):\n{r['stderr']}")
    r["summary"] = json.loads(r.pop("stdout"))
    r["rss_mb"] = r["maxrss_kb"] * 1024 / 1e6 if sys.platform != "darwin" else r["maxrss_kb"] / 1e6
    return r


def measure_baseline(path: Path, block_rows: int) -> dict:
    """Bare tiktoken on the same texts: stream blocks, encode each on all cores."""
    enc = get_encoding(ENCODING)
    threads = os.cpu_count() or 1
    enc.encode_ordinary_batch(["warm up"] * 4, num_threads=threads)
    read_s = encode_s = 0.0
    rows = tokens = nbytes = 0
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        col = next(reader).index("response")
        while True:
            t0 = time.perf_counter()
            block = [r[col] for _, r in zip(range(block_rows), reader)]
            t1 = time.perf_counter()
            read_s += t1 - t0
            if not block:
                break
            encoded = enc.encode_ordinary_batch(block, num_threads=threads)
            encode_s += time.perf_counter() - t1
            rows += len(block)
            tokens += sum(map(len, encoded))
            nbytes += sum(len(t.encode("utf-8")) for t in block)
            del encoded
    return {"rows": rows, "tokens": tokens, "text_bytes": nbytes, "read_s": read_s, "encode_s": encode_s, "threads": threads}


def python_start_s(runs: int = 3) -> float:
    """Time to start Python and import the CLI (part of every `bgctl` run)."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import batchgrader.cli.commands"], check=True)
        times.append(time.perf_counter() - t0)
    return min(times)


def machine() -> str:
    import tiktoken

    return benchdocs.machine(f"tiktoken {tiktoken.__version__}")


# --- report ---------------------------------------------------------------------------------------


def figures(r: dict) -> dict:
    big, small, bases = r["big"], r["small"], r["baselines"]
    rows, mb = bases[0]["rows"], bases[0]["text_bytes"] / 1e6
    f = {
        "rows": rows,
        "text_mb": mb,
        "count_wall": statistics.median(x["wall_s"] for x in big["runs"]),
        "base_encode": statistics.median(b["encode_s"] for b in bases),
        "base_read": statistics.median(b["read_s"] for b in bases),
        "rss_big": max(x["rss_mb"] for x in big["runs"]),
        "rss_small": max(x["rss_mb"] for x in small["runs"]),
        "small_wall": statistics.median(x["wall_s"] for x in small["runs"]),
    }
    f["count_rows_s"] = rows / f["count_wall"]
    f["count_mb_s"] = mb / f["count_wall"]
    f["base_rows_s"] = rows / f["base_encode"]
    f["base_mb_s"] = mb / f["base_encode"]
    f["ratio"] = f["count_rows_s"] / f["base_rows_s"]
    f["growth"] = f["rss_big"] / f["rss_small"]
    f["ok_ratio"] = f["ratio"] >= TARGET_RATIO
    f["ok_rss"] = f["rss_big"] <= TARGET_RSS_MB
    f["ok_growth"] = f["growth"] <= TARGET_RSS_GROWTH
    return f


def markdown(r: dict, notes: str) -> str:
    f = figures(r)
    big, small, bases = r["big"], r["small"], r["baselines"]
    s = big["runs"][0]["summary"]
    ok = lambda good: "meets the target" if good else "**misses the target**"  # noqa: E731
    n_big, n_small = big["rows"], small["rows"]
    threads = bases[0]["threads"]
    lines = [
        SECTION,
        "",
        f"Measured {r['date']} with `bench/bench_count.py` on {r['machine']}. The machine is a 2-vCPU VM "
        "shared with other work (see the load averages below), so single figures vary from run to run (by up to about 25 % in these runs).",
        "",
        f"Data: a CSV `id,response` of {n_big:,} rows ({big['file_mb']:,.0f} MB; {f['text_mb']:,.0f} MB of response text) "
        f"and one of its first {n_small:,} rows ({small['file_mb']:,.0f} MB), generated by the script (seed {r['seed']}): "
        f"each text {MIN_CHARS}-{MAX_CHARS:,} characters (uniform) of mixed ASCII, accented Latin, CJK and emoji, "
        "with commas, quotes and some line breaks inside fields. Default profile "
        f"({s['model']}, {s['encoding']}, the default system prompt and user template); the home is empty.",
        "",
        "Commands:",
        "",
        "```",
        f".venv/bin/python bench/bench_count.py{r['argv']}",
        f"bgctl --home <empty temp dir> count bench/out/{Path(big['path']).name} --json   # timed: wall clock of the whole process",
        f"enc.encode_ordinary_batch(block, num_threads={threads})   # baseline: o200k_base, blocks of {r['block_rows']:,} texts read with csv.reader; only this call is timed",
        "```",
        "",
        "### Throughput",
        "",
        "| | rows/s | MB/s (response text) | time |",
        "|---|---:|---:|---:|",
        f"| `bgctl count --json`, {n_big:,} rows, whole process | {f['count_rows_s']:,.0f} | {f['count_mb_s']:,.1f} | "
        f"{f['count_wall']:.1f} s |",
        f"| bare tiktoken `encode_ordinary_batch`, {threads} threads, same texts (encoding only) | "
        f"{f['base_rows_s']:,.0f} | {f['base_mb_s']:,.1f} | {f['base_encode']:.1f} s |",
        f"| (baseline's reading of the texts with `csv.reader`, not counted above) | | | {f['base_read']:.1f} s |",
        "",
        f"Ratio `bgctl count` / bare tiktoken: **{f['ratio']:.2f}** — target ≥ {TARGET_RATIO}, {ok(f['ok_ratio'])}. "
        f"The `bgctl` time includes starting Python and importing the CLI ({r['startup_s'] * 1000:.0f} ms), loading and "
        "verifying the rank file, hashing the file (sha256), parsing the CSV, building every request and its exact JSONL "
        f"size, counting, and planning the chunks. Counted: {s['requests']:,} requests, {s['input_tokens']:,} input tokens, "
        f"{len(s['chunks'])} chunks (baseline: {bases[0]['tokens']:,} tokens of bare text; the difference is the system "
        f"prompt, the template and the per-message overheads). At {n_small:,} rows `bgctl count` took "
        f"{f['small_wall']:.1f} s ({n_small / f['small_wall']:,.0f} rows/s).",
    ]
    if len(big["runs"]) > 1:
        lines += [
            "",
            f"{len(big['runs'])} runs of each at {n_big:,} rows, alternating `bgctl count` and the baseline "
            "(the throughput table shows the medians):",
        ]
        lines += [
            "",
            "| run | `bgctl count` wall (CPU: user + sys) | baseline encoding | ratio | load average before (1 min) |",
            "|---:|---:|---:|---:|---:|",
        ]
        for i, (c, b) in enumerate(zip(big["runs"], bases), 1):
            lines.append(
                f"| {i} | {c['wall_s']:.1f} s ({c['user_s'] + c['sys_s']:.0f} s) | {b['encode_s']:.1f} s | "
                f"{b['encode_s'] / c['wall_s']:.2f} | {c['load']:.1f} / {b['load']:.1f} |"
            )
        lines += ["", "The load averages include the benchmark's own previous measurement (2 busy threads)."]
    else:
        c = big["runs"][0]
        lines += [
            "",
            f"`bgctl count` used {c['user_s'] + c['sys_s']:.0f} s of CPU (user + sys) in {c['wall_s']:.1f} s. "
            f"Load average (1 min) before the `bgctl` run: {c['load']:.1f}; before the baseline: {bases[0]['load']:.1f} "
            "(these include the benchmark's own previous measurement).",
        ]
    lines += [
        "",
        "### Peak memory of `bgctl count` (peak RSS of the process: `getrusage(RUSAGE_CHILDREN)` in a fresh wrapper)",
        "",
        "| rows | peak RSS |",
        "|---:|---:|",
        f"| {n_small:,} | {f['rss_small']:.0f} MB |",
        f"| {n_big:,} | {f['rss_big']:.0f} MB |",
        "",
        f"Targets: ≤ {TARGET_RSS_MB:.0f} MB at 1M rows — {ok(f['ok_rss'])}; ≤ {TARGET_RSS_GROWTH}× the 100k figure "
        f"(here {f['growth']:.2f}×) — {ok(f['ok_growth'])}. Per row only two integers (tokens, bytes) are kept "
        "(`array('Q')`, 16 bytes per row: 16 MB at 1M rows), and the chunk planner (`splitting.plan_chunks`) builds two "
        "prefix-sum arrays of the same size while it runs; that is the growth from 100k to 1M rows. The rest, the same at "
        "both sizes, is the interpreter and CLI (about 25 MB), tiktoken's o200k_base tables (about 78 MB) and the blocks "
        "in flight (the block being read, the block being counted, and each counting thread's joined part and its tokens).",
    ]
    if notes:
        lines += ["", notes]
    lines.append("")
    return "\n".join(lines)


def write_docs(text: str) -> Path:
    return write_section(SECTION, text)


def load() -> float:
    return benchdocs.load_average()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the large file (default 1,000,000)")
    ap.add_argument("--small-rows", type=int, default=100_000, help="rows of the small file (default 100,000)")
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each measurement, `bgctl count` and the baseline alternating (medians; RSS: the maximum)",
    )
    ap.add_argument("--no-docs", action="store_true", help="print the docs section instead of writing docs/benchmarks.md")
    ap.add_argument("--clean", action="store_true", help="delete the generated files afterwards")
    ap.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="RESULTS_JSON",
        help="measure nothing: write the docs section from the raw results a previous run saved",
    )
    args = ap.parse_args()
    argv = "".join(f" {a}" for a in sys.argv[1:])
    if args.render:
        r = json.loads(args.render.read_text(encoding="utf-8"))
        text = markdown(r, "")
        print(text if args.no_docs else f"written to {write_docs(text)}")
        return

    r: dict = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "seed": args.seed,
        "block_rows": BLOCK_ROWS,
        "argv": argv,
    }
    print(f"machine: {r['machine']}", flush=True)
    paths = generate(sorted({args.rows, args.small_rows}), args.seed)
    r["startup_s"] = python_start_s()

    home = Path(tempfile.mkdtemp(prefix="bench-count-home-"))

    def count(n: int, i: int) -> dict:
        before = load()
        m = measure_count(paths[n], home)
        m["load"] = before
        print(
            f"  bgctl count, {n:,} rows, run {i + 1}: {m['wall_s']:.2f} s wall "
            f"(user {m['user_s']:.1f} s, sys {m['sys_s']:.1f} s), peak RSS {m['rss_mb']:.0f} MB, load {before:.1f}",
            flush=True,
        )
        got = m["summary"]["rows"]
        if got != n:
            raise SystemExit(f"bgctl counted {got:,} rows in {paths[n]}, expected {n:,}")
        return m

    try:
        r["small"] = {
            "rows": args.small_rows,
            "path": str(paths[args.small_rows]),
            "file_mb": paths[args.small_rows].stat().st_size / 1e6,
            "runs": [count(args.small_rows, i) for i in range(args.repeat)],
        }
        big_runs, bases = [], []
        for i in range(args.repeat):
            big_runs.append(count(args.rows, i))
            before = load()
            b = measure_baseline(paths[args.rows], BLOCK_ROWS)
            b["load"] = before
            print(
                f"  bare tiktoken, {b['rows']:,} rows, run {i + 1}: encode {b['encode_s']:.2f} s, read {b['read_s']:.2f} s, "
                f"{b['tokens']:,} tokens, load {before:.1f}",
                flush=True,
            )
            if b["rows"] != args.rows:
                raise SystemExit(f"baseline read {b['rows']:,} rows, expected {args.rows:,}")
            bases.append(b)
        r["big"] = {
            "rows": args.rows,
            "path": str(paths[args.rows]),
            "file_mb": paths[args.rows].stat().st_size / 1e6,
            "runs": big_runs,
        }
        r["baselines"] = bases
    finally:
        shutil.rmtree(home, ignore_errors=True)

    f = figures(r)
    yes = lambda good: "yes" if good else "NO"  # noqa: E731
    print()
    print(f"bgctl count  : {f['count_rows_s']:>9,.0f} rows/s {f['count_mb_s']:>8.1f} MB/s  ({f['count_wall']:.1f} s)")
    print(
        f"bare tiktoken: {f['base_rows_s']:>9,.0f} rows/s {f['base_mb_s']:>8.1f} MB/s  ({f['base_encode']:.1f} s encoding, "
        f"+{f['base_read']:.1f} s reading)"
    )
    print(f"ratio        : {f['ratio']:.3f}   (target >= {TARGET_RATIO}: {yes(f['ok_ratio'])})")
    print(f"peak RSS     : {f['rss_small']:.0f} MB at {args.small_rows:,} rows, {f['rss_big']:.0f} MB at {args.rows:,} rows")
    print(
        f"               <= {TARGET_RSS_MB:.0f} MB: {yes(f['ok_rss'])};  growth {f['growth']:.2f}x <= {TARGET_RSS_GROWTH}x: {yes(f['ok_growth'])}"
    )

    results = OUT / "bench_count_results.json"
    results.write_text(json.dumps(r, indent=1, default=str), encoding="utf-8")
    print(f"\nraw results in {results.relative_to(ROOT)}")
    text = markdown(r, "")
    if not args.no_docs:
        print(f"\nwritten to {write_docs(text)}")
    else:
        print()
        print(text)
    if args.clean:
        for p in paths.values():
            p.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
