"""Where a training run writes: a folder of its own, never another run's.

`train.py`'s run folder is `runs/NAME` (conf/train.yaml `hydra.run.dir`, through the resolver
registered here). A second run of the same name must not overwrite the first one's export, curves
and checkpoints, so a taken folder gives the new run the next free `runs/NAME-2`, `runs/NAME-3`...
With `ckpt_path=last` the run continues in the newest folder of that name (the highest number),
the one a killed run left; `name=NAME-2 ckpt_path=last` picks an older one by its folder name.

Pure file-system rules, no Hydra import; `register()` installs the OmegaConf resolver. The choice
is made once per process (Hydra may resolve the run folder more than once), and Lightning's
child processes receive the parent's folder as `hydra.run.dir`, so every rank writes to one.
"""

from __future__ import annotations

import re
from pathlib import Path

RESOLVER = "paravt_run_dir"
_chosen: dict[tuple[str, str, str], str] = {}


RESULTS = ("checkpoints", "hf", "tb", "curves")  # what a run that got going leaves


def _taken(folder: Path) -> bool:
    """Holds another run's results (a run stopped by a pre-flight error is free to reuse)."""
    return any((folder / part).exists() for part in RESULTS)


def run_folders(root: str | Path, name: str) -> list[Path]:
    """The existing folders of runs named `name`, oldest first: NAME, NAME-2, NAME-3, ..."""
    root = Path(root)
    pattern = re.compile(rf"{re.escape(name)}-(\d+)")
    numbered = []
    if root.is_dir():
        for child in root.iterdir():
            match = pattern.fullmatch(child.name)
            if match and child.is_dir() and int(match.group(1)) >= 2:
                numbered.append((int(match.group(1)), child))
    first = [root / name] if (root / name).is_dir() else []
    return first + [path for _, path in sorted(numbered)]


def choose_run_dir(root: str | Path, name: str, ckpt_path: str | None) -> Path:
    """The folder of a run: the newest of its name when resuming (`ckpt_path=last`), else the
    first of NAME, NAME-2, NAME-3, ... that holds no run's results."""
    existing = run_folders(root, name)
    with_results = [f for f in existing if _taken(f)]
    if str(ckpt_path) == "last" and with_results:
        return with_results[-1]
    root = Path(root)
    if not _taken(root / name):
        return root / name
    for folder in existing[1:]:  # a numbered folder left by a pre-flight error is reused
        if not _taken(folder):
            return folder
    numbers = [int(p.name.rsplit("-", 1)[1]) for p in existing[1:]]
    return root / f"{name}-{max(numbers, default=1) + 1}"


def resolve(name: str, ckpt_path: str | None = None, root: str = "runs") -> str:
    """The OmegaConf resolver: `${paravt_run_dir:${name},${ckpt_path}}`, fixed per process."""
    key = (root, str(name), str(ckpt_path))
    if key not in _chosen:
        _chosen[key] = str(choose_run_dir(root, str(name), ckpt_path))
    return _chosen[key]


def shown(path: str | Path) -> str:
    """`path` relative to the working folder when it lies inside it (what summaries print)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def register() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, resolve)
