"""A tiny randomly initialised Qwen2 model with a real byte-level BPE tokenizer.

Built in about a second with no download, it runs the exact code paths of the real model
(same architecture, same special tokens, same chat template), so contract tests are fast.
Its answers are random text; behaviour tests use the embedded model instead.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]

# Qwen2.5's tool-call markers: added tokens, but not special ones (they are answer text).
TOOL_MARKERS = ["<tool_call>", "</tool_call>"]
# The Qwen2.5 chat template's behaviour, reduced to what the service uses: system, user and
# assistant turns, the tools block in the system turn, assistant tool calls and tool results.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nCall a function as:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n'
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first and tools %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls %}"
    "{%- if call.function is defined %}{%- set call = call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{\\"name\\": \\"\' + call.name + \'\\", \\"arguments\\": \' }}'
    "{{- call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Bumped when what ``build_tiny_model`` writes changes: an older folder is rebuilt.
TINY_VERSION = 3

# The tiny model's sizes, as ``Qwen2Config`` arguments; ``bench.gpu --smoke`` runs this shape.
TINY_SHAPE: Final[dict[str, Any]] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n    print(i)\n",
    "The answer is true. The answer is false. yes no True False 0 1 2 3 4 5 6 7 8 9",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n",
    '{"key": "value", "list": [1, 2, 3]}',
]


def build_tiny_model(
    path: str | Path, *, vocab_size: int = 600, seed: int = 0, shape: dict[str, Any] | None = None
) -> Path:
    """Write a tiny Qwen2 model and tokenizer to ``path`` (reused when already there);
    ``shape``: sizes that differ from ``TINY_SHAPE`` (a draft model for tests)."""
    path = Path(path)
    marker = {"seed": seed, "vocab_size": vocab_size, "version": TINY_VERSION}
    # A folder of this version is reused whatever it was built with (``tiny:FOLDER`` names
    # one built earlier with other sizes); an older version's is rebuilt.
    if (path / "config.json").exists() and _read_marker(path).get("version") == TINY_VERSION:
        return path
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path.mkdir(parents=True, exist_ok=True)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(vocab_size),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    base_vocab = len(tokenizer)
    tokenizer.add_tokens(TOOL_MARKERS)  # not special: the answer's text shows them
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=base_vocab,
        **{**TINY_SHAPE, **(shape or {})},
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    model = Qwen2ForCausalLM(config)
    # The markers' rows come last, after every other weight is drawn: the rest of the model
    # is the one the tests were written against before the markers existed.
    model.resize_token_embeddings(len(tokenizer))
    model.generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]
    model.save_pretrained(path)
    (path / "tiny.json").write_text(json.dumps(marker))
    return path


def _read_marker(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / "tiny.json").read_text())
    except (OSError, ValueError):
        return {}


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tokenizer
