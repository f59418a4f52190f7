"""paravt: PARA-GRPO training of video language models that call video tools in parallel.

The Lightning callbacks are `paravt.callbacks`. Installed, they sit in paravt/callbacks/; in a
source checkout (PYTHONPATH at the repository root) they are the top-level callbacks/ folder,
which pyproject.toml maps to `paravt.callbacks` and `_checkout_callbacks` finds here.
"""

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.1.0"

_CALLBACKS = "paravt.callbacks"


class _CheckoutCallbacks(importlib.abc.MetaPathFinder):
    """Resolves `paravt.callbacks` to a checkout's callbacks/ folder (its submodules follow)."""

    def __init__(self, folder: Path):
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _CALLBACKS:
            return None
        return importlib.util.spec_from_file_location(
            fullname,
            self.folder / "__init__.py",
            submodule_search_locations=[str(self.folder)],
        )


def _checkout_callbacks() -> None:
    here = Path(__file__).resolve().parent
    folder = here.parent / "callbacks"
    installed = (here / "callbacks").is_dir()
    # pyproject.toml beside the folder: a paravt checkout, not some other site-packages entry.
    if installed or not (here.parent / "pyproject.toml").is_file():
        return
    if (folder / "__init__.py").is_file():
        # First: an editable install of another checkout maps `paravt.callbacks` to its own
        # folder, which must not win over the callbacks beside this `paravt`.
        sys.meta_path.insert(0, _CheckoutCallbacks(folder))


_checkout_callbacks()
