"""A tiny Llama with random weights, made locally in seconds: a real model folder that a
real engine (vLLM, also on the CPU) loads and runs, with no download.

    python -m dynamo.llm.tiny_model /tmp/tiny-llama       # then: python -m dynamo.vllm --model /tmp/tiny-llama

The folder is what a Hugging Face model folder holds: ``config.json`` and
``model.safetensors`` (bf16, ~36 MB) written by ``transformers``, a ``tokenizer.json``
trained here (SentencePiece-style BPE as Llama 2 has it: ``▁`` for spaces, byte
fallback, a BOS added to every sequence), a ``tokenizer_config.json`` with a chat template
that writes the BOS itself, and a ``generation_config.json`` with no sampling defaults.

The weights come from a fixed seed, so the same call makes the same model: its text is
gibberish, but the same gibberish every time, which is what an equality test needs. Its
end-of-sequence logit is held at 0, so greedy decoding runs to ``max_tokens``. The
sizes keep vLLM's CPU attention kernels happy (head size 64; they refuse 16).

Needs ``torch``, ``transformers`` and ``tokenizers`` (all vLLM dependencies); they are
imported only when a model is made.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

#: Special tokens, in id order (0, 1, 2), as Llama 2's tokenizer has them.
UNK, BOS, EOS = "<unk>", "<s>", "</s>"

#: Target vocabulary size of the trained tokenizer (specials and 256 byte tokens included).
VOCAB_SIZE = 2048

#: A chat template in the Zephyr style, writing the BOS itself (so a prompt must be
#: tokenized without adding special tokens, as vLLM's chat server does).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def corpus() -> Iterator[str]:
    """Training text for the tokenizer: English prose that ships with every Python (the
    standard library's module docstrings, in a fixed order), so no file is needed."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # its import prints the Zen; the text is rot13 in this.s

    yield "".join(this.d.get(c, c) for c in this.s)  # type: ignore[attr-defined]
    import argparse as a
    import asyncio as b
    import collections as c
    import functools as f
    import json as j
    import pathlib as p
    import subprocess as s
    import threading as t

    for module in (a, b, c, f, j, p, s, t):
        for name in sorted(vars(module)):
            doc = getattr(getattr(module, name), "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                yield doc


def make_tokenizer(vocab_size: int = VOCAB_SIZE):  # type: ignore[no-untyped-def]
    """A Llama-2-style tokenizer trained on :func:`corpus`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=UNK, byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[UNK, BOS, EOS, *byte_tokens],
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    # The trainer reserved ids 3..258 for the byte tokens by listing them as special
    # tokens, which made them special *added* tokens: decoding with
    # skip_special_tokens (vLLM's default, and the frontend's) then dropped every
    # byte-fallback token's text. In Llama 2's tokenizer they are plain vocabulary.
    data = json.loads(tokenizer.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in (UNK, BOS, EOS)]
    tokenizer = Tokenizer.from_str(json.dumps(data))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (UNK, BOS, EOS)])
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer


def make(path: str | Path, seed: int = 0, max_len: int = 1024) -> Path:
    """Write the tiny model to ``path`` (created) and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=max_len,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        # The end-of-sequence logit is always 0, below the best of 2,000 random logits:
        # greedy decoding writes until max_tokens (sampling may still end it).
        model.lm_head.weight[config.eos_token_id].zero_()
    model.save_pretrained(out, safe_serialization=True)
    # No sampling defaults: requests mean the same to every server of this model.
    (out / "generation_config.json").write_text(json.dumps({
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
    }))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynamo.llm.tiny_model", description=__doc__.split("\n\n")[0])
    p.add_argument("path", help="the folder to write (created)")
    p.add_argument("--seed", type=int, default=0, help="weights' random seed (default 0)")
    p.add_argument("--max-len", type=int, default=1024, help="the model's context length (default 1024)")
    args = p.parse_args(argv)
    print(make(args.path, args.seed, args.max_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
