"""The template folder the API shows and edits, checked with the templater's own rules.

Which folder: TEMPLATER_TEMPLATE_DIR when it is set, since that is what the templater reads.
Otherwise the templater reads the built-in templates inside the installed package, which are
code and not the API's to change; the API then uses `<WARDEN_STATE_DIR>/templates`, seeded
with a copy of the built-in ones, and `warden up` points the templater at the same folder
(see `templater_env`); copies nobody edited follow the built-in ones (see `seed`). The
templater loads templates when it starts, so a saved edit is used from its next start.

A candidate is checked twice before it is saved: as one file (`load_template`: every field,
action, placeholder and guard) and as part of the folder it would join (`load_templates`:
one template per need, relations that resolve and agree), so a save can never leave a
folder the templater refuses to start with.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from services.templater.templates import (
    TEMPLATE_DIR,
    Template,
    TemplateError,
    load_template,
    load_templates,
)

# Larger than any sensible template (the built-in ones are about 1 KiB).
MAX_TEMPLATE_BYTES = 64 * 1024


class Problem(BaseModel):
    """One thing wrong with a template: the field (dotted path) and why."""

    model_config = ConfigDict(frozen=True)

    field: str
    message: str


class TemplateInvalid(ValueError):
    """A candidate template failed a check; `problems` name each field."""

    def __init__(self, message: str, problems: list[Problem]) -> None:
        super().__init__(message)
        self.problems = problems


class TemplateSummary(BaseModel):
    """A template file as listed: its identity, or why it does not load."""

    file: str
    name: str
    version: int | None = None
    need: str | None = None
    description: str = ""
    priority: int | None = None
    steps: int = 0
    error: str | None = None


class TemplateDocument(BaseModel):
    """One template: its file, its YAML text and, if it loads, its parsed form."""

    file: str
    name: str
    yaml: str
    sha256: str
    template: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Saved:
    """A checked save: where it goes, what it is, and whether it changes anything."""

    file: Path
    template: Template
    previous_sha256: str | None
    sha256: str

    @property
    def changed(self) -> bool:
        return self.sha256 != self.previous_sha256


def folder_for(template_dir: str, state_dir: str) -> Path:
    """The folder templates are read from and saved to (see the module docstring)."""
    if template_dir:
        return Path(template_dir)
    folder = Path(state_dir) / "templates"
    seed(folder)
    return folder


SEED_MANIFEST = ".seeded.json"


def seed(folder: Path) -> None:
    """Copy the built-in templates into `folder`, and keep unedited copies current.

    A manifest records what each copy was made from: a copy still equal to it follows the
    built-in template when that changes (a new release), a copy edited since is left alone,
    and a file removed after it was seeded is not brought back.
    """
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / SEED_MANIFEST
    try:
        manifest: dict[str, str] = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    changed = False
    for source in sorted(TEMPLATE_DIR.glob("*.yaml")):
        text = source.read_text()
        target = folder / source.name
        seeded = manifest.get(source.name)
        if seeded == sha256(text):
            continue
        if seeded is None and target.exists():
            continue  # a file of that name made otherwise: not ours to replace
        if seeded is not None and (not target.exists() or sha256(target.read_text()) != seeded):
            continue  # removed or edited since it was seeded
        _write_atomic(target, text)
        manifest[source.name] = sha256(text)
        changed = True
    if changed:
        _write_atomic(manifest_path, json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def templater_env(template_dir: str, state_dir: str) -> dict[str, str]:
    """TEMPLATER_TEMPLATE_DIR for the services, so the templater reads what the API edits."""
    return {"TEMPLATER_TEMPLATE_DIR": str(folder_for(template_dir, state_dir).resolve())}


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.yaml"))


def _summary(path: Path) -> TemplateSummary:
    try:
        template = load_template(path)
    except TemplateError as err:
        return TemplateSummary(file=path.name, name=path.stem, error=str(err))
    return TemplateSummary(
        file=path.name, name=template.name, version=template.version, need=template.need,
        description=template.description, priority=template.priority,
        steps=len(template.steps),
    )


def list_templates(folder: Path) -> list[TemplateSummary]:
    """Every template file of the folder, loadable or not (a broken one says why)."""
    return [_summary(path) for path in _files(folder)]


def _path_of(folder: Path, name: str) -> Path | None:
    """The file holding template `name`: the one whose template has that name, else a file
    of that name that does not load (so a broken file can be shown and repaired)."""
    by_stem: Path | None = None
    for path in _files(folder):
        summary = _summary(path)
        if summary.error is None and summary.name == name:
            return path
        if summary.error is not None and path.stem == name:
            by_stem = path
    return by_stem


def _target(folder: Path, name: str) -> Path:
    """Where template `name` is saved: its current file, or `<name>.yaml` for a new one."""
    current = _path_of(folder, name)
    if current is not None:
        return current
    path = folder / f"{name}.yaml"
    if path.exists():
        raise TemplateInvalid("file taken", [Problem(
            field="name", message=f"{path.name} holds template {_summary(path).name!r}; "
                                  "choose another name")])
    return path


def read_template(folder: Path, name: str) -> TemplateDocument | None:
    path = _path_of(folder, name)
    if path is None:
        return None
    text = path.read_text()
    try:
        template = load_template(path)
    except TemplateError as err:
        return TemplateDocument(file=path.name, name=name, yaml=text, sha256=sha256(text),
                                error=str(err))
    return TemplateDocument(file=path.name, name=template.name, yaml=text, sha256=sha256(text),
                            template=template.model_dump(mode="json"))


# ---------------------------------------------------------------- checks


def problems_of(err: TemplateError) -> list[Problem]:
    """The fields a TemplateError names, one Problem each."""
    cause = err.__cause__
    if isinstance(cause, ValidationError):
        found: list[Problem] = []
        for e in cause.errors():
            if e["type"] == "template":
                # The model's own check joins `field: why` texts (see template_problems).
                found += [_split(part) for part in str(e["ctx"]["problems"]).split("; ")]
            else:
                found.append(Problem(field=".".join(str(p) for p in e["loc"]) or "template",
                                     message=e["msg"]))
        return found
    if isinstance(cause, yaml.YAMLError):
        return [Problem(field="yaml", message=f"not valid YAML: {cause}")]
    # "file: field: why" (registry checks): the file is ours, the rest names the field.
    _, _, rest = str(err).partition(": ")
    return [_split(rest)]


def _split(text: str) -> Problem:
    field, sep, message = text.partition(": ")
    if not sep or " " in field:
        return Problem(field="template", message=text)
    return Problem(field=field, message=message)


def _no_aliases(text: str) -> None:
    """Refuse YAML anchors and aliases: templates need none, and nested aliases expand
    exponentially when the parsed document is walked (a "billion laughs")."""
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
                raise TemplateInvalid("anchors and aliases are not allowed", [
                    Problem(field="yaml", message="anchors and aliases are not allowed")])
    except yaml.YAMLError as err:
        raise TemplateInvalid(f"not valid YAML: {err}",
                              [Problem(field="yaml", message=f"not valid YAML: {err}")]) from err


def check(folder: Path, text: str, name: str | None = None) -> Template:
    """The template `text` as it would be saved into `folder`, or TemplateInvalid.

    `name`, when given, is the template the text must be (an edit of that template).
    """
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        raise TemplateInvalid("too large", [Problem(
            field="yaml", message=f"larger than {MAX_TEMPLATE_BYTES} bytes")])
    _no_aliases(text)
    with tempfile.TemporaryDirectory(prefix="warden-template-") as scratch:
        alone = Path(scratch) / "alone"
        alone.mkdir()
        candidate = alone / f"{name or 'template'}.yaml"
        candidate.write_text(text)
        try:
            template = load_template(candidate)
        except TemplateError as err:
            raise TemplateInvalid(str(err), problems_of(err)) from err
        if name is not None and template.name != name:
            raise TemplateInvalid("name mismatch", [Problem(
                field="name", message=f"{template.name!r} does not match the template being "
                                      f"saved, {name!r}")])
        target = _target(folder, template.name)
        # The folder as it would be after the save: the others, and this one in its place.
        joined = Path(scratch) / "folder"
        joined.mkdir()
        for path in _files(folder):
            if path != target:
                shutil.copyfile(path, joined / path.name)
        (joined / target.name).write_text(text)
        try:
            load_templates(joined)
        except TemplateError as err:
            raise TemplateInvalid(str(err), problems_of(err)) from err
    return template


def prepare(folder: Path, name: str, text: str) -> Saved:
    """Check `text` as template `name` for a save, writing nothing; raises TemplateInvalid.

    A changed template must carry a higher version: tasks name their template `name.vN`,
    and two different templates under one label would make task records ambiguous.
    """
    template = check(folder, text, name)
    current = _path_of(folder, name)
    target = _target(folder, name)
    previous_sha: str | None = None
    if current is not None:
        previous_text = current.read_text()
        previous_sha = sha256(previous_text)
        if previous_text == text:
            return Saved(current, template, previous_sha, previous_sha)
        try:
            previous_version: int | None = load_template(current).version
        except TemplateError:
            previous_version = None  # replacing a broken file: any version will do
        if previous_version is not None and template.version <= previous_version:
            raise TemplateInvalid("version not raised", [Problem(
                field="version", message=f"must be greater than {previous_version} for a "
                f"changed template (tasks name it {template.name}.v{template.version})")])
    return Saved(target, template, previous_sha, sha256(text))


def write(saved: Saved, text: str) -> None:
    """Write a prepared save in place of the current file, atomically."""
    if saved.changed:
        _write_atomic(saved.file, text)


def _write_atomic(target: Path, text: str) -> None:
    # Written beside the target and renamed over it: the templater never reads half a file.
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.",
                                   suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(folder: Path, name: str, text: str) -> Saved:
    """Check and write template `name` (see `prepare`)."""
    saved = prepare(folder, name, text)
    write(saved, text)
    return saved
