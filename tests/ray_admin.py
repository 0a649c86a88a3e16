"""A Ray driver in its own process, for tests that reach into the graph's cluster.

The test process cannot simply ``ray.init(address=...)``: the in-process fixtures may already
have started a local Ray there, and a process holds one Ray connection at a time. So fault
tests run this module as a child process (``RayAdmin``) and talk to it over stdin/stdout, one
JSON line per command and answer:

    python -m tests.ray_admin GCS_ADDRESS
    <- {"actors": [...]}                 once connected: named actors in namespace "serve"
    -> list                             <- {"actors": [...]}
    -> kill NAME                        <- {"killed": NAME}   ray.kill(..., no_restart=True)
    -> metrics                          <- {"ports": [...]}   each node's Prometheus port
    -> status                           <- {"deployments": {name: {state: count}}}
                                           serve.status(): replicas per state, application llm
    -> nodes                            <- {"alive": n}  Ray nodes alive
    -> hold RESOURCE N                  <- {"held": N}  an actor on the head node takes N of
                                           RESOURCE there (until ``release``)
    -> release                          <- {"released": true}

Connecting first and killing on command keeps the kill itself to milliseconds, so requests
started just before it are still in flight when it lands.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

SERVE_NAMESPACE = "serve"
APPLICATION = "llm"
HEAD_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource
ROOT = Path(__file__).resolve().parents[1]


class RayAdmin:
    """This module in a child process, connected to the cluster at ``address``."""

    def __init__(self, address: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.ray_admin", address],
            cwd=ROOT,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.actors: list[str] = self.read(timeout=60)["actors"]

    def read(self, timeout: float) -> dict:
        import pytest

        deadline = time.monotonic() + timeout
        while True:  # Ray itself may print a line to stdout (seen after a node died): skipped
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if not ready:
                pytest.fail(f"ray admin gave no answer in {timeout}s")
            line = self.process.stdout.readline()
            if not line:
                pytest.fail(f"ray admin exited with {self.process.wait(timeout=10)}")
            if line.startswith("{"):
                return json.loads(line)

    def command(self, text: str, timeout: float = 30) -> dict:
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        return self.read(timeout)

    def replica_counts(self) -> dict[str, int]:
        """RUNNING replicas per deployment, as Serve's own status reports them."""
        deployments = self.command("status")["deployments"]
        return {name: states.get("RUNNING", 0) for name, states in deployments.items()}

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def main() -> None:
    import ray
    from ray import serve

    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    holders: list = []

    @ray.remote(num_cpus=0)
    class Holder:
        """Takes resources on a node and does nothing else."""

        def ready(self) -> bool:
            return True

    def actors() -> list[str]:
        named = ray.util.list_named_actors(all_namespaces=True)
        return sorted(a["name"] for a in named if a["namespace"] == SERVE_NAMESPACE)

    def status() -> dict:
        application = serve.status().applications.get(APPLICATION)
        deployments = application.deployments if application else {}
        counts = {name: dict(d.replica_states) for name, d in deployments.items()}
        return {"deployments": counts}

    def hold(resource: str, amount: str) -> dict:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [node for node in ray.nodes() if node["Alive"]]
        (head,) = [node["NodeID"] for node in alive if HEAD_RESOURCE in node["Resources"]]
        strategy = NodeAffinitySchedulingStrategy(head, soft=False)
        holder = Holder.options(resources={resource: float(amount)}, scheduling_strategy=strategy)
        holders.append(holder.remote())
        ray.get(holders[-1].ready.remote(), timeout=30)
        return {"held": float(amount)}

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
        elif command == "status":
            answer(status())
        elif command == "nodes":
            answer({"alive": sum(node["Alive"] for node in ray.nodes())})
        elif command == "hold":
            answer(hold(*argument.split()))
        elif command == "release":
            while holders:
                ray.kill(holders.pop())
            answer({"released": True})
        else:
            break


if __name__ == "__main__":
    main()
