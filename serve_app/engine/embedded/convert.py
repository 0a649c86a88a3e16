"""Convert a GGUF file to a float32 safetensors Hugging Face folder with ``transformers``."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("serve_app.engine.embedded")  # one logger for the package
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
# Chat turns end with <|im_end|>, FIM and plain completions with <|endoftext|>: stop on both.
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Load a GGUF file with ``transformers`` and save it as a float32 safetensors folder."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    with _step("reading the tokenizer from the GGUF"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        _fix_tokenizer(tokenizer)
    with _step("dequantizing the weights to float32 (the long step, about a minute)"):
        model = _load_dense_model(gguf_path)
    with _step("saving safetensors, tokenizer and generation config"):
        # save_pretrained refuses a model still tied to the GGUF quantizer; its weights are dense.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _fix_generation_config(model, tokenizer)
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)


def _load_dense_model(gguf_path: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    return AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        # Dense weights even where a GGUF matmul kernel is installed: we save safetensors.
        quantization_config=GgufConfig(dequantize=True),
    )


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    started = time.monotonic()
    logger.info("converting: %s...", what)
    yield
    logger.info("converting: %s: done in %.1fs", what, time.monotonic() - started)


def _fix_tokenizer(tokenizer: Any) -> None:
    """FIM tokens must be single ids and chat needs the template, whatever the GGUF carried."""
    split = [
        token for token in FIM_TOKENS if len(tokenizer.encode(token, add_special_tokens=False)) != 1
    ]
    if split:
        # They are in the vocabulary: registering them as special reuses their ids.
        tokenizer.add_special_tokens(
            {"additional_special_tokens": split}, replace_extra_special_tokens=False
        )
    if not tokenizer.chat_template:
        logger.info("the GGUF carries no chat template; using the Qwen2.5 one")
        tokenizer.chat_template = QWEN2_5_CHAT_TEMPLATE


def _fix_generation_config(model: Any, tokenizer: Any) -> None:
    eos = [tokenizer.convert_tokens_to_ids(token) for token in EOS_TOKENS]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.generation_config.bos_token_id = pad  # Qwen2.5 has no BOS; its configs name this id
    if tokenizer.pad_token is None:
        tokenizer.pad_token = "<|endoftext|>"


# The official Qwen2.5 chat template (tools included), as the Qwen2.5 GGUFs carry it: the
# fallback for a file without one. Kept last because it is long.
QWEN2_5_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501
