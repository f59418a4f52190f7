"""Fixtures for the benchmark tests: tiny annotation files in each official layout."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest


@pytest.fixture
def write_parquet(tmp_path):
    def write(rows, name="annotations.parquet"):
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows), path)
        return str(path)

    return write


@pytest.fixture
def write_json(tmp_path):
    def write(rows, name="annotations.json"):
        path = tmp_path / name
        path.write_text(json.dumps(rows), encoding="utf-8")
        return str(path)

    return write


@pytest.fixture
def touch(tmp_path):
    """Create a dummy (empty) video file under tmp_path; adapters only check existence."""

    def make(relative):
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x00")
        return str(path)

    return make
