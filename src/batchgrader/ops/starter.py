"""`bgctl init`: a new home's commented starter ``config.yaml`` and an example data file.

It asks nothing and overwrites nothing: a file that is already there is kept, and said so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from batchgrader.core.host.home import Home

EXAMPLE_NAME = "reviews.csv"  # the example shipped in batchgrader/data/examples

STARTER_CONFIG = """\
# BatchGrader configuration (written by `bgctl init`).
# The top level is the default profile; every key, its default and its environment variable:
# docs/configuration.md, or `bgctl config show` for the effective values and where they came from.

# The model every request of a job goes to (it needs a row in the pricing table).
model: gpt-5.4-mini
# provider: openai             # or azure, anthropic, gemini (docs/providers.md)
# The key: set OPENAI_API_KEY in the environment (or in <home>/secrets.env); never here.

# What to ask. {column} placeholders take each row's fields.
response_field: response        # the input column holding the text to grade
output_column: grade            # the result column that receives the answer
system_prompt: "You are a careful grader. Read the text and give a short, fair assessment."
# Each {column} must be a column of every file you grade (the example has id, product, response).
user_prompt: "Review: {response}\\nGrade the review from 1 (useless) to 5 (very helpful) and say why in one sentence."
# user_prompt: "Product: {product}\\nReview: {response}\\nGrade the review from 1 to 5."

# Structured answers: a JSON schema whose fields become their own result columns.
# response_format:
#   type: object
#   properties:
#     score: {type: integer}
#     reason: {type: string}
#   required: [score, reason]

# max_completion_tokens: 1000    # the output bound of each request (also bounds the estimate)
# temperature: 0

# Money: a job whose estimate exceeds this is held (bgctl retry JOB sends it anyway).
# max_cost_per_job_usd: 5.00
# daily_cost_limit_usd: 20.00

# Profiles: named overrides of the settings above, e.g. `bgctl grade FILE --profile careful`.
# profiles:
#   careful:
#     model: gpt-5.4
"""


def init_home(home: Home) -> dict[str, Any]:
    """Create ``home``'s folders, its starter ``config.yaml`` and ``examples/reviews.csv``, each
    only if absent.  ``{home, written: [paths], kept: [paths], example: path}``."""
    from importlib.resources import files

    from batchgrader.fsio import atomic_write_bytes

    home.ensure()
    example = home.root / "examples" / EXAMPLE_NAME
    wanted: list[tuple[Path, bytes]] = [
        (home.config_file, STARTER_CONFIG.encode("utf-8")),
        (example, (files("batchgrader") / "data" / "examples" / EXAMPLE_NAME).read_bytes()),
    ]
    written: list[str] = []
    kept: list[str] = []
    for path, data in wanted:
        try:
            atomic_write_bytes(path, data, overwrite=False)
        except FileExistsError:
            kept.append(str(path))
        else:
            written.append(str(path))
    return {"home": str(home.root), "written": written, "kept": kept, "example": str(example)}
