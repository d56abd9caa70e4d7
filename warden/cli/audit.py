"""`warden audit`: the audit log's head, to keep apart from the store, the chain's
verification against it, and the head keyed again after a check (through the API: admin)."""

from __future__ import annotations

import json
import re
from typing import Annotated

import typer

from warden.cli.common import EXIT_FAILED, JsonOption, from_api, valid_reason

app = typer.Typer(help="The audit log's hash chain: export its head, verify it (admin).",
                  no_args_is_help=True)
_HASH = re.compile(r"^[0-9a-f]{64}$")


def chain_hash(value: str | None) -> str | None:
    if value is not None and not _HASH.match(value):
        raise typer.BadParameter("64 lowercase hex digits, as `warden audit head` prints")
    return value


@app.command("head")
def audit_head(as_json: JsonOption = False) -> None:
    """Print the chain's head (its last hash and count): keep it apart from the store, and
    give it to `warden audit verify --head` later."""
    head = from_api(lambda client: client.audit_head())
    typer.echo(json.dumps(head) if as_json else f"{head['hash']} {head['count']}")


@app.command("verify")
def audit_verify(
    head: Annotated[str | None, typer.Option(
        help="A head `warden audit head` printed earlier: the chain must still hold its "
             "entry, so a tail cut off with the head rewritten is found.",
        callback=chain_hash)] = None,
    as_json: JsonOption = False,
) -> None:
    """Recompute the chain from its first entry; exit 1 if it is broken."""
    verdict = from_api(lambda client: client.verify_audit(head))
    if as_json:
        typer.echo(json.dumps(verdict))
    elif verdict["ok"]:
        typer.echo(f"audit chain intact: {verdict['entries']} entries"
                   + (", the anchored head among them" if head else ""))
    else:
        where = f" (entry {verdict['bad_id']})" if verdict.get("bad_id") else ""
        typer.echo(f"audit chain broken after {verdict['entries']} entries{where}: "
                   f"{verdict['reason']}", err=True)
    if not verdict["ok"]:
        raise typer.Exit(EXIT_FAILED)


@app.command("key-head")
def audit_key_head(
    head: Annotated[str, typer.Option(
        help="The head `warden audit head` printed, checked first (e.g. with `warden audit "
             "verify --head` against one kept apart): keyed only if it is still the head.",
        callback=chain_hash)],
    reason: Annotated[str, typer.Option(help="Why (recorded in the audit log).",
                                        callback=valid_reason)],
) -> None:
    """Key the chain's head under the audit key (admin, audited): a head from before the key
    was set, or one an append left unkeyed because the head before it had failed. Prints the
    new head: keep it apart as the next anchor."""
    keyed = from_api(lambda client: client.call("POST", "/api/v1/audit/head/key",
                                                json={"head": head, "reason": reason}))
    typer.echo(f"{keyed['hash']} {keyed['count']}")
