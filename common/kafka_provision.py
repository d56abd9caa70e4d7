"""The setup step of a secured broker: create a namespace's topics and its ACLs, as the admin.

    python -m common.kafka_provision [--namespace NS]

reads the admin's connection from the environment (KAFKA_BOOTSTRAP_SERVERS,
KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_USERNAME, ...; deploy/local/kafka.sh runs it after the
broker starts). The rules come from the one table, schemas/access.py; creating a rule that
exists is a no-op on the broker, so running this again is safe.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest

from common.kafka_access import client_options
from common.messaging import ensure_topics
from common.settings import ServiceSettings
from schemas.access import AclRule, Operation, Pattern, ResourceKind, acl_rules

# The wire codes of the broker's ACL enums (Kafka's AclOperation, ResourceType,
# PatternType and AclPermissionType).
_RESOURCE_CODES = {ResourceKind.TOPIC: 2, ResourceKind.GROUP: 3, ResourceKind.CLUSTER: 4}
_PATTERN_CODES = {Pattern.LITERAL: 3, Pattern.PREFIXED: 4}
_OPERATION_CODES = {Operation.READ: 3, Operation.WRITE: 4, Operation.DESCRIBE: 8,
                    Operation.IDEMPOTENT_WRITE: 12}
_ALLOW = 3
_ANY_HOST = "*"


def _request(rule: AclRule) -> CreateAclsRequest:
    return CreateAclsRequest(_RESOURCE_CODES[rule.kind], rule.resource,
                             _PATTERN_CODES[rule.pattern], f"User:{rule.principal}",
                             _ANY_HOST, _OPERATION_CODES[rule.operation], _ALLOW)


async def create_acls(settings: ServiceSettings, rules: list[AclRule]) -> None:
    """Create every rule on the broker; raises the broker's error if one is refused."""
    admin = AIOKafkaAdminClient(**client_options(settings), request_timeout_ms=10_000)
    await admin.start()
    try:
        for rule in rules:
            # The admin client has no ACL call of its own; it sends the protocol request.
            response: Any = await admin._send_request(_request(rule))
            for code, message, *_ in response.creation_responses:
                if code:
                    raise for_code(code)(f"ACL {rule.row()!r} refused: {message}")
    finally:
        await admin.close()


async def provision(settings: ServiceSettings, namespace: str) -> int:
    """Create the topics of `namespace` and their ACLs; returns how many rules."""
    await ensure_topics(settings.kafka_bootstrap_servers, namespace,
                        security=client_options(settings))
    rules = acl_rules(namespace)
    await create_acls(settings, rules)
    return len(rules)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default="", help="topic prefix (default: production)")
    parser.add_argument("--print", action="store_true", help="print the rules, change nothing")
    args = parser.parse_args()
    if args.print:
        for rule in acl_rules(args.namespace):
            print(rule.row())
        return
    count = asyncio.run(provision(ServiceSettings(), args.namespace))
    print(f"created the topics of namespace {args.namespace!r} and {count} ACL rules")


if __name__ == "__main__":
    main()
