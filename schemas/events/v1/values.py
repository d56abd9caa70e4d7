"""Value types that more than one family of v1 events uses (bounds, modes, ML inputs)."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, Field, StringConstraints

from schemas.envelope import ShortText

Percent = Annotated[float, Field(ge=0.0, le=100.0)]
MiB = Annotated[int, Field(ge=0, le=4_194_304)]
Count = Annotated[int, Field(ge=0, le=2**53)]
Seq = Annotated[int, Field(ge=0, le=2**63 - 1)]
REPORT_CLOCK_SKEW_S: Final = 30.0
"""How far ahead of the collector's clock a report may be, its timestamp and its seq alike
(an agent numbers its reports at least by its clock in milliseconds): beyond it, a timestamp
is skewed and a seq implausible."""
Priority = Annotated[int, Field(ge=0, le=9, description="0 is the most urgent.")]
StepIndex = Annotated[int, Field(ge=0, le=63)]

NodeMode = Literal["active", "draining", "offline"]
NeedKind = Literal["scale_out", "scale_in", "load_balance", "offline", "online",
                   "restart_agent"]
OutputValue = ShortText | int | float | bool

# A host name (RFC 1123 labels), an IPv4 address, or an IPv6 address in brackets; then a port.
_HOST_NAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                        r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def check_probe_address(value: str) -> str:
    """`host:port` where a peer's probe listener answers; anything else is refused.

    Strict because it travels from one node to the centre and on to other nodes, which
    connect to it: a value that is not plainly an address must never get that far.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65_536 or port != str(int(port)):
        raise ValueError("a probe address is host:port with a port 1-65535")
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError("an IPv6 host goes in brackets")
        ipaddress.IPv6Address(host[1:-1])  # ValueError if it is not one
    elif host.replace(".", "").isdigit():
        ipaddress.IPv4Address(host)
    elif not _HOST_NAME.match(host):
        raise ValueError("not a host name or IP address")
    if host in ("0.0.0.0", "[::]"):
        raise ValueError("a wildcard address cannot be connected to: advertise a real one")
    return value


ProbeAddress = Annotated[str, StringConstraints(min_length=3, max_length=262),
                         AfterValidator(check_probe_address)]

# ML task routing
ModelVersion = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,32}$")]
Attempt = Annotated[int, Field(ge=1, le=16, description="1 for the first try of a task.")]
# A task's input: numbers only (the digits models take 64 pixel counts 0..16). Bounded so a
# signed command carrying it stays far below the agents' 16 KiB command limit.
MlInput = Annotated[list[Annotated[float, Field(ge=-1e6, le=1e6)]],
                    Field(min_length=1, max_length=1_024)]
# Why an ML attempt failed, in the words of the selector's attribution
# (services/router/policy/attribution.py):
# model_fault counts against the model, node_fault against the node, timeout and unknown
# against both; bad_input, capacity and deadline_too_short against neither. Two more never
# reach the statistics: unavailable (the model was not ready there, or the agent refused the
# command: the router's view was stale) and no_candidates (nothing served the task type).
InferenceCause = Literal["model_fault", "node_fault", "timeout", "unknown", "bad_input",
                         "capacity", "deadline_too_short", "unavailable", "no_candidates"]
