"""Benchmark metrics as `torchmetrics.Metric`s, so that they reduce across ranks the standard way.

`CategoryMean` is accuracy overall and per category (any per-item score in [0, 1]: a letter
match, a needle IoU), in torchmetrics' shape: `update(preds, target=None, categories=...)`
(per-item scores, or predictions compared with `target`), `compute()` -> the overall mean as a
0-dim tensor (so `self.log("val/acc", metric)` works), `per_category()` -> every mean by name.
Its states are sums and counts (`dist_reduce_fx="sum"`), so the mean over all ranks is exact
whatever the shards. Categories are fixed at construction (every rank must build the metric with
the same list: derive it from the whole split, not the shard) and, when declared, every update
must say each item's (an item counts in every category it belongs to: LVBench's question types
are multi-label); a metric built without categories refuses them. An item with weight 0 stays
out of every denominator (the "exclude" unparseable-answer policy).

`GroundingMetric` is temporal grounding: `compute()` -> the mIoU tensor, `per_threshold()` -> mIoU
and R@{0.3, 0.5, 0.7} (the share of items with IoU >= threshold), from sums of IoUs and of hits.

Both are used by `paravt.eval.adapters` reports (hence by `evaluate.py`) and by the
`BenchmarkValidation` callback during training. This module deliberately does not score answers
(see `paravt.eval.scoring`) nor know any benchmark's schema.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from paravt.eval.scoring import RECALL_THRESHOLDS


class CategoryMean(Metric):
    """Mean of per-item scores: compute() -> overall tensor; per_category() -> every mean."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, categories: Sequence[str] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        if len(set(categories)) != len(categories):
            raise ValueError(f"CategoryMean: categories must be distinct, got {list(categories)}")
        self.categories = tuple(categories)
        self._index = {name: i for i, name in enumerate(self.categories)}
        zeros = torch.zeros(len(self.categories), dtype=torch.float64)
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("sums", zeros.clone(), dist_reduce_fx="sum")
        self.add_state("counts", zeros.clone(), dist_reduce_fx="sum")

    def membership(self, labels: Sequence[Sequence[str]]) -> torch.Tensor:
        """[N, C] 0/1 matrix of the items' categories; an unknown category is an error."""
        out = torch.zeros(len(labels), len(self.categories), dtype=torch.float64)
        for row, names in enumerate(labels):
            for name in names:
                if name not in self._index:
                    raise ValueError(
                        f"CategoryMean: category {name!r} was not declared; build the metric "
                        "with the categories of the whole split"
                    )
                out[row, self._index[name]] = 1.0
        return out

    def _check_categories(self, n: int, categories: Sequence[Sequence[str]] | None) -> None:
        if self.categories and categories is None:
            raise ValueError(
                f"CategoryMean was built with categories {list(self.categories)[:4]}...: pass "
                "update(..., categories=[names of item i, ...]) (one list per item)"
            )
        if not self.categories and categories is not None:
            raise ValueError(
                "CategoryMean was built without categories, so it would ignore `categories`; "
                "build it with CategoryMean(categories=[...]) (those of the whole split)"
            )
        if categories is not None and len(categories) != n:
            raise ValueError(f"CategoryMean: {len(categories)} category lists for {n} items")

    def update(
        self,
        preds: torch.Tensor,  # [N] per-item scores in [0, 1], or predictions (with `target`)
        target: torch.Tensor | None = None,  # [N]: the score is 1 where preds == target
        categories: Sequence[Sequence[str]] | None = None,  # N lists of category names
        weights: torch.Tensor | None = None,  # [N] 1 counts the item, 0 leaves it out
    ) -> None:
        scores = torch.as_tensor(preds, device=self.total.device)
        if target is not None:
            target = torch.as_tensor(target, device=scores.device)
            if target.shape != scores.shape:
                raise ValueError(
                    f"CategoryMean: preds {tuple(scores.shape)} and target "
                    f"{tuple(target.shape)} must have the same shape"
                )
            scores = scores == target
        scores = scores.to(torch.float64)
        n = scores.shape[0]
        self._check_categories(n, categories)
        weights = (
            torch.ones(n, dtype=torch.float64, device=scores.device)
            if weights is None
            else torch.as_tensor(weights, dtype=torch.float64, device=scores.device)
        )
        self.total += (scores * weights).sum()
        self.count += weights.sum()
        if self.categories and n:
            member = self.membership(categories).to(scores.device)  # [N, C]
            self.sums += ((scores * weights)[:, None] * member).sum(0)
            self.counts += (weights[:, None] * member).sum(0)

    def compute(self) -> torch.Tensor:
        """The overall mean, a 0-dim float64 tensor (0 with nothing counted)."""
        return torch.where(self.count > 0, self.total / self.count.clamp(min=1), 0.0)

    def per_category(self) -> dict[str, float]:
        """{"overall": m, category: m, ...}, reduced over all ranks like compute()."""
        with self.sync_context(should_sync=self._to_sync, should_unsync=self._should_unsync):
            means = torch.where(self.counts > 0, self.sums / self.counts.clamp(min=1), 0.0)
            overall = (self.total / self.count).item() if self.count > 0 else 0.0
            return {"overall": overall, **dict(zip(self.categories, means.tolist(), strict=True))}

    def counted(self) -> dict[str, float]:
        """Items counted overall and per category (after reduction when called after compute)."""
        per = dict(zip(self.categories, self.counts.tolist(), strict=True))
        return {"overall": self.count.item(), **per}


class GroundingMetric(Metric):
    """mIoU and R@threshold over per-item IoUs: compute() -> mIoU; per_threshold() -> all."""

    full_state_update = False
    higher_is_better = True

    def __init__(self, thresholds: Sequence[float] = RECALL_THRESHOLDS, **kwargs) -> None:
        super().__init__(**kwargs)
        self.thresholds = tuple(float(t) for t in thresholds)
        self.add_state("iou_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        hits = torch.zeros(len(self.thresholds), dtype=torch.float64)
        self.add_state("hits", hits, dist_reduce_fx="sum")

    def update(self, ious: torch.Tensor) -> None:  # ious: [N] in [0, 1]
        ious = torch.as_tensor(ious, dtype=torch.float64, device=self.iou_sum.device)
        self.iou_sum += ious.sum()
        self.count += ious.numel()
        limits = torch.tensor(self.thresholds, dtype=torch.float64, device=ious.device)
        self.hits += (ious[:, None] >= limits[None, :]).to(torch.float64).sum(0)

    def compute(self) -> torch.Tensor:
        """The mIoU, a 0-dim float64 tensor (0 with nothing counted)."""
        return torch.where(self.count > 0, self.iou_sum / self.count.clamp(min=1), 0.0)

    def per_threshold(self) -> dict[str, float]:
        """{"miou": m, "r@0.3": r, ...}, reduced over all ranks like compute()."""
        with self.sync_context(should_sync=self._to_sync, should_unsync=self._should_unsync):
            n = self.count.item()
            recall = (self.hits / n).tolist() if n else [0.0] * len(self.thresholds)
            out = {"miou": self.iou_sum.item() / n if n else 0.0}
            out.update({f"r@{t:g}": r for t, r in zip(self.thresholds, recall, strict=True)})
            return out
