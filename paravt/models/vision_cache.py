"""Vision features of each distinct clip computed once, reused by every forward that shows it.

GRPO's G rollouts of a prompt share its overview clip, and their crops often show the same
window; the rollout engine re-encodes every clip at every agent round, and the trainer's
log-prob passes and the update encode them again. `install_feature_cache` puts a cache in front
of the model's `get_video_features` (Qwen2.5-VL and Qwen3-VL alike): each clip of a call is
looked up by its content (a blake2b digest of its pixel tensor and its grid, `clip_key`) and only
the clips not seen yet go through the vision tower, in one call; the per-clip outputs (embeddings,
and Qwen3-VL's deepstack features) are then put back in the caller's order. The tower treats
every clip on its own (attention within a clip), so a clip's features do not depend on which
clips share its call.

When cached features are used:
- the key also holds the tower's weight stamp (every parameter's in-place version counter and
  storage), so features are never reused across a weight update of the tower, whoever updates it
  (an optimiser step, `load_state_dict`, a cold start that trains the tower);
- a tower with trainable parameters under autograd is never cached: its features carry the
  graph of their own forward, which the backward of each micro-batch needs for itself;
- nothing is cached under `torch.inference_mode` (such tensors cannot join a later autograd pass).

Bounded: least recently used clips leave once the cached features pass `max_bytes`. The digest of
a CPU pixel tensor is memoised per tensor object (`Visual` tensors live for the whole step);
`visual_kwargs` registers the source tensors of the batched tensor it builds, so a model on an
accelerator never copies its pixels back to hash them. `FeatureCache.seconds` is the wall time of
the vision tower calls (cached or not), for the `time/vision_*` metrics.

This module deliberately does not decide when a step starts (`GRPOModule` clears the cache after
each step) and does not cache images (paravt feeds videos only).
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

ATTR = "_paravt_feature_cache"


@dataclass
class _Entry:
    pooler: torch.Tensor  # [tokens, hidden] of one clip
    deepstack: tuple[torch.Tensor, ...] | None  # one [tokens, hidden] per deepstack layer
    nbytes: int


class FeatureCache:
    """Per-clip vision outputs by content key, least recently used first out past `max_bytes`."""

    def __init__(self, max_bytes: int, enabled: bool = True):
        if max_bytes < 0:
            raise ValueError(f"vision feature cache: max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.enabled = enabled and max_bytes > 0
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.nbytes = 0
        self.hits = 0  # clips served from the cache (or from a copy earlier in the same call)
        self.misses = 0  # clips that went through the tower
        self.seconds = 0.0  # wall time of the calls through this cache
        self.output_type: type | None = None  # the model's vision output class, once seen

    def __deepcopy__(self, memo) -> FeatureCache:
        return FeatureCache(self.max_bytes, self.enabled)  # a copied model has its own tower

    def get(self, key: tuple) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple, entry: _Entry) -> None:
        if entry.nbytes > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        self.nbytes += entry.nbytes - (old.nbytes if old else 0)
        self._entries[key] = entry
        while self.nbytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self.nbytes -= gone.nbytes

    def clear(self) -> None:
        """Drop every cached clip (the counters stay: `take_stats` reads and resets them)."""
        self._entries.clear()
        self.nbytes = 0

    def take_stats(self) -> tuple[int, int, float]:
        """(hits, misses, seconds) since the last call, then zeroed."""
        out = (self.hits, self.misses, self.seconds)
        self.hits, self.misses, self.seconds = 0, 0, 0.0
        return out

    def __len__(self) -> int:
        return len(self._entries)


# ---- content keys ----------------------------------------------------------------------------
_memo_lock = threading.Lock()
_digests: dict[int, tuple[weakref.ref, tuple]] = {}  # id(CPU tensor) -> (ref, clip keys)
_registered: dict[int, tuple[weakref.ref, tuple]] = {}  # id(batched tensor) -> (ref, sources)


def clip_key(pixels: torch.Tensor, grid: Sequence[int]) -> tuple:
    """A content key of one clip: its grid (t, h, w), dtype, and the blake2b of its bytes."""
    flat = pixels.detach().contiguous().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    digest = hashlib.blake2b(flat.view(torch.uint8).numpy(), digest_size=16).digest()
    return (tuple(int(x) for x in grid), str(pixels.dtype), digest)


def _remember(table: dict, tensor: torch.Tensor, keys: tuple) -> None:
    ident = id(tensor)

    def forget(_ref, ident=ident, table=table):
        with _memo_lock:
            table.pop(ident, None)

    with _memo_lock:
        table[ident] = (weakref.ref(tensor, forget), keys)


def _recall(table: dict, tensor: torch.Tensor) -> tuple | None:
    with _memo_lock:
        found = table.get(id(tensor))
    if found is None or found[0]() is not tensor:
        return None
    return found[1]


def tensor_keys(pixels: torch.Tensor, grids: torch.Tensor) -> tuple:
    """The clip keys of a [patches, dim] tensor holding the clips of `grids` [n, 3] in order;
    memoised per CPU tensor object."""
    known = _recall(_digests, pixels)
    if known is not None:
        return known
    rows = grids.prod(-1).tolist()
    keys, at = [], 0
    for grid, n in zip(grids.tolist(), rows, strict=True):
        keys.append(clip_key(pixels[at : at + n], grid))
        at += n
    keys = tuple(keys)
    if pixels.device.type == "cpu":
        _remember(_digests, pixels, keys)
    return keys


def register_sources(batched: torch.Tensor, sources: Sequence[tuple]) -> None:
    """Tell the cache which (pixels, grids) CPU tensors `batched` concatenates, in order, so a
    lookup hashes those (memoised) instead of `batched` (which may live on an accelerator)."""
    _remember(_registered, batched, tuple(sources))


def batch_keys(pixels: torch.Tensor, grids: torch.Tensor) -> tuple:
    """The clip keys of a model call's pixels: from its registered sources, else its bytes."""
    sources = _recall(_registered, pixels)
    if sources is not None:
        keys = tuple(k for p, g in sources for k in tensor_keys(p, g))
        if len(keys) == grids.shape[0]:
            return keys
    return tensor_keys(pixels, grids)


# ---- the wrapper ------------------------------------------------------------------------------
def weight_stamp(tower: torch.nn.Module) -> tuple[int, int]:
    """Changes whenever any tower weight is written in place or replaced."""
    params = list(tower.parameters())
    return sum(p._version for p in params), hash(tuple(p.data_ptr() for p in params))


def cacheable(tower: torch.nn.Module) -> bool:
    """Whether this call's features may be stored and reused (see the module docstring)."""
    if torch.is_inference_mode_enabled():
        return False
    trains = any(p.requires_grad for p in tower.parameters())
    return not (trains and torch.is_grad_enabled())


def inner_model(model) -> Any:
    """The module that owns `visual` and `get_video_features` (a LoRA wrapper's base too)."""
    seen = model
    for _ in range(4):
        if hasattr(seen, "visual") and hasattr(seen, "get_video_features"):
            return seen
        seen = getattr(seen, "model", None) or getattr(seen, "base_model", None)
        if seen is None:
            break
    raise AttributeError(
        f"{type(model).__name__} has no Qwen-VL `model.visual` / `get_video_features`; the "
        "vision feature cache supports Qwen2.5-VL and Qwen3-VL models (model.vision_cache=false "
        "turns it off)"
    )


def install_feature_cache(model, max_bytes: int, enabled: bool = True) -> FeatureCache:
    """Give `model` a `FeatureCache` in front of its `get_video_features` (once; later calls
    return the installed one). `enabled=False` still times the tower (`FeatureCache.seconds`)
    but caches nothing.

    The model's class is swapped for a subclass that overrides `get_video_features` only (no
    parameter, no state-dict key changes); a `copy.deepcopy` of the model gets an empty cache of
    its own, in front of its own tower."""
    inner = inner_model(model)
    existing = inner.__dict__.get(ATTR)
    if existing is not None:
        return existing
    cache = FeatureCache(max_bytes, enabled)
    inner.__dict__[ATTR] = cache
    inner.__class__ = _cached_class(type(inner))
    return cache


_CLASSES: dict[type, type] = {}


def _cached_class(base: type) -> type:
    """`base` with a caching `get_video_features` (one subclass per model class)."""
    if base not in _CLASSES:
        body = {"get_video_features": _get_video_features, "_paravt_base": base}
        _CLASSES[base] = type(base.__name__, (base,), body)
    return _CLASSES[base]


def _get_video_features(self, pixel_values_videos, video_grid_thw=None, **kwargs):
    cache: FeatureCache = self.__dict__[ATTR]
    original = partial(self._paravt_base.get_video_features, self)
    t0 = time.perf_counter()
    try:
        if not cache.enabled or video_grid_thw is None or not cacheable(self.visual):
            cache.misses += int(video_grid_thw.shape[0]) if video_grid_thw is not None else 0
            return original(pixel_values_videos, video_grid_thw, **kwargs)
        return _cached_call(cache, self, original, pixel_values_videos, video_grid_thw, kwargs)
    finally:
        if pixel_values_videos.device.type == "cuda":  # the tower's time, not its launch's
            torch.cuda.synchronize(pixel_values_videos.device)
        cache.seconds += time.perf_counter() - t0


def feature_cache(model) -> FeatureCache | None:
    """The cache installed on `model`, if any."""
    try:
        return inner_model(model).__dict__.get(ATTR)
    except AttributeError:
        return None


def _cached_call(cache: FeatureCache, inner, original, pixels, grids, kwargs):
    stamp = weight_stamp(inner.visual)
    keys = [(stamp, k) for k in batch_keys(pixels, grids)]
    entries: dict[tuple, _Entry] = {}
    for key in keys:
        found = cache.get(key)
        if found is not None:
            entries[key] = found
    missing = list(dict.fromkeys(k for k in keys if k not in entries))  # distinct, in order
    cache.hits += len(keys) - len(missing)
    cache.misses += len(missing)
    out = None
    if missing:
        rows = _clip_rows(grids)
        where = {k: i for i, k in enumerate(keys)}  # a clip of each missing key
        take = [where[k] for k in missing]
        sub_pixels = torch.cat([pixels[rows[i][0] : rows[i][1]] for i in take])
        out = original(sub_pixels, grids[take], **kwargs)
        for j, key in enumerate(missing):
            entry = _entry(out, j)
            entries[key] = entry
            cache.put(key, entry)
    if out is not None:
        cache.output_type = type(out)
    return _assemble(cache.output_type, [entries[k] for k in keys])


def _clip_rows(grids: torch.Tensor) -> list[tuple[int, int]]:
    rows, at = [], 0
    for n in grids.prod(-1).tolist():
        rows.append((at, at + n))
        at += n
    return rows


def _entry(out, j: int) -> _Entry:
    pooler = out.pooler_output[j]
    deep = getattr(out, "deepstack_features", None)
    stack = tuple(layer[j] for layer in deep) if deep is not None else None
    nbytes = pooler.numel() * pooler.element_size()
    nbytes += sum(t.numel() * t.element_size() for t in stack or ())
    return _Entry(pooler=pooler, deepstack=stack, nbytes=nbytes)


def _assemble(kind: type | None, entries: list[_Entry]):
    """The caller's output: per-clip embeddings (and deepstack features) in the caller's order."""
    if kind is None:  # unreachable in practice: entries exist only after a tower call
        from transformers.modeling_outputs import BaseModelOutputWithPooling as kind
    fields: dict[str, Any] = {"pooler_output": tuple(e.pooler for e in entries)}
    if entries and entries[0].deepstack is not None:
        layers = len(entries[0].deepstack)
        deep = [tuple(e.deepstack[i] for e in entries) for i in range(layers)]
        fields["deepstack_features"] = deep
    return kind(**fields)


def model_caches(*models) -> list[FeatureCache]:
    """The distinct caches installed on `models` (None entries and uncached models skipped; a
    LoRA reference shares its policy's)."""
    out: list[FeatureCache] = []
    for model in models:
        cache = feature_cache(model) if model is not None else None
        if cache is not None and all(cache is not c for c in out):
            out.append(cache)
    return out


def take_stats(*models) -> tuple[int, int, float]:
    """(hits, misses, tower seconds) of `models`' caches since the last call, then zeroed."""
    stats = [c.take_stats() for c in model_caches(*models)]
    return sum(s[0] for s in stats), sum(s[1] for s in stats), sum(s[2] for s in stats)
