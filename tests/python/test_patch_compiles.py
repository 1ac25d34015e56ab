"""tools/patch_compiles.sh, run with a stand-in nvcc: which CUDA files it compiles for each
patch (those the patch touches, and those including a header it touches, through other
headers too), each patch applied alone to HEAD, and its exit status when a patch does not
compile or does not apply. No GPU, no CUDA toolkit: the stand-in fails on a marker."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# nvcc for the script (run in the patched tree): notes each source it is given, fails on one
# that says BROKEN, or that says NEEDS_HELPER where the tree's helpers.cuh has no helper()
STAND_IN = """#!/bin/sh
for arg in "$@"; do case "$arg" in *.cu) src=$arg ;; esac; done
echo "$src" >> "$NVCC_LOG"
if grep -q BROKEN "$src"; then echo "$src(1): error: BROKEN" >&2; exit 1; fi
if grep -q NEEDS_HELPER "$src" && ! grep -q "helper()" csrc/common/helpers.cuh; then
  echo "$src(1): error: identifier helper is undefined" >&2; exit 1
fi
"""

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("git") is None,
                                reason="needs bash and git")

FILES = {
    "csrc/common/helpers.cuh": "// helpers\n",
    "csrc/ops/x/x_kernel.cuh": '#include "common/helpers.cuh"\n',  # includes helpers.cuh
    "csrc/ops/x/x.cu": '#include "ops/x/x_kernel.cuh"\n',  # through x_kernel.cuh
    "csrc/ops/y/y.cu": '#include "common/helpers.cuh"\n',  # directly
    "csrc/ops/z/z.cu": "// includes nothing\n",
}


def commit_tree(repo):
    for path, text in FILES.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    (repo / "tools").mkdir()
    shutil.copy(os.path.join(ROOT, "tools", "patch_compiles.sh"), repo / "tools")
    for args in (["init", "-q"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tree"]):
        subprocess.run(["git", *args], cwd=repo, check=True)


def make_patch(repo, out, edits):
    """`edits` (path -> text) as a patch against HEAD, the tree left as committed."""
    for path, text in edits.items():
        (repo / path).write_text(text)
    out.write_text(subprocess.run(["git", "diff"], cwd=repo, check=True, capture_output=True, text=True).stdout)
    subprocess.run(["git", "checkout", "-q", "--", "."], cwd=repo, check=True)
    return str(out)


@pytest.fixture
def tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    commit_tree(repo)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(STAND_IN)
    (bin_dir / "nvcc").chmod(stat.S_IRWXU)
    log = tmp_path / "nvcc.log"
    env = dict(os.environ, NVCC=str(bin_dir / "nvcc"), NVCC_LOG=str(log))
    return repo, env, log


def run(repo, env, *patches):
    return subprocess.run(["bash", "tools/patch_compiles.sh", *patches], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=120)


def compiled(log):
    return sorted(line.strip() for line in log.read_text().splitlines()) if log.exists() else []


def test_a_header_compiles_every_file_that_includes_it(tree, tmp_path):
    repo, env, log = tree
    patch = make_patch(repo, tmp_path / "h.patch", {"csrc/common/helpers.cuh": "// helpers, changed\n"})
    result = run(repo, env, patch)
    assert result.returncode == 0, result.stdout + result.stderr
    assert compiled(log) == ["csrc/ops/x/x.cu", "csrc/ops/y/y.cu"]
    assert "ok csrc/ops/x/x.cu" in result.stdout and "ok csrc/ops/y/y.cu" in result.stdout


def test_a_failing_file_fails_the_run_and_its_error_is_shown(tree, tmp_path):
    repo, env, log = tree
    good = make_patch(repo, tmp_path / "good.patch", {"csrc/ops/y/y.cu": "// y, changed\n"})
    bad = make_patch(repo, tmp_path / "bad.patch", {"csrc/ops/z/z.cu": "BROKEN\n"})
    result = run(repo, env, good, bad)
    assert result.returncode == 1
    assert compiled(log) == ["csrc/ops/y/y.cu", "csrc/ops/z/z.cu"]
    assert "ok csrc/ops/y/y.cu" in result.stdout
    assert "FAILED csrc/ops/z/z.cu" in result.stdout and "error: BROKEN" in result.stdout


def test_each_patch_is_applied_alone(tree, tmp_path):
    """The second patch uses what the first adds: alone it is broken, as device_ab.sh would
    build it (the fifty-fourth session's slip)."""
    repo, env, log = tree
    first = make_patch(repo, tmp_path / "first.patch", {"csrc/common/helpers.cuh": "// adds helper()\n"})
    second = make_patch(repo, tmp_path / "second.patch", {"csrc/ops/z/z.cu": "// calls NEEDS_HELPER\n"})
    result = run(repo, env, first, second)
    assert result.returncode == 1
    assert "ok csrc/ops/x/x.cu" in result.stdout and "ok csrc/ops/y/y.cu" in result.stdout
    assert "FAILED csrc/ops/z/z.cu" in result.stdout and "helper is undefined" in result.stdout
    # with the helper in the same patch it compiles
    both = make_patch(repo, tmp_path / "both.patch",
                      {"csrc/common/helpers.cuh": "// adds helper()\n", "csrc/ops/z/z.cu": "// calls NEEDS_HELPER\n"})
    assert run(repo, env, both).returncode == 0


def test_a_patch_that_does_not_apply_fails(tree, tmp_path):
    repo, env, log = tree
    patch = tmp_path / "stale.patch"
    patch.write_text("diff --git a/csrc/ops/z/z.cu b/csrc/ops/z/z.cu\n--- a/csrc/ops/z/z.cu\n+++ b/csrc/ops/z/z.cu\n"
                     "@@ -1 +1 @@\n-// not this line\n+// new\n")
    result = run(repo, env, str(patch))
    assert result.returncode == 1
    assert "does not apply to HEAD" in result.stdout
    assert compiled(log) == []


def test_worktrees_are_removed(tree, tmp_path):
    repo, env, log = tree
    patch = make_patch(repo, tmp_path / "y.patch", {"csrc/ops/y/y.cu": "// y, changed\n"})
    assert run(repo, env, patch).returncode == 0
    listed = subprocess.run(["git", "worktree", "list"], cwd=repo, check=True, capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1, listed
