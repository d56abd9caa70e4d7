"""The JSON Schema of every topic's event, one file per topic: `python -m schemas.export DIR`.

Made from the models, so the published files are exactly what a reader holds a message to;
tests/contracts/test_schema_files.py fails when the committed files (docs/schemas/) differ
from what the models make. The signed command payload, carried base64url inside a command,
gets a file of its own beside its topic's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Final

from schemas.catalog import TOPIC_MODELS
from schemas.envelope import SCHEMA_VERSION, Versioned
from schemas.events.v1 import CommandPayload
from schemas.topics import Topic

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SIGNED_PAYLOAD: Final = f"{Topic.NODE_COMMANDS.value}.payload"
NEWER_MINOR_NOTE: Final = (
    "A message whose schema_minor is above x-schema-minor may carry properties not listed "
    "here, at any depth: ignore them. At x-schema-minor or below, an unlisted property is an "
    "error (docs/events.md).")


def schema_document(name: str, model: type[Versioned]) -> dict[str, Any]:
    """The published schema of `model` under the file name `name` (without `.json`)."""
    # Validation mode: what a reader accepts (defaults are optional), not what one writer
    # happens to emit.
    schema = model.model_json_schema(mode="validation")
    return {"$schema": DIALECT, "$id": f"{name}.json", "$comment": NEWER_MINOR_NOTE,
            "x-schema-version": SCHEMA_VERSION, "x-schema-minor": model.SCHEMA_MINOR,
            **schema}


def documents() -> dict[str, dict[str, Any]]:
    """Every published schema by file name (without `.json`): one per topic, and the signed
    command payload."""
    docs = {topic.value: schema_document(topic.value, model)
            for topic, model in sorted(TOPIC_MODELS.items())}
    docs[SIGNED_PAYLOAD] = schema_document(SIGNED_PAYLOAD, CommandPayload)
    return docs


def render(document: dict[str, Any]) -> str:
    """A schema as its file holds it."""
    return json.dumps(document, indent=2) + "\n"


def write(folder: Path) -> list[Path]:
    """Write every schema into `folder` and remove the `.json` files no topic makes any more
    (the folder holds these files only). The paths written, sorted."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = documents()
    for stale in folder.glob("*.json"):
        if stale.stem not in docs:
            stale.unlink()
    written = []
    for name, document in docs.items():
        path = folder / f"{name}.json"
        path.write_text(render(document))
        written.append(path)
    return sorted(written)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m schemas.export DIR", file=sys.stderr)
        return 2
    for path in write(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
