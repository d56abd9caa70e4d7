"""Peer probes at the centre: record every prober's verdicts, assign peers, tell the nodes.

The policy (quorum, freshness, the ring) is in `peer_policy`; this module is its Redis and
Kafka side. Reports arrive in batches, so one pipelined round trip records a batch's
addresses and verdicts and reads back the verdicts on the batch's own nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import uuid4

from redis.asyncio import Redis

from common.clock import Clock
from common.messaging import EventBus
from common.signing import CommandSigner
from schemas.events.v1 import CommandPayload, NodeReport, Peer, SetPeers, now_utc
from schemas.topics import Topic
from services.collector import peer_policy
from services.collector.peer_policy import PeerJudgement
from services.collector.settings import CollectorSettings
from services.shared.redis_client import Keys, text

log = logging.getLogger("clusterwarden.collector.peers")
SOURCE = "collector"
# A node that probes other peers than it was told to (a restarted agent that lost its list)
# is told again, once its list had time to arrive: this long after it was sent.
RETELL_AFTER_S = 10.0


@dataclass(frozen=True)
class Told:
    """What a node was last told to probe (set_peers), and when."""

    fingerprint: str
    sent_at: float
    peers: tuple[str, ...]


def _told(raw: bytes | str | None) -> Told | None:
    if raw is None:
        return None
    fingerprint, _, rest = text(raw).partition("|")
    sent, _, peers = rest.partition("|")
    try:
        return Told(fingerprint, float(sent), tuple(p for p in peers.split(",") if p))
    except ValueError:
        return None


class PeerStore:
    """Peer-probe state in Redis (keys in services/shared/redis_client.py)."""

    def __init__(self, redis: Redis, keys: Keys, verdict_ttl_s: float) -> None:
        self.redis = redis
        self.keys = keys
        self.verdict_ttl_s = verdict_ttl_s

    async def record(self, reports: Sequence[NodeReport]) -> list[list[peer_policy.ProberVerdict]]:
        """Record each report's address and verdicts; return the verdicts on each reporter.

        Only reports applied as the node's newest ('ok') come here, so a verdict written is
        always its prober's latest.
        """
        ttl = max(1, int(self.verdict_ttl_s))
        async with self.redis.pipeline(transaction=False) as pipe:
            for report in reports:
                sent = f"{report.occurred_at.timestamp():.6f}"
                if report.probe_address is not None:
                    pipe.hset(self.keys.peer_addresses(report.cluster_id), report.node_id,
                              f"{report.probe_address}|{sent}")
                for probe in report.peer_probes:
                    key = self.keys.peer_verdicts(report.cluster_id, probe.peer_node_id)
                    pipe.hset(key, report.node_id, f"{1 if probe.reachable else 0}|{sent}")
                    pipe.expire(key, ttl)
            for report in reports:
                pipe.hgetall(self.keys.peer_verdicts(report.cluster_id, report.node_id))
            replies = await pipe.execute()
        return [peer_policy.parse_verdicts({text(k): text(v) for k, v in raw.items()})
                for raw in replies[-len(reports):]] if reports else []

    async def verdicts(self, cluster: str, node: str) -> list[peer_policy.ProberVerdict]:
        raw = await self.redis.hgetall(self.keys.peer_verdicts(cluster, node))
        return peer_policy.parse_verdicts({text(k): text(v) for k, v in raw.items()})

    async def addresses(self, cluster: str, newer_than: float) -> dict[str, str]:
        """Each node's advertised address, if its latest report is newer than `newer_than`."""
        found: dict[str, str] = {}
        for node, value in (await self.redis.hgetall(self.keys.peer_addresses(cluster))).items():
            address, _, sent = text(value).partition("|")
            try:
                if float(sent) > newer_than:
                    found[text(node)] = address
            except ValueError:
                continue
        return found

    async def told(self, cluster: str, nodes: Sequence[str] | None = None) -> dict[str, Told]:
        """What each node (of `nodes`, else every node) was last told."""
        key = self.keys.peer_assigned(cluster)
        raw: dict[str, bytes | str | None]
        if nodes is None:
            raw = {text(n): v for n, v in (await self.redis.hgetall(key)).items()}
        else:
            # Only the nodes of one batch of reports: never the whole cluster per batch.
            raw = dict(zip(nodes, await self.redis.hmget(key, list(nodes)), strict=True))
        return {node: told for node, value in raw.items() if (told := _told(value)) is not None}

    async def mark_told(self, cluster: str, node: str, told: Told) -> None:
        await self.redis.hset(self.keys.peer_assigned(cluster), node,
                              f"{told.fingerprint}|{told.sent_at:.6f}|{','.join(told.peers)}")

    async def retell(self, cluster: str, nodes: Sequence[str]) -> None:
        """Forget what these nodes were told, so the next round tells them again."""
        if nodes:
            await self.redis.hdel(self.keys.peer_assigned(cluster), *nodes)

    async def first_agent_death(self, cluster: str, node: str, last_report_at: str,
                                ttl_s: float) -> bool:
        """True once per silence (named by the last report): the agent-dead state is news."""
        return bool(await self.redis.set(self.keys.agent_dead(cluster, node, last_report_at),
                                         b"1", nx=True, ex=max(1, int(ttl_s))))


class PeerWatch:
    """The collector's reading of peer probes, and its assignment of peers to nodes."""

    def __init__(self, settings: CollectorSettings, store: PeerStore, signer: CommandSigner,
                 bus: EventBus, clock: Clock = now_utc) -> None:
        self.settings = settings
        self.store = store
        self.signer = signer
        self.bus = bus
        self.clock = clock

    @property
    def quorum(self) -> int:
        return self.settings.min_peer_quorum

    async def observe(self, reports: Sequence[NodeReport], now: datetime) -> list[PeerJudgement]:
        """Record the reports' probes; judge each reporter by its peers' fresh verdicts."""
        verdicts = await self.store.record(reports)
        now_s = now.timestamp()
        await self._check_lists(reports)
        return [peer_policy.judge(v, now_s, self.settings.peer_verdict_max_age_s)
                for v in verdicts]

    async def judge_silent(self, cluster: str, node: str, last_report_s: float,
                           now: datetime) -> PeerJudgement:
        """The fresh verdicts on a silent node made since its last report."""
        return peer_policy.judge(await self.store.verdicts(cluster, node), now.timestamp(),
                                 self.settings.peer_verdict_max_age_s, since_s=last_report_s)

    async def _check_lists(self, reports: Sequence[NodeReport]) -> None:
        """Tell again a node that probes other peers than it was told (it lost the list)."""
        if self.settings.peer_count <= 0:
            return
        now_s = self.clock().timestamp()
        by_cluster: dict[str, list[NodeReport]] = {}
        for report in reports:
            if report.probe_address is not None and report.peer_probes:
                by_cluster.setdefault(report.cluster_id, []).append(report)
        for cluster, listed in by_cluster.items():
            told = await self.store.told(cluster, [r.node_id for r in listed])
            stale = [r.node_id for r in listed
                     if (t := told.get(r.node_id)) is not None
                     and now_s - t.sent_at >= RETELL_AFTER_S
                     and {p.peer_node_id for p in r.peer_probes} != set(t.peers)]
            await self.store.retell(cluster, stale)

    async def assign(self, clusters: Sequence[str]) -> int:
        """Tell every node whose peers changed (or were told long ago) its peers; returns
        how many were told."""
        settings = self.settings
        if settings.peer_count <= 0:
            return 0
        now = self.clock()
        sent = 0
        for cluster in clusters:
            addresses = await self.store.addresses(
                cluster, now.timestamp() - settings.peer_address_max_age_s)
            told = await self.store.told(cluster)
            for node, peers in peer_policy.assign_ring(addresses, settings.peer_count).items():
                listed = [(peer, addresses[peer]) for peer in peers]
                fingerprint = peer_policy.assignment_fingerprint(addresses[node], listed)
                previous = told.get(node)
                if not peer_policy.assignment_due(
                        fingerprint, None if previous is None else
                        (previous.fingerprint, previous.sent_at),
                        now.timestamp(), settings.peer_resend_s):
                    continue
                await self._tell(cluster, node, listed, now)
                await self.store.mark_told(cluster, node, Told(fingerprint, now.timestamp(),
                                                               tuple(peers)))
                sent += 1
        return sent

    async def _tell(self, cluster: str, node: str, peers: list[tuple[str, str]],
                    now: datetime) -> None:
        # Outside the node's command ordering, like a probe: an absolute list is idempotent.
        payload = CommandPayload.for_action(
            SetPeers(node_id=node, peers=[Peer(node_id=p, address=a) for p, a in peers]),
            cluster_id=cluster, command_id=uuid4(), issued_at=now,
            expires_at=now + timedelta(seconds=60),
        )
        await self.bus.publish(Topic.NODE_COMMANDS, self.signer.sign(payload, SOURCE))
        log.info("told %s/%s to probe %s", cluster, node,
                 ", ".join(f"{p}@{a}" for p, a in peers) or "nobody")
