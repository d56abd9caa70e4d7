"""`warden templates`: list, show, validate and save task templates, their history, diffs,
rollbacks and pins (through the API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from services.api.client import ApiError
from warden.cli import common
from warden.cli.common import JsonOption, ReasonOption, fail, or_dash, print_json, table

app = typer.Typer(help="Task templates: list, show, validate, save, history, diff, rollback, "
                  "pin (through the API).",
                  no_args_is_help=True)


@app.command("list")
def templates_list(as_json: JsonOption = False) -> None:
    """Every template and the need it serves (a broken file says why)."""
    found = common.from_api(lambda client: client.templates())
    if as_json:
        print_json(found)
        return
    typer.echo(table(["NAME", "VERSION", "ORIGIN", "PINNED", "NEED", "PRIORITY", "STEPS",
                      "DESCRIPTION"],
                     [[t["name"], or_dash(t.get("version")), or_dash(t.get("origin")),
                       f"yes ({t.get('pinned_by')})" if t.get("pinned") else "no",
                       or_dash(t.get("need")), or_dash(t.get("priority")),
                       str(t.get("steps", 0)),
                       f"BROKEN: {t['error']}" if t.get("error") else t.get("description", "")]
                      for t in found], max_width=70))


@app.command("show")
def templates_show(name: str, as_json: JsonOption = False) -> None:
    """One template's YAML (or, with --json, its parsed form too)."""
    found = common.from_api(lambda client: client.template(name))
    if as_json:
        print_json(found)
        return
    typer.echo(f"# {found['file']} (sha256 {found['sha256'][:12]})")
    if found.get("error"):
        typer.echo(f"# BROKEN: {found['error']}")
    typer.echo(found["yaml"].rstrip("\n"))


def _problems(err: ApiError) -> list[str]:
    """An invalid template's problems, field by field (a member of the problem details)."""
    problems = err.body.get("problems") if isinstance(err.body, dict) else None
    if isinstance(problems, list):
        return [f"{p['field']}: {p['message']}" for p in problems]
    return []


@app.command("validate")
def templates_validate(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    as_json: JsonOption = False,
) -> None:
    """Check a template file with the templater's rules, against the saved ones (operator)."""
    try:
        with common.api_client() as client:
            checked = client.validate_template(file.read_text())
    except ApiError as err:
        if err.status != 422:
            raise fail(err) from err
        if as_json:
            print_json(err.body)
        else:
            typer.echo(f"{file.name}: invalid")
            for line in _problems(err) or [str(err)]:
                typer.echo(f"  {line}")
        raise typer.Exit(common.EXIT_FAILED) from err
    if as_json:
        print_json(checked)
    else:
        template = checked["template"]
        typer.echo(f"{file.name}: valid ({template['name']}.v{template['version']} for need "
                   f"{template['need']}, {len(template['steps'])} steps)")


@app.command("save")
def templates_save(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    reason: ReasonOption,
    name: Annotated[str | None, typer.Option(
        help="The template's name; default: the file's name without .yaml.")] = None,
) -> None:
    """Validate and save a template as its next version (admin); running templaters use it
    from their next need."""
    target = name or file.stem
    try:
        with common.api_client() as client:
            saved = client.save_template(target, file.read_text(), reason)
    except ApiError as err:
        typer.echo(f"{file.name}: not saved", err=True)
        for line in _problems(err) or [str(err)]:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(common.EXIT_FAILED) from err
    typer.echo(f"{saved['file']}: {'saved' if saved['saved'] else 'unchanged'}; "
               f"{saved['note']}")


@app.command("history")
def templates_history(name: str, as_json: JsonOption = False) -> None:
    """Every version of a template, newest first: origin, who, why (a tuned one's evidence
    with --json)."""
    found = common.from_api(lambda client: client.template_history(name))
    if as_json:
        print_json(found)
        return
    pin = (f"pinned by {found['pinned_by']}: {found['pin_reason']}" if found["pinned"]
           else "not pinned")
    typer.echo(f"{name}: active v{found['active_version']}, {pin}")
    typer.echo(table(["VERSION", "ORIGIN", "ACTOR", "CREATED", "REASON"],
                     [[f"v{v['version']}" + (" *" if v["version"] == found["active_version"]
                                              else ""),
                       v["origin"], v["actor"], v["created_at"][:19], v["reason"]]
                      for v in found["versions"]], max_width=80))


@app.command("diff")
def templates_diff(name: str, old: int, new: int) -> None:
    """The unified diff of a template's YAML from version OLD to version NEW."""
    found = common.from_api(lambda client: client.template_diff(name, old, new))
    typer.echo(found["diff"].rstrip("\n") or f"{name}: v{old} and v{new} are the same")


@app.command("rollback")
def templates_rollback(name: str, version: int, reason: ReasonOption) -> None:
    """Make a new version equal to VERSION (admin); running templaters use it at once."""
    saved = common.from_api(lambda client: client.rollback_template(name, version, reason))
    typer.echo(f"{name}: {saved['note']}")


@app.command("pin")
def templates_pin(name: str, reason: ReasonOption) -> None:
    """Pin a template: the tuner never changes it (operator)."""
    state = common.from_api(lambda client: client.pin_template(name, True, reason))
    typer.echo(f"{name}: pinned at v{state['active_version']} by {state['pinned_by']}")


@app.command("unpin")
def templates_unpin(name: str, reason: Annotated[str, typer.Option(
        help="Why (audited).")] = "unpinned") -> None:
    """Unpin a template: the tuner may tune it again (operator)."""
    state = common.from_api(lambda client: client.pin_template(name, False, reason))
    typer.echo(f"{name}: unpinned (v{state['active_version']})")
