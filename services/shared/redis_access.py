"""Who may do what in Redis: a user per service, the one table the secured Redis' ACL comes from.

Each service that keeps state in Redis connects as its own user (its `REDIS_URL` names it and
its password), so the server's ACL log and `CLIENT LIST` say which service did what, one
service's password can be changed or revoked alone, and a service that is taken over cannot
act as another. Every user may reach only the keys of its deployment's namespace
(`Keys.prefix`) and no command of Redis' `@dangerous` category (FLUSHALL, CONFIG, KEYS, DEBUG,
SHUTDOWN, ACL, MONITOR, REPLICAOF, MODULE, ...): nothing that wipes, reconfigures or spies on
the server. The `default` user is off, so a client without a password gets `NOAUTH`; `admin`
(every key and command) is for the operator and the setup scripts, and nothing runs as it.

What the table does not do yet is confine a service to its own key families (the router to
its ML records, say): scripts of several services share families such as locks and breaker
holds, and that split waits for the key layout of Redis Cluster (hash tags per family).

`python -m services.shared.redis_access write --namespace NS --dir DIR` makes each user's
password (once, owner-only, `DIR/<user>.password`) and writes `DIR/users.acl` for
redis-server's `--aclfile`; `url USER` prints the URL that connects as USER
(deploy/local/redis.sh `start --secure`, `url USER`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import sys
from collections.abc import Mapping
from pathlib import Path

from schemas.access import Principal
from services.shared.redis_client import Keys

ADMIN = "admin"
# The services that keep state in Redis; the others (templater, store, alerts) and the
# agents get no Redis user at all.
REDIS_USERS: tuple[Principal, ...] = (
    Principal.COLLECTOR, Principal.ANALYZER, Principal.SCHEDULER, Principal.EXECUTOR,
    Principal.ROUTER, Principal.TUNER, Principal.INVENTORY, Principal.API)
# Every command but those that wipe, reconfigure or watch the whole server.
SERVICE_COMMANDS = "+@all -@dangerous"
PASSWORD_BYTES = 24


def password_digest(password: str) -> str:
    """The form an ACL file keeps a password in (`#<sha256 hex>`): the file holds no secret."""
    return hashlib.sha256(password.encode()).hexdigest()


def user_rule(user: str, password: str, prefix: str | None) -> str:
    """One `user` line of the ACL file; `prefix` None: every key and command (the admin)."""
    head = f"user {user} on #{password_digest(password)} resetkeys resetchannels"
    if prefix is None:
        return f"{head} ~* &* +@all"
    # A prefix is made of identifier characters and ':' only (Keys), never a glob character.
    return f"{head} ~{prefix}* -@all {SERVICE_COMMANDS}"


def acl_file(namespace: str, passwords: Mapping[str, str]) -> str:
    """The whole ACL file: `default` off, the admin, one user per service of REDIS_USERS."""
    prefix = Keys(namespace).prefix
    lines = ["user default off resetkeys resetchannels -@all",
             user_rule(ADMIN, passwords[ADMIN], None)]
    lines += [user_rule(user, passwords[user], prefix) for user in REDIS_USERS]
    return "\n".join(lines) + "\n"


def ensure_password(directory: Path, user: str) -> str:
    """`user`'s password, made (random, owner-only) the first time."""
    path = directory / f"{user}.password"
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(PASSWORD_BYTES) + "\n")
    return path.read_text().strip()


def write(namespace: str, directory: Path) -> Path:
    passwords = {user: ensure_password(directory, user) for user in (ADMIN, *REDIS_USERS)}
    path = directory / "users.acl"
    path.write_text(acl_file(namespace, passwords))
    return path


def url(directory: Path, user: str, host: str, port: int) -> str:
    """The URL that connects as `user` (its password is URL-safe as made)."""
    return f"redis://{user}:{ensure_password(directory, user)}@{host}:{port}/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.shared.redis_access")
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("write", help="make the passwords and write users.acl")
    made.add_argument("--namespace", default="")
    made.add_argument("--dir", type=Path, required=True)
    asked = sub.add_parser("url", help="print the URL that connects as a user")
    asked.add_argument("user", choices=[ADMIN, *REDIS_USERS])
    asked.add_argument("--dir", type=Path, required=True)
    asked.add_argument("--host", default="127.0.0.1")
    asked.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "write":
        print(write(args.namespace, args.dir))
    else:
        print(url(args.dir, args.user, args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
