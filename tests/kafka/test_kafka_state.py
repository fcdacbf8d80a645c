"""The snapshot+offset state file: one atomic pair, damage detected, settings and factory wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from lookahead_rag.services.events import DRAFTCACHE_GROUP
from lookahead_rag.services.events.factory import make_bus
from lookahead_rag.services.events.kafka.bus import KafkaBus
from lookahead_rag.services.events.kafka.settings import KafkaSettings
from lookahead_rag.services.events.kafka.state import (
    ConsumerState,
    StateFileError,
    encode,
    read_state,
    state_path,
    write_state,
)


def test_state_round_trips_and_replaces_atomically(tmp_path: Path) -> None:
    path = state_path(tmp_path, "lookahead-rag.draftcache")
    assert read_state(path) is None
    first = ConsumerState("topic", "g", "cluster-a", {0: 5, 2: 7}, b"\x00snapshot-1")
    second = ConsumerState("topic", "g", "cluster-a", {0: 9, 1: 1, 2: 7}, b"snapshot-2")
    write_state(path, first)
    assert read_state(path) == first
    write_state(path, second)
    assert read_state(path) == second
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left behind


@pytest.mark.parametrize("damage", ["flip_snapshot_byte", "truncate", "not_a_state_file"])
def test_damaged_state_is_refused_not_half_loaded(tmp_path: Path, damage: str) -> None:
    data = encode(ConsumerState("topic", "g", "c", {0: 3}, b"applier snapshot bytes"))
    if damage == "flip_snapshot_byte":
        data = data[:-1] + bytes([data[-1] ^ 0xFF])
    elif damage == "truncate":
        data = data[:-5]
    else:
        data = b"{}"
    path = tmp_path / "g.state"
    path.write_bytes(data)
    with pytest.raises(StateFileError):
        read_state(path)


def test_group_names_become_safe_file_names(tmp_path: Path) -> None:
    assert state_path(tmp_path, "a/b c").name == "a_b_c.state"
    assert state_path(tmp_path, "x").parent == tmp_path


def test_settings_map_logical_groups_and_make_kafka_bus(tmp_path: Path) -> None:
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:1", draftcache_group="dc")
    assert settings.group_id(DRAFTCACHE_GROUP) == "dc"
    assert settings.group_id("other") == "lookahead-rag.other"
    assert settings.dlt_topic == "lookahead.generation-completed.DLT"
    assert settings.producer_acks() == "all"
    assert KafkaSettings(acks="1").producer_acks() == 1
    bus = make_bus(settings, tmp_path)
    assert isinstance(bus, KafkaBus)
    assert settings.resolved_outbox_path(tmp_path) == tmp_path / "outbox.sqlite3"


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAR_KAFKA_BOOTSTRAP_SERVERS", "kafka:9092")
    monkeypatch.setenv("LAR_KAFKA_ENABLE_IDEMPOTENCE", "true")
    settings = KafkaSettings()
    assert settings.enabled and settings.bootstrap_servers == "kafka:9092"
    assert settings.enable_idempotence is True
