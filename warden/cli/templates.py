"""`warden templates`: list, show, validate and save task templates (through the API)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from services.api.client import ApiError
from warden.cli import common
from warden.cli.common import JsonOption, ReasonOption, fail, or_dash, print_json, table

app = typer.Typer(help="Task templates: list, show, validate, save (through the API).",
                  no_args_is_help=True)


@app.command("list")
def templates_list(as_json: JsonOption = False) -> None:
    """Every template and the need it serves (a broken file says why)."""
    found = common.from_api(lambda client: client.templates())
    if as_json:
        print_json(found)
        return
    typer.echo(table(["NAME", "VERSION", "NEED", "PRIORITY", "STEPS", "FILE", "DESCRIPTION"],
                     [[t["name"], or_dash(t.get("version")), or_dash(t.get("need")),
                       or_dash(t.get("priority")), str(t.get("steps", 0)), t["file"],
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
    detail = err.body.get("detail") if isinstance(err.body, dict) else None
    if isinstance(detail, dict):
        return [f"{p['field']}: {p['message']}" for p in detail.get("problems", [])]
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
        raise typer.Exit(1) from err
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
    """Validate and save a template (admin); the templater uses it from its next start."""
    target = name or file.stem
    try:
        with common.api_client() as client:
            saved = client.save_template(target, file.read_text(), reason)
    except ApiError as err:
        typer.echo(f"{file.name}: not saved", err=True)
        for line in _problems(err) or [str(err)]:
            typer.echo(f"  {line}", err=True)
        raise typer.Exit(1) from err
    typer.echo(f"{saved['file']}: {'saved' if saved['saved'] else 'unchanged'}; "
               f"{saved['note']}")
