"""`assert_built_as_configured`: an object Hydra instantiated is its config's `_target_` and
holds the config's values, so a composition test fails when a key stops reaching the object."""

from __future__ import annotations

from collections.abc import Mapping

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf


def _compare(obj, values: Mapping, where: str) -> int:
    """Compare each key `obj` keeps as an attribute with the config's value (nested sections
    too); return how many were compared."""
    checked = 0
    for key, value in values.items():
        if key.startswith("_") or not hasattr(obj, key) or isinstance(value, list):
            continue
        got = getattr(obj, key)
        if isinstance(value, Mapping):
            if not isinstance(got, Mapping):  # a section built into an object of its own
                checked += _compare(got, value, f"{where}.{key}")
            continue
        assert got == value, f"{where}.{key}: config says {value!r}, the object holds {got!r}"
        checked += 1
    return checked


def assert_built_as_configured(obj, node: DictConfig, where: str = "config") -> None:
    """`obj` is an instance of `node._target_` (when that is a class) and holds the values of
    at least one of the node's keys; every key it keeps equals the config's value."""
    target = get_object(node._target_)
    if isinstance(target, type):
        assert type(obj) is target, f"{where}: built {type(obj)}, the config names {target}"
    checked = _compare(obj, OmegaConf.to_container(node, resolve=True), where)
    assert checked > 0, f"{where}: no key of the config is held by the {type(obj).__name__}"
