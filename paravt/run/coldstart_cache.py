"""One cold start per sweep: the jobs of a Hydra multirun that share it reuse the first one's.

A sweep such as `-m reward.format_weight=0.5,1.0` varies nothing the cold start reads, yet every
job used to repeat it (teacher tracing, 250 SFT steps, the per-budget report). The cold start is
a function of its own config, the model, the agent/crop settings, the data files and the seed, so
the first job saves its result (policy weights, report, RNG states) under the sweep folder keyed
by a hash of exactly those, and a later job with the same key loads it instead of recomputing:
the job then continues exactly as if it had run the cold start itself (the RNG states are
restored too). Single runs are not cached. Nothing here decides what the cold start does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from paravt.run.coldstart import ColdStartResult

log = logging.getLogger(__name__)


def _file_id(path: Any) -> Any:
    p = Path(str(path)) if path else None
    if p is None or not p.is_file():
        return str(path)
    stat = p.stat()
    return [str(p.resolve()), stat.st_size, stat.st_mtime_ns]


def cache_key(cfg) -> str:
    """sha256 of everything the cold start reads (resolved config values and data file ids)."""
    from omegaconf import OmegaConf

    def plain(key: str) -> Any:
        node = OmegaConf.select(cfg, key)
        return OmegaConf.to_container(node, resolve=True) if hasattr(node, "keys") else node

    parts = {
        "cold_start": plain("cold_start"),
        "model": plain("model"),
        "agent": plain("rollout.agent"),
        "crop": plain("rollout.crop"),
        "frame_budget": plain("rollout.frame_budget"),
        "engine": plain("rollout.engine"),
        "data": {k: v for k, v in plain("data").items() if k != "max_steps"},  # RL's length
        "files": [_file_id(plain("data.train_path")), _file_id(plain("data.eval_path"))],
        "seed": plain("seed"),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def sweep_cache_dir(cfg) -> Path | None:
    """`<sweep folder>/.cold_start_cache` for a multirun job, None for a single run."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        if HydraConfig.get().mode != RunMode.MULTIRUN:
            return None
    except ValueError:  # not under @hydra.main (a test composing the config)
        return None
    return Path(str(cfg.run_dir)).resolve().parent / ".cold_start_cache"


def cached_cold_start(cfg, module, run: Callable[[], ColdStartResult]) -> ColdStartResult:
    """`run()` (the cold start), or its saved result when this sweep already computed it."""
    from paravt.models.runtime import rng_state, set_rng_state
    from paravt.modules.checkpoint import atomic_torch_save

    folder = sweep_cache_dir(cfg)
    if folder is None:
        return run()
    import torch

    path = folder / f"{cache_key(cfg)[:16]}.pt"
    if path.is_file():
        started = time.perf_counter()
        saved = torch.load(path, map_location="cpu", weights_only=False)
        module.policy.load_state_dict(saved["policy"])
        module.reset_reference()
        set_rng_state(saved["rng"])
        result: ColdStartResult = saved["result"]
        note = (
            f"cold start: loaded from an earlier job of this sweep with the same cold start "
            f"({path.name}; it took {result.seconds:.0f} s there)"
        )
        log.info("cold start: the same as an earlier job of this sweep, loaded from %s", path)
        return replace(
            result,
            notes=(*result.notes, note),
            seconds=time.perf_counter() - started,
            cached=True,
        )
    result = run()
    state = {k: v.detach().cpu() for k, v in module.policy.state_dict().items()}
    atomic_torch_save({"policy": state, "result": result, "rng": rng_state()}, path)
    log.info("cold start saved for the sweep's other jobs with the same cold start: %s", path)
    return result
