"""Memory of a running local graph: proportional set size (PSS) summed over all its processes.

    make run &                                         # or: .venv/bin/serve run configs/local.yaml
    .venv/bin/python -m bench.memory                   # the one `serve run` on this machine
    .venv/bin/python -m bench.memory --pid 12345       # a given root (several graphs running)

PSS, not RSS: the replicas memory-map the same weight files, and RSS would count each shared
page once per replica. PSS splits a shared page among *all* its mappers, processes outside the
graph included (another graph or a benchmark mapping the same model file): so the script also
prints "alone", the graph's private memory plus each shared mapping once (its largest resident
size in any graph process), which is what the graph would take with nothing else running.

The graph is the process tree under ``serve run`` (its driver starts gcs_server, raylet and
the dashboard, and raylet the workers: proxy, controller, replicas), so another Ray cluster on
the same machine is not counted. Linux only (``/proc/<pid>/smaps``).
Warm the graph first (one request to each model endpoint): lazily built caches count.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from bench.common import table

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    name: str
    pss_kb: int
    rss_kb: int
    private_kb: int
    shared_kb: dict[str, int]  # mapping name -> resident pages shared with anyone (kB)


def _parents() -> dict[int, int]:
    """pid -> parent pid for every process still readable."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # the command name is in parentheses and may hold spaces: split after the last ")"
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def find_serve_run() -> int:
    """The pid of the only ``serve run`` process, or a message naming the candidates."""
    pids = [pid for pid in _parents() if _is_serve_run(_cmdline(pid))]
    if len(pids) != 1:
        raise SystemExit(f"expected one `serve run` process, found {pids or 'none'}: use --pid")
    return pids[0]


def _is_serve_run(command: str) -> bool:
    """``serve run ...`` however ``serve`` was named (``.venv/bin/serve``, a full path), or
    ``python -m serve_app.launch ...`` (``make run``'s)."""
    words = command.split()
    return any(
        (Path(word).name == "serve" and following == "run")
        or (word == "-m" and following == "serve_app.launch")
        for word, following in zip(words, words[1:], strict=False)
    )


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def measure(pid: int) -> ProcessMemory | None:
    """One process's memory from ``smaps``; None when it is gone or a kernel thread."""
    try:
        smaps = (PROC / str(pid) / "smaps").read_text()
    except OSError:
        return None
    totals = {"Pss": 0, "Rss": 0, "Private_Clean": 0, "Private_Dirty": 0}
    shared: dict[str, int] = {}
    name, rss, private = "", 0, 0
    for line in smaps.splitlines():
        key, _, rest = line.partition(":")
        if " " in key or "-" in key:  # a mapping header: "start-end perms offset dev inode name"
            shared[name] = shared.get(name, 0) + rss - private
            fields = line.split(maxsplit=5)
            name, rss, private = (fields[5] if len(fields) > 5 else "[anon]"), 0, 0
        elif key in totals:
            value = int(rest.split()[0])
            totals[key] += value
            rss += value if key == "Rss" else 0
            private += value if key.startswith("Private") else 0
    shared[name] = shared.get(name, 0) + rss - private
    return ProcessMemory(
        pid,
        _cmdline(pid)[:70],
        totals["Pss"],
        totals["Rss"],
        totals["Private_Clean"] + totals["Private_Dirty"],
        shared,
    )


def alone_kb(processes: list[ProcessMemory]) -> int:
    """Private memory plus every shared mapping once: the graph's footprint by itself."""
    largest: dict[str, int] = {}
    for process in processes:
        for name, kb in process.shared_kb.items():
            largest[name] = max(largest.get(name, 0), kb)
    return sum(p.private_kb for p in processes) + sum(largest.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pid", type=int, help="the graph's root (default: the `serve run`)")
    parser.add_argument("--top", type=int, default=12, help="processes listed, largest first")
    args = parser.parse_args()
    root = args.pid or find_serve_run()
    processes = [m for m in map(measure, tree(root)) if m is not None and m.rss_kb]
    processes.sort(key=lambda m: m.pss_kb, reverse=True)
    rows = [["pid", "PSS MB", "RSS MB", "process"]]
    rows += [
        [str(m.pid), f"{m.pss_kb / 1024:.0f}", f"{m.rss_kb / 1024:.0f}", m.name]
        for m in processes[: args.top]
    ]
    total_pss = sum(m.pss_kb for m in processes) / 1024
    total_rss = sum(m.rss_kb for m in processes) / 1024
    rows.append(["", f"{total_pss:.0f}", f"{total_rss:.0f}", f"total, {len(processes)} processes"])
    print(table(rows))
    print(f"graph PSS: {total_pss / 1024:.2f} GB over {len(processes)} processes (root {root})")
    print(f"graph alone (private + shared mappings once): {alone_kb(processes) / 1024**2:.2f} GB")


if __name__ == "__main__":
    main()
