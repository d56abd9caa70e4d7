"""The bad inputs of the matrix, made from the golden events, and what each may end as.

Shared by the tests of each surface and by the property tests, so a case is written once:
a report is the golden `node_report` of tests/contracts (node-002 of cluster itest, as
tests/integration/test_dead_letters.py makes it fresh), changed in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final, TypeVar, get_args

from pydantic import ValidationError
from pydantic_core.core_schema import ErrorType

from common.deadletter import classify
from common.errors import PermanentError
from common.messaging import parse_event
from schemas.envelope import Envelope
from schemas.events.v1 import NodeReport
from tests.integration.test_dead_letters import fresh_report, gpu_mutated, mutated

E = TypeVar("E", bound=Envelope)

NODE: Final = "node-002"
OTHER_NODE: Final = "node-001"
EVENT_LIMIT: Final = 65_536  # WARDEN_MAX_MESSAGE_BYTES' default, the collector's limit

# What a refused message may be dead-lettered as when its bytes are the problem: the
# pipeline's own reasons (common/messaging.py), "invalid" for several kinds of schema error at
# once, or one of pydantic's error types (common/errors.py, describe_validation_error). Never
# `unhandled_error` (a bug, or an input nobody foresaw) or `retries_exhausted`.
PIPELINE_REASONS: Final = frozenset(
    {"oversize", "json_invalid", "key_missing", "key_mismatch", "unsupported_version",
     "invalid"})
SCHEMA_REASONS: Final = frozenset(get_args(ErrorType))
PARSE_REASONS: Final = PIPELINE_REASONS | SCHEMA_REASONS
# What the collector dead-letters a report as after it parsed (services/collector/handlers.py).
REPORT_REASONS: Final = PARSE_REASONS | {"unauthenticated_report", "implausible_seq",
                                         "unknown_node"}


def refusal(model: type[E], body: bytes, key: bytes | None, limit: int) -> str | None:
    """The reason the strict decoder dead-letters `body` with, or None if it is valid.

    Anything but a refusal (PermanentError or ValidationError) escapes, as it would escape the
    handler: the dead-letter policy would call it `unhandled_error`."""
    try:
        parse_event(model, body, key, limit)
    except (PermanentError, ValidationError) as err:
        disposition, reason, _ = classify(err)
        assert disposition == "dead_letter", (reason, disposition)
        return reason
    return None


def report_data(node: str = NODE) -> dict[str, Any]:
    """A fresh, valid report of `node` as JSON data (to be changed in one place)."""
    data: dict[str, Any] = json.loads(fresh_report(node).model_dump_json())
    return data


def encoded(data: object) -> bytes:
    return json.dumps(data).encode()


def good_report() -> bytes:
    return fresh_report().model_dump_json().encode()


def with_part(part: str, **changes: object) -> bytes:
    """A report whose first item of `part` (host, gpus, jobs) has `changes`."""
    data = report_data()
    target = data[part] if part == "host" else data[part][0]
    target.update(changes)
    return encoded(data)


def without(field: str) -> bytes:
    data = report_data()
    del data[field]
    return encoded(data)


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@dataclass(frozen=True)
class BadInput:
    """One bad message: the matrix case, what is wrong with it, its bytes and Kafka key, and
    the reason it must be dead-lettered (or rejected) with."""

    case: str
    what: str
    body: bytes
    key: bytes
    reason: str

    @property
    def label(self) -> str:
        return f"{self.case}: {self.what}"


def _bad_reports() -> list[BadInput]:
    good = good_report()
    key = NODE.encode()
    return [
        BadInput("B1", "truncated JSON", good[: len(good) // 2], key, "json_invalid"),
        BadInput("B1", "malformed JSON", b'{"event_id": "abc', key, "json_invalid"),
        BadInput("B2", "bytes that are not UTF-8", b"\xff\xfe\xfa", key, "json_invalid"),
        BadInput("B2", "a report with a byte that is not UTF-8 in a string",
                 good.replace(b"Simulated GPU", b"Simulated \xff GPU"), key, "json_invalid"),
        BadInput("B3", "no node_id", without("node_id"), key, "missing"),
        BadInput("B3", "no host metrics", without("host"), key, "missing"),
        BadInput("B4", 'utilisation "high"', gpu_mutated(utilization_pct="high"), key,
                 "float_type"),
        BadInput("B4", 'seq "42" (no coercion)', mutated(seq="42"), key, "int_type"),
        BadInput("B5", 'unknown field "cmd": "rm -rf /"', mutated(cmd="rm -rf /"), key,
                 "extra_forbidden"),
        BadInput("B5", "unknown field in a GPU", gpu_mutated(exec="reboot"), key,
                 "extra_forbidden"),
        BadInput("B6", "schema_version 99", mutated(schema_version=99), key,
                 "unsupported_version"),
        BadInput("B7", "NaN utilisation", gpu_mutated(utilization_pct="__NAN__"), key,
                 "finite_number"),
        BadInput("B7", "Infinity utilisation",
                 gpu_mutated(utilization_pct="__NAN__").replace(b"NaN", b"Infinity"), key,
                 "finite_number"),
        BadInput("B7", "1e309 utilisation",
                 gpu_mutated(utilization_pct="__NAN__").replace(b"NaN", b"1e309"), key,
                 "finite_number"),
        BadInput("B8", "negative utilisation", gpu_mutated(utilization_pct=-1.0), key,
                 "greater_than_equal"),
        BadInput("B8", "utilisation above 100 %", gpu_mutated(utilization_pct=100.5), key,
                 "less_than_equal"),
        BadInput("B8", "GPU memory used above its total", gpu_mutated(memory_used_mib=90_000),
                 key, "value_error"),
        BadInput("B8", "host memory used above its total",
                 with_part("host", memory_used_mib=70_000), key, "value_error"),
        BadInput("B9", "a 900 KiB report", mutated(pad="x" * 900 * 1024), key, "oversize"),
        BadInput("B9", "100,000 GPUs", encoded(report_data() | {
            "gpus": report_data()["gpus"] * 100_000}), key, "oversize"),
        BadInput("B11", "30,000-deep nesting within the size limit", nested(30_000), key,
                 "json_invalid"),
        BadInput("B17", "Kafka key node-001, subject node-002", good, OTHER_NODE.encode(),
                 "key_mismatch"),
        BadInput("B24", 'job_id "j1; rm -rf /"', with_part("jobs", job_id="j1; rm -rf /"), key,
                 "string_pattern_mismatch"),
        BadInput("B24", 'job_id "../../etc"', with_part("jobs", job_id="../../etc"), key,
                 "string_pattern_mismatch"),
        BadInput("B24", "job_id with a newline", with_part("jobs", job_id="j1\nreboot"), key,
                 "string_pattern_mismatch"),
    ]


BAD_REPORTS: Final = _bad_reports()


def cases(inputs: list[BadInput], case: str) -> list[BadInput]:
    """The inputs of one matrix case (at least one: a case never goes unchecked)."""
    found = [i for i in inputs if i.case == case]
    assert found, f"no input for {case}"
    return found


def check_golden_report_is_valid() -> NodeReport:
    """The report every bad one is made from parses: a bad one is bad for its change only."""
    report = parse_event(NodeReport, good_report(), NODE.encode(), EVENT_LIMIT)
    assert report.node_id == NODE
    return report
