"""A Ray driver in its own process, for tests that reach into the graph's cluster.

The test process cannot simply ``ray.init(address=...)``: the in-process fixtures may already
have started a local Ray there, and a process holds one Ray connection at a time. So fault
tests run this module as a child process and talk to it over stdin/stdout, one JSON line per
command and answer:

    python -m tests.ray_admin GCS_ADDRESS
    <- {"actors": [...]}                 once connected: named actors in namespace "serve"
    -> list                             <- {"actors": [...]}
    -> kill NAME                        <- {"killed": NAME}   ray.kill(..., no_restart=True)
    -> metrics                          <- {"ports": [...]}   each node's Prometheus port

Connecting first and killing on command keeps the kill itself to milliseconds, so requests
started just before it are still in flight when it lands.
"""

from __future__ import annotations

import json
import sys

SERVE_NAMESPACE = "serve"


def main() -> None:
    import ray

    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

    def actors() -> list[str]:
        named = ray.util.list_named_actors(all_namespaces=True)
        return sorted(a["name"] for a in named if a["namespace"] == SERVE_NAMESPACE)

    def answer(payload: dict) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    answer({"actors": actors()})
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "list":
            answer({"actors": actors()})
        elif command == "metrics":
            answer({"ports": [node["MetricsExportPort"] for node in ray.nodes() if node["Alive"]]})
        elif command == "kill":
            ray.kill(ray.get_actor(argument, namespace=SERVE_NAMESPACE), no_restart=True)
            answer({"killed": argument})
        else:
            break


if __name__ == "__main__":
    main()
