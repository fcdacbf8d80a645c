"""API keys: random tokens handed out once, kept only as SHA-256 digests in one JSON file.

    keys = KeyFile(path)
    record, token = keys.add(["acme"], name="acme-web")    # token: "lar_..." shown once, never stored
    keys.add(["acme"], name="acme-sync", scopes=["write"])  # scopes: services.common.auth.scopes (default: answer)
    keys.revoke(record.id)
    store = KeyStore(path)                                 # the server's view
    store.find(token)                                      # the ApiKey, or None (unknown or revoked)

Why a plain SHA-256 and not a slow password hash (bcrypt, scrypt): a key is ``secrets.token_urlsafe``
of 32 bytes, 256 bits chosen by the machine, so there is nothing to guess or brute-force from a
digest; slow hashes protect low-entropy human passwords, and would cost every RPC milliseconds.
The lookup is by digest, so the time it takes tells nothing about the token.

The file (mode 0600, written atomically by ``lookahead_rag.services.common.atomic``)::

    {"version": 1, "keys": [{"id": "k3f9a1c2b", "name": "acme-web", "tenants": ["acme"],
      "created": "2026-01-01T00:00:00+00:00", "revoked": false, "sha256": "<hex digest>",
      "scopes": ["answer"]}]}

A record written before scopes existed has no ``scopes``: it keeps what it could do then, less what
only an administrator should (``scopes.legacy_scopes``): ``answer`` and ``write`` for its tenants,
``admin`` for a ``*`` key. An admin key is always a ``*`` key (admin means every tenant).

``KeyStore`` rereads it when it changes (inode, mtime or size), so ``lookahead-rag keys revoke``
takes effect on the next call of a running server. A file that cannot be read or parsed holds no
key (every key is refused, and the error is logged): a broken file never lets a revoked key in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lookahead_rag.services.common.atomic import write_bytes_atomic
from lookahead_rag.services.common.auth.scopes import DEFAULT_SCOPES, Scope, legacy_scopes, parse_scopes
from lookahead_rag.services.common.auth.settings import ALL_TENANTS

log = logging.getLogger(__name__)

KEY_PREFIX = "lar_"  # recognisable in a leaked config or log (secret scanners can match it)
KEY_BYTES = 32  # 256 random bits: a digest cannot be brute-forced back to the key
ID_BYTES = 4  # the public id: 8 hex digits after "k"
FORMAT_VERSION = 1
LOCK_SUFFIX = ".lock"


class KeyFileError(ValueError):
    """The keys file cannot be read, or a change to it is not possible (one line)."""


def digest(token: str) -> str:
    """The SHA-256 hex digest a key is stored and looked up by."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


@dataclass(frozen=True)
class ApiKey:
    """One key's record: everything but the key itself."""

    id: str
    name: str
    tenants: tuple[str, ...]  # "*": every tenant
    created: str  # ISO 8601, UTC
    revoked: bool
    sha256: str
    scopes: tuple[Scope, ...] = DEFAULT_SCOPES  # answer, write, admin

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tenants": list(self.tenants), "scopes": [s.value for s in self.scopes]}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ApiKey:
        tenants = raw["tenants"]
        if not isinstance(tenants, list) or not tenants or not all(isinstance(t, str) and t for t in tenants):
            raise KeyFileError(f"key {raw.get('id')!r}: tenants must be a non-empty list of names")
        return cls(id=str(raw["id"]), name=str(raw.get("name", "")), tenants=tuple(tenants),
                   created=str(raw.get("created", "")), revoked=bool(raw.get("revoked", False)),
                   sha256=str(raw["sha256"]), scopes=_scopes_of(raw, tenants))

    @property
    def all_tenants(self) -> bool:
        return ALL_TENANTS in self.tenants


def _scopes_of(raw: dict[str, Any], tenants: list[str]) -> tuple[Scope, ...]:
    """A record's scopes; one written before scopes existed gets ``legacy_scopes``."""
    if "scopes" not in raw:
        return legacy_scopes(tenants, ALL_TENANTS)
    scopes = raw["scopes"]
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise KeyFileError(f"key {raw.get('id')!r}: scopes must be a non-empty list of names")
    try:
        return parse_scopes(scopes)
    except ValueError as exc:
        raise KeyFileError(f"key {raw.get('id')!r}: {exc}") from None


def checked_scopes(tenants: Sequence[str], scopes: Sequence[str]) -> tuple[Scope, ...]:
    """A new key's scopes, validated (KeyFileError): at least one, and admin only for every tenant."""
    try:
        parsed = parse_scopes(scopes)
    except ValueError as exc:
        raise KeyFileError(str(exc)) from None
    if not parsed:
        raise KeyFileError("a key needs at least one scope (answer, write, admin)")
    if Scope.ADMIN in parsed and list(tenants) != [ALL_TENANTS]:
        raise KeyFileError("an admin key is for every tenant: give it tenant * (--all-tenants)")
    return parsed


def parse(data: bytes, path: Path) -> list[ApiKey]:
    """The records of a keys file's contents (KeyFileError when it is not one)."""
    try:
        doc = json.loads(data)
        version, raw_keys = doc.get("version"), doc["keys"]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise KeyFileError(f"{path}: not a keys file ({type(exc).__name__})") from None
    if version != FORMAT_VERSION:
        raise KeyFileError(f"{path}: unknown keys file version {version!r}")
    try:
        return [ApiKey.from_json(raw) for raw in raw_keys]
    except (KeyError, TypeError, AttributeError) as exc:
        raise KeyFileError(f"{path}: a key record is incomplete ({type(exc).__name__}: {exc})") from None


class KeyFile:
    """Reading and changing the keys file (the ``keys`` command); changes hold an exclusive lock."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def load(self) -> list[ApiKey]:
        """Every record, revoked ones included; none when the file does not exist yet."""
        try:
            return parse(self.path.read_bytes(), self.path)
        except FileNotFoundError:
            return []

    def save(self, keys: Sequence[ApiKey]) -> None:
        doc = {"version": FORMAT_VERSION, "keys": [k.to_json() for k in keys]}
        write_bytes_atomic(self.path, (json.dumps(doc, indent=1) + "\n").encode("utf-8"))

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[ApiKey]]:
        """The records under an exclusive lock (two ``keys add`` at once both land)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + LOCK_SUFFIX), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield self.load()

    def add(self, tenants: Sequence[str], name: str = "", scopes: Sequence[str] = DEFAULT_SCOPES
            ) -> tuple[ApiKey, str]:
        """A new key for ``tenants`` ("*" = every tenant) with ``scopes``: (its record, the key, shown only now)."""
        if not tenants or not all(tenants):
            raise KeyFileError("a key needs at least one tenant (or every tenant: *)")
        granted = checked_scopes(tenants, scopes)
        token = new_token()
        with self._locked() as keys:
            taken = {k.id for k in keys}
            key_id = "k" + secrets.token_hex(ID_BYTES)
            while key_id in taken:
                key_id = "k" + secrets.token_hex(ID_BYTES)
            created = datetime.now(UTC).isoformat(timespec="seconds")
            record = ApiKey(key_id, name, tuple(dict.fromkeys(tenants)), created, False, digest(token), granted)
            self.save([*keys, record])
        return record, token

    def revoke(self, key_id: str) -> ApiKey:
        """Mark ``key_id`` revoked (kept in the file, so ``keys list`` still shows it)."""
        with self._locked() as keys:
            found = [k for k in keys if k.id == key_id]
            if not found:
                raise KeyFileError(f"no key with id {key_id!r} in {self.path}")
            revoked = dataclasses.replace(found[0], revoked=True)
            self.save([revoked if k.id == key_id else k for k in keys])
        return revoked


class KeyStore:
    """The server's view of the keys file: live keys by digest, reread whenever the file changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._signature: tuple[int, int, int] | None = None
        self._by_digest: dict[str, ApiKey] = {}

    def _current(self) -> tuple[int, int, int] | None:
        """(inode, mtime, size): an atomic rewrite makes a new inode, and mtime alone is coarse (a jiffy)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _refresh(self) -> None:
        signature = self._current()
        if signature == self._signature:
            return
        keys: list[ApiKey] = []
        if signature is not None and self.path is not None:
            try:
                keys = parse(self.path.read_bytes(), self.path)
            except (OSError, KeyFileError) as exc:
                log.error("API keys unreadable, every key is refused until the file is fixed: %s", exc)
        self._by_digest = {k.sha256: k for k in keys if not k.revoked}
        self._signature = signature
        log.info("API keys loaded: %d live", len(self._by_digest))

    def find(self, token: str) -> ApiKey | None:
        """The live key ``token`` is, or None (unknown or revoked)."""
        with self._lock:
            self._refresh()
            return self._by_digest.get(digest(token))
