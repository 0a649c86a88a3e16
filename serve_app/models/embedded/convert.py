"""Convert a GGUF file to a float32 safetensors Hugging Face folder, one tensor at a time."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve_app.models.embedded.gguf_weights import GgufWeights

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
# Chat turns end with <|im_end|>, FIM and plain completions with <|endoftext|>: stop on both.
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Write ``gguf_path`` as the float32 safetensors folder ``from_pretrained`` loads.

    The weights stream one tensor at a time (``gguf_weights`` -> ``safetensors_shards``), so
    memory holds one tensor, not the model: the same values ``from_pretrained(gguf_file=...)``
    gives, without its 9 GB peak on the 1.5B model.
    """
    # torch only here: this package is imported by the config, i.e. by every process of the
    # graph, and the router and auth replicas never load torch (~150 MB each).
    from serve_app.models.embedded.gguf_weights import GgufWeights

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    with _step("reading the tokenizer from the GGUF"):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        _fix_tokenizer(tokenizer)
    with _step("reading the model config and tensor table from the GGUF"):
        model = _empty_model(gguf_path)
        weights = GgufWeights(gguf_path, model)
    with _step(f"dequantizing {len(weights.plan)} tensors to float32 (the long step)"):
        _write_weights(weights, out_dir)
    with _step("saving config, tokenizer and generation config"):
        # What save_pretrained records: the class that loads the folder.
        model.config.architectures = [type(model).__name__]
        model.config.save_pretrained(out_dir)
        _fix_generation_config(model, tokenizer)
        model.generation_config.save_pretrained(out_dir)
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
        tokenizer.save_pretrained(out_dir)


def _empty_model(gguf_path: Path) -> Any:
    """The model ``from_pretrained(gguf_file=...)`` builds, on the meta device: no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # transformers' own GGUF metadata -> config mapping (load_gguf_checkpoint under the hood).
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config.dtype = torch.float32
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _write_weights(weights: GgufWeights, out_dir: Path) -> None:
    from serve_app.models.embedded.safetensors_shards import ShardWriter

    started = time.monotonic()
    total = len(weights.plan)
    next_report, done = 0.1, 0
    with ShardWriter(out_dir, weights.plan) as writer:
        # No enumerate(): its cached result tuple would keep the last tensor alive while the
        # next is made, two model-sized tensors at a time instead of one.
        for name, tensor in weights:
            writer.write(name, tensor)
            del tensor
            done += 1
            if done / total >= next_report:  # every 10%, so the long step never looks hung
                logger.info(
                    "converting: %d/%d tensors (%d%%, %.1fs)",
                    done,
                    total,
                    done * 100 // total,
                    time.monotonic() - started,
                )
                while next_report <= done / total:
                    next_report += 0.1


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
