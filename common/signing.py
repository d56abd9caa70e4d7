"""Ed25519 command signing: each signer (executor, collector, router) holds its own private
key, agents only public keys, each trusted for the actions of its signer's role.

The signature covers the exact payload bytes (canonical JSON of `CommandPayload`), carried
base64url-encoded in `Command.payload`; the agent verifies those bytes before parsing them,
so nothing is ever re-serialised between signing and verifying.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import get_args
from uuid import uuid4

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from common.errors import PermanentError
from schemas.events.v1 import Command, CommandPayload, NodeAction, OpsActionName, now_utc

log = logging.getLogger("clusterwarden.signing")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CommandSigner:
    """Signs command payloads with one signer's private key (its kid goes with each)."""

    def __init__(self, key: Ed25519PrivateKey, kid: str) -> None:
        self.key = key
        self.kid = kid

    def sign(self, payload: CommandPayload, source: str) -> Command:
        """The signed command; its envelope's cluster and subject are the payload's own."""
        body = payload.model_dump_json().encode()
        return Command(
            event_id=uuid4(),
            source=source,
            occurred_at=now_utc(),
            cluster_id=payload.cluster_id,
            subject=payload.node_id,
            correlation_id=str(payload.task_id) if payload.task_id else None,
            kid=self.kid,
            payload=b64url(body),
            sig=b64url(self.key.sign(body)),
        )


# ---------------------------------------------------------------- who may sign what

# The one home of the signers' permissions: each service that signs commands has its own key,
# and an agent executes a command only if the key's role may sign its action. A stolen
# collector or router key can then probe or route, never drain, take offline or move jobs.
_OPS_ACTIONS: frozenset[str] = frozenset(get_args(OpsActionName))
_NODE_ACTIONS: frozenset[str] = frozenset(
    cls.model_fields["action"].default for cls in get_args(NodeAction))
SIGNER_ACTIONS: Mapping[str, frozenset[str]] = MappingProxyType({
    # The task steps (templates use the ops actions only), their status queries and cancels.
    "executor": _OPS_ACTIONS,
    # Liveness: probes, the peers each node probes, the report interval it wants.
    "collector": frozenset({"probe_node", "set_peers", "set_report_interval"}),
    # Routed ML tasks.
    "router": frozenset({"run_inference"}),
    # One key for every signer, as before per-signer keys: a deployment that still has a
    # single `command-signing` pair keeps working, without the limits above.
    "shared": _NODE_ACTIONS,
})
SIGNER_ROLES: tuple[str, ...] = ("executor", "collector", "router")
SHARED_ROLE = "shared"


@dataclass(frozen=True)
class TrustedKey:
    """A public key an agent trusts, and the role whose actions it may sign."""

    kid: str
    public: Ed25519PublicKey
    role: str


@dataclass(frozen=True)
class KeyRegistry:
    """What an agent trusts: keys by id (several per role during a rotation), and the ids
    revoked since (their commands are answered `revoked_kid`, never executed)."""

    keys: Mapping[str, TrustedKey] = field(default_factory=dict)
    revoked: frozenset[str] = frozenset()

    @classmethod
    def of(cls, keys: Iterable[TrustedKey], revoked: Iterable[str] = ()) -> KeyRegistry:
        by_kid: dict[str, TrustedKey] = {}
        for key in keys:
            if key.role not in SIGNER_ACTIONS:
                raise ValueError(f"key {key.kid}: unknown signer role {key.role!r}")
            known = by_kid.setdefault(key.kid, key)
            if known.role != key.role:
                raise ValueError(f"key {key.kid} is trusted as {known.role} and {key.role}")
        return cls(MappingProxyType(by_kid), frozenset(revoked))

    def refusal(self, kid: str, action: str) -> str | None:
        """Why a command signed by `kid` may not do `action`, or None if it may."""
        if kid in self.revoked:
            return "revoked_kid"
        key = self.keys.get(kid)
        if key is None:
            return "unknown_kid"
        if action not in SIGNER_ACTIONS[key.role]:
            return "action_not_allowed"
        return None


@dataclass(frozen=True)
class Authorised:
    """A command whose signature verified: its payload, and why its signer may not do its
    action (None: it may)."""

    payload: CommandPayload
    refusal: str | None


class CommandVerifier:
    """Checks a command's key id, algorithm and signature, then parses its payload.

    `trust` is the registry, or where to read the current one from (re-read as its files
    change, so a rotation or a revocation takes effect without a restart)."""

    def __init__(self, trust: KeyRegistry | Callable[[], KeyRegistry]) -> None:
        self._trust = trust

    def registry(self) -> KeyRegistry:
        trust = self._trust
        return trust if isinstance(trust, KeyRegistry) else trust()

    def verify(self, command: Command) -> CommandPayload:
        return self._verify(command, self.registry())

    def authorise(self, command: Command) -> Authorised:
        """The verified payload and whether its signer may do its action: both from one
        reading of the registry."""
        registry = self.registry()
        payload = self._verify(command, registry)
        return Authorised(payload, registry.refusal(command.kid, payload.action.action))

    @staticmethod
    def _verify(command: Command, registry: KeyRegistry) -> CommandPayload:
        # A revoked key still verifies: its commands are answered (`revoked_kid`), so the
        # centre learns that a signer still uses it.
        trusted = registry.keys.get(command.kid)
        if trusted is None:
            raise PermanentError("unknown_kid", f"key id {command.kid!r} is not trusted")
        if command.alg != "ed25519":
            raise PermanentError("alg_mismatch", command.alg)
        try:
            # Inside: a payload the pattern allows and base64 cannot decode (4n+1 characters)
            # is a bad signature too, not an unhandled error.
            body = unb64url(command.payload)
            trusted.public.verify(unb64url(command.sig), body)
        except (InvalidSignature, ValueError) as err:
            raise PermanentError("bad_signature", "signature does not verify") from err
        return CommandPayload.model_validate_json(body)


# ---------------------------------------------------------------- key files
#
# A key file's name carries its role: `<role>.key` / `<role>.pub`, and during a rotation
# `<role>.<label>.pub` beside it (`executor.2027-01.pub`). The name is the one thing every
# copy of a public key keeps, in a state folder, a Secret or a mounted volume, so the agent's
# list of trusted keys stays a list of files (or folders of them) and nothing else must
# agree with it. `command-signing.pub`, the single pair of older deployments, is the shared
# role.

SHARED_STEM = "command-signing"


def role_of(path: Path) -> str:
    """The signer role a public key file's name gives it."""
    role = path.name.removesuffix(".pub").split(".", 1)[0]
    if role == SHARED_STEM:
        return SHARED_ROLE
    if role not in SIGNER_ROLES:
        raise ValueError(f"{path}: the name of a trusted key must be <role>.pub or "
                         f"<role>.<label>.pub, role one of {', '.join(SIGNER_ROLES)}")
    return role


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable id derived from the public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "cw-" + b64url(raw)[:16].replace("-", "x").replace("_", "y")


def public_pem(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.PEM,
                               serialization.PublicFormat.SubjectPublicKeyInfo)


def ensure_keypair(directory: Path, stem: str) -> tuple[Path, Path]:
    """Create the pair `<stem>.key`, `<stem>.pub` in `directory` if missing; returns
    (private, public)."""
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / f"{stem}.key", directory / f"{stem}.pub"
    if not private_path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = private_path.with_suffix(f".{uuid4().hex}.tmp")
        tmp.write_bytes(pem)
        os.chmod(tmp, 0o600)
        # Two services starting at once must not each make a different key: the first wins.
        try:
            os.link(tmp, private_path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    if not public_path.exists():
        write_public_key(public_path, load_private_key(private_path).public_key())
    return private_path, public_path


def write_public_key(path: Path, public: Ed25519PublicKey) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{uuid4().hex}.tmp")
    tmp.write_bytes(public_pem(public))
    tmp.replace(path)


def ensure_signer_keys(directory: Path) -> list[Path]:
    """Every signer's pair in `directory` (made if missing); returns the public keys, the
    ones a local agent trusts."""
    return [ensure_keypair(directory, role)[1] for role in SIGNER_ROLES]


def load_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(path.read_bytes())
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} is not an Ed25519 public key")
    return key


def signer_from_file(path: Path) -> CommandSigner:
    private = load_private_key(path)
    return CommandSigner(private, key_id(private.public_key()))


def trusted_key_files(entries: Iterable[Path]) -> list[Path]:
    """The public key files of `entries`: a file is itself, a folder its `*.pub` files."""
    files: list[Path] = []
    for entry in entries:
        files.extend(sorted(entry.glob("*.pub")) if entry.is_dir() else [entry])
    return files


def read_revoked(path: Path | None) -> frozenset[str]:
    """The revoked key ids of a file, one a line (`#` starts a comment); none if missing."""
    if path is None or not path.exists():
        return frozenset()
    kids = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return frozenset(kid for kid in kids if kid)


def registry_from_files(entries: Iterable[Path], revoked: Path | None = None) -> KeyRegistry:
    keys = []
    for path in trusted_key_files(entries):
        public = load_public_key(path)
        keys.append(TrustedKey(key_id(public), public, role_of(path)))
    return KeyRegistry.of(keys, read_revoked(revoked))


class TrustFiles:
    """The registry of an agent's trusted key files and revoked-kid file, read again when
    any of them (or a trusted folder) changes: a rotation's new key, or a revocation, takes
    effect with the next command. A few stat calls a command; the signature check costs
    more."""

    def __init__(self, entries: Iterable[Path], revoked: Path | None = None) -> None:
        self.entries = list(entries)
        self.revoked = revoked
        self._stamp = self._stamp_now()
        self._registry = registry_from_files(self.entries, revoked)  # a bad file: no start

    def _stamp_now(self) -> tuple[tuple[str, int, int], ...]:
        paths = [*self.entries, *trusted_key_files(p for p in self.entries if p.is_dir())]
        if self.revoked is not None:
            paths.append(self.revoked)
        stamp = []
        for path in paths:
            try:
                info = path.stat()
            except OSError:
                stamp.append((str(path), -1, -1))
            else:
                stamp.append((str(path), info.st_mtime_ns, info.st_size))
        return tuple(stamp)

    def __call__(self) -> KeyRegistry:
        stamp = self._stamp_now()
        if stamp != self._stamp:
            try:
                self._registry = registry_from_files(self.entries, self.revoked)
            except (OSError, ValueError):
                # Half-written or wrong: keep what was trusted, and read again next time.
                log.exception("the trusted keys changed but cannot be read; keeping the "
                              "previous ones")
                return self._registry
            self._stamp = stamp
            log.info("trusted keys read again: %s; revoked: %s",
                     ", ".join(f"{k.kid} ({k.role})" for k in self._registry.keys.values()),
                     ", ".join(sorted(self._registry.revoked)) or "none")
        return self._registry


def verifier_from_files(entries: list[Path], revoked: Path | None = None) -> CommandVerifier:
    return CommandVerifier(TrustFiles(entries, revoked))


def local_signer(configured: str, state_dir: str, role: str) -> CommandSigner:
    """The configured private key, or the role's own pair made on first start (for a local
    fleet): `<state>/keys/<role>.key`."""
    if configured:
        return signer_from_file(Path(configured))
    private, _ = ensure_keypair(Path(state_dir) / "keys", role)
    return signer_from_file(private)
