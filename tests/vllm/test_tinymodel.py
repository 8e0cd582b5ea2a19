"""The tiny model builder: a real Hugging Face folder, deterministic, built once per folder."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from services.worker.vllm.tinymodel import (
    MARKER,
    FolderInUse,
    TinyModelSpec,
    build_tiny_model,
    is_built,
    main,
)

pytestmark = pytest.mark.vllm  # needs torch / transformers from the vllm environment


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_folder_holds_a_llama_vllm_can_serve(tiny_model_dir: Path) -> None:
    config = json.loads((tiny_model_dir / "config.json").read_text())

    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["vocab_size"] == TinyModelSpec().vocab_size
    assert (tiny_model_dir / "model.safetensors").is_file()
    assert (tiny_model_dir / "tokenizer.json").is_file()
    assert is_built(tiny_model_dir, TinyModelSpec())


def test_the_tokenizer_has_bos_eos_and_a_chat_template(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )

    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")
    assert text == "<s><|user|>\nHi</s>\n<|assistant|>\n"
    assert tokenizer.decode(tokenizer.encode("naïve café ☕", add_special_tokens=False)) == (
        "naïve café ☕"
    )


def test_the_same_spec_gives_the_same_weights_and_another_seed_does_not(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    again = build_tiny_model(tmp_path / "again")
    other = build_tiny_model(tmp_path / "other", TinyModelSpec(seed=1))

    weights = digest(tiny_model_dir / "model.safetensors")
    assert digest(again / "model.safetensors") == weights
    assert digest(other / "model.safetensors") != weights
    assert digest(again / "tokenizer.json") == digest(tiny_model_dir / "tokenizer.json")


def test_building_into_a_folder_that_holds_the_model_is_a_no_op(tiny_model_dir: Path) -> None:
    before = (tiny_model_dir / "model.safetensors").stat().st_mtime_ns

    assert build_tiny_model(tiny_model_dir) == tiny_model_dir

    assert (tiny_model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_a_model_of_another_spec_is_replaced(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "m", TinyModelSpec(seed=1))

    build_tiny_model(folder, TinyModelSpec(seed=2))

    assert json.loads((folder / MARKER).read_text())["spec"]["seed"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


def test_a_folder_of_other_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")

    with pytest.raises(FolderInUse):
        build_tiny_model(tmp_path)

    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden_size": 128, "num_attention_heads": 8}, "64"),
        ({"num_attention_heads": 2, "num_key_value_heads": 3}, "multiple"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ],
)
def test_specs_vllm_cannot_serve_on_cpu_are_refused(fields: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelSpec(**fields)  # type: ignore[arg-type]  # ints only, as the table says


def test_the_cli_prints_the_folder(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tiny_model_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_model_dir)


def test_the_cli_refuses_a_foreign_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x").write_text("")

    assert main([str(tmp_path)]) == 2
    assert "not replacing" in capsys.readouterr().err
