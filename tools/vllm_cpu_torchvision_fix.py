"""Lets PyPI's CUDA-linked torchvision import in the CPU vLLM environment (docs/engines.md).

torchvision 0.28's compiled ops link libtorch_cuda and do not load on a CPU torch; its
Python side then registers fake kernels for ``torchvision::nms`` / ``torchvision::qnms`` and
fails with ``operator torchvision::nms does not exist``. Defining the two schemas before
torchvision is first imported lets the pure-Python parts (``transforms.v2``, used by the video
processors) work; ``torchvision.ops`` stays unavailable. ``make venv-vllm`` copies this file
into ``.venv-vllm``'s site-packages and loads it from a ``.pth`` file; it installs an import
hook, so Python start-up does not import torch.
"""

from __future__ import annotations

import importlib.abc
import sys

_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBS: list = []  # keeps the Library objects (and so the definitions) alive


def define_schemas() -> None:
    import torch

    lib = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _SCHEMAS:
        name = schema.split("(", 1)[0]
        try:
            torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
            continue  # the compiled ops loaded after all
        except RuntimeError:
            pass
        lib.define(schema)
    _LIBS.append(lib)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        define_schemas()
        return None  # the normal finders import torchvision itself


def install() -> None:
    if "torchvision" not in sys.modules and not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
