"""The templater's registry, kept live from the task store without a restart.

Loaded from the store's active versions at start, re-read on every `TemplateChanged` event
(only a trigger: the content is the store's, so a forged event can make the templater re-read,
never run a template nobody saved) and periodically as a safety net for a missed event. A
re-read that does not load keeps the registry that runs, and says why: logged, and for an
event, dead-lettered with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from common.errors import PermanentError
from schemas.events.v1 import NeedKind, TemplateChanged
from services.store.db import Store
from services.store.template_versions import load_active
from services.templater.templates import Template
from services.templater.validation import TemplateInvalid

log = logging.getLogger("clusterwarden.templater")
Install = Callable[[dict[NeedKind, Template]], None]


class LiveTemplates:
    """Re-reads the active versions and installs them when they load."""

    def __init__(self, store: Store, install: Install) -> None:
        self.store = store
        self.install = install
        self.versions: dict[str, int] = {}

    async def reload(self, why: str) -> bool:
        """Read and install the active versions; False (and the old registry kept) if they
        do not load. Raises TemplateInvalid with the reason."""
        registry, versions = await load_active(self.store)
        if versions == self.versions:
            return False
        self.install(registry)
        changed = sorted(f"{n}.v{v}" for n, v in versions.items() if self.versions.get(n) != v)
        self.versions = versions
        log.info("templates loaded (%s): %s", why, ", ".join(changed))
        return True

    async def on_template_change(self, event: TemplateChanged) -> None:
        """A template changed in the store: read the store again (the event carries no text)."""
        if self.versions.get(event.template) == event.version:
            return  # already running that version (a replayed or pin-only event)
        try:
            await self.reload(f"{event.template}.v{event.version} by {event.actor}")
        except TemplateInvalid as err:
            log.error("templates not reloaded, the running ones stay: %s", err)
            raise PermanentError("reload_failed", str(err)[:500]) from err

    async def tick(self) -> None:
        """The periodic re-read (a missed event is found here)."""
        try:
            await self.reload("periodic re-read")
        except TemplateInvalid as err:
            log.error("templates not reloaded, the running ones stay: %s", err)
