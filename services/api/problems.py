"""Every error the API answers, as RFC 9457 problem details (`application/problem+json`).

A problem document holds `type` (a URI naming the kind of problem; `about:blank` for a status
with no kind of its own, titled with the status's phrase), `title` (the kind's summary, the
same for every occurrence), `status`, `detail` (this occurrence, for a person) and `instance`
(the request's path). What an error said before problem details, beyond its `detail`, stays
as an extension member: the guard's `reason` on a 401, FastAPI's `errors` on an invalid
request, a template's `problems` field by field.

The handlers here are registered in services/api/app.py; the guard (services/api/guard.py)
answers its 401 and 413 with `problem_response` itself, before the app is reached.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from http import HTTPStatus
from typing import Any, Final, NamedTuple

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

PROBLEM_JSON: Final = "application/problem+json"
TYPE_BASE: Final = "https://clusterwarden.dev/problems/"
BLANK: Final = "about:blank"
STANDARD_MEMBERS: Final = frozenset({"type", "title", "status", "detail", "instance"})


class ProblemKind(NamedTuple):
    """A kind of problem: its `type` is TYPE_BASE + slug."""

    slug: str
    title: str


UNAUTHENTICATED: Final = ProblemKind("unauthenticated", "A valid bearer token is required")
FORBIDDEN: Final = ProblemKind("forbidden", "The caller's role does not allow this")
NOT_FOUND: Final = ProblemKind("not-found", "No such resource")
CONFLICT: Final = ProblemKind("conflict", "Refused in the resource's current state")
BODY_TOO_LARGE: Final = ProblemKind("body-too-large", "The request body is too large")
INVALID_REQUEST: Final = ProblemKind("invalid-request", "The request is not valid")
INVALID_TEMPLATE: Final = ProblemKind("invalid-template", "The template is not valid")
INTERNAL_ERROR: Final = ProblemKind("internal-error", "The API failed")
UNAVAILABLE: Final = ProblemKind("unavailable", "A service the API needs is unavailable")

# The kind an error of each status is unless it names its own (ApiProblem).
KIND_OF_STATUS: Final[Mapping[int, ProblemKind]] = {
    401: UNAUTHENTICATED, 403: FORBIDDEN, 404: NOT_FOUND, 409: CONFLICT,
    413: BODY_TOO_LARGE, 422: INVALID_REQUEST, 500: INTERNAL_ERROR, 503: UNAVAILABLE,
}
# Every kind, for the documentation and its test.
KINDS: Final = (*KIND_OF_STATUS.values(), INVALID_TEMPLATE)


class ProblemResponse(JSONResponse):
    media_type = PROBLEM_JSON


def phrase(status: int) -> str:
    """The status's reason phrase; a code HTTP does not define has none."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return f"Error {status}"


def problem_body(status: int, detail: str, instance: str, kind: ProblemKind | None = None,
                 **extensions: Any) -> dict[str, Any]:
    clash = STANDARD_MEMBERS & extensions.keys()
    if clash:
        raise ValueError(f"extension members may not redefine {sorted(clash)}")
    kind = kind or KIND_OF_STATUS.get(status)
    if kind is None:
        kind_fields = {"type": BLANK, "title": phrase(status)}
    else:
        kind_fields = {"type": TYPE_BASE + kind.slug, "title": kind.title}
    return kind_fields | {"status": status, "detail": detail, "instance": instance} | extensions


def problem_response(status: int, detail: str, instance: str, kind: ProblemKind | None = None,
                     headers: Mapping[str, str] | None = None,
                     **extensions: Any) -> ProblemResponse:
    """A problem document as the answer (`instance`: the request's path)."""
    return ProblemResponse(problem_body(status, detail, instance, kind, **extensions),
                           status_code=status, headers=headers)


class ApiProblem(Exception):
    """Raised by a route for a problem of a kind of its own, or with extension members."""

    def __init__(self, status: int, detail: str, kind: ProblemKind | None = None,
                 **extensions: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind
        self.extensions = extensions


def _detail_text(detail: object) -> str:
    return detail if isinstance(detail, str) else str(jsonable_encoder(detail))


async def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
    """An HTTPException (a route's, the router's 404 and 405, the console's 404)."""
    if exc.status_code in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
        return Response(status_code=exc.status_code, headers=exc.headers)  # may have no body
    return problem_response(exc.status_code, _detail_text(exc.detail), request.url.path,
                            headers=exc.headers)


async def raised_problem(request: Request, exc: ApiProblem) -> Response:
    return problem_response(exc.status, exc.detail, request.url.path, exc.kind,
                            **exc.extensions)


def where(error: Mapping[str, Any]) -> str:
    """`body.reason`, `query.limit`: the dotted location FastAPI gives an invalid field."""
    return ".".join(str(part) for part in error.get("loc", ()))


def invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """422: every invalid field in `detail`, and each as FastAPI reports it in `errors`."""
    errors = jsonable_encoder(exc.errors())
    detail = "; ".join(f"{where(e)}: {e.get('msg')}" if where(e) else str(e.get("msg"))
                       for e in errors) or "the request is not valid"
    return problem_response(422, detail, request.url.path, errors=errors)


async def unhandled_problem(request: Request, exc: Exception) -> Response:
    """500 for an exception no route expected. Nothing of it is said: its text may hold what a
    caller must not see. The server logs it (the exception is raised again after this)."""
    return problem_response(500, "the API failed on this request; its log has the cause",
                            request.url.path)


# ------------------------------------------------------------------ the OpenAPI document


class ProblemDocument(BaseModel):
    """An error, as RFC 9457 problem details (`application/problem+json`)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description=f"The kind of problem: {TYPE_BASE}<kind>, or {BLANK}.")
    title: str = Field(description="The kind's summary.")
    status: int
    detail: str = Field(description="What went wrong this time.")
    instance: str = Field(description="The request's path.")
    reason: str | None = Field(
        default=None, description="401 only: no_token, unknown_token or token_expired.")
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="422 on an invalid request: each invalid field.")


PROBLEM_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    "4XX": {"model": ProblemDocument, "description": "Refused (problem details)"},
    "5XX": {"model": ProblemDocument, "description": "Failed (problem details)"},
}


def with_problem_media_type(make_document: Callable[[], dict[str, Any]],
                            ) -> Callable[[], dict[str, Any]]:
    """The OpenAPI document with its error responses as `application/problem+json`: FastAPI
    files every response model under `application/json`."""

    def document() -> dict[str, Any]:
        made = make_document()
        for operations in made.get("paths", {}).values():
            for operation in operations.values():
                for code, response in operation.get("responses", {}).items():
                    content = response.get("content", {})
                    if str(code)[0] in "45" and "application/json" in content:
                        content[PROBLEM_JSON] = content.pop("application/json")
        return made

    return document
