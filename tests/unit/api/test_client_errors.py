"""The API client's errors say what to do (pure: the API's answers are made by the test)."""

from __future__ import annotations

import httpx
import pytest

from services.api.client import ApiClient, ApiError


def client_answering(status: int, body: dict[str, object]) -> ApiClient:
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


def test_the_client_reads_problem_details() -> None:
    invalid = {"type": "https://clusterwarden.dev/problems/invalid-template", "status": 422,
               "title": "The template is not valid", "detail": "2 problems",
               "instance": "/api/v1/templates/validate",
               "problems": [{"field": "priority", "message": "less than or equal to 9"},
                            {"field": "yaml", "message": "not valid YAML"}]}
    with pytest.raises(ApiError) as caught:
        client_answering(422, invalid).validate_template("x")
    assert str(caught.value) == "priority: less than or equal to 9; yaml: not valid YAML"
    assert caught.value.body == invalid
    conflict = {"type": "https://clusterwarden.dev/problems/conflict", "status": 409,
                "title": "Refused in the resource's current state",
                "detail": "cannot resume a task that is running", "instance": "/api/v1/tasks"}
    with pytest.raises(ApiError) as caught:
        client_answering(409, conflict).tasks()
    assert str(caught.value) == "cannot resume a task that is running"
    # A problem without a detail says its title.
    blank = {"type": "about:blank", "title": "Method Not Allowed", "status": 405}
    with pytest.raises(ApiError) as caught:
        client_answering(405, blank).tasks()
    assert str(caught.value) == "Method Not Allowed"


def test_the_client_calls_the_v1_paths() -> None:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={"items": [], "total": 0, "limit": 50, "offset": 0})

    http = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://api.test")
    ApiClient(http=http).tasks()
    assert asked == ["/api/v1/tasks"]
