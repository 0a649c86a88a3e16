"""``bench.memory`` measures a real process tree: a child that maps a file it shares with us.

The memory figures in README.md and docs/operations.md come from this script, so its tree
walk and its "alone" correction (shared pages counted once, not once per mapper) are checked
on real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.memory import alone_kb, measure, tree

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc")

MAP_AND_WAIT = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    sum(view[i] for i in range(0, len(view), 4096))  # touch every page
    print("mapped", flush=True)
    time.sleep(60)
"""


@pytest.fixture
def child_mapping(tmp_path: Path):
    """A child process that maps (and touches) a 16 MB file, which this process maps too."""
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(16 << 20))
    child = subprocess.Popen(
        [sys.executable, "-c", MAP_AND_WAIT, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "mapped"
        yield child, data
    finally:
        child.kill()
        child.wait()


def test_tree_holds_the_root_and_its_children(child_mapping) -> None:
    child, _ = child_mapping
    pids = tree(os.getpid())
    assert pids[0] == os.getpid()
    assert child.pid in pids
    assert os.getppid() not in pids


def test_a_file_both_processes_map_counts_once_alone(child_mapping) -> None:
    import mmap

    child, data = child_mapping
    with data.open("rb") as f:
        view = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        sum(view[i] for i in range(0, len(view), 4096))
        time.sleep(0.1)
        ours, theirs = measure(os.getpid()), measure(child.pid)
        shared = [m.shared_kb.get(str(data), 0) for m in (ours, theirs)]
        view.close()
    assert min(shared) >= 15 << 10  # ~16 MB resident in both, shared
    both = [ours, theirs]
    # alone: each process's private memory, plus the file once (not twice)
    assert alone_kb(both) < sum(p.private_kb for p in both) + sum(
        sum(p.shared_kb.values()) for p in both
    ) - (15 << 10)
    assert theirs.pss_kb > 0 and theirs.rss_kb >= theirs.pss_kb
