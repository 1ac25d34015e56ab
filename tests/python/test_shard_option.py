"""conftest.py's --shard K/N: N interleaved shares that together run every test once, for
a GPU suite longer than one device call (tools/device_check.sh's TESTS_SHARD)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# a small file of this suite, so that each child's collection takes seconds
TARGET = "test_ab_summary.py"

pytestmark = pytest.mark.child_process


def collect(*extra):
    """The test ids pytest collects from TARGET with `extra` options, and its exit code."""
    # run from this folder, not the repository root: the source tree must not shadow the
    # installed package (tools/run_tests.sh)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", TARGET, *extra],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    return ids, done.returncode, done.stdout + done.stderr


def test_shards_partition_the_collection_in_order():
    whole, rc, out = collect()
    assert rc == 0, out
    assert len(whole) >= 3, f"{TARGET} has too few tests to split: {whole}"
    first, rc1, out1 = collect("--shard", "1/2")
    second, rc2, out2 = collect("--shard", "2/2")
    assert rc1 == 0 and rc2 == 0, out1 + out2
    assert first == whole[0::2]
    assert second == whole[1::2]


@pytest.mark.parametrize("value", ["3/2", "0/2", "1", "a/b"])
def test_bad_shard_names_the_option(value):
    ids, rc, out = collect("--shard", value)
    assert rc != 0
    assert "--shard" in out and repr(value) in out
    assert ids == []
