"""What each service sends, and the event schemas, in its AsyncAPI document:
`python -m schemas.asyncapi docs/asyncapi` (after `make asyncapi`).

`make asyncapi` writes a service's document from its FastStream subscribers, which tell only
what it receives. What a service sends is declared once, in the access table
(`schemas.access.GRANTS`) that the broker's ACLs come from too; this adds a `send` operation
for every topic a principal writes, a `receive` operation for every topic it reads that the
document lacks (the API and the alerts service have no FastStream document of their own),
and rewrites every event schema from the models. Running it again changes nothing.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

from pydantic.json_schema import models_json_schema

from schemas.access import GRANTS, Principal
from schemas.catalog import TOPIC_MODELS
from schemas.topics import Topic

SCHEMA_REF: Final = "#/components/schemas/{model}"
# Marks what this module declared, so that a second run replaces it instead of adding twice.
DECLARED: Final = "x-declared-in"
ACCESS_TABLE: Final = "schemas/access.py"
# The local broker every FastStream document names.
SERVERS: Final = {"development": {"host": "127.0.0.1:19092", "pathname": "",
                                  "protocol": "kafka", "protocolVersion": "auto"}}
Action = Literal["send", "receive"]


def documented_principals() -> list[Principal]:
    """The principals that write or read a topic: each has a document `<principal>.json`."""
    return [p for p, grant in GRANTS.items() if grant.writes or grant.reads]


def _discriminator_names(node: Any) -> Any:
    # AsyncAPI's schema object names the discriminating property with a string, where JSON
    # Schema (as pydantic writes it) has an OpenAPI-style object; FastStream converts it so.
    if isinstance(node, dict):
        return {key: (value["propertyName"] if key == "discriminator" and isinstance(value, dict)
                      else _discriminator_names(value)) for key, value in node.items()}
    if isinstance(node, list):
        return [_discriminator_names(item) for item in node]
    return node


def event_schemas() -> dict[str, dict[str, Any]]:
    """Every event model's schema (and its nested models') by the name AsyncAPI gives it."""
    _, top = models_json_schema([(model, "validation") for model in TOPIC_MODELS.values()],
                                ref_template=SCHEMA_REF)
    schemas: dict[str, dict[str, Any]] = _discriminator_names(top["$defs"])
    return schemas


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            yield ref.removeprefix("#/components/schemas/")
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _new_document() -> dict[str, Any]:
    return {"info": {}, "asyncapi": "3.0.0", "defaultContentType": "application/json",
            "servers": copy.deepcopy(SERVERS), "channels": {}, "operations": {},
            "components": {"messages": {}, "schemas": {}}}


def _drop_declared(document: dict[str, Any]) -> None:
    for section in ("channels", "operations"):
        document[section] = {key: value for key, value in document[section].items()
                             if DECLARED not in value}
    messages = document["components"]["messages"]
    document["components"]["messages"] = {key: value for key, value in messages.items()
                                          if DECLARED not in value}


def _received(document: dict[str, Any]) -> set[str]:
    """The topics the document's receive operations name."""
    topics = set()
    for operation in document["operations"].values():
        if operation.get("action") == "receive":
            channel = operation["channel"]["$ref"].removeprefix("#/channels/")
            topics.add(document["channels"][channel]["address"])
    return topics


def _declare(document: dict[str, Any], topic: Topic, action: Action, who: str) -> None:
    model = TOPIC_MODELS[topic].__name__
    name = f"{topic.value}:{'Publisher' if action == 'send' else 'Subscriber'}"
    message = "Message" if action == "send" else "SubscribeMessage"
    verb = "publishes" if action == "send" else "consumes"
    document["channels"][name] = {
        "address": topic.value,
        "description": f"{model} events the {who} {verb} (schema: docs/schemas/"
                       f"{topic.value}.json).",
        "servers": [{"$ref": "#/servers/development"}],
        "messages": {message: {"$ref": f"#/components/messages/{name}:{message}"}},
        "bindings": {"kafka": {"topic": topic.value, "bindingVersion": "0.4.0"}},
        DECLARED: ACCESS_TABLE,
    }
    document["operations"][name] = {
        "action": action, "channel": {"$ref": f"#/channels/{name}"},
        "messages": [{"$ref": f"#/channels/{name}/messages/{message}"}],
        DECLARED: ACCESS_TABLE,
    }
    document["components"]["messages"][f"{name}:{message}"] = {
        "title": f"{name}:{message}", "payload": {"$ref": SCHEMA_REF.format(model=model)},
        DECLARED: ACCESS_TABLE,
    }


def _refresh_schemas(document: dict[str, Any], models: dict[str, dict[str, Any]]) -> None:
    """Every event schema as the models make it now; the ones no message needs dropped."""
    current = document["components"]["schemas"]
    needed: list[str] = []
    pending = list(_refs(document["components"]["messages"]))
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.append(name)
        pending.extend(_refs(models.get(name, current.get(name))))
    # Existing entries keep their place, new ones follow in name order: a rerun is a no-op.
    order = [name for name in current if name in needed]
    order += sorted(name for name in needed if name not in current)
    document["components"]["schemas"] = {name: models.get(name, current.get(name))
                                         for name in order}


def complete(document: dict[str, Any] | None, principal: Principal) -> dict[str, Any]:
    """`document` (FastStream's, or None) with `principal`'s sends and any missing receives
    declared from the access table, and the event schemas of the models."""
    document = copy.deepcopy(document) if document is not None else _new_document()
    who = "agent" if principal is Principal.AGENT else f"{principal.value} service"
    document["info"] = {"title": f"ClusterWarden {principal.value}", "version": "1"}
    _drop_declared(document)
    grant = GRANTS[principal]
    received = _received(document)
    for topic in sorted(grant.reads - {Topic(t) for t in received}):
        _declare(document, topic, "receive", who)
    for topic in sorted(grant.writes):
        _declare(document, topic, "send", who)
    _refresh_schemas(document, event_schemas())
    return document


def render(document: dict[str, Any]) -> str:
    """A document as its file holds it (as FastStream writes it)."""
    return json.dumps(document, indent=2)


def write(folder: Path) -> list[Path]:
    """Complete the document of every principal that has topics, in `folder`."""
    written = []
    for principal in documented_principals():
        path = folder / f"{principal.value}.json"
        existing = json.loads(path.read_text()) if path.exists() else None
        path.write_text(render(complete(existing, principal)))
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m schemas.asyncapi DIR", file=sys.stderr)
        return 2
    for path in write(Path(argv[0])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
