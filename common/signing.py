"""Ed25519 command signing: the centre holds the private key, agents only public keys.

The signature covers the exact payload bytes (canonical JSON of `CommandPayload`), carried
base64url-encoded in `Command.payload`; the agent verifies those bytes before parsing them,
so nothing is ever re-serialised between signing and verifying.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from uuid import uuid4

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from common.errors import PermanentError
from schemas.events.v1 import Command, CommandPayload, now_utc


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class CommandSigner:
    """Signs command payloads with the centre's private key."""

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


class CommandVerifier:
    """Checks a command's key id, algorithm and signature, then parses its payload."""

    def __init__(self, trusted: dict[str, Ed25519PublicKey]) -> None:
        self.trusted = trusted

    def verify(self, command: Command) -> CommandPayload:
        key = self.trusted.get(command.kid)
        if key is None:
            raise PermanentError("unknown_kid", f"key id {command.kid!r} is not trusted")
        if command.alg != "ed25519":
            raise PermanentError("alg_mismatch", command.alg)
        body = unb64url(command.payload)
        try:
            key.verify(unb64url(command.sig), body)
        except (InvalidSignature, ValueError) as err:
            raise PermanentError("bad_signature", "signature does not verify") from err
        return CommandPayload.model_validate_json(body)


# ---------------------------------------------------------------- key files

PRIVATE_NAME = "command-signing.key"
PUBLIC_NAME = "command-signing.pub"


def key_id(public: Ed25519PublicKey) -> str:
    """A short, stable id derived from the public key."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "cw-" + b64url(raw)[:16].replace("-", "x").replace("_", "y")


def ensure_keypair(directory: Path) -> tuple[Path, Path]:
    """Create the centre's key pair in `directory` if missing; returns (private, public)."""
    directory.mkdir(parents=True, exist_ok=True)
    private_path, public_path = directory / PRIVATE_NAME, directory / PUBLIC_NAME
    if not private_path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = private_path.with_suffix(".tmp")
        tmp.write_bytes(pem)
        os.chmod(tmp, 0o600)
        tmp.replace(private_path)
    if not public_path.exists():
        private = load_private_key(private_path)
        public_path.write_bytes(
            private.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return private_path, public_path


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


def verifier_from_files(paths: list[Path]) -> CommandVerifier:
    keys = [load_public_key(p) for p in paths]
    return CommandVerifier({key_id(k): k for k in keys})


def local_signer(configured: str, state_dir: str) -> CommandSigner:
    """The configured private key, or a local pair made on first start (for a local fleet)."""
    if configured:
        return signer_from_file(Path(configured))
    private, _ = ensure_keypair(Path(state_dir) / "keys")
    return signer_from_file(private)
