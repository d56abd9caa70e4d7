"""The API client's errors say what to do (pure: the API's answers are made by the test)."""

from __future__ import annotations

import httpx
import pytest

from services.api.client import ApiClient, ApiError


def client_answering(status: int, body: dict[str, str]) -> ApiClient:
    transport = httpx.MockTransport(lambda _: httpx.Response(status, json=body))
    return ApiClient(http=httpx.Client(transport=transport, base_url="http://api.test"))


@pytest.mark.parametrize(("reason", "hint"), [
    ("token_expired", "the token expired: ask an admin for a new one (`warden api token`)"),
    ("unknown_token", "unauthenticated: set WARDEN_API_TOKEN"),
])
def test_a_401_says_whether_the_token_expired(reason: str, hint: str) -> None:
    client = client_answering(401, {"detail": "a valid bearer token is required",
                                    "reason": reason})
    with pytest.raises(ApiError) as caught:
        client.tasks()
    assert caught.value.status == 401
    assert str(caught.value).startswith(hint)
    assert str(caught.value).endswith(": a valid bearer token is required")
