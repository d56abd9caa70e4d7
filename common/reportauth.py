"""Reports authenticated per node: each node holds its own key, and signs every report with it.

Kafka ACLs admit or refuse a principal per topic, not per message key, so any client that may
write reports could write them in any node's name. The collector therefore holds one master
secret and derives each node's key from it:

    key = HKDF-SHA256(master, info = "clusterwarden report key" NUL cluster NUL node)

(the NUL separators keep ("ab", "c") and ("a", "bc") apart; identifiers never hold a NUL).
Enrolment hands a node its key once; the collector keeps no per-node secret, so 50,000 nodes
cost no storage and a new node needs no write on the centre. A node's key authenticates only
its own reports: holding node-001's key does not let anyone speak for node-002.

The agent computes HMAC-SHA256 over the exact bytes it publishes and sends the MAC and the
master's key id in two Kafka headers (`report-mac`, `report-kid`), so the report schema is
unchanged and there is no canonical form to agree on: the collector checks the bytes it read.
docs/security.md §Reports authenticated per node says why HMAC and not Ed25519 per node.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import uuid4

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.signing import b64url, unb64url

if TYPE_CHECKING:
    from common.settings import ReportReaderSettings

MAC_HEADER = "report-mac"
KID_HEADER = "report-kid"
MASTER_FILE = "report-master.key"
NODE_KEY_FILE = "report.key"
UNAUTHENTICATED = "unauthenticated_report"
UNAUTHENTICATED_RESULT = "unauthenticated_result"
# An answer sealed by its node, but not by the node the command went to.
WRONG_SENDER = "wrong_sender"

_INFO = b"clusterwarden report key"
_KID_INFO = b"clusterwarden report key id"
MASTER_BYTES = 32
KEY_BYTES = 32
# Derived keys the collector keeps: one HKDF per node and master, not one per report. Far
# above the largest fleet, and bounded: a flood of made-up node names cannot grow it forever.
_CACHE_LIMIT = 200_000


def master_kid(master: bytes) -> str:
    """The master's public name (it says which master a node key came from, for rotation)."""
    return "rk-" + b64url(hmac.new(master, _KID_INFO, hashlib.sha256).digest())[:16]


def derive_node_key(master: bytes, cluster_id: str, node_id: str) -> bytes:
    """The key of `node_id` in `cluster_id` under `master`."""
    info = b"\0".join((_INFO, cluster_id.encode(), node_id.encode()))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(master)


def report_mac(key: bytes, body: bytes) -> str:
    return b64url(hmac.new(key, body, hashlib.sha256).digest())


@dataclass(frozen=True)
class NodeReportKey:
    """What a node holds: its own key, for its cluster and node, under the master `kid`."""

    kid: str
    cluster_id: str
    node_id: str
    secret: bytes

    def headers(self, body: bytes) -> dict[str, str]:
        """The headers that authenticate `body`, the exact bytes to be published."""
        return {MAC_HEADER: report_mac(self.secret, body), KID_HEADER: self.kid}

    def to_json(self) -> str:
        return json.dumps({"kid": self.kid, "cluster_id": self.cluster_id,
                           "node_id": self.node_id, "key": b64url(self.secret)})

    @classmethod
    def from_json(cls, raw: str) -> NodeReportKey:
        data = json.loads(raw)
        secret = unb64url(str(data["key"]))
        if len(secret) != KEY_BYTES:
            raise ValueError(f"a report key has {KEY_BYTES} bytes, not {len(secret)}")
        return cls(str(data["kid"]), str(data["cluster_id"]), str(data["node_id"]), secret)


def enrol_key(master: bytes, cluster_id: str, node_id: str) -> NodeReportKey:
    """The key a node is given at enrolment."""
    return NodeReportKey(master_kid(master), cluster_id, node_id,
                         derive_node_key(master, cluster_id, node_id))


def _write_private(path: Path, data: bytes, *, replace: bool) -> None:
    """Write an owner-only file; without `replace`, the first writer wins (two services
    starting at once must not each make a different master)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid4().hex}.tmp")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o600)
    try:
        if replace:
            tmp.replace(path)
        else:
            os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)


def ensure_master(path: Path) -> bytes:
    """The master secret in `path`, made (random, owner-only) if missing."""
    if not path.exists():
        _write_private(path, (b64url(secrets.token_bytes(MASTER_BYTES)) + "\n").encode(),
                       replace=False)
    return load_master(path)


def load_master(path: Path) -> bytes:
    master = unb64url(path.read_text().strip())
    if len(master) < MASTER_BYTES:
        raise ValueError(f"{path}: a report master secret needs at least {MASTER_BYTES} bytes")
    return master


def master_path(configured: str, state_dir: str | Path) -> Path:
    """The configured master file, else `<state>/keys/report-master.key`."""
    return Path(configured) if configured else Path(state_dir) / "keys" / MASTER_FILE


# Where a deployment names its master: the name the collector and the router share first, the
# collector's own of earlier releases second.
MASTER_ENV = ("WARDEN_REPORT_MASTER_KEY", "COLLECTOR_REPORT_MASTER_KEY")


def configured_master(env: Mapping[str, str], state_dir: str | Path) -> Path:
    """The master file the environment `env` names, else the state folder's."""
    return master_path(next((env[name] for name in MASTER_ENV if env.get(name)), ""), state_dir)


def write_node_key(path: Path, key: NodeReportKey) -> Path:
    _write_private(path, (key.to_json() + "\n").encode(), replace=True)
    return path


def read_node_key(path: Path) -> NodeReportKey:
    return NodeReportKey.from_json(path.read_text())


def header_text(headers: Iterable[tuple[str, bytes]], name: str) -> str | None:
    """The one value of header `name`, or None if absent, repeated or not ASCII (a report
    carrying two MACs is as unauthenticated as one carrying none)."""
    values = [value for key, value in headers if key == name]
    if len(values) != 1:
        return None
    try:
        return values[0].decode("ascii")
    except UnicodeDecodeError:
        return None


class ReportAuthenticator:
    """The collector's check: is this report's MAC the one its node's key gives?"""

    def __init__(self, masters: Iterable[bytes]) -> None:
        # Several masters during a rotation; each node key says by its kid which it is under.
        self._masters: Mapping[str, bytes] = {master_kid(m): m for m in masters}
        self._keys: dict[tuple[str, str, str], bytes] = {}

    def _key(self, kid: str, cluster_id: str, node_id: str) -> bytes | None:
        master = self._masters.get(kid)
        if master is None:
            return None
        slot = (kid, cluster_id, node_id)
        key = self._keys.get(slot)
        if key is None:
            if len(self._keys) >= _CACHE_LIMIT:
                self._keys.clear()
            key = self._keys[slot] = derive_node_key(master, cluster_id, node_id)
        return key

    def refusal(self, cluster_id: str, node_id: str, body: bytes,
                headers: Iterable[tuple[str, bytes]]) -> str | None:
        """Why the report `body` (as read) is not authentic for (cluster_id, node_id), or None
        if it is."""
        pairs = list(headers)
        mac, kid = header_text(pairs, MAC_HEADER), header_text(pairs, KID_HEADER)
        if mac is None or kid is None:
            return f"no single {MAC_HEADER}/{KID_HEADER} header: the report is not signed"
        key = self._key(kid, cluster_id, node_id)
        if key is None:
            return f"{KID_HEADER} {kid[:40]!r} is not a report master this collector holds"
        if not hmac.compare_digest(mac.encode(), report_mac(key, body).encode()):
            return (f"{MAC_HEADER} is not the MAC of node {node_id!r} of cluster "
                    f"{cluster_id!r} over the report")
        return None

    @staticmethod
    def signed(headers: Iterable[tuple[str, bytes]]) -> bool:
        """True if the report carries a MAC at all (checked even when not required)."""
        return any(key == MAC_HEADER for key, _ in headers)

    def check(self, cluster_id: str, node_id: str, body: bytes,
              headers: Iterable[tuple[str, bytes]], *, required: bool) -> str | None:
        """Why the report may not be read as its node's own, or None if it may: its MAC must
        be right, and, unless MACs are `required`, an unsigned report passes (an old agent
        that cannot sign yet, while a deployment migrates)."""
        pairs = list(headers)
        if not required and not self.signed(pairs):
            return None
        return self.refusal(cluster_id, node_id, body, pairs)


@dataclass(frozen=True)
class NodeSeal:
    """The check a consumer of what nodes send makes before it reads a message as its node's:
    the MAC of the node the message names (its `cluster_id` and `node_id`) over the bytes read;
    a message without it is refused with `reason`."""

    authenticator: ReportAuthenticator
    required: bool
    reason: str

    def refusal(self, cluster_id: str, node_id: str, body: bytes,
                headers: Iterable[tuple[str, bytes]]) -> str | None:
        return self.authenticator.check(cluster_id, node_id, body, headers,
                                        required=self.required)


def result_seal(settings: ReportReaderSettings,
                authenticator: ReportAuthenticator | None = None) -> NodeSeal:
    """How a service that acts on command results checks them: an answer decides whether a
    step (a drain, a job's move) succeeded, so a forged one could fail steps until a breaker
    opens, or pass a drain that never happened. The agent seals its answers with its report
    key; the body's strict `event_type` keeps a report's MAC from passing as a result's.
    A service that reads reports too passes its `authenticator`, so the masters are read and
    the node keys derived once."""
    return NodeSeal(authenticator or authenticator_for(settings), settings.require_report_mac,
                    UNAUTHENTICATED_RESULT)


def authenticator_for(settings: ReportReaderSettings) -> ReportAuthenticator:
    """The authenticator of a service that reads reports: the current master (made in the
    state folder if none is configured and none is there yet) and the retired ones of a
    rotation, so nodes whose keys are under either are read."""
    current = ensure_master(master_path(settings.report_master_key, settings.state_dir))
    retired = [load_master(Path(item.strip()))
               for item in settings.report_retired_master_keys.split(",") if item.strip()]
    return ReportAuthenticator([current, *retired])
