from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from paravt.eval.adapters import BENCHMARKS, get_benchmark

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "conf" / "benchmark").glob("*.yaml"))
# The paper's evaluation benchmarks (Video-MME with and without subtitles, LongVideoBench,
# LVBench, MLVU, MMVU, Charades-STA) and the demo's needle split.
PAPER_AND_DEMO = {
    "videomme",
    "videomme_sub",
    "longvideobench",
    "lvbench",
    "mlvu",
    "mmvu",
    "charades",
    "needle",
}


def test_every_benchmark_config_builds_the_benchmark_it_names(tmp_path):
    """`benchmark=X` works for each conf/benchmark file, and nothing is registered that no
    config selects."""
    assert {p.stem for p in CONFIGS} >= PAPER_AND_DEMO
    for path in CONFIGS:
        cfg = OmegaConf.load(path)
        options = dict(cfg.options)
        if "subtitle_root" in options:  # checked to be a folder when built
            options["subtitle_root"] = str(tmp_path)
        bench = get_benchmark(cfg.name, **options)
        assert bench.name == cfg.name == path.stem
        assert bench.forced_answer and callable(bench.load) and callable(bench.report)
    assert set(BENCHMARKS) == {p.stem for p in CONFIGS}


def test_forced_answers():
    assert "letter" in get_benchmark("mlvu").forced_answer
    assert "The event happens in the X.X - Y.Y seconds." in get_benchmark("charades").forced_answer


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError, match=r"unknown benchmark 'vmme'.*videomme, videomme_sub"):
        get_benchmark("vmme")
    with pytest.raises(TypeError, match="benchmark 'lvbench': bad arguments"):
        get_benchmark("lvbench", subtitle_root="x")


def test_missing_annotation_file_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        get_benchmark("videomme").load(str(tmp_path / "nope.parquet"), str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        get_benchmark("charades").load(str(tmp_path / "nope.txt"), str(tmp_path))


def test_negative_limit_rejected(write_json, tmp_path):
    ann = write_json([])
    with pytest.raises(ValueError, match="limit must be >= 0"):
        get_benchmark("mmvu").load(ann, str(tmp_path), limit=-1)


def test_needle_is_known_by_name():
    bench = get_benchmark("needle")
    assert bench.name == "needle" and callable(bench.report)
