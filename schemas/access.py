"""Who may write and read each topic: the one table the secured broker's ACLs come from.

Each service (and every agent) connects as its own principal. A principal may write only the
topics it publishes, read only the topics it consumes, in consumer groups named after it
(`<namespace>.<principal>...`, see `common.messaging.group_name`), and write the dead-letter
topic of each topic it consumes. Everything else is refused by the broker, so a client that
holds one principal's credentials cannot forge another's events: an agent cannot publish a
dispatched task, an operator control or a command.

`admin` is the broker's super user; it creates the topics, users and ACLs and nothing runs
as it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from schemas.topics import Topic, dead_letter_name, topic_name


class Principal(StrEnum):
    """The broker users; one per service, one shared by the agents, and the admin."""

    AGENT = "agent"
    COLLECTOR = "collector"
    ANALYZER = "analyzer"
    TEMPLATER = "templater"
    SCHEDULER = "scheduler"
    EXECUTOR = "executor"
    STORE = "store"
    ROUTER = "router"
    TUNER = "tuner"
    ALERTS = "alerts"
    INVENTORY = "inventory"
    API = "api"
    ADMIN = "admin"


@dataclass(frozen=True)
class Grant:
    """What one principal may do: the topics it writes and the topics it reads."""

    writes: frozenset[Topic]
    reads: frozenset[Topic]


def _grant(writes: tuple[Topic, ...] = (), reads: tuple[Topic, ...] = ()) -> Grant:
    return Grant(writes=frozenset(writes), reads=frozenset(reads))


T = Topic
GRANTS: dict[Principal, Grant] = {
    Principal.AGENT: _grant(writes=(T.NODE_REPORTS, T.NODE_COMMAND_RESULTS),
                            reads=(T.NODE_COMMANDS,)),
    # The collector writes commands too: the probes it sends a node's peers (services/collector).
    Principal.COLLECTOR: _grant(
        writes=(T.OPS_SAMPLES, T.OPS_NODE_STATE, T.OPS_ALERTS, T.NODE_COMMANDS),
        reads=(T.NODE_REPORTS, T.NODE_COMMAND_RESULTS)),
    Principal.ANALYZER: _grant(writes=(T.OPS_NEEDS, T.OPS_POOL_HEALTH, T.OPS_CAPACITY_PLANS),
                               reads=(T.OPS_SAMPLES, T.OPS_NODE_STATE)),
    # Template changes too: a templater that seeds a built-in version tells the others.
    Principal.TEMPLATER: _grant(writes=(T.OPS_TASKS, T.OPS_TASK_EVENTS, T.OPS_TEMPLATE_CHANGES),
                                reads=(T.OPS_NEEDS, T.OPS_TEMPLATE_CHANGES)),
    Principal.SCHEDULER: _grant(writes=(T.OPS_TASKS_SCHEDULED, T.OPS_TASK_EVENTS, T.OPS_ALERTS),
                                reads=(T.OPS_TASKS, T.OPS_TASK_EVENTS, T.OPS_POOL_HEALTH)),
    Principal.EXECUTOR: _grant(writes=(T.NODE_COMMANDS, T.OPS_TASKS, T.OPS_TASK_EVENTS),
                               reads=(T.OPS_TASKS_SCHEDULED, T.NODE_COMMAND_RESULTS,
                                      T.OPS_TASK_CONTROL)),
    Principal.STORE: _grant(reads=(T.OPS_TASK_EVENTS, T.ML_TASKS_SUBMITTED, T.ML_DECISIONS,
                                   T.ML_TASKS_OUTCOMES, T.OPS_CAPACITY_PLANS)),
    Principal.ROUTER: _grant(writes=(T.ML_DECISIONS, T.ML_TASKS_OUTCOMES, T.NODE_COMMANDS),
                             reads=(T.ML_TASKS_SUBMITTED, T.NODE_COMMAND_RESULTS,
                                    T.NODE_REPORTS)),
    Principal.TUNER: _grant(writes=(T.OPS_TEMPLATE_CHANGES,), reads=(T.OPS_SAMPLES,)),
    Principal.ALERTS: _grant(reads=(T.OPS_ALERTS,)),
    Principal.INVENTORY: _grant(),
    # The operator's way in: controls, alerts, ML submissions, maintenance needs and template
    # changes. `warden events` watches alerts and task events with the API's principal.
    Principal.API: _grant(writes=(T.OPS_TASK_CONTROL, T.OPS_ALERTS, T.ML_TASKS_SUBMITTED,
                                  T.OPS_NEEDS, T.OPS_TEMPLATE_CHANGES),
                          reads=(T.OPS_ALERTS, T.OPS_TASK_EVENTS)),
    Principal.ADMIN: _grant(),
}
del T

SERVICE_PRINCIPALS: tuple[Principal, ...] = tuple(p for p in Principal if p is not Principal.ADMIN)


class Operation(StrEnum):
    """The ACL operations the table grants (Kafka's names)."""

    WRITE = "Write"
    READ = "Read"
    DESCRIBE = "Describe"
    IDEMPOTENT_WRITE = "IdempotentWrite"


class ResourceKind(StrEnum):
    TOPIC = "Topic"
    GROUP = "Group"
    CLUSTER = "Cluster"


# The one name of the cluster resource in Kafka's ACLs.
CLUSTER_RESOURCE = "kafka-cluster"


class Pattern(StrEnum):
    LITERAL = "Literal"
    PREFIXED = "Prefixed"


@dataclass(frozen=True, order=True)
class AclRule:
    """One allow rule: `principal` may do `operation` on the named resource."""

    principal: Principal
    kind: ResourceKind
    pattern: Pattern
    resource: str
    operation: Operation

    def row(self) -> str:
        """The rule as a tab-separated row (the table docs/security.md shows)."""
        return "\t".join((f"User:{self.principal}", self.operation, self.kind, self.pattern,
                          self.resource))


def group_prefix(principal: Principal, namespace: str) -> str:
    """The prefix of every consumer group `principal` may join (common.messaging.group_name)."""
    return f"{namespace}.{principal}" if namespace else f"warden.{principal}"


def acl_rules(namespace: str = "") -> list[AclRule]:
    """Every allow rule of the table for the topics of `namespace`, sorted."""
    rules: set[AclRule] = set()
    for principal, grant in GRANTS.items():
        def topic_rule(wire: str, operation: Operation, who: Principal = principal) -> AclRule:
            return AclRule(who, ResourceKind.TOPIC, Pattern.LITERAL, wire, operation)

        for topic in grant.writes:
            rules.add(topic_rule(topic_name(topic, namespace), Operation.WRITE))
        for topic in grant.reads:
            wire = topic_name(topic, namespace)
            rules.add(topic_rule(wire, Operation.READ))
            # A consumer dead-letters what it cannot take, and waits for that topic's leader.
            rules.add(topic_rule(dead_letter_name(wire), Operation.WRITE))
        if grant.reads:
            rules.add(AclRule(principal, ResourceKind.GROUP, Pattern.PREFIXED,
                              group_prefix(principal, namespace), Operation.READ))
        elif not grant.writes and principal is not Principal.ADMIN:
            # Every service's producer is idempotent, and taking a producer id needs the
            # right to write somewhere; a principal that writes nothing gets only that.
            rules.add(AclRule(principal, ResourceKind.CLUSTER, Pattern.LITERAL,
                              CLUSTER_RESOURCE, Operation.IDEMPOTENT_WRITE))
    return sorted(rules)


def writers(topic: Topic) -> frozenset[Principal]:
    """The principals that may publish `topic`."""
    return frozenset(p for p, grant in GRANTS.items() if topic in grant.writes)
