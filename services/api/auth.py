"""Bearer tokens and the three roles (docs/reliability.md §Roles).

Tokens are configured as `<token>:<user>:<role>` entries (API_TOKENS, comma-separated, or
API_TOKENS_FILE, one a line), or as `sha256=<hex>:<user>:<role>` so that the server need not
hold the token itself. Only SHA-256 digests are kept in memory, and a presented token is
compared with every digest in constant time: neither a timing difference nor an early exit
tells a caller how close a guess came, or which entry it matched.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
# Each role can do everything the roles before it can.
RANK: dict[Role, int] = {role: i for i, role in enumerate(ROLES)}
_ROLE_OF: dict[str, Role] = {role: role for role in ROLES}

DIGEST_PREFIX = "sha256="
# Users become actors of control events and audit entries, which are Identifiers.
_USER = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
# A token shorter than this is guessable; `new_token` makes 43 characters (256 bits).
MIN_TOKEN_CHARS = 16


class TokenConfigError(ValueError):
    """A token entry is malformed; the message says which entry (never the token)."""


@dataclass(frozen=True)
class Principal:
    """Who is calling, and with which role."""

    user: str
    role: Role

    def allows(self, needed: Role) -> bool:
        return RANK[self.role] >= RANK[needed]


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes
    principal: Principal


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_entry(raw: str, where: str) -> TokenEntry:
    """One `<token|sha256=hex>:<user>:<role>` entry; `where` names it in errors."""
    secret, sep1, rest = raw.strip().partition(":")
    user, sep2, role = rest.partition(":")
    if not (sep1 and sep2):
        raise TokenConfigError(f"{where}: expected <token>:<user>:<role>")
    if not _USER.match(user):
        raise TokenConfigError(f"{where}: user {user!r}: letters, digits, '_.-' only (1-128)")
    checked = _ROLE_OF.get(role)
    if checked is None:
        raise TokenConfigError(f"{where}: role {role!r}: one of {', '.join(ROLES)}")
    if secret.startswith(DIGEST_PREFIX):
        hexdigest = secret[len(DIGEST_PREFIX):].lower()
        if not _DIGEST.match(hexdigest):
            raise TokenConfigError(f"{where}: sha256= needs 64 hex digits")
        value = bytes.fromhex(hexdigest)
    elif len(secret) < MIN_TOKEN_CHARS:
        raise TokenConfigError(f"{where}: token shorter than {MIN_TOKEN_CHARS} characters")
    else:
        value = digest(secret)
    return TokenEntry(value, Principal(user, checked))


class TokenTable:
    """The configured tokens, by digest."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self.entries = tuple(entries)
        seen: set[bytes] = set()
        for entry in self.entries:
            # Two users sharing a token could not be told apart in the audit log.
            if entry.digest in seen:
                raise TokenConfigError(f"user {entry.principal.user}: a token is configured "
                                       "twice")
            seen.add(entry.digest)

    def __len__(self) -> int:
        return len(self.entries)

    def authenticate(self, token: str) -> Principal | None:
        """The principal whose token this is, or None; the same work whatever matches."""
        presented = digest(token)
        found: Principal | None = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry.principal
        return found


def load_tokens(inline: str, file: str = "") -> TokenTable:
    """Entries from API_TOKENS (comma-separated) and API_TOKENS_FILE (one a line)."""
    entries = [parse_entry(raw, f"API_TOKENS entry {i + 1}")
               for i, raw in enumerate(inline.split(",")) if raw.strip()]
    if file:
        for n, line in enumerate(Path(file).read_text().splitlines(), start=1):
            line = line.strip()
            if line and not line.startswith("#"):
                entries.append(parse_entry(line, f"{file} line {n}"))
    return TokenTable(entries)


def new_token() -> str:
    """A fresh random token (256 bits, URL-safe, no ':')."""
    return secrets.token_urlsafe(32)


def token_lines(token: str, user: str, role: Role) -> tuple[str, str]:
    """The entry to configure for `token`: as is, and as its digest only."""
    parse_entry(f"{token}:{user}:{role}", "the new entry")  # the same checks as the server
    return f"{token}:{user}:{role}", f"{DIGEST_PREFIX}{digest(token).hex()}:{user}:{role}"
