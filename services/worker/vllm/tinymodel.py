"""A tiny random-weight Llama, built locally in seconds, so the real vLLM path runs without a hub.

No machine of this project can download weights. What the tests and the CPU stack need is not
a good model but a *real* one: a Hugging Face folder that vLLM loads like any other (config,
safetensors weights, a fast tokenizer with a chat template). The text it produces is noise;
what is real is everything around it: tokenizer, chat template, scheduler, KV cache, sampling,
streaming, abort.

Shape (see notes/vllm-cpu.md): ``hidden_size / num_attention_heads`` must be 64, the head size
the CPU attention kernels accept (16 is refused). The tokenizer is byte-level BPE trained on a
few sentences, so any UTF-8 text encodes, with ``<s>`` / ``</s>`` as BOS / EOS.

Weights are drawn from a seeded generator (the caller's global RNG is left untouched), so one
spec always gives the same model. The folder carries ``meridian-tinymodel.json`` with the
spec's fingerprint: building into a folder that already holds the same model is a no-op, and a
folder that holds anything else that is not ours is refused rather than overwritten. The model
is written to a temporary sibling and renamed into place, so concurrent builders (several
workers of one local stack) never see half a model.

CLI: ``python -m services.worker.vllm.tinymodel OUT_DIR [--seed N]`` prints the folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "meridian-tinymodel.json"
FORMAT_VERSION = 3
"""Bumped whenever the builder would write a different folder for the same spec."""

BOS = "<s>"
EOS = "</s>"
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
"""Hermes-style call markers (vLLM's ``hermes`` tool parser finds calls between them)."""
HEAD_DIM = 64

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}"
    "</tools>{{ eos_token }}\n{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}{{ part['text'] }}"
    "{% endfor %}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>"
    '{"name": "{{ call[\'function\'][\'name\'] }}", "arguments": '
    "{% if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}"
    "{% else %}{{ call['function']['arguments'] | tojson }}{% endif %}}</tool_call>"
    "{% endfor %}"
    "{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Zephyr-style turns: ``<|role|>`` line, content, EOS. Ends with an open assistant turn.

Tools (as vLLM passes them, OpenAI's ``{"type": "function", "function": {...}}``) go in a
leading system turn; an assistant's calls follow its text as Hermes ``<tool_call>{"name":
..., "arguments": ...}</tool_call>`` blocks — what vLLM's ``hermes`` tool parser reads back.
"""

CORPUS = (
    "Meridian serves language models from regional clusters close to the user.",
    "The edge accepts a chat request, the router picks a region, the worker streams tokens.",
    "A system message sets the tone; the user asks; the assistant answers briefly.",
    "Tokens arrive one by one over a stream until a stop string or the length limit.",
    "The quick brown fox jumps over the lazy dog while the cache keeps recent prefixes.",
    "Latency, throughput and queue length decide which region should serve right now.",
    "Hello! How are you today? I am fine, thank you, and you? Let us count: one two three.",
    "Numbers 0123456789, punctuation .,;:!?'\"()[]{}<>/\\|@#$%^&*-_=+~ and newlines\n\n.",
    "<|system|>\nYou are helpful.</s>\n<|user|>\nWrite a poem.</s>\n<|assistant|>\nSure.",
    '<tools>{"type": "function", "function": {"name": "get_weather", "parameters": {"type": '
    '"object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": '
    '"integer", "maximum": 7} }, "required": ["city", "days"]} } }</tools>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Seoul", "days": 3} }</tool_call>',
)
"""Text the BPE merges are learned from. Any UTF-8 text still encodes (byte fallback). The JSON
lines give tool schemas and calls merges of their own (a tools prompt fits the context, and
the random model's forced calls end within a few hundred tokens)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TinyModelSpec:
    """The model's shape and seed. Defaults are the ones notes/vllm-cpu.md verified on CPU."""

    vocab_size: int = 640
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 512
    seed: int = 0
    # Declare the model Matryoshka-trained (config ``is_matryoshka``), so vLLM's pooling runner
    # accepts ``dimensions``: the embedding model of the tests (``--runner pooling``).
    matryoshka: bool = False

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.hidden_size != self.num_attention_heads * HEAD_DIM:
            raise ValueError(
                f"hidden_size / num_attention_heads must be {HEAD_DIM} (the head size vLLM's "
                f"CPU attention accepts), got {self.hidden_size} / {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.vocab_size < 256 + 2:
            raise ValueError("vocab_size must hold the 256 byte tokens and <s>, </s>")

    def fingerprint(self) -> str:
        """Identifies what the builder writes for this spec (fields + builder version)."""
        fields = asdict(self)
        if not self.matryoshka:
            del fields["matryoshka"]  # the chat model's fingerprint predates the field
        blob = json.dumps({"format": FORMAT_VERSION, **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


class FolderInUse(Exception):
    """The target folder holds files that are not a Meridian tiny model."""


def is_built(out_dir: Path, spec: TinyModelSpec) -> bool:
    """Whether ``out_dir`` already holds the model this spec describes."""
    marker = out_dir / MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(recorded, dict) and recorded.get("fingerprint") == spec.fingerprint()


def build_tiny_model(out_dir: Path | str, spec: TinyModelSpec | None = None) -> Path:
    """Write the tiny model to ``out_dir`` (skipped when it already holds it); return the path.

    Raises :class:`FolderInUse` when ``out_dir`` is a non-empty folder that is not ours.
    """
    spec = spec or TinyModelSpec()
    out = Path(out_dir).resolve()
    if is_built(out, spec):
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise FolderInUse(f"{out} is not empty and holds no Meridian tiny model; not replacing")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would follow the folder into place
    try:
        _write_model(staging, spec)
        _swap_into_place(staging, out, spec)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _swap_into_place(staging: Path, out: Path, spec: TinyModelSpec) -> None:
    """Rename the finished folder into place; a concurrent builder of the same spec may win."""
    if out.exists():
        if is_built(out, spec):
            return
        retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        out.rename(retired / out.name)
        shutil.rmtree(retired, ignore_errors=True)
    try:
        staging.rename(out)
    except OSError:
        if not is_built(out, spec):
            raise


def _write_model(folder: Path, spec: TinyModelSpec) -> None:
    # Heavy imports here, not at module level: importing this module must stay cheap.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(spec.vocab_size),
        bos_token=BOS,
        eos_token=EOS,
        additional_special_tokens=[TOOL_CALL_START, TOOL_CALL_END],
        model_max_length=spec.max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
        **({"is_matryoshka": True} if spec.matryoshka else {}),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    (folder / MARKER).write_text(
        json.dumps({"fingerprint": spec.fingerprint(), "spec": asdict(spec)}, indent=2) + "\n"
    )


def _train_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]  # tokenizers is untyped
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[BOS, EOS, TOOL_CALL_START, TOOL_CALL_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.worker.vllm.tinymodel",
        description="Write a tiny random-weight Llama (for vLLM on CPU) to OUT_DIR.",
    )
    parser.add_argument("out_dir", type=Path, help="folder to write (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    parser.add_argument(
        "--matryoshka",
        action="store_true",
        help="declare it Matryoshka-trained (an embedding model that takes dimensions)",
    )
    args = parser.parse_args(argv)
    try:
        path = build_tiny_model(
            args.out_dir, TinyModelSpec(seed=args.seed, matryoshka=args.matryoshka)
        )
    except (FolderInUse, ValueError) as err:
        print(f"tinymodel: {err}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
