"""`warden secrets init`: everything a deployment's processes must share, made once (the
compose stack's one-shot `secrets` service runs it before anything else starts).

Into the state folder's `keys/` (mounted into the control-plane services only):
- a signing pair per signer (executor, collector, router), each trusted by agents for its own
  actions only (docs/security.md);
- the report master the collector checks reports with and the API enrols nodes under;
- the audit key the audit chains' heads are keyed with;
- `api-tokens`: the API's entries, as digests only, for an admin and for node bootstrap;
  the admin's token itself in `admin.token`, for the operator to copy out.
Into `--trust` (mounted into the agents): the signers' public keys and the bootstrap token,
nothing an agent could sign or forge a report with.

What exists is kept: running it again changes nothing, so it can run at every `up`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Annotated

import typer

from common.reportauth import ensure_master, master_path
from common.settings import ReportReaderSettings
from common.signing import ensure_signer_keys
from services.api.auth import Role, new_token, token_lines
from services.shared.audit import audit_key
from warden.cli.common import service_settings, state_dir

app = typer.Typer(help="What a deployment's processes share: keys, master, tokens.",
                  no_args_is_help=True)

TOKENS_FILE = "api-tokens"
ADMIN_TOKEN_FILE = "admin.token"
BOOTSTRAP_TOKEN_FILE = "bootstrap.token"
ADMIN_USER = "admin"
BOOTSTRAP_USER = "node-bootstrap"


def write_new(path: Path, text: str, mode: int) -> bool:
    """Write `path` only if it does not exist yet (O_EXCL: two runs at once make one)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return True


def token_file(folder: Path, name: str, mode: int) -> str:
    """The token kept in `folder/name`, made if missing."""
    path = folder / name
    write_new(path, new_token() + "\n", mode)
    return path.read_text().strip()


@app.command("init")
def init(
    trust: Annotated[Path, typer.Option(
        help="Where the agents' trusted public keys and the bootstrap token go.")],
) -> None:
    """Make the keys, the report master, the audit key and the API tokens (if missing)."""
    settings = service_settings()
    master = master_path(ReportReaderSettings().report_master_key, state_dir(settings))
    keys = state_dir(settings) / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    trust.mkdir(parents=True, exist_ok=True)
    for public in ensure_signer_keys(keys):
        shutil.copyfile(public, trust / public.name)
    ensure_master(master)
    audit_key(settings)
    admin = token_file(keys, ADMIN_TOKEN_FILE, 0o600)
    # Agents run as the same numeric user as the services, and read it from their own mount.
    bootstrap = token_file(trust, BOOTSTRAP_TOKEN_FILE, 0o600)
    entries: list[tuple[str, str, Role]] = [(admin, ADMIN_USER, "admin"),
                                            (bootstrap, BOOTSTRAP_USER, "node")]
    lines = [token_lines(token, user, role)[1] for token, user, role in entries]
    made = write_new(keys / TOKENS_FILE,
                     "# made by `warden secrets init`: digests only\n" + "\n".join(lines) + "\n",
                     0o600)
    typer.echo(f"keys in {keys} (signers, report master {master.name}, audit key, "
               f"{TOKENS_FILE}{'' if made else ' kept'}); trusted keys and the bootstrap token "
               f"in {trust}; the admin token is in {keys / ADMIN_TOKEN_FILE}")
