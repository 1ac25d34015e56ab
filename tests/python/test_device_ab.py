"""tools/device_ab.sh, run on the CPU with a stand-in python3: the variants it builds and
runs, in order, each patch applied while its CHECK runs and reverted after, CHECK_LAST.
The script spends device time only when it works; here its control flow is checked
without a GPU or a build (the stand-in's "pip install" does nothing)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# python3 for the script: its builds succeed at once, its other commands echo themselves
STAND_IN = """#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then exit 0; fi
echo "ran $*"
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None,
                                reason="needs bash and git")


@pytest.fixture
def tree(tmp_path):
    """A tree with the script and a one-line notes.txt, two patches (each includes the one
    before it: a line, then a second), and the stand-in python3 on PATH."""
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "tools", "device_ab.sh"), repo / "tools")
    notes = repo / "notes.txt"
    notes.write_text("base\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    patches = []
    for i, lines in enumerate(["base\none\n", "base\none\ntwo\n"], 1):
        notes.write_text(lines)
        patch = tmp_path / f"p{i}.patch"
        patch.write_text(subprocess.run(["git", "diff"], cwd=repo, check=True, capture_output=True,
                                        text=True).stdout)
        patches.append(str(patch))
    notes.write_text("base\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STAND_IN)
    (bin_dir / "python3").chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", ROUNDS="2", AB_DIR=str(tmp_path / "ab"))
    return repo, patches, env


def device_ab(repo, patches, env, **extra):
    env = dict(env, CHECK="echo checked $(tail -1 notes.txt)", **extra)
    return subprocess.run(["bash", "tools/device_ab.sh", *patches, "--", "python3", "bench.py"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=60)


def run_ab(repo, patches, env, **extra):
    out = device_ab(repo, patches, env, **extra)
    assert out.returncode == 0, out.stderr
    assert (repo / "notes.txt").read_text() == "base\n"  # every patch reverted
    return out.stdout.splitlines()


def test_variants_checks_and_rounds(tree):
    repo, patches, env = tree
    lines = run_ab(repo, patches, env)
    # each patch's CHECK sees its own tree; the benchmark runs under every variant a round
    assert [line for line in lines if "checked" in line] == ["[p1.patch] checked one", "[p2.patch] checked two"]
    runs = [line for line in lines if "ran bench.py" in line]
    assert runs == ["[base] ran bench.py", "[p1.patch] ran bench.py", "[p2.patch] ran bench.py"] * 2
    assert lines.count("== round 2") == 1


def test_check_last_only(tree):
    repo, patches, env = tree
    lines = run_ab(repo, patches, env, CHECK_LAST="1")
    assert [line for line in lines if "checked" in line] == ["[p2.patch] checked two"]


def test_a_patch_that_does_not_apply_stops_it_first(tree):
    repo, patches, env = tree
    (repo / "notes.txt").write_text("changed\n")
    out = device_ab(repo, patches, env)
    assert out.returncode == 2 and "does not apply" in out.stderr
    assert "built" not in out.stdout
