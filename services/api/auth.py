"""Bearer tokens and the three roles (docs/reliability.md §Roles).

Tokens are configured as `<token>:<user>:<role>` entries (API_TOKENS, comma-separated, or
API_TOKENS_FILE, one a line), or as `sha256=<hex>:<user>:<role>` so that the server need not
hold the token itself. Only SHA-256 digests are kept in memory, and a presented token is
compared with every digest in constant time: neither a timing difference nor an early exit
tells a caller how close a guess came, or which entry it matched.

An entry may end in `:issued=<time>:expires=<time>` (UTC, `20261202T135600Z`: the basic ISO
form, which has no `:` or `,` to clash with the separators); from its expiry on, the token is
refused as `token_expired`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal, get_args

# `node`: a node's bootstrap token, which can only enrol a node not enrolled yet
# (services/api/routes/enrolment.py); it reads nothing.
Role = Literal["node", "viewer", "operator", "admin"]
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
# The times of an entry's `issued=` and `expires=` fields.
ENTRY_TIME = "%Y%m%dT%H%M%SZ"
_ENTRY_TIME = re.compile(r"^\d{8}T\d{6}Z$")
_TIME_FIELDS = ("issued", "expires")

RefusalReason = Literal["no_token", "unknown_token", "token_expired"]
REFUSAL_TEXT: dict[RefusalReason, str] = {
    "no_token": "no bearer token",
    "unknown_token": "unknown bearer token",
    "token_expired": "expired bearer token",
}


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
class Refusal:
    """Why a caller was not admitted (said in the 401 and in the audit log)."""

    reason: RefusalReason

    @property
    def text(self) -> str:
        return REFUSAL_TEXT[self.reason]


@dataclass(frozen=True)
class TokenEntry:
    digest: bytes
    principal: Principal
    issued_at: datetime | None = None
    expires_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        """True from the entry's expiry on (never, without one)."""
        return self.expires_at is not None and now >= self.expires_at


def entry_time(value: datetime) -> str:
    """`value` as an entry's `issued=`/`expires=` field spells it (UTC, whole seconds)."""
    return value.astimezone(UTC).strftime(ENTRY_TIME)


def _times(fields: list[str], where: str) -> dict[str, datetime]:
    """The `issued=`/`expires=` fields after the role, each at most once."""
    times: dict[str, datetime] = {}
    for field in fields:
        name, sep, value = field.partition("=")
        if not sep or name not in _TIME_FIELDS or name in times:
            raise TokenConfigError(f"{where}: after the role only issued=<time> and "
                                   "expires=<time>, each once")
        if not _ENTRY_TIME.match(value):
            raise TokenConfigError(f"{where}: {name}= needs a UTC time like 20261202T135600Z")
        try:
            times[name] = datetime.strptime(value, ENTRY_TIME).replace(tzinfo=UTC)
        except ValueError as err:
            raise TokenConfigError(f"{where}: {name}={value} is not a date") from err
    if "issued" in times and "expires" in times and times["expires"] <= times["issued"]:
        raise TokenConfigError(f"{where}: expires= must come after issued=")
    return times


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_entry(raw: str, where: str) -> TokenEntry:
    """One `<token|sha256=hex>:<user>:<role>[:issued=<t>][:expires=<t>]` entry; `where`
    names it in errors."""
    secret, sep1, rest = raw.strip().partition(":")
    user, sep2, rest = rest.partition(":")
    role, _, extra = rest.partition(":")
    if not (sep1 and sep2):
        raise TokenConfigError(f"{where}: expected <token>:<user>:<role>")
    times = _times(extra.split(":") if extra else [], where)
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
    return TokenEntry(value, Principal(user, checked), issued_at=times.get("issued"),
                      expires_at=times.get("expires"))


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

    def authenticate(self, token: str | None, now: datetime) -> Principal | Refusal:
        """The principal whose token this is, or why not; the same work whatever matches.

        `token` None: the request carried no bearer token.
        """
        if token is None:
            return Refusal("no_token")
        presented = digest(token)
        found: TokenEntry | None = None
        for entry in self.entries:
            if hmac.compare_digest(presented, entry.digest):
                found = entry
        if found is None:
            return Refusal("unknown_token")
        if found.expired(now):
            return Refusal("token_expired")
        return found.principal


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (None: none, or another scheme)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


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


def token_lines(token: str, user: str, role: Role, issued_at: datetime | None = None,
                ttl: timedelta | None = None) -> tuple[str, str]:
    """The entry to configure for `token`: as is, and as its digest only.

    With `ttl` (and the time it is issued at), the entry expires `ttl` after `issued_at`.
    """
    times = ""
    if ttl is not None:
        if issued_at is None:
            raise ValueError("a token with a ttl needs the time it is issued at")
        times = f":issued={entry_time(issued_at)}:expires={entry_time(issued_at + ttl)}"
    plain = f"{token}:{user}:{role}{times}"
    parse_entry(plain, "the new entry")  # the same checks as the server
    return plain, f"{DIGEST_PREFIX}{digest(token).hex()}:{user}:{role}{times}"
