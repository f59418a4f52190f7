"""Mistakes a user can make at the front door, and the rules that decide what may be created.

`UserError` is the one exception type the entry points turn into a single line and exit code 2
(a deep traceback is for bugs, not for a mistyped path). The path rules are pure functions of
plain values, shared by the pre-flight check in train.py, the data module and the policy loader,
so "generate only where asked" is decided in exactly one place. This module imports nothing
heavy and never touches the filesystem beyond `exists` checks.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class UserError(Exception):
    """A problem the user can fix; the message names the problem and the fix in one line."""


class InputPathError(UserError, FileNotFoundError):
    """A user-given data or model path that does not exist and will not be created."""


class VideoError(ValueError):
    """A video that cannot be used: the message names the file and what is wrong with it.

    Defined here (not in `paravt.video.reader`) so code that only handles it, such as the agent
    loop skipping a prompt whose video fails mid-step, needs no decoder import.
    """


def check_number(
    name: str,
    value: object,
    *,
    least: float | None = None,
    above: float | None = None,
    integer: bool = False,
    optional: bool = False,
) -> None:
    """Refuse a config number no run can use (`ValueError` naming the key and the value): not a
    number (a bool is none), not finite, not an integer where one is needed, below `least` or
    not above `above`; None passes where `optional`."""
    if value is None and optional:
        return
    kinds = (int,) if integer else (int, float)
    ok = isinstance(value, kinds) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (least is None or value >= least) and (above is None or value > above)
    if not ok:
        what = "an integer" if integer else "a finite number"
        bound = f" >= {least}" if least is not None else f" > {above}" if above is not None else ""
        raise ValueError(
            f"{name} must be {what}{bound}{' or null' if optional else ''}, got {value!r}"
        )


def check_stage_numbers(group: str, cfg: Any) -> None:
    """The numbers a supervised stage (the cold start, the prior) trains with, checked when its
    config is read."""
    check_number(f"{group}.lr", cfg.lr, above=0)
    check_number(f"{group}.min_lr_ratio", cfg.min_lr_ratio, least=0)
    check_number(f"{group}.batch_size", cfg.batch_size, least=1, integer=True)
    for name in ("steps", "oracle_steps", "warmup_steps"):
        check_number(f"{group}.{name}", getattr(cfg, name), least=0, integer=True)


def check_optimizer(make: Any) -> None:
    """Build the optimizer (`cfg.optimizer`, a `_partial_` factory) over one throw-away
    parameter, so that a value it refuses (a negative lr, betas out of range) is a `UserError`
    now, not after the data, the model and the cold start are built."""
    if not callable(make):
        raise UserError(f"optimizer must be a `_partial_: true` factory, got {make!r}")
    import torch

    try:
        make([torch.nn.Parameter(torch.zeros(1))])
    except (ValueError, TypeError) as err:
        raise UserError(f"optimizer: {err} (the optimizer.* keys, conf/optimizer/)") from err


def _same_place(a: str | Path, b: str | Path) -> bool:
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def generation_dir(train_path: str, generate_out_dir: str | None) -> Path:
    """Where synthetic needle data for `train_path` is written (its folder, unless named)."""
    return Path(generate_out_dir) if generate_out_dir else Path(train_path).parent


def may_generate_data(train_path: str, generate_out_dir: str | None) -> bool:
    """Generation is allowed only into its own folder: train_path must lie directly in it.

    The default config names both (artifacts/needle); a user who points train_path anywhere else
    gets an error instead of 80 videos written next to a mistyped path.
    """
    if generate_out_dir is None:
        return True  # the caller passed `generate` explicitly without a folder: its own choice
    return _same_place(Path(train_path).parent, generate_out_dir)


# `ckpt_path` values Lightning resolves itself (checkpoints it finds in the run's folders).
CKPT_KEYWORDS = ("last", "best", "hpc", "registry")


def check_ckpt_path(ckpt_path: str | None) -> None:
    """Raise `InputPathError` for a resume checkpoint that does not exist (a file, or a sharded
    checkpoint's folder), before anything is built; Lightning's own keywords pass."""
    if not ckpt_path or str(ckpt_path) in CKPT_KEYWORDS or Path(ckpt_path).expanduser().exists():
        return
    raise InputPathError(
        f"ckpt_path {ckpt_path!r} does not exist; ckpt_path=last resumes the newest checkpoint "
        "of runs/NAME (runs/NAME/checkpoints/), or name a .ckpt file or sharded folder"
    )


def check_data_path(train_path: str, generate: bool, generate_out_dir: str | None) -> None:
    """Raise `InputPathError` unless train_path exists or will be generated where asked."""
    if Path(train_path).expanduser().exists():
        return
    if generate and may_generate_data(train_path, generate_out_dir):
        return
    hint = (
        f"synthetic needle data is generated only into data.generate.out_dir={generate_out_dir}; "
        "set data.generate.out_dir to this file's folder to generate it there"
        if generate
        else "or set data.generate to make synthetic needle data"
    )
    raise InputPathError(
        f"data.train_path {train_path!r} does not exist; point it at a parquet/jsonl file in the "
        f"ParaVT or verl layout ({hint})"
    )


def may_build_tiny(path: str, build_tiny: str | None, tiny_dir: str | None) -> bool:
    """A tiny model is built only when asked, and only at its own folder (tiny_dir, if named)."""
    if build_tiny is None:
        return False
    return tiny_dir is None or _same_place(path, tiny_dir)


def check_model_path(path: str, build_tiny: str | None, tiny_dir: str | None) -> None:
    """Raise `InputPathError` unless `path` holds an HF checkpoint or a tiny one is built there."""
    if (Path(path).expanduser() / "config.json").exists():
        return
    if may_build_tiny(path, build_tiny, tiny_dir):
        return
    if build_tiny is not None:
        fix = (
            f"the tiny {build_tiny} model is built only at model.tiny_dir={tiny_dir}; "
            "set model.tiny_dir to this path to build one here"
        )
    else:
        fix = "download the checkpoint there, or use model=tiny_qwen3 for a tiny local model"
    raise InputPathError(
        f"model.path {path!r} is not a local HF checkpoint (no config.json); {fix}"
    )


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """Turn a user's mistake into one line on stderr and exit code 2 (HYDRA_FULL_ERROR=1: the
    traceback first, the same line and exit code after it).

    Catches `UserError` and Hydra's instantiation errors (a misspelt key under a `_target_`);
    anything else is a bug and keeps its traceback.
    """
    try:
        yield
    except Exception as error:
        message = user_message(error)
        if message is None:
            raise
        if os.environ.get("HYDRA_FULL_ERROR") == "1":  # the traceback, and still exit code 2
            import traceback

            traceback.print_exc()
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def user_message(error: BaseException, script: str = "train.py") -> str | None:
    """The one-line message for a user's mistake, or None for an error that is a bug (`script`:
    the entry point its hint names)."""
    if isinstance(error, UserError):
        return str(error)
    cause = error.__cause__
    if type(error).__name__ == "InstantiationException":
        if isinstance(cause, UserError):
            return str(cause)
        first = str(error).splitlines()[0].rstrip(":")
        detail = f"{type(cause).__name__}: {cause}" if cause is not None else ""
        return (
            f"config error: {first} {detail};{_did_you_mean(first, cause)} check the key names "
            f"against the conf/ file of that group (`python {script} --cfg job` prints the "
            "composed config)"
        )
    return None


def _did_you_mean(first_line: str, cause: BaseException | None) -> str:
    """` did you mean 'path'?` for an unexpected keyword of a `_target_`, else ""."""
    import difflib
    import inspect
    import re

    target = re.search(r"target '([\w.]+)'", first_line)
    key = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
    if target is None or key is None:
        return ""
    try:
        from hydra.utils import get_object

        names = list(inspect.signature(get_object(target.group(1))).parameters)
    except Exception:  # not importable or no signature: no suggestion
        return ""
    near = difflib.get_close_matches(key.group(1), names, n=1, cutoff=0.6)
    return f" did you mean '{near[0]}'?" if near else ""


def check_callback_target(name: str, target: str) -> None:
    """Refuse the callbacks' old global package name (`callbacks.X`), naming the new one."""
    if target.startswith("callbacks."):
        raise UserError(
            f"callbacks.{name}._target_={target}: paravt's callbacks are the package "
            f"`paravt.callbacks` (a global `callbacks` package is no longer installed); "
            f"fix: callbacks.{name}._target_=paravt.{target}"
        )
