"""Sending alerts out: Alertmanager's API v2 and webhooks, over HTTP.

A failed delivery raises DeliveryFailed; the alert's row keeps saying it is not delivered, so
the resend loop tries again (nothing is lost to an Alertmanager that is down for a while).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence
from typing import Any, Final

import httpx

SIGNATURE_HEADER: Final = "X-ClusterWarden-Signature"


class DeliveryFailed(Exception):
    """Alertmanager or a webhook did not accept what was sent."""


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Deliverer:
    """One HTTP client for Alertmanager and the webhooks."""

    def __init__(self, alertmanager_url: str, webhook_urls: Sequence[str], secret: str,
                 timeout_s: float, client: httpx.AsyncClient | None = None) -> None:
        self.alertmanager_url = alertmanager_url.rstrip("/")
        self.webhook_urls = tuple(webhook_urls)
        self.secret = secret
        self.client = client or httpx.AsyncClient(timeout=timeout_s)

    async def to_alertmanager(self, alerts: list[dict[str, Any]]) -> None:
        """POST /api/v2/alerts (a no-op without an Alertmanager)."""
        if not self.alertmanager_url or not alerts:
            return
        await self._post(f"{self.alertmanager_url}/api/v2/alerts", json.dumps(alerts).encode())

    async def to_webhooks(self, body: dict[str, Any]) -> None:
        """POST one change to every webhook; raises if any refused it (all are tried)."""
        raw = json.dumps(body, sort_keys=True).encode()
        failures: list[str] = []
        for url in self.webhook_urls:
            try:
                await self._post(url, raw)
            except DeliveryFailed as err:
                failures.append(str(err))
        if failures:
            raise DeliveryFailed("; ".join(failures))

    async def _post(self, url: str, raw: bytes) -> None:
        headers = {"content-type": "application/json"}
        if self.secret:
            headers[SIGNATURE_HEADER] = signature(self.secret, raw)
        try:
            response = await self.client.post(url, content=raw, headers=headers)
        except httpx.HTTPError as err:
            raise DeliveryFailed(f"{url}: {err!r}"[:300]) from err
        if response.status_code >= 300:
            raise DeliveryFailed(f"{url}: HTTP {response.status_code} {response.text[:200]}")

    async def close(self) -> None:
        await self.client.aclose()
