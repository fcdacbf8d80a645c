"""State = snapshot + offset: one file holding an applier's snapshot and the log positions it covers.

The file is replaced atomically (temp file, fsync, rename, fsync of the folder), so after a crash
it is either the old pair or the new pair, never a snapshot with offsets it does not cover.

Layout: MAGIC, 4-byte big-endian header length, JSON header, snapshot bytes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from lookahead_rag.services.common.atomic import write_bytes_atomic

MAGIC = b"LARSTATE1\n"
_LEN = struct.Struct(">I")
FILE_SUFFIX = ".state"


class StateFileError(RuntimeError):
    """A state file that cannot be read back (not written by this code, or damaged on disk)."""


@dataclass(frozen=True)
class ConsumerState:
    topic: str
    group: str
    cluster_id: str  # offsets are positions in this cluster's log only
    offsets: dict[int, int] = field(default_factory=dict)  # partition -> next offset to apply
    snapshot: bytes = b""  # the applier's snapshot(), covering every record below those offsets


def state_path(state_dir: Path, group: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in group)
    return Path(state_dir) / f"{safe}{FILE_SUFFIX}"


def encode(state: ConsumerState) -> bytes:
    header = {
        "topic": state.topic,
        "group": state.group,
        "cluster_id": state.cluster_id,
        "offsets": {str(p): o for p, o in sorted(state.offsets.items())},
        "snapshot_sha256": hashlib.sha256(state.snapshot).hexdigest(),
    }
    head = json.dumps(header, sort_keys=True).encode()
    return MAGIC + _LEN.pack(len(head)) + head + state.snapshot


def decode(data: bytes) -> ConsumerState:
    if not data.startswith(MAGIC):
        raise StateFileError("not a consumer state file")
    start = len(MAGIC) + _LEN.size
    if len(data) < start:
        raise StateFileError("truncated header")
    (size,) = _LEN.unpack_from(data, len(MAGIC))
    try:
        header = json.loads(data[start : start + size])
    except ValueError as exc:
        raise StateFileError(f"bad header: {exc}") from exc
    snapshot = data[start + size :]
    try:
        if hashlib.sha256(snapshot).hexdigest() != header["snapshot_sha256"]:
            raise StateFileError("snapshot checksum mismatch")
        return ConsumerState(
            topic=str(header["topic"]),
            group=str(header["group"]),
            cluster_id=str(header["cluster_id"]),
            offsets={int(p): int(o) for p, o in header["offsets"].items()},
            snapshot=snapshot,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateFileError(f"bad header: {exc!r}") from exc


def write_state(path: Path, state: ConsumerState) -> None:
    """Atomically replace ``path`` with ``state`` (durable once this returns)."""
    write_bytes_atomic(Path(path), encode(state))


def read_state(path: Path) -> ConsumerState | None:
    """The saved state, or None when there is none yet."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    return decode(data)
