"""Run the control plane locally: the signing keys, the topics, every service and the API."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Annotated

import typer

from common.kafka_access import client_options
from common.messaging import ensure_topics
from common.settings import ServiceSettings
from common.signing import SHARED_STEM, ensure_keypair, ensure_signer_keys
from warden import launcher
from warden.cli.common import (
    LOCAL_ADMIN,
    api_url,
    local_tokens_file,
    service_env,
    service_settings,
    state_dir,
)


def keys(
    shared: Annotated[bool, typer.Option(
        "--shared", help="One pair for every signer (command-signing.key, .pub), as a "
        "deployment from before per-signer keys uses; agents trust it for every action.")
    ] = False,
) -> None:
    """Create the command-signing key pairs in the state folder (if missing): one per signer
    (executor, collector, router), each trusted by agents for its own actions only."""
    folder = state_dir(service_settings()) / "keys"
    if shared:
        private, public = ensure_keypair(folder, SHARED_STEM)
        typer.echo(f"private key: {private}\npublic key:  {public}")
        return
    for public in ensure_signer_keys(folder):
        typer.echo(f"{public.stem}: private key {public.with_suffix('.key')}, "
                   f"public key {public}")


def topics() -> None:
    """Create every topic (and dead-letter topic) of the namespace."""
    settings = service_settings()
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace,
                              security=client_options(settings)))
    typer.echo("topics ready")


def api_env(settings: ServiceSettings) -> dict[str, str]:
    """What the API (and the templater) need beside the shared settings.

    Without API_TOKENS or API_TOKENS_FILE every call would be refused, so a local admin token
    is made once in the state folder (readable by its owner only), where `warden tasks ...`
    finds it too. Templates need nothing: the API and the templater share the task store
    (DATABASE_URL, or the state folder's warden.db), where every template version lives.
    """
    from services.api.auth import new_token
    from services.api.templates import templater_env

    env = templater_env(os.environ.get("TEMPLATER_TEMPLATE_DIR", ""), str(state_dir(settings)))
    if not (os.environ.get("API_TOKENS") or os.environ.get("API_TOKENS_FILE")):
        path = local_tokens_file(settings)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(f"# made by `warden up`: the local admin's token\n"
                          f"{new_token()}:{LOCAL_ADMIN}:admin\n")
        env["API_TOKENS_FILE"] = str(path)
    return env


def up() -> None:
    """Run every control-plane service and the API, each in its own process, until Ctrl-C."""
    settings = service_settings()
    asyncio.run(ensure_topics(settings.kafka_bootstrap_servers, settings.namespace,
                              security=client_options(settings)))
    services = launcher.start_services(state_dir(settings),
                                       service_env(settings) | api_env(settings),
                                       launcher.PROCESSES)
    typer.echo("services: " + ", ".join(f"{s.name} (pid {s.process.pid})" for s in services))
    typer.echo(f"API and console: {api_url()}")
    try:
        while not launcher.dead_services(services):
            time.sleep(1.0)
        for svc in launcher.dead_services(services):
            typer.echo(f"{svc.name} exited ({svc.process.returncode}); see {svc.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        launcher.stop_services(services)
