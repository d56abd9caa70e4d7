"""A small synchronous client of the API, for the `warden` commands that go through it and for
scripts."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import httpx
from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.api.settings import DEFAULT_PORT


class ClientSettings(BaseSettings):
    """Where the API is and the caller's token (WARDEN_API_URL, WARDEN_API_TOKEN)."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    url: str = Field(default=f"http://127.0.0.1:{DEFAULT_PORT}",
                     validation_alias=AliasChoices("WARDEN_API_URL", "url"))
    token: SecretStr = Field(default=SecretStr(""),
                             validation_alias=AliasChoices("WARDEN_API_TOKEN", "token"))
    timeout_s: float = Field(default=30.0, gt=0.0,
                             validation_alias=AliasChoices("WARDEN_API_TIMEOUT_S", "timeout_s"))


class ApiError(Exception):
    """The API refused a call, or could not be reached; the message says what to do."""

    def __init__(self, status: int, message: str, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def _message(response: httpx.Response) -> tuple[str, Any]:
    """What a refusal says, and its body: the API answers problem details (RFC 9457), whose
    `detail` says what went wrong; an invalid template's `problems` say it field by field."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase, None
    if not isinstance(body, dict):
        return str(body), body
    problems = body.get("problems")
    if isinstance(problems, list) and problems:
        return "; ".join(f"{p.get('field')}: {p.get('message')}" for p in problems
                         if isinstance(p, dict)), body
    detail = body.get("detail") or body.get("title")
    return str(detail) if detail else response.reason_phrase, body


_HINTS = {
    401: "unauthenticated: set WARDEN_API_TOKEN (a token from `warden api token`)",
    403: "forbidden",
}


class ApiClient:
    """Calls the API; every error becomes an ApiError with a readable message."""

    def __init__(self, settings: ClientSettings | None = None,
                 http: httpx.Client | None = None) -> None:
        settings = settings or ClientSettings()
        self.url = settings.url.rstrip("/")
        token = settings.token.get_secret_value()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = http or httpx.Client(base_url=self.url, timeout=settings.timeout_s)
        self.http.headers.update(headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             json: Any = None) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = self.http.request(method, path, params=clean, json=json)
        except httpx.TransportError as err:
            raise ApiError(0, f"cannot reach the API at {self.url} ({err}); is `warden api` "
                              "running, and WARDEN_API_URL right?") from err
        if response.is_success:
            return response.json()
        message, body = _message(response)
        hint = _HINTS.get(response.status_code)
        if isinstance(body, dict) and body.get("reason") == "token_expired":
            hint = "the token expired: ask an admin for a new one (`warden api token`)"
        raise ApiError(response.status_code,
                       f"{hint}: {message}" if hint else message, body)

    # ------------------------------------------------------------ tasks

    def tasks(self, **filters: Any) -> dict[str, Any]:
        page: dict[str, Any] = self.call("GET", "/api/v1/tasks", params=filters)
        return page

    def task(self, task_id: UUID) -> dict[str, Any]:
        detail: dict[str, Any] = self.call("GET", f"/api/v1/tasks/{task_id}")
        return detail

    def control(self, task_id: UUID, action: str, reason: str,
                step_index: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"reason": reason}
        if step_index is not None:
            body["step_index"] = step_index
        accepted: dict[str, Any] = self.call("POST", f"/api/v1/tasks/{task_id}/{action}",
                                             json=body)
        return accepted

    # ------------------------------------------------------------ maintenance and rotation

    def maintenance(self, cluster: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call("GET", "/api/v1/maintenance",
                                                params={"cluster": cluster})["windows"]
        return found

    def maintenance_change(self, step: str, cluster: str, node: str | None,
                           reason: str) -> dict[str, Any]:
        """Start or end (`step`) the maintenance of a cluster or a node (operator)."""
        window: dict[str, Any] = self.call("POST", f"/api/v1/maintenance/{step}", json={
            "cluster": cluster, "node": node, "reason": reason})
        return window

    def rotation(self, step: str, cluster: str, node: str, reason: str) -> dict[str, Any]:
        """Start (offline) or end (online) the rotation of a node (operator)."""
        accepted: dict[str, Any] = self.call("POST", f"/api/v1/nodes/{node}/rotation/{step}",
                                             json={"cluster": cluster, "reason": reason})
        return accepted

    # ------------------------------------------------------------ cluster and templates

    def nodes(self, cluster: str | None = None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call("GET", "/api/v1/nodes",
                                                params={"cluster": cluster})["nodes"]
        return found

    def enroll(self, cluster: str, node: str) -> dict[str, Any]:
        """Enrol `node` in `cluster` (admin; or a bootstrap token, for a new node only): the
        answer holds the node's report key."""
        enrolled: dict[str, Any] = self.call("POST", "/api/v1/nodes/enroll",
                                             json={"cluster_id": cluster, "node_id": node})
        return enrolled

    def reset_breaker(self, cluster: str, kind: str, reason: str, node: str | None = None,
                      scope: str | None = None) -> dict[str, Any]:
        """Close a breaker (admin); the API audits it under the token's user and announces it."""
        body = {"cluster": cluster, "kind": kind, "node": node, "reason": reason}
        if scope is not None:
            body["scope"] = scope
        reset: dict[str, Any] = self.call("POST", "/api/v1/breakers/reset", json=body)
        return reset

    def templates(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.call("GET", "/api/v1/templates")
        return found

    def template(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/api/v1/templates/{name}")
        return found

    def validate_template(self, text: str) -> dict[str, Any]:
        checked: dict[str, Any] = self.call("POST", "/api/v1/templates/validate",
                                            json={"yaml": text})
        return checked

    def save_template(self, name: str, text: str, reason: str) -> dict[str, Any]:
        saved: dict[str, Any] = self.call("PUT", f"/api/v1/templates/{name}",
                                          json={"yaml": text, "reason": reason})
        return saved

    def template_history(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/api/v1/templates/{name}/history")
        return found

    def template_diff(self, name: str, old: int, new: int) -> dict[str, Any]:
        found: dict[str, Any] = self.call("GET", f"/api/v1/templates/{name}/diff",
                                          params={"from": old, "to": new})
        return found

    def rollback_template(self, name: str, version: int, reason: str) -> dict[str, Any]:
        saved: dict[str, Any] = self.call("POST", f"/api/v1/templates/{name}/rollback",
                                          json={"version": version, "reason": reason})
        return saved

    def pin_template(self, name: str, pinned: bool, reason: str) -> dict[str, Any]:
        state: dict[str, Any] = self.call(
            "POST", f"/api/v1/templates/{name}/{'pin' if pinned else 'unpin'}",
            json={"reason": reason})
        return state

    # ------------------------------------------------------------ ML tasks

    def submit_ml(self, task_type: str, values: list[float], deadline_s: float,
                  priority: int, critical: bool) -> dict[str, Any]:
        accepted: dict[str, Any] = self.call("POST", "/api/v1/ml/tasks", json={
            "task_type": task_type, "input": values, "deadline_s": deadline_s,
            "priority": priority, "critical": critical})
        return accepted

    def ml_tasks(self, **filters: Any) -> dict[str, Any]:
        page: dict[str, Any] = self.call("GET", "/api/v1/ml/tasks", params=filters)
        return page

    def ml_task(self, task_id: UUID) -> dict[str, Any]:
        detail: dict[str, Any] = self.call("GET", f"/api/v1/ml/tasks/{task_id}")
        return detail

    def ml_models(self, cluster: str | None = None,
                  task_type: str | None = None) -> dict[str, Any]:
        view: dict[str, Any] = self.call("GET", "/api/v1/ml/models",
                                         params={"cluster": cluster, "task_type": task_type})
        return view

    # ------------------------------------------------------------ audit

    def audit_head(self) -> dict[str, Any]:
        """The audit chain's head: hash and count (admin)."""
        result: dict[str, Any] = self.call("GET", "/api/v1/audit/head")
        return result

    def verify_audit(self, anchor: str | None = None) -> dict[str, Any]:
        """The chain's verdict, checked from its first entry (and against `anchor`)."""
        result: dict[str, Any] = self.call("GET", "/api/v1/audit", params={
            "verify": "true", "limit": 1, "anchor": anchor})["chain"]
        return result

    # ------------------------------------------------------------ alerts

    def alerts(self, **filters: Any) -> dict[str, Any]:
        """A page of alerts, firing first (filters: status, cluster, limit, offset)."""
        page: dict[str, Any] = self.call("GET", "/api/v1/alerts", params=filters)
        return page

    def ack_alert(self, cluster: str, dedup_key: str, reason: str) -> dict[str, Any]:
        """Acknowledge an alert (operator); the API audits it under the token's user."""
        acked: dict[str, Any] = self.call("POST", f"/api/v1/alerts/{cluster}/{dedup_key}/ack",
                                          json={"reason": reason})
        return acked
