#!/usr/bin/env python
"""Build a tiny, random-weight Llama model plus a locally trained tokenizer.

No network / model hub access is needed: the tokenizer is a byte-level BPE
trained here on a small built-in text, and the weights are random (seeded).
The result is a normal Hugging Face model directory (``save_pretrained``)
that vLLM can serve, including a chat template for ``/v1/chat/completions``.

Run it with the vLLM venv's python (it needs torch, transformers, tokenizers)::

    python scripts/build_tiny_llama.py OUT_DIR [--force]

Idempotent: if OUT_DIR already holds a build with the same config hash, it
does nothing (prints the directory and exits 0).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

# Bump when the build procedure changes in a way the config dict does not show.
BUILD_VERSION = 2
STAMP_NAME = ".inferq_tiny_llama.json"

MODEL_CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head_dim = 128 / 4 = 32 (vLLM CPU wants 32/64/...)
    "num_key_value_heads": 2,  # GQA, like real Llamas
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "dtype": "bfloat16",  # what vLLM runs on CPU anyway (it downcasts fp32 with warnings)
}
TOKENIZER_CONFIG = {
    "vocab_size": 1024,
    "min_frequency": 1,
    "model_max_length": 2048,
}
SEED = 1234

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# Small built-in training text: enough variety for a few hundred merges.
_CORPUS_BASE = """
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
Inference requests are queued in a Redis stream and consumed by GPU workers.
A worker reads a batch of messages, runs the model, and writes the results back.
When the queue is empty the workers scale down to zero, and scale up again on demand.
Hello, how are you today? I am fine, thank you. What is the weather like?
Once upon a time there was a small model that could only say random things.
The server exposes an OpenAI compatible API with chat completions and completions.
Tokens, prompts, latency, throughput, batch size, concurrency, and time to first token.
def main():\n    print("hello world")\n    return 0\n
{"model": "tiny-llama", "prompt": "Say hi", "max_tokens": 32, "temperature": 0.0}
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024 2048 4096
Numbers, letters, punctuation: ! ? . , ; : ' " ( ) [ ] { } < > / \\ | @ # $ % ^ & * - + = _ ~
Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt.
"""


def config_hash() -> str:
    payload = json.dumps(
        {
            "build_version": BUILD_VERSION,
            "model": MODEL_CONFIG,
            "tokenizer": TOKENIZER_CONFIG,
            "seed": SEED,
            "chat_template": CHAT_TEMPLATE,
            "corpus": _CORPUS_BASE,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def is_built(out_dir: Path, want_hash: str) -> bool:
    stamp = out_dir / STAMP_NAME
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    return data.get("config_hash") == want_hash


def _build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_CONFIG["vocab_size"],
        min_frequency=TOKENIZER_CONFIG["min_frequency"],
        special_tokens=[BOS, EOS, PAD, UNK, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte -> no OOV
        show_progress=False,
    )
    corpus = [line for line in _CORPUS_BASE.splitlines() if line.strip()] * 4
    tok.train_from_iterator(corpus, trainer=trainer)

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=TOKENIZER_CONFIG["model_max_length"],
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build(out_dir: Path, force: bool = False) -> Path:
    want = config_hash()
    out_dir = out_dir.resolve()
    if not force and is_built(out_dir, want):
        print(f"tiny llama already built ({want}): {out_dir}")
        return out_dir

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    tokenizer = _build_tokenizer()
    # Exactly the tokenizer's size: with a random model every id can be sampled,
    # and ids the tokenizer does not know would detokenize badly.
    vocab_size = len(tokenizer)

    cfg = dict(MODEL_CONFIG)
    dtype = str(cfg.pop("dtype"))
    config = LlamaConfig(
        vocab_size=vocab_size,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **cfg,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = dtype
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # Belt and braces: make sure the chat template is on disk in the form
        # both older (tokenizer_config.json) and newer (chat_template.jinja)
        # transformers read.
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)
        tc_path = tmp / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc.setdefault("chat_template", CHAT_TEMPLATE)
        tc_path.write_text(json.dumps(tc, indent=2))
        n_params = sum(p.numel() for p in model.parameters())
        (tmp / STAMP_NAME).write_text(
            json.dumps(
                {
                    "config_hash": want,
                    "vocab_size": vocab_size,
                    "n_params": n_params,
                    "seed": SEED,
                },
                indent=2,
            )
        )
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"built tiny llama ({want}, {n_params} params, vocab {vocab_size}): {out_dir}")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--print-hash", action="store_true", help="print the config hash and exit")
    args = ap.parse_args(argv)
    if args.print_hash:
        print(config_hash())
        return 0
    build(args.out_dir, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
