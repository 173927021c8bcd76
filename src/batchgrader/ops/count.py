"""`bgctl count`: a file's requests, exact input tokens, chunk plan and estimated cost, with no
API call, for one profile or for a judge panel.

A panel (``judges``) runs no model of its own: each judge's job runs on the panel's input with the
judge's model, prompts, output bound and samples (the panel's ``samples`` unless the judge's own
profile sets them: :func:`~batchgrader.core.rules.panel.judge_profile`).  So ``count --profile PANEL``
counts the file once per judge, as that judge's job will be prepared, and the panel's estimate is
the sum of its judges' (:func:`count_panel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchgrader.core.configuration.config import Config, Profile
from batchgrader.core.rules.panel import judge_profile
from batchgrader.store.figures import add_estimates


def count_file(home: Any, file: Path, prof: Profile, prices: Any, *, sandbox: bool) -> dict[str, Any]:
    """The count of ``file`` under the profile ``prof`` (``bgctl count``'s summary): stored
    answers and identical rows apart, the schema's learned overhead, and the provider's exact
    counts where it has them."""
    from batchgrader.pipeline.answerkey import provider_id_of
    from batchgrader.pipeline.requests import schema_sha256
    from batchgrader.provider.counting import OFFLINE_EXACT, CountCache, count_hook, counter_for
    from batchgrader.store.answers import count_preview
    from batchgrader.store.log_queries import learned_schema_overhead

    learned = learned_schema_overhead(home, prof.model, schema_sha256(prof.response_format), provider_id_of(prof, sandbox))
    hook, cache = None, None
    if prof.provider not in OFFLINE_EXACT:  # the counting hook: the provider's own exact counts
        counter = counter_for(prof.provider, prof)
        cache = CountCache.of_home(home) if counter is not None else None
        hook = count_hook(counter, cache)
    try:
        summary = count_preview(
            home,
            file,
            prof,
            prices,
            sandbox=sandbox,
            schema_overhead=learned["per_request"] if learned else None,
            count_exact=hook,
        )
    finally:
        if cache is not None:
            cache.close()
    if learned and summary.get("schema"):
        summary["schema"]["learned_from"] = {k: learned[k] for k in ("job_id", "ts", "requests")}
    # tiktoken is exact for OpenAI models; for another provider the counting hook decided
    summary.setdefault("input_tokens_exact", prof.provider in OFFLINE_EXACT)
    summary["provider"] = prof.provider
    return summary


def panel_judge_profiles(config: Config, panel: Profile) -> list[Profile]:
    """Each judge's profile of the panel ``panel``, as its job will run (with the panel's samples)."""
    samples = int(panel.values.get("samples") or 1)
    return [judge_profile(config.profile(name), samples) for name in panel.values.get("judges") or ()]


def count_panel(home: Any, file: Path, config: Config, panel: Profile, prices: Any, *, sandbox: bool) -> dict[str, Any]:
    """``bgctl count --profile PANEL``: each judge's count (``judges``, in the panel's order, each
    :func:`count_file`'s summary with ``judge``: the judge's profile and ``samples``), the models
    that run (``models``), and the panel's sums: ``requests``, ``input_tokens`` and
    ``estimated_cost_usd`` (``input``, ``max_output``, ``max_total``; null when a judge's model
    has no price).  ``row_errors`` and ``pricing_error`` are each judge's, named."""
    judges = []
    for prof in panel_judge_profiles(config, panel):
        summary = count_file(home, file, prof, prices, sandbox=sandbox)
        summary.update(judge=prof.name, samples=int(prof.values.get("samples") or 1))
        judges.append(summary)
    total = add_estimates([j.get("estimated_cost_usd") for j in judges])  # as a panel job's estimate is summed
    problems = [f"judge {j['judge']} ({j['model']}): {j['pricing_error']}" for j in judges if j.get("pricing_error")]
    return {
        "file": str(file),
        "profile": panel.name,
        "panel": True,
        "rows": judges[0]["rows"] if judges else 0,
        "models": [j["model"] for j in judges],
        "requests": sum(int(j["requests"]) for j in judges),
        "input_tokens": sum(int(j.get("input_tokens_estimate", j["input_tokens"])) for j in judges),
        "estimated_cost_usd": total,
        "judges": judges,
        "row_errors": [{**e, "judge": j["judge"]} for j in judges for e in j.get("row_errors") or ()],
        "pricing_error": "; ".join(problems) or None,
    }
