"""Texts and images to every experiment tracker of a run that can hold them.

`TrackerWriter(loggers)` has TensorBoard's `add_text(tag, text, global_step)` and
`add_image(tag, image, global_step, dataformats="HWC")` and fans each call out to
- TensorBoard (or any logger whose `experiment` has `add_text` / `add_image`): as is;
- Weights & Biases: a one-column table `text` and a `wandb.Image`, at the trainer's step;
- MLflow: artifacts `TAG/step_STEP` of the run, as markdown text and a PNG image.
CSV (scalars only) and unknown loggers are skipped; `writer.sinks` names the ones used. It
deliberately logs no scalars (Lightning's `log_dict` reaches every logger already).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

TextFn = Callable[[str, str, int], None]
ImageFn = Callable[[str, np.ndarray, int], None]


def _tensorboard(logger: Any) -> tuple[TextFn, ImageFn] | None:
    exp = logger.experiment
    if not (callable(getattr(exp, "add_text", None)) and callable(getattr(exp, "add_image", None))):
        return None

    def text(tag: str, body: str, step: int) -> None:
        exp.add_text(tag, body, global_step=step)

    def image(tag: str, img: np.ndarray, step: int) -> None:
        exp.add_image(tag, img, global_step=step, dataformats="HWC")

    return text, image


def _wandb(logger: Any) -> tuple[TextFn, ImageFn]:
    def text(tag: str, body: str, step: int) -> None:
        logger.log_text(key=tag, columns=["text"], data=[[body]], step=step)

    def image(tag: str, img: np.ndarray, step: int) -> None:
        logger.log_image(key=tag, images=[img], step=step)

    return text, image


def _mlflow(logger: Any) -> tuple[TextFn, ImageFn]:
    def text(tag: str, body: str, step: int) -> None:
        logger.experiment.log_text(logger.run_id, body, f"{tag}/step_{step}.md")

    def image(tag: str, img: np.ndarray, step: int) -> None:
        logger.experiment.log_image(logger.run_id, img, artifact_file=f"{tag}/step_{step}.png")

    return text, image


def _sink(logger: Any) -> tuple[str, TextFn, ImageFn] | None:
    kind = type(logger).__name__
    if isinstance(logger, WandbLogger):
        return (kind, *_wandb(logger))
    if isinstance(logger, MLFlowLogger):
        return (kind, *_mlflow(logger))
    board = _tensorboard(logger)
    return None if board is None else (kind, *board)


class TrackerWriter:
    """TensorBoard's text/image calls, sent to every logger that can hold them."""

    def __init__(self, loggers: Sequence[Any]) -> None:
        found = [_sink(logger) for logger in loggers]
        self._sinks = [s for s in found if s is not None]
        self.sinks = tuple(name for name, _, _ in self._sinks)

    def __bool__(self) -> bool:
        return bool(self._sinks)

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        for _, write, _ in self._sinks:
            write(tag, text, global_step)

    def add_image(
        self, tag: str, image: np.ndarray, global_step: int, dataformats: str = "HWC"
    ) -> None:
        if dataformats != "HWC":
            raise ValueError(f"TrackerWriter takes [H, W, 3] images (HWC), got {dataformats}")
        for _, _, write in self._sinks:
            write(tag, image, global_step)
