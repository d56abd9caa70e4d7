"""The API's template folder: seeded from the built-in templates without overwriting edits,
the templater's folder, and checked before a save (pure; the endpoints are in
tests/service/api/test_api_templates.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.api import templates
from services.api.templates import TemplateInvalid, seed
from services.templater.templates import TEMPLATE_DIR, load_templates

BUILT_IN = (TEMPLATE_DIR / "load_balance.yaml").read_text()


def test_seeding_copies_the_built_in_templates_once_and_keeps_edits(tmp_path: Path) -> None:
    folder = tmp_path / "templates"
    seed(folder)
    names = sorted(p.name for p in folder.glob("*.yaml"))
    assert names == sorted(p.name for p in TEMPLATE_DIR.glob("*.yaml"))
    manifest = json.loads((folder / templates.SEED_MANIFEST).read_text())
    assert set(manifest) == set(names)

    # An unedited copy follows a new built-in version; an edited one is left alone.
    edited = folder / "offline.yaml"
    edited.write_text(edited.read_text() + "\n# edited\n")
    manifest["online.yaml"] = manifest["scale_in.yaml"] = "0" * 64  # built-ins "changed"
    (folder / templates.SEED_MANIFEST).write_text(json.dumps(manifest))
    (folder / "online.yaml").write_text("stale copy")
    (folder / "scale_in.yaml").write_text("x")  # edited since it was seeded
    manifest["online.yaml"] = templates.sha256("stale copy")
    (folder / templates.SEED_MANIFEST).write_text(json.dumps(manifest))
    seed(folder)
    assert (folder / "online.yaml").read_text() == (TEMPLATE_DIR / "online.yaml").read_text()
    assert (folder / "scale_in.yaml").read_text() == "x"
    assert edited.read_text().endswith("# edited\n")


def test_the_api_folder_is_the_templaters(tmp_path: Path) -> None:
    explicit = tmp_path / "mine"
    assert templates.folder_for(str(explicit), str(tmp_path)) == explicit
    assert not explicit.exists()  # an explicit folder is used as it is
    default = templates.folder_for("", str(tmp_path / "state"))
    assert default == tmp_path / "state" / "templates"
    assert templates.templater_env("", str(tmp_path / "state")) == {
        "TEMPLATER_TEMPLATE_DIR": str(default.resolve())}
    assert load_templates(default)


def test_a_file_holding_another_template_is_not_overwritten(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    seed(folder)
    (folder / "balance_two.yaml").write_text((folder / "online.yaml").read_text())
    (folder / "online.yaml").unlink()
    with pytest.raises(TemplateInvalid) as caught:
        templates.check(folder, BUILT_IN.replace("name: load_balance", "name: balance_two")
                        .replace("version: 1", "version: 3"), "balance_two")
    assert any(p.field == "name" and "holds template 'online'" in p.message
               for p in caught.value.problems)
