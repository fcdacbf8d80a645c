"""`--model FILE.gguf`: any GGUF file is converted once into the cache; a file transformers cannot read
is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from lookahead_core.catalog import builtin_gguf_path, converted_dir
from lookahead_core.defaults import CACHE_ENV
from lookahead_core.models import UnsupportedModelError, load_model, resolve_model_path
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def write_gguf(path: Path, architecture: str) -> Path:
    """A small but well-formed GGUF file of ``architecture`` with one tensor."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_unknown_architecture_is_refused_in_one_line(cache: Path, tmp_path: Path) -> None:
    # a GGUF whose architecture transformers does not know: one line naming the file and the reason
    path = write_gguf(tmp_path / "odd.gguf", "nosucharch")
    with pytest.raises(UnsupportedModelError) as err:
        resolve_model_path(str(path))
    assert "odd.gguf" in str(err.value) and "nosucharch" in str(err.value) and "\n" not in str(err.value)
    assert not converted_dir(path).exists()  # nothing half-converted is left to be taken for a model


def test_a_file_that_is_not_gguf_is_refused_in_one_line(cache: Path, tmp_path: Path) -> None:
    # bytes without the GGUF magic under a .gguf name
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a model")
    with pytest.raises(UnsupportedModelError, match=r"junk\.gguf.*not a GGUF file"):
        resolve_model_path(str(path))


@pytest.mark.slow
def test_a_gguf_path_is_converted_once_and_equals_the_builtin(
    cache: Path, tmp_path: Path, smollm: tuple[PreTrainedModel, PreTrainedTokenizerBase]
) -> None:
    # a copy of the bundled GGUF passed as a path: converted into the cache (its own key), giving the
    # built-in's logits; the second load finds the conversion and does not convert again
    copy = tmp_path / "models" / "SmolLM2-copy.gguf"
    copy.parent.mkdir()
    shutil.copyfile(builtin_gguf_path(), copy)
    model, tok = load_model(str(copy))
    target = converted_dir(copy)
    assert (target / "config.json").exists() and target.parent == cache / "models"
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])  # [1, prompt]
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, smollm[0](ids).logits)
    stamp = (target / "config.json").stat().st_mtime_ns
    assert resolve_model_path(str(copy)) == str(target)
    assert (target / "config.json").stat().st_mtime_ns == stamp

