"""Pin the parts of OpenAI's OpenAPI spec the emulator is checked against (see docs/providers.md).

Usage: python tests/pin_openai_spec.py OPENAPI_YAML COMMIT DATE > src/batchgrader/emulator/openai_openapi.yaml
"""

from __future__ import annotations

import re
import sys
from typing import Any

import yaml

ROOTS = (
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateResponse",
    "Response",
    "CreateBatchRequest",
    "Batch",
    "ListBatchesResponse",
    "OpenAIFile",
    "ListFilesResponse",
    "DeleteFileResponse",
    "ErrorResponse",
)
#: schema keywords dropped (prose and vendor extensions), never property names
DROP = {"description", "title", "example", "examples", "deprecated"}


def _strip(node: Any, names: bool = False) -> Any:
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if not isinstance(node, dict):
        return node
    if names:  # the keys of `properties` are property names
        return {k: _strip(v) for k, v in node.items()}
    return {
        k: _strip(v, names=k in ("properties", "patternProperties"))
        for k, v in node.items()
        if k not in DROP and not k.startswith("x-")
    }


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        out = {node["$ref"].rsplit("/", 1)[1]} if isinstance(node.get("$ref"), str) else set()
        for v in node.values():
            out |= _refs(v)
        return out
    if isinstance(node, list):
        return set().union(*map(_refs, node)) if node else set()
    return set()


def pin(spec: dict[str, Any]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    keep: dict[str, Any] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = _strip(schemas[name])
        todo.extend(_refs(keep[name]) - keep.keys())
    return {
        "openapi": spec["openapi"],
        "info": {"version": spec["info"]["version"]},
        "components": {"schemas": dict(sorted(keep.items()))},
    }


def main() -> None:
    path, commit, date = sys.argv[1:4]
    with open(path, encoding="utf-8") as fh:
        spec = yaml.safe_load(fh)
    assert re.fullmatch(r"[0-9a-f]{40}", commit)
    pinned = pin(spec)
    print(f"# Pinned from https://github.com/openai/openai-openapi openapi.yaml (info.version {spec['info']['version']}),")
    print(f"# commit {commit} ({date}): only the schemas the chat-completions, responses, batch and file")
    print(f"# endpoints use ({', '.join(ROOTS)}) and those they reference, descriptions and x-* keys")
    print("# dropped. Regenerate with tests/pin_openai_spec.py; see docs/providers.md.")
    print(yaml.safe_dump(pinned, sort_keys=False, width=120), end="")


if __name__ == "__main__":
    main()
