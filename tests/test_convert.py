"""The GGUF -> float32 safetensors conversion, on a real GGUF written from the tiny model.

The GGUF holds the tiny random Qwen2 model's weights in several ggml types (F32, F16, Q8_0,
Q5_0, Q4_0: those ``gguf.quants`` can write), so every dequantization path runs; the converted
folder must load with exactly the weights transformers' own GGUF loader gives for the same file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from serve_app.models.embedded import EOS_TOKENS, FIM_TOKENS, convert_gguf
from serve_app.models.embedded.safetensors_shards import INDEX_NAME, PlannedTensor, ShardWriter


def _ggml_type(hf_name: str) -> str:
    """A mix like a real Q4_K_M file's, of the types gguf.quants can write."""
    if hf_name.endswith(".bias") or "norm" in hf_name:
        return "F32"  # llama.cpp keeps 1-D tensors in F32
    for part, kind in (
        ("embed_tokens", "Q8_0"),
        ("lm_head", "Q8_0"),
        ("q_proj", "Q5_0"),
        ("k_proj", "Q4_0"),
        ("v_proj", "Q8_0"),
        ("o_proj", "F16"),
        ("gate_proj", "Q4_0"),
        ("up_proj", "Q5_0"),
    ):
        if part in hf_name:
            return kind
    return "F32"  # down_proj


def _write_gguf(model_dir: Path, dest: Path, *, tied: bool) -> Path:
    """Write the tiny model as llama.cpp's converter would, tokenizer included."""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = model.config
    writer = gguf.GGUFWriter(dest, "qwen2")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    _add_tokenizer(writer, tokenizer)

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, config.num_hidden_layers)
    state = model.state_dict()
    if not tied:  # a distinct output matrix, as the real Qwen2.5 GGUFs carry
        state["lm_head.weight"] = torch.randn_like(state["lm_head.weight"])
    else:
        del state["lm_head.weight"]
    for hf_name, value in state.items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        kind = gguf.GGMLQuantizationType[_ggml_type(hf_name)]
        data = value.numpy()
        if kind == gguf.GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, data.astype(np.float16))
        elif kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, data)
        else:
            writer.add_tensor(gguf_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _add_tokenizer(writer, tokenizer) -> None:
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    by_id = {index: token for token, index in spec["model"]["vocab"].items()}
    specials = {token["id"]: token["content"] for token in spec["added_tokens"]}
    by_id.update(specials)
    tokens = [by_id[index] for index in range(len(by_id))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    merges = spec["model"]["merges"]
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from serve_app.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_converted_folder_loads_the_weights_transformers_reads_from_the_gguf(
    tiny_dir: Path, tmp_path: Path, tied: bool
) -> None:
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf_path = _write_gguf(tiny_dir, tmp_path / "tiny.gguf", tied=tied)
    kinds = {tensor.tensor_type.name for tensor in gguf.GGUFReader(gguf_path).tensors}
    assert kinds == {"F32", "F16", "Q8_0", "Q5_0", "Q4_0"}  # every dequantization path runs

    out = tmp_path / "converted"
    out.mkdir()
    convert_gguf(gguf_path, out)

    converted = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(
        gguf_path.parent,
        gguf_file=gguf_path.name,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    ours, theirs = converted.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name].dtype == torch.float32
        assert torch.equal(ours[name], value), name
    for (name, buffer), (_, expected) in zip(
        converted.named_buffers(), reference.named_buffers(), strict=True
    ):
        assert torch.equal(buffer, expected), name
    assert converted.config.tie_word_embeddings is tied
    assert (converted.lm_head.weight is converted.model.embed_tokens.weight) is tied

    tokenizer = AutoTokenizer.from_pretrained(out)
    generation = converted.generation_config
    assert generation.eos_token_id == [tokenizer.convert_tokens_to_ids(t) for t in EOS_TOKENS]
    assert generation.pad_token_id == generation.bos_token_id == tokenizer.pad_token_id
    assert all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in FIM_TOKENS)
    assert tokenizer.model_max_length == converted.config.max_position_embeddings


def test_shard_writer_splits_by_size_and_indexes_the_shards(tmp_path: Path) -> None:
    from safetensors import safe_open

    tensors = {f"t{i}": torch.arange(i * 100, i * 100 + 64, dtype=torch.float32) for i in range(5)}
    plan = [PlannedTensor(name, tuple(value.shape), value.dtype) for name, value in tensors.items()]
    with ShardWriter(tmp_path, plan, max_shard_bytes=2 * 64 * 4) as writer:
        for name, value in tensors.items():
            writer.write(name, value)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    assert sorted(set(index["weight_map"].values())) == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)
    ]
    assert index["metadata"]["total_size"] == 5 * 64 * 4
    for name, value in tensors.items():
        with safe_open(tmp_path / index["weight_map"][name], "pt") as shard:
            assert torch.equal(shard.get_tensor(name), value)


def test_shard_writer_refuses_a_tensor_out_of_plan(tmp_path: Path) -> None:
    plan = [PlannedTensor("a", (4,), torch.float32), PlannedTensor("b", (4,), torch.float32)]
    with pytest.raises(ValueError, match="expected tensor"), ShardWriter(tmp_path, plan) as writer:
        writer.write("b", torch.zeros(4))
    with pytest.raises(ValueError, match="never arrived"), ShardWriter(tmp_path, plan) as writer:
        writer.write("a", torch.zeros(4))
