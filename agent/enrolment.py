"""An agent's own enrolment at start-up: with a bootstrap token and no report key yet, it asks
the API to enrol its node and keeps the key it is handed (services/api/routes/enrolment.py).

A key already on disk is used as it is: the bootstrap token enrols a node once, so an agent
that restarts must keep its key (its state folder is a volume). One that lost it is enrolled
again by an admin (`warden nodes enroll`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Final

import httpx

from agent.settings import AgentSettings
from common.reportauth import NodeReportKey, write_node_key

log = logging.getLogger("clusterwarden.agent.enrolment")

ENROL_PATH: Final = "/api/v1/nodes/enroll"
# The API may still be starting when the agents do (compose starts them together): a refused
# connection or a 5xx is tried again, for about this long in all.
ENROL_ATTEMPTS: Final = 30
ENROL_PAUSE_S: Final = 2.0
REQUEST_TIMEOUT_S: Final = 10.0


class EnrolmentRefused(RuntimeError):
    """The API said no (an unknown or expired token, a node enrolled already): trying again
    would not help, and an agent without its key would only be refused."""


async def enrol_if_needed(settings: AgentSettings,
                          pause_s: float = ENROL_PAUSE_S) -> NodeReportKey | None:
    """The key enrolment handed out and written to the report key file, or None if there was
    nothing to do (a key on disk, or no bootstrap token configured)."""
    path = settings.report_key_path()
    if path.exists() or settings.bootstrap_token_file is None or not settings.api_url:
        return None
    token = settings.bootstrap_token_file.read_text().strip()
    url = settings.api_url.rstrip("/") + ENROL_PATH
    body = {"cluster_id": settings.cluster_id, "node_id": settings.node_id}
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for attempt in range(1, ENROL_ATTEMPTS + 1):
            try:
                answer = await client.post(url, json=body,
                                           headers={"Authorization": f"Bearer {token}"})
            except httpx.TransportError as err:
                log.warning("enrolment at %s: %s (attempt %d)", url, err, attempt)
            else:
                if answer.status_code == 200:
                    key = NodeReportKey.from_json(json.dumps(answer.json()["report_key"]))
                    if (key.cluster_id, key.node_id) != (settings.cluster_id, settings.node_id):
                        raise EnrolmentRefused(f"the API handed out the key of "
                                               f"{key.cluster_id}/{key.node_id}")
                    write_node_key(path, key)
                    log.info("enrolled %s/%s (report master %s): key in %s",
                             settings.cluster_id, settings.node_id, key.kid, path)
                    return key
                if answer.status_code < 500:
                    raise EnrolmentRefused(f"enrolment at {url} refused: {answer.status_code} "
                                           f"{answer.text[:300]}")
                log.warning("enrolment at %s: %d (attempt %d)", url, answer.status_code, attempt)
            await asyncio.sleep(pause_s)
    raise EnrolmentRefused(f"enrolment at {url}: no answer after {ENROL_ATTEMPTS} attempts")
