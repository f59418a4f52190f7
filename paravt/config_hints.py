""" "Did you mean ...?" for a misspelt override, after Hydra has refused it.

Hydra names a key that is not in the config but suggests appending it with `+`, which for a typo
is the wrong fix (the run then fails later, or silently ignores the value). `with_config_hints`
wraps an entry point: when Hydra exits with code 1, it re-reads the command line's overrides,
composes the config without the plain `key=value` ones and prints, for each key or group option
that does not exist, the closest existing names. It prints nothing for any other failure and
never changes the exit code. Glue over Hydra's compose API; nothing runs when Hydra succeeds.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

# Names other frameworks (verl's rollout correction, Mini-o3's masking) use for a paravt key.
ALIASES = {
    "rl.mismatch.mode": "algorithm.engine_is_correction",
    "rl.mismatch.level": "algorithm.engine_is_level",
    "rl.mismatch.cap": "algorithm.engine_is_cap",
    "rl.mask_truncated": "algorithm.mask_truncated",
    "monitor.min_kappa": "callbacks.tool_alarm.min_kappa",
}
# paravt's own former names (one name per concept): a key under a renamed one is renamed too.
RENAMED = {
    "rollout.default_budget": "rollout.frame_budget",
    "protocol.num_frames": "protocol.frame_budget",
    "callbacks.frame_budget": "callbacks.frame_budget_gating",
    "callbacks.frame_budget.budgets": "callbacks.frame_budget_gating.frame_budgets",
    "cold_start.budgets": "cold_start.frame_budgets",
    "cold_start.report_budgets": "cold_start.report_frame_budgets",
    "prior.budgets": "prior.frame_budgets",
    "data.generate.budgets": "data.generate.frame_budgets",
}


def renamed(key: str) -> str | None:
    """The current name of a renamed `key` (or of a key under a renamed one), else None."""
    for old in sorted(RENAMED, key=len, reverse=True):  # the most specific rename first
        if key == old or key.startswith(old + "."):
            return RENAMED[old] + key[len(old) :]
    return None


def _flat_keys(node, prefix: str = "") -> Iterator[str]:
    from omegaconf import DictConfig

    for key in node.keys() if isinstance(node, DictConfig) else ():
        name = f"{prefix}{key}"
        yield name
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing():
            yield from _flat_keys(child, name + ".")


def _parse(args: Sequence[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        return OverridesParser.create().parse_overrides(plain)
    except Exception:  # a syntax error: Hydra's own message says it
        return []


def typo_hints(config_dir: str | Path, config_name: str, args: Sequence[str]) -> list[str]:
    """One line per override of `args` naming a key or group option that does not exist."""
    from hydra.core.override_parser.types import OverrideType

    overrides = [
        o
        for o in _parse(args)
        if not o.is_hydra_override() and o.type == OverrideType.CHANGE  # not +, ++ or ~
    ]
    root = Path(config_dir).resolve()  # initialize_config_dir needs an absolute path
    groups = [o for o in overrides if (root / o.key_or_group).is_dir()]
    keys = [o for o in overrides if o not in groups]
    # Unknown group options first: the config cannot compose with them.
    return _group_hints(groups, root) or _key_hints(keys, groups, root, config_name)


def _group_hints(groups, root: Path) -> list[str]:
    lines = []
    for o in groups:
        if o.is_sweep_override():
            continue
        options = sorted(p.stem for p in (root / o.key_or_group).glob("*.yaml"))
        values = o.value() if isinstance(o.value(), list) else [o.value()]  # logger=[a,b]
        for value in map(str, values):
            if value not in options:
                near = difflib.get_close_matches(value, options, n=3, cutoff=0.5)
                lines.append(_line(f"{o.key_or_group}={value}", near, options, o.key_or_group))
    return lines


def _key_hints(keys, groups, root: Path, config_name: str) -> list[str]:
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(str(root), version_base="1.3"):
            cfg = compose(config_name, overrides=[o.input_line for o in groups])
    except Exception:  # a problem Hydra already described
        return []
    known = list(_flat_keys(cfg))
    lines = []
    for o in keys:
        if not _exists(cfg, o.key_or_group):
            alias = ALIASES.get(o.key_or_group) or renamed(o.key_or_group)
            near = [alias] if alias else difflib.get_close_matches(o.key_or_group, known, 3, 0.6)
            lines.append(_line(f"key '{o.key_or_group}'", near, None, None))
    return lines


def _exists(cfg, key: str) -> bool:
    """Whether `key` names a node of `cfg`, read without resolving any interpolation."""
    from omegaconf import DictConfig

    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig):
            return True  # an index into a list (or deeper into a value): Hydra's to judge
        try:
            node = node._get_node(part)
        except Exception:  # struct mode raises for an absent key
            return False
        if node is None:
            return False
    return True


def _line(what: str, near: list[str], options: list[str] | None, group: str | None) -> str:
    if group is not None:
        known = ", ".join(options or [])
        guess = f"did you mean {group}={near[0]}? " if near else ""
        return f"hint: no config {what} in conf/{group}/; {guess}available: {known}"
    guess = f"did you mean '{near[0]}'? " if near else ""
    return (
        f"hint: the config has no {what}; {guess}(a new key needs a leading '+'; "
        "`--cfg job` prints every key)"
    )


def with_config_hints(main: Callable[[], object], config_dir: str | Path, config_name: str):
    """Run a @hydra.main `main`; when Hydra exits with 1, print typo hints, then exit 1."""
    try:
        main()
    except SystemExit as exit_:
        if exit_.code == 1:
            for line in typo_hints(config_dir, config_name, sys.argv[1:]):
                print(line, file=sys.stderr)
        raise
