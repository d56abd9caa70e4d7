"""A template text checked with the templater's own rules, alone and in the set it joins.

Every save (an operator's edit, a rollback, the tuner) and every reload goes through these
checks, so no version the templater would refuse is ever made active. A candidate is checked
twice: as one file (`load_template`: every field, action, placeholder and guard) and as part
of the set it would join (`load_templates`: one template per need, relations that resolve,
lock counts). Both run on files in a scratch folder, exactly as the templater loads a folder.

Also the text edits a save makes: the version line the store sets (a template's version is
the store's count, tasks name it `name.vN`), a tuned parameter, and diffs between versions.
"""

from __future__ import annotations

import difflib
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.events.v1 import NeedKind
from services.templater.templates import Template, TemplateError, load_template, load_templates

# Larger than any sensible template (the built-in ones are about 1 KiB).
MAX_TEMPLATE_BYTES = 64 * 1024
_VERSION_LINE = re.compile(r"^version:[ \t]*\d+[ \t]*(#.*)?$", re.MULTILINE)


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


def invalid(field: str, message: str) -> TemplateInvalid:
    return TemplateInvalid(message, [Problem(field=field, message=message)])


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
                raise invalid("yaml", "anchors and aliases are not allowed")
    except yaml.YAMLError as err:
        raise invalid("yaml", f"not valid YAML: {err}") from err


def check_text(text: str, name: str | None = None) -> Template:
    """The template `text` checked alone, or TemplateInvalid; `name`, when given, is the
    template the text must be (an edit of that template)."""
    if len(text.encode()) > MAX_TEMPLATE_BYTES:
        raise invalid("yaml", f"larger than {MAX_TEMPLATE_BYTES} bytes")
    _no_aliases(text)
    with tempfile.TemporaryDirectory(prefix="warden-template-") as scratch:
        candidate = Path(scratch) / f"{name or 'template'}.yaml"
        candidate.write_text(text)
        try:
            template = load_template(candidate)
        except TemplateError as err:
            raise TemplateInvalid(str(err), problems_of(err)) from err
    if name is not None and template.name != name:
        raise invalid("name", f"{template.name!r} does not match the template being saved, "
                              f"{name!r}")
    return template


def check_set(texts: Mapping[str, str]) -> dict[NeedKind, Template]:
    """The registry `texts` (template name -> YAML) make, as the templater loads a folder,
    or TemplateInvalid naming the template and the field."""
    with tempfile.TemporaryDirectory(prefix="warden-templates-") as scratch:
        folder = Path(scratch)
        for name, text in texts.items():
            (folder / f"{name}.yaml").write_text(text)
        try:
            return load_templates(folder)
        except TemplateError as err:
            raise TemplateInvalid(str(err), problems_of(err)) from err


def with_version(text: str, version: int) -> str:
    """`text` with its top-level `version:` set to `version` (comments and layout kept)."""
    if not _VERSION_LINE.search(text):
        raise invalid("version", "a template needs a top-level `version: N` line")
    return _VERSION_LINE.sub(f"version: {version}", text, count=1)


def with_parameter(text: str, parameter: str, value: int) -> str:
    """`text` with `parameters.<parameter>` set to `value`.

    The parameter's own line is rewritten when it stands on one (block style, comments
    kept); otherwise the document is written out again from its parsed form.
    """
    line = re.compile(rf"^([ \t]+{re.escape(parameter)}:[ \t]*)[^#\n]*?([ \t]*(#.*)?)$",
                      re.MULTILINE)
    data = yaml.safe_load(text)
    if len(line.findall(text)) == 1:
        edited = line.sub(lambda m: f"{m.group(1)}{value}{m.group(2)}", text, count=1)
        if yaml.safe_load(edited).get("parameters", {}).get(parameter) == value:
            return edited
    data.setdefault("parameters", {})[parameter] = value
    return str(yaml.safe_dump(data, sort_keys=False))


def unified_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    """The unified diff from `old` to `new` ("" when equal)."""
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True),
                                        fromfile=old_label, tofile=new_label))
