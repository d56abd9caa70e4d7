"""Reports authenticated per node: key derivation, the MAC check, the key files, enrolment."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from agent import fleet
from agent.report import load_report_key
from agent.settings import AgentSettings
from bench.fleet_sim import FleetSim
from common.reportauth import (
    KID_HEADER,
    MAC_HEADER,
    ReportAuthenticator,
    authenticator_for,
    configured_master,
    derive_node_key,
    enrol_key,
    ensure_master,
    load_master,
    master_kid,
    read_node_key,
    write_node_key,
)
from common.settings import ReportReaderSettings

pytestmark = pytest.mark.unit

MASTER = bytes(range(32))
BODY = b'{"event_type":"node_report","node_id":"node-002","cluster_id":"east","seq":7}'


def wire(headers: dict[str, str]) -> list[tuple[str, bytes]]:
    """Headers as a Kafka record carries them."""
    return [("content-type", b"application/json"), *((k, v.encode()) for k, v in headers.items())]


def test_a_node_key_is_fixed_by_master_cluster_and_node_and_differs_for_any_other() -> None:
    key = derive_node_key(MASTER, "east", "node-002")
    assert len(key) == 32
    assert key == derive_node_key(MASTER, "east", "node-002")
    others = {derive_node_key(MASTER, "east", "node-003"),
              derive_node_key(MASTER, "west", "node-002"),
              derive_node_key(bytes(32), "east", "node-002"),
              # The parts are separated: ("east", "node-002") is not ("eas", "tnode-002").
              derive_node_key(MASTER, "eas", "tnode-002")}
    assert key not in others
    assert len(others) == 4


def test_the_master_kid_names_the_master_without_revealing_it() -> None:
    kid = master_kid(MASTER)
    assert kid.startswith("rk-")
    assert kid == master_kid(MASTER) != master_kid(bytes(32))
    assert MASTER.hex() not in kid


def test_a_genuine_report_passes() -> None:
    key = enrol_key(MASTER, "east", "node-002")
    check = ReportAuthenticator([MASTER])
    assert check.refusal("east", "node-002", BODY, wire(key.headers(BODY))) is None


def test_a_report_without_a_mac_is_refused() -> None:
    check = ReportAuthenticator([MASTER])
    refusal = check.refusal("east", "node-002", BODY, wire({}))
    assert refusal is not None
    assert "not signed" in refusal


def test_a_report_changed_after_signing_is_refused() -> None:
    key = enrol_key(MASTER, "east", "node-002")
    headers = wire(key.headers(BODY))
    forged = BODY.replace(b'"seq":7', b'"seq":9000000000000')
    refusal = ReportAuthenticator([MASTER]).refusal("east", "node-002", forged, headers)
    assert refusal is not None
    assert "node-002" in refusal


def test_another_nodes_key_cannot_speak_for_node_002() -> None:
    """A node owns only its own key: node-001's MAC over a report in node-002's name (or a
    node of the same name in another cluster) is refused."""
    check = ReportAuthenticator([MASTER])
    for cluster, node in (("east", "node-001"), ("west", "node-002")):
        impostor = enrol_key(MASTER, cluster, node)
        assert check.refusal("east", "node-002", BODY, wire(impostor.headers(BODY))) is not None


def test_a_key_under_another_master_or_a_made_up_mac_is_refused() -> None:
    check = ReportAuthenticator([MASTER])
    stranger = enrol_key(bytes(32), "east", "node-002")
    refusal = check.refusal("east", "node-002", BODY, wire(stranger.headers(BODY)))
    assert refusal is not None
    assert "not a report master" in refusal
    made_up = {MAC_HEADER: "A" * 43, KID_HEADER: master_kid(MASTER)}
    assert check.refusal("east", "node-002", BODY, wire(made_up)) is not None
    not_ascii = [(MAC_HEADER, b"\xff\xfe"), (KID_HEADER, master_kid(MASTER).encode())]
    assert check.refusal("east", "node-002", BODY, not_ascii) is not None


def test_two_macs_are_as_unauthenticated_as_none() -> None:
    key = enrol_key(MASTER, "east", "node-002")
    genuine = wire(key.headers(BODY))
    doubled = [*genuine, (MAC_HEADER, b"A" * 43)]
    assert ReportAuthenticator([MASTER]).refusal("east", "node-002", BODY, doubled) is not None


def test_during_a_rotation_keys_under_either_master_pass() -> None:
    new = bytes(range(1, 33))
    check = ReportAuthenticator([MASTER, new])
    for master in (MASTER, new):
        key = enrol_key(master, "east", "node-002")
        assert check.refusal("east", "node-002", BODY, wire(key.headers(BODY))) is None


def test_a_reader_holds_the_configured_master_and_the_retired_ones(tmp_path: Path) -> None:
    old, new = tmp_path / "old.key", tmp_path / "new.key"
    ensure_master(old), ensure_master(new)
    settings = ReportReaderSettings(state_dir=str(tmp_path / "state"),
                                    report_master_key=str(new),
                                    report_retired_master_keys=f" {old}, ")
    check = authenticator_for(settings)
    for path in (old, new):
        key = enrol_key(load_master(path), "east", "node-002")
        assert check.refusal("east", "node-002", BODY, wire(key.headers(BODY))) is None
    # Retired no more: reports under the old master are refused from the next start.
    current_only = authenticator_for(ReportReaderSettings(
        state_dir=str(tmp_path / "state"), report_master_key=str(new)))
    key = enrol_key(load_master(old), "east", "node-002")
    assert current_only.refusal("east", "node-002", BODY, wire(key.headers(BODY))) is not None


def test_the_master_is_named_by_the_shared_variable_or_the_collectors_older_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert configured_master({}, tmp_path) == tmp_path / "keys" / "report-master.key"
    assert configured_master({"COLLECTOR_REPORT_MASTER_KEY": "/a"}, tmp_path) == Path("/a")
    assert configured_master({"COLLECTOR_REPORT_MASTER_KEY": "/a",
                              "WARDEN_REPORT_MASTER_KEY": "/b"}, tmp_path) == Path("/b")
    monkeypatch.setenv("COLLECTOR_REQUIRE_REPORT_MAC", "false")
    monkeypatch.setenv("COLLECTOR_REPORT_MASTER_KEY", "/a")
    older = ReportReaderSettings()
    assert (older.require_report_mac, older.report_master_key) == (False, "/a")
    monkeypatch.setenv("WARDEN_REPORT_MASTER_KEY", "/b")
    assert ReportReaderSettings().report_master_key == "/b"


def test_unsigned_reports_pass_only_while_macs_are_not_required() -> None:
    check = ReportAuthenticator([MASTER])
    assert check.check("east", "node-002", BODY, wire({}), required=True) is not None
    assert check.check("east", "node-002", BODY, wire({}), required=False) is None
    forged = enrol_key(MASTER, "east", "node-001").headers(BODY)
    assert check.check("east", "node-002", BODY, wire(forged), required=False) is not None


def test_signed_says_whether_a_mac_is_there_at_all() -> None:
    key = enrol_key(MASTER, "east", "node-002")
    assert ReportAuthenticator.signed(wire(key.headers(BODY)))
    assert not ReportAuthenticator.signed(wire({}))


def test_the_master_is_made_once_owner_only_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "report-master.key"
    first = ensure_master(path)
    assert len(first) == 32
    assert ensure_master(path) == first == load_master(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.write_text("c2hvcnQ\n")  # "short": too few bytes to be a master
    with pytest.raises(ValueError, match="at least 32 bytes"):
        load_master(path)


def test_a_node_key_file_round_trips_owner_only(tmp_path: Path) -> None:
    key = enrol_key(MASTER, "east", "node-002")
    path = write_node_key(tmp_path / "report.key", key)
    assert read_node_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def agent_settings(tmp_path: Path, node: str = "node-002", **extra: object) -> AgentSettings:
    return AgentSettings(node_id=node, cluster_id="east", agent_state_dir=tmp_path / node,
                         **extra)  # type: ignore[arg-type]  # pydantic-settings fields


def test_the_agent_loads_its_own_key_and_refuses_another_nodes(tmp_path: Path) -> None:
    write_node_key(tmp_path / "node-002" / "report.key", enrol_key(MASTER, "east", "node-002"))
    loaded = load_report_key(agent_settings(tmp_path))
    assert loaded is not None
    assert loaded.node_id == "node-002"
    other = write_node_key(tmp_path / "other.key", enrol_key(MASTER, "east", "node-001"))
    with pytest.raises(ValueError, match="east/node-001, not of east/node-002"):
        load_report_key(agent_settings(tmp_path, report_key_file=other))


def test_an_agent_without_a_key_signs_nothing_unless_one_was_configured(tmp_path: Path) -> None:
    assert load_report_key(agent_settings(tmp_path)) is None
    with pytest.raises(ValueError, match="does not exist"):
        load_report_key(agent_settings(tmp_path, report_key_file=tmp_path / "missing.key"))


def test_a_local_agent_is_enrolled_with_the_key_of_the_collectors_master(tmp_path: Path) -> None:
    centre, fleet_dir = tmp_path / "centre", tmp_path / "fleet"
    env = {"WARDEN_STATE_DIR": str(centre)}
    master = fleet.centre_master(env, fleet_dir)
    assert master == centre / "keys" / "report-master.key"
    path = fleet.enrol_report_key(fleet_dir, "node-002", "east", master)
    assert read_node_key(path) == enrol_key(load_master(master), "east", "node-002")
    child = fleet.agent_env(node_id="node-002", gpus=1, cluster_id="east", namespace="ns",
                            state_dir=fleet_dir, env={"AGENT_REPORT_KEY_FILE": "/elsewhere"},
                            trusted_keys=[], interval_s=1.0)
    assert child["AGENT_REPORT_KEY_FILE"] == str(path)


def test_the_fleet_simulator_signs_each_nodes_reports_with_its_own_key() -> None:
    sim = FleetSim("unused:9092", "ns", "east", ["node-001", "node-002"], interval_s=1.0,
                   report_master=MASTER)
    check = ReportAuthenticator([MASTER])
    key = sim.report_keys["node-002"]
    assert check.refusal("east", "node-002", BODY, wire(key.headers(BODY))) is None
    assert check.refusal("east", "node-001", BODY, wire(key.headers(BODY))) is not None
    assert FleetSim("unused:9092", "ns", "east", ["node-001"], interval_s=1.0).report_keys == {}
