from __future__ import annotations

import pytest

from paravt.eval.adapters import BENCHMARKS, get_benchmark

NAMES = [
    "videomme",
    "videomme_sub",
    "longvideobench",
    "lvbench",
    "mlvu",
    "mmvu",
    "mmvu_oe",
    "charades",
    "needle",
]


def test_registry_names_and_protocol(tmp_path):
    assert list(BENCHMARKS) == NAMES
    for name in NAMES:
        kwargs = {"subtitle_root": str(tmp_path)} if name == "videomme_sub" else {}
        bench = get_benchmark(name, **kwargs)
        assert bench.name == name
        assert bench.forced_answer and callable(bench.load) and callable(bench.report)


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
