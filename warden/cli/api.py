"""`warden api`: run the operators' HTTP API and web console, or make a token for it."""

from __future__ import annotations

import contextlib
import re
from datetime import timedelta
from typing import Annotated

import typer

from warden.cli.common import identifier

_TTL = re.compile(r"^(\d{1,6})([mhd])$")
_TTL_UNIT = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}


def ttl_option(value: str | None) -> timedelta | None:
    """`--ttl`: minutes, hours or days (`90m`, `12h`, `30d`), or none (never expires)."""
    if value is None:
        return None
    found = _TTL.match(value.strip())
    if not found or int(found.group(1)) == 0:
        raise typer.BadParameter(f"{value!r}: a whole number of minutes, hours or days, "
                                 "like 90m, 12h or 30d")
    return int(found.group(1)) * _TTL_UNIT[found.group(2)]


app = typer.Typer(help="Run the operators' HTTP API and web console (no subcommand), or "
                  "make a token for it (`token`).")


@app.callback(invoke_without_command=True)
def api_serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Listen address (API_HOST).")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65_535,
                                             help="Port (API_PORT, 18080).")] = None,
) -> None:
    """Run the API and the web console (uvicorn) until Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    from services.api.app import serve
    from services.api.settings import ApiSettings

    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = ApiSettings().model_copy(update=overrides)
    with contextlib.suppress(KeyboardInterrupt):
        serve(settings)


@app.command("token")
def api_token(
    user: Annotated[str, typer.Option(help="Who the token is for (named in the audit log).",
                                      callback=identifier)],
    role: Annotated[str, typer.Option(
        help="node (a bootstrap token: enrols new nodes only), viewer, operator or admin.")],
    ttl: Annotated[str | None, typer.Option(
        help="Expire the token this long after now (90m, 12h, 30d); without it, it never "
             "expires.")] = None,
) -> None:
    """Make a new random token and print the entry that grants it."""
    from schemas.events.v1 import now_utc
    from services.api.auth import ROLES, new_token, token_lines

    if role not in ROLES:
        raise typer.BadParameter(f"one of {', '.join(ROLES)}", param_hint="--role")
    lifetime = ttl_option(ttl)
    token = new_token()
    issued = now_utc()
    plain, hashed = token_lines(token, user, role, issued_at=issued, ttl=lifetime)
    typer.echo(f"token: {token}")
    typer.echo(f"add to API_TOKENS (comma-separated) or a line of API_TOKENS_FILE:\n  {plain}")
    typer.echo(f"or keep only its digest on the server:\n  {hashed}")
    typer.echo("the caller sets WARDEN_API_TOKEN to the token")
    if lifetime is not None:
        typer.echo(f"it expires at {(issued + lifetime).replace(microsecond=0).isoformat()}")
