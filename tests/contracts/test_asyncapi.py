"""The AsyncAPI documents (docs/asyncapi/) say what every service sends and receives, as the
access table declares it, with the event schemas the models make."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from schemas.access import GRANTS, Principal, writers
from schemas.asyncapi import complete, documented_principals, event_schemas, render
from schemas.catalog import TOPIC_MODELS
from schemas.topics import Topic

ROOT = Path(__file__).resolve().parents[2]
ASYNCAPI = ROOT / "docs" / "asyncapi"
REGENERATE = "make asyncapi, then python -m schemas.asyncapi docs/asyncapi"
# A batch subscriber takes the raw records and validates each itself (common.messaging).
RAW_BATCH = "OnReports:Message:Payload"
# Publishes in the code that the access table does not grant, each with why it stays so.
UNGRANTED_PUBLISHES: dict[tuple[Principal, Topic], str] = {}


def document(principal: Principal) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ASYNCAPI / f"{principal.value}.json").read_text())
    return data


def operations(doc: dict[str, Any], action: str) -> dict[str, str]:
    """The topic of each operation doing `action`, and the schema its message carries."""
    found = {}
    for operation in doc["operations"].values():
        if operation["action"] != action:
            continue
        channel = doc["channels"][operation["channel"]["$ref"].removeprefix("#/channels/")]
        message_ref = next(iter(channel["messages"].values()))["$ref"]
        message = doc["components"]["messages"][message_ref.rpartition("/")[2]]
        found[channel["address"]] = message["payload"]["$ref"].rpartition("/")[2]
    return found


@pytest.mark.parametrize("principal", documented_principals())
def test_the_document_is_complete_and_current(principal: Principal) -> None:
    path = ASYNCAPI / f"{principal.value}.json"
    assert path.exists(), f"{path.relative_to(ROOT)} is missing: {REGENERATE}"
    text = path.read_text()
    assert text == render(complete(json.loads(text), principal)), f"stale: {REGENERATE}"


@pytest.mark.parametrize("principal", documented_principals())
def test_a_service_sends_and_receives_what_the_access_table_grants(
        principal: Principal) -> None:
    doc = document(principal)
    grant = GRANTS[principal]
    sends, receives = operations(doc, "send"), operations(doc, "receive")
    assert set(sends) == {topic.value for topic in grant.writes}
    assert set(receives) == {topic.value for topic in grant.reads}
    assert sends == {t: TOPIC_MODELS[Topic(t)].__name__ for t in sends}
    assert all(schema in (TOPIC_MODELS[Topic(t)].__name__, RAW_BATCH)
               for t, schema in receives.items())


def test_only_the_principals_with_topics_have_documents() -> None:
    assert {p.stem for p in ASYNCAPI.glob("*.json")} == {
        p.value for p in documented_principals()}


def test_every_topic_has_a_sender_and_every_sender_is_documented() -> None:
    sent: dict[str, set[str]] = {}
    for principal in documented_principals():
        for topic in operations(document(principal), "send"):
            sent.setdefault(topic, set()).add(principal.value)
    assert all(writers(topic) for topic in Topic)
    assert sent == {topic.value: {p.value for p in writers(topic)} for topic in Topic}
    # Consumed by the alerts service only, and sent from three places.
    assert sent[Topic.OPS_ALERTS.value] == {"collector", "scheduler", "api"}
    assert Topic.OPS_ALERTS.value in operations(document(Principal.ALERTS), "receive")


def test_every_event_schema_in_the_documents_is_the_models() -> None:
    models = event_schemas()
    for principal in documented_principals():
        schemas = document(principal)["components"]["schemas"]
        assert {name: schemas[name] for name in schemas.keys() & models.keys()} == {
            name: models[name] for name in schemas.keys() & models.keys()}
        assert set(schemas) - set(models) <= {RAW_BATCH}


def published_topics(folder: Path) -> set[Topic]:
    """The topics named literally (`Topic.X`) as the first argument of a publish call."""
    topics: set[Topic] = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"publish", "publish_many", "publish_sealed"}
                    and node.args and isinstance(first := node.args[0], ast.Attribute)
                    and isinstance(first.value, ast.Name) and first.value.id == "Topic"):
                topics.add(Topic[first.attr])
    return topics


def test_what_the_code_publishes_is_granted_to_its_principal() -> None:
    # A lower bound (a topic travelling in a variable, as through an outbox, is not seen):
    # the secured broker's integration tests check the rest by refusing ungranted writes.
    ungranted = set()
    for principal in documented_principals():
        folder = ROOT / ("agent" if principal is Principal.AGENT
                         else f"services/{principal.value}")
        ungranted |= {(principal, topic) for topic in published_topics(folder)
                      if topic not in GRANTS[principal].writes}
    assert ungranted == set(UNGRANTED_PUBLISHES)


def test_the_consumers_guide_lists_every_topic_with_its_model_and_senders() -> None:
    rows = [[cell.strip(" `") for cell in line.split("|")[1:4]]
            for line in (ROOT / "docs" / "consuming.md").read_text().splitlines()
            if line.startswith("| `")]
    listed = {topic: (model, set(senders.split(", "))) for topic, model, senders in rows}
    assert listed == {topic.value: (TOPIC_MODELS[topic].__name__,
                                    {p.value for p in writers(topic)}) for topic in Topic}
