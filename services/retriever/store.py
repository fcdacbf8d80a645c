"""Where tenant indexes and the past-sessions snapshot live on disk.

Layout under ``data_dir``::

    indexes/<slug>-<hash>.npz   one file per tenant (TenantIndex.to_bytes; the tenant name is inside)
    sessions.bin                PastSessions.snapshot()

Every file is replaced atomically (services.common.atomic); stray temp files from a crash are
removed on load. ``data_dir=None`` keeps everything in memory.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from lookahead_rag.services.common.atomic import remove_stale_temps, write_bytes_atomic
from lookahead_rag.services.retriever.index import CorruptIndex, IndexConfig, TenantIndex

log = logging.getLogger(__name__)

INDEX_DIR = "indexes"
INDEX_SUFFIX = ".npz"
SESSIONS_FILE = "sessions.bin"
SLUG_CHARS = 40  # readable part of a tenant's file name
HASH_CHARS = 16  # hash part: tenants whose slugs collide still get distinct files
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def tenant_filename(tenant: str) -> str:
    slug = _UNSAFE.sub("_", tenant)[:SLUG_CHARS].lstrip(".") or "_"
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:HASH_CHARS]
    return f"{slug}-{digest}{INDEX_SUFFIX}"


class IndexStore:
    """Loads and saves TenantIndex files; a no-op when ``data_dir`` is None."""

    def __init__(self, data_dir: Path | None) -> None:
        self.data_dir = data_dir

    @property
    def index_dir(self) -> Path | None:
        return self.data_dir / INDEX_DIR if self.data_dir is not None else None

    @property
    def sessions_path(self) -> Path | None:
        return self.data_dir / SESSIONS_FILE if self.data_dir is not None else None

    def save_index(self, index: TenantIndex, data: bytes | None = None) -> None:
        """Persist one tenant (``data``: its already-serialized bytes, if the caller has them)."""
        if self.index_dir is None:
            return
        blob = index.to_bytes() if data is None else data
        write_bytes_atomic(self.index_dir / tenant_filename(index.tenant), blob)

    def load_indexes(self, config: IndexConfig, dim: int) -> dict[str, TenantIndex]:
        """Every persisted tenant; a file that fails to load is an error, never silently skipped."""
        directory = self.index_dir
        if directory is None or not directory.is_dir():
            return {}
        removed = remove_stale_temps(directory)
        if removed:
            log.warning("removed %d temp file(s) left by an interrupted write in %s", removed, directory)
        out: dict[str, TenantIndex] = {}
        for path in sorted(directory.glob(f"*{INDEX_SUFFIX}")):
            try:
                index = TenantIndex.from_bytes(path.read_bytes(), config)
            except CorruptIndex as exc:
                raise CorruptIndex(f"{path}: {exc}") from exc
            if index.dim != dim:
                raise CorruptIndex(f"{path}: vectors of dim {index.dim}, the embedder gives {dim}")
            out[index.tenant] = index
        log.info("loaded %d tenant index(es) from %s", len(out), directory)
        return out

    def save_sessions(self, data: bytes) -> None:
        if self.sessions_path is not None:
            write_bytes_atomic(self.sessions_path, data)

    def load_sessions(self) -> bytes | None:
        path = self.sessions_path
        if path is None or not path.exists():
            return None
        remove_stale_temps(path.parent)
        return path.read_bytes()
