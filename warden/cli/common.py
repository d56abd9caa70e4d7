"""What every command group uses: the settings, option types and checks, the API client and
plain-text output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

import typer
from pydantic import SecretStr, TypeAdapter, ValidationError

from common.settings import ServiceSettings
from schemas.envelope import Identifier, Reason
from services.api.client import ApiClient, ApiError, ClientSettings
from services.shared.registry import register

# How every command ends, for scripts (also in `warden --help` and the README).
EXIT_OK: Final = 0
# The API refused or failed the call, or what was asked did not happen (e.g. a control the
# executor refused, a broken audit chain).
EXIT_FAILED: Final = 1
# A usage error: a bad option or argument. Click ends its own usage errors so, and every
# check of ours raises typer.BadParameter, which Click ends the same way.
EXIT_USAGE: Final = 2
# `--wait` gave up: the task had not settled when its --timeout ran out (it may still).
EXIT_WAIT_TIMEOUT: Final = 3
EXIT_CODES: Final = {
    EXIT_OK: "done",
    EXIT_FAILED: "the API refused or failed the call, or what was asked did not happen",
    EXIT_USAGE: "usage error (a bad option or argument)",
    EXIT_WAIT_TIMEOUT: "--wait timed out before the task settled",
}


def exit_codes_text() -> str:
    """The exit codes, for the root command's help."""
    return "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items())


def wait_timed_out(state: str, timeout_s: float) -> typer.Exit:
    typer.echo(f"still {state} after {timeout_s:g}s; stopped waiting", err=True)
    return typer.Exit(EXIT_WAIT_TIMEOUT)


def service_settings() -> ServiceSettings:
    return ServiceSettings()


def state_dir(settings: ServiceSettings) -> Path:
    return Path(settings.state_dir).resolve()


def service_env(settings: ServiceSettings) -> dict[str, str]:
    return {
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "REDIS_URL": settings.redis_url,
        "WARDEN_NAMESPACE": settings.namespace,
        "WARDEN_CLUSTER_ID": settings.cluster_id,
        "WARDEN_STATE_DIR": str(state_dir(settings)),
    }


def enrol(settings: ServiceSettings, nodes: list[str]) -> None:
    """Register local agents: the collector quarantines reports from unknown nodes."""
    asyncio.run(register(settings.redis_url, settings.namespace, settings.cluster_id, nodes))


def api_url() -> str:
    from services.api.settings import ApiSettings

    api = ApiSettings()
    return f"http://{api.host}:{api.port}"


LOCAL_TOKENS_FILE = "api-tokens"
LOCAL_ADMIN = "local-admin"


def local_tokens_file(settings: ServiceSettings) -> Path:
    """The token file `warden up` makes for a local API when none is configured."""
    return state_dir(settings) / "keys" / LOCAL_TOKENS_FILE


_IDENTIFIER: TypeAdapter[str] = TypeAdapter(Identifier)
_REASON: TypeAdapter[str] = TypeAdapter(Reason)


def identifier(value: str) -> str:
    """An id as the contract spells ids (letters, digits, `_.-`), or a usage error."""
    try:
        return _IDENTIFIER.validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter(
            f"{value!r}: letters, digits, '_', '.' and '-' only (1-128)") from err


def optional_identifier(value: str | None) -> str | None:
    return None if value is None else identifier(value)


def valid_reason(value: str) -> str:
    try:
        return _REASON.validate_python(value)
    except ValidationError as err:
        raise typer.BadParameter("a reason of 1 to 500 characters is required") from err


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON (for scripts).")]
# The filters and the page of a listing (`warden tasks list`, `warden ml list`).
ClusterOption = Annotated[str | None, typer.Option(callback=optional_identifier)]
SinceOption = Annotated[str | None, typer.Option(help="Active since (ISO time, UTC).")]
LimitOption = Annotated[int, typer.Option(min=1, max=500)]
OffsetOption = Annotated[int, typer.Option(min=0)]
WaitOption = Annotated[bool, typer.Option(
    "--wait", help="Follow the task, printing each transition, until it settles.")]
TimeoutOption = Annotated[float, typer.Option(
    min=1.0, help=f"Give up waiting after this, s (exit {EXIT_WAIT_TIMEOUT}).")]
ReasonOption = Annotated[str, typer.Option(help="Why (recorded with the control and in the "
                                                "audit log).", callback=valid_reason)]


def api_client() -> ApiClient:
    """The API client of WARDEN_API_URL and WARDEN_API_TOKEN (replaced in tests).

    Without WARDEN_API_TOKEN, the local admin token `warden up` made is used, if there is one.
    """
    client = ClientSettings()
    if not client.token.get_secret_value():
        local = local_tokens_file(service_settings())
        if local.exists():
            entries = [line for line in local.read_text().splitlines()
                       if line.strip() and not line.startswith("#")]
            if entries:
                client = client.model_copy(
                    update={"token": SecretStr(entries[0].partition(":")[0])})
    return ApiClient(client)


def fail(err: ApiError) -> typer.Exit:
    typer.echo(f"error ({err.status}): {err}" if err.status else f"error: {err}", err=True)
    return typer.Exit(EXIT_FAILED)


T = TypeVar("T")


def from_api(call: Callable[[ApiClient], T]) -> T:
    """What one call of the API client returns; an API error ends the command (EXIT_FAILED)."""
    try:
        with api_client() as client:
            return call(client)
    except ApiError as err:
        raise fail(err) from err


def print_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True))


def print_page(page: Mapping[str, Any], as_json: bool, offset: int,
               render: Callable[[list[Any]], str], what: str) -> None:
    """A listing's page: its JSON, `no <what> matches`, or its table and where the rest is."""
    if as_json:
        print_json(page)
        return
    items = page["items"]
    if not items:
        typer.echo(f"no {what} matches")
        return
    typer.echo(render(items))
    shown = offset + len(items)
    if shown < page["total"]:
        typer.echo(f"({len(items)} of {page['total']}; --offset {shown} for more)")


def table(headers: list[str], rows: list[list[str]], max_width: int = 60) -> str:
    """A plain-text table: one header line, one line per row, columns padded to fit."""
    cells = [[c if len(c) <= max_width else c[:max_width - 1] + "~" for c in row]
             for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


def when(value: object) -> str:
    """An API time (ISO, UTC) as `YYYY-MM-DD HH:MM:SS`; '-' for none."""
    if not isinstance(value, str) or not value:
        return "-"
    return value.replace("T", " ")[:19]


def or_dash(value: object) -> str:
    """A value as a table or a description prints it: '-' for none."""
    return "-" if value is None or value == "" else str(value)
