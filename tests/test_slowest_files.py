"""The list of the slowest test files (tests/slowest_files.txt), which `make test` starts first."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import ROOT, SLOWEST_FILES, pytest_collection_modifyitems, slowest_files


def test_every_listed_file_exists_once_slowest_first():
    listed = slowest_files()
    assert listed and len(set(listed)) == len(listed)
    missing = [p for p in listed if not (ROOT / p).is_file()]
    assert not missing, f"{missing} are gone: update {SLOWEST_FILES.name} (pytest --durations)"
    rows = [line.split() for line in SLOWEST_FILES.read_text().splitlines()]
    seconds = [float(row[0]) for row in rows if row and not row[0].startswith("#")]
    assert seconds == sorted(seconds, reverse=True)


def test_the_slowest_files_go_first_each_keeping_its_tests_order():
    slowest, second = slowest_files()[:2]
    ids = ["tests/a.py::x", f"{second}::y", "tests/b.py::z", f"{slowest}::v", f"{second}::w"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        f"{slowest}::v",
        f"{second}::y",
        f"{second}::w",
        "tests/a.py::x",
        "tests/b.py::z",
    ]
