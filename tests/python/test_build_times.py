"""tools/build_times.py: compile steps' seconds from a Ninja log, and their wall time on N cores."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "build_times.py")
spec = importlib.util.spec_from_file_location("build_times", TOOL)
build_times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_times)

# a clean build, then a rebuild of one file (Ninja appends its line): start, end (ms), mtime,
# output, hash
LOG = """# ninja log v7
0\t64000\t1\tCMakeFiles/core.dir/csrc/ops/norm/norm_fwd.cu.o\taa
0\t3000\t1\tCMakeFiles/core.dir/csrc/common/error.cpp.o\tbb
3000\t13000\t1\tCMakeFiles/core.dir/csrc/ops/softmax/softmax.cu.o\tcc
13000\t22000\t1\tCMakeFiles/core.dir/csrc/ops/rope/rope.cu.o\tdd
64000\t66000\t1\tlibopente_core.a\tee
0\t2500\t2\tCMakeFiles/core.dir/csrc/common/error.cpp.o\tff
"""


def test_the_last_run_of_each_step_counts():
    seconds = build_times.step_seconds(LOG)
    assert seconds["CMakeFiles/core.dir/csrc/common/error.cpp.o"] == 2.5
    assert seconds["CMakeFiles/core.dir/csrc/ops/norm/norm_fwd.cu.o"] == 64.0
    assert seconds["libopente_core.a"] == 2.0


def test_only_object_files_are_compile_steps():
    steps = build_times.compile_steps(build_times.step_seconds(LOG))
    assert sorted(os.path.basename(o) for o in steps) == ["error.cpp.o", "norm_fwd.cu.o", "rope.cu.o", "softmax.cu.o"]


def test_wall_time_longest_first_to_the_core_free_soonest():
    # one long step bounds any number of cores
    assert build_times.wall_time([64.0, 10.0, 10.0, 2.5], 2) == 64.0
    assert build_times.wall_time([64.0, 10.0, 10.0, 2.5], 16) == 64.0
    # 3 | 3, then 2 -> 5 | 3, 2 -> 5 | 5, 2 -> 7 | 5
    assert build_times.wall_time([2.0, 3.0, 2.0, 3.0, 2.0], 2) == 7.0
    assert build_times.wall_time([2.0, 3.0, 2.0, 3.0, 2.0], 1) == 12.0
    assert build_times.wall_time([], 4) == 0.0


def test_report_lists_the_longest_and_each_core_count():
    lines = build_times.report(build_times.step_seconds(LOG), [1, 2], longest=2)
    assert lines[0] == "4 compile steps, 85.5 s of compiler time; the longest:"
    assert lines[1].split() == ["64.0", "s", "norm_fwd.cu.o"]
    assert lines[2].split() == ["10.0", "s", "softmax.cu.o"]
    assert lines[3] == "on 1 cores: 85.5 s (the longest step alone 64.0 s)"
    assert lines[4] == "on 2 cores: 64.0 s (the longest step alone 64.0 s)"


def test_command_line(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text(LOG)
    out = subprocess.run([sys.executable, TOOL, str(log), "--cores", "16", "--longest", "1"], check=True,
                         capture_output=True, text=True).stdout
    assert out.splitlines() == ["4 compile steps, 85.5 s of compiler time; the longest:", "    64.0 s  norm_fwd.cu.o",
                                "on 16 cores: 64.0 s (the longest step alone 64.0 s)"]
