"""Build a tiny offline model folder that Dynamo's frontend and mocker accept.

The local stack never downloads anything, so it needs a model folder made on the spot: a
byte-level BPE tokenizer, a tokenizer config with a ChatML chat template, and a llama-shaped
``config.json``. No weights: the mocker only reads the tokenizer and the config.

Two details matter to Dynamo:

* The mocker emits random token ids in ``[1000, 2000)``. Every id it can produce must exist in
  the vocabulary, otherwise the frontend's detokenizer yields null content. The trained BPE
  vocabulary is small, so it is padded with plain added tokens up to ``VOCAB_SIZE``.
* Agent contexts grow long; ``max_position_embeddings`` is large so the frontend never rejects
  a long program for exceeding the model length.

Run ``python -m dynamo_thunderagent.stack.tiny_model DEST`` to build the folder by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

MODEL_NAME = "tiny"
VOCAB_SIZE = 2048
BPE_VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 131072

BOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [BOS_TOKEN, IM_START, IM_END]

# The trainer only needs enough text to learn common English merges; the exact words do not
# matter for scheduling experiments, only that prompts turn into a realistic number of tokens.
TRAINING_TEXT = [
    "An agent reads the task, thinks about a plan, and calls a tool to inspect the repository.",
    "The tool returns a long observation that is appended to the conversation history.",
    "Each turn reuses the previous context, so the prefix cache should keep it resident.",
    "When memory runs short the scheduler pauses whole programs at tool boundaries.",
    "A paused program resumes later on whichever worker has enough free key value blocks.",
    "The quick brown fox jumps over the lazy dog while the compiler finishes the build.",
    "def main(argv: list[str]) -> int: return run(parse_args(argv)) if argv else 0",
    "import os, sys, json; print(json.dumps({'status': 'ok', 'files': os.listdir('.')}))",
    "Error: test_parse failed with AssertionError: expected 3 tokens but found 4 tokens.",
    "Please summarise the findings, list the changed files, and propose the next step.",
    "user assistant system tool observation thought action result answer question",
    "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?()[]{}<>/=+-*_'\"",
]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Files whose presence means a previous build finished (config.json is written last).
_MARKER = "config.json"


def _train_tokenizer() -> Tokenizer:
    """Train a byte-level BPE on ``TRAINING_TEXT`` and pad it to ``VOCAB_SIZE`` ids."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    # Plain (non-special) added tokens so that generated ids decode to visible text.
    filler = [f"<t{i}>" for i in range(tokenizer.get_vocab_size(), VOCAB_SIZE)]
    tokenizer.add_tokens(filler)
    if tokenizer.get_vocab_size() < VOCAB_SIZE:
        raise RuntimeError(
            f"tiny tokenizer has {tokenizer.get_vocab_size()} ids, expected {VOCAB_SIZE}"
        )
    return tokenizer


def _model_config(tokenizer: Tokenizer) -> dict[str, Any]:
    """A small llama-shaped config; the mocker reads it for KV sizing only."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tokenizer.get_vocab_size(),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": tokenizer.token_to_id(BOS_TOKEN),
        "eos_token_id": tokenizer.token_to_id(IM_END),
    }


def _tokenizer_config(tokenizer: Tokenizer) -> dict[str, Any]:
    added = {
        str(tokenizer.token_to_id(tok)): {
            "content": tok,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for tok in SPECIAL_TOKENS
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": IM_END,
        "pad_token": BOS_TOKEN,
        "unk_token": None,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_tiny_model(dest: Path) -> Path:
    """Build the tiny model folder at ``dest`` and return it; a finished folder is reused."""
    dest = Path(dest)
    if (dest / _MARKER).is_file() and (dest / "tokenizer.json").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer()
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_json(dest / "tokenizer_config.json", _tokenizer_config(tokenizer))
    _write_json(
        dest / "special_tokens_map.json",
        {"bos_token": BOS_TOKEN, "eos_token": IM_END, "pad_token": BOS_TOKEN},
    )
    eos = tokenizer.token_to_id(IM_END)
    _write_json(
        dest / "generation_config.json",
        {"bos_token_id": tokenizer.token_to_id(BOS_TOKEN), "eos_token_id": [eos]},
    )
    # Written last: its presence marks a complete build.
    _write_json(dest / _MARKER, _model_config(tokenizer))
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dest", type=Path, help="folder to create (reused if already built)")
    args = parser.parse_args(argv)
    path = build_tiny_model(args.dest)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
