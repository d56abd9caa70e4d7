"""The tuner: samples in (measures in Redis), tuned template versions out (the store's save
path, so a tuned version is validated, audited and announced like an operator's edit)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from schemas.events.v1 import SampleBatch
from services.store.template_versions import (
    SaveRequest,
    TemplateBook,
    TemplatePinned,
    VersionRow,
    active_rows,
    states,
)
from services.templater.templates import Template
from services.templater.validation import TemplateInvalid, check_text, with_parameter
from services.tuner.measures import Measures
from services.tuner.policy import Decision, Measure, combined, decide, evidence_of

log = logging.getLogger("clusterwarden.tuner")
ACTOR = "tuner"


@dataclass(frozen=True)
class Outcome:
    """What one look at one template came to (what a tick returns, for tests and logs)."""

    template: str
    decision: Decision
    saved_version: int | None = None


class Tuner:
    """Measures delivered throughput and tunes the templates that opted in."""

    def __init__(self, measures: Measures, book: TemplateBook) -> None:
        self.measures = measures
        self.book = book
        # What was last said of each pinned template: said again only when it changes.
        self._pinned_said: dict[str, int] = {}

    async def on_samples(self, batch: SampleBatch) -> None:
        """A batch of samples: each working node's throughput into its pool's measures."""
        await self.measures.record(batch.samples)

    async def tick(self) -> None:
        await self.tune()

    async def tune(self) -> list[Outcome]:
        """Look at every tunable template once; save those whose parameter must change."""
        async with self.book.store.session() as session:
            active = await active_rows(session)
            pinned = {s.name for s in await states(session) if s.pinned}
        measures = await self.measures.all()
        figure = combined(measures)
        outcomes: list[Outcome] = []
        for name, row in active.items():
            template = await asyncio.to_thread(check_text, row.yaml, name)
            if template.tuning is None:
                continue
            current = template.parameters[template.tuning.parameter]
            assert isinstance(current, int)  # checked when the template was saved
            decision = decide(template.tuning, current, row.evidence, figure, name in pinned)
            outcomes.append(await self._act(row, template, decision, measures))
        return outcomes

    async def _act(self, row: VersionRow, template: Template, decision: Decision,
                   measures: list[Measure]) -> Outcome:
        tuning = template.tuning
        assert tuning is not None
        if decision.verdict == "pinned":
            if self._pinned_said.get(row.name) != decision.value:
                log.info("template %s is pinned: %s", row.name, decision.reason)
            self._pinned_said[row.name] = decision.value
        else:
            self._pinned_said.pop(row.name, None)
        if not decision.acts:
            return Outcome(row.name, decision)
        text = with_parameter(row.yaml, tuning.parameter, decision.value)
        try:
            saved = await self.book.save(SaveRequest(
                name=row.name, text=text, origin="tuned", actor=ACTOR, role="service",
                reason=decision.reason[:500],
                evidence=evidence_of(decision, tuning, measures)))
        except TemplatePinned as err:  # pinned between the read and the save
            log.info("template %s was pinned meanwhile: %s", row.name, err)
            return Outcome(row.name, decision)
        except TemplateInvalid as err:
            log.error("tuned %s does not validate, nothing saved: %s", row.name, err)
            return Outcome(row.name, decision)
        log.info("tuned %s: %s", saved.template.label, decision.reason)
        return Outcome(row.name, decision, saved.version.version)
