"""`warden api`: run the operators' HTTP API and web console, or make a token for it."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from warden.cli.common import identifier

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
    role: Annotated[str, typer.Option(help="viewer, operator or admin.")],
) -> None:
    """Make a new random token and print the entry that grants it."""
    from services.api.auth import ROLES, new_token, token_lines

    if role not in ROLES:
        raise typer.BadParameter(f"one of {', '.join(ROLES)}", param_hint="--role")
    token = new_token()
    plain, hashed = token_lines(token, user, role)
    typer.echo(f"token: {token}")
    typer.echo(f"add to API_TOKENS (comma-separated) or a line of API_TOKENS_FILE:\n  {plain}")
    typer.echo(f"or keep only its digest on the server:\n  {hashed}")
    typer.echo("the caller sets WARDEN_API_TOKEN to the token")
