"""A real Ray cluster of separate node processes on this machine, for the Ray engine's tests and bench.

Each node is its own ``ray start --block`` in a process group of its own, on free ports (never Ray's
defaults: other Ray users may share the machine), under a temp dir of its own. ``stop()`` kills the
groups, then any process still naming that temp dir or holding a file open in it (a worker that left
its group), and waits for them: nothing is left running, whatever the test did. Never ``ray stop``:
it stops every Ray instance on the machine, other users' too. One port range stays shared: a Ray Client
session's server takes the first free port of Ray's fixed 23000-24000, so two sessions starting at the
same instant on one machine (another Ray user's and a test's) can collide and one of them fails.
Every node's Python processes import ``ray_hooks/sitecustomize.py``, which lets a test kill the next
Ray Client session's server as it starts (:meth:`RayCluster.kill_next_session_server`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

__all__ = ["RayCluster", "ray_cluster"]

_START_TIMEOUT = 180.0  # a loaded two-core machine takes its time


_handed_out: set[int] = set()  # a port the kernel just freed may come back at the next bind: never twice


def _free_port() -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")


def _ports() -> list[str]:
    """The ports one node listens on, each chosen free (workers take random ports: 0)."""
    names = ("node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "runtime-env-agent-port")  # fmt: skip
    return [f"--{name}={_free_port()}" for name in names] + ["--min-worker-port=0", "--max-worker-port=0"]


class RayCluster:
    """Nodes started with :meth:`add_node`; ``address`` is the head's GCS address (``HOST:PORT``)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # short: Ray's socket paths must fit
        self.address = ""
        self.client_address = ""  # the head's Ray Client server, ray://HOST:PORT
        # no token auth: `ray start` turns it on when ~/.ray/auth_token exists, which another Ray user of
        # this machine may create at any moment (the drivers here would then be refused)
        self.env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
        # every node's Python processes import ray_hooks/sitecustomize.py: kill_next_session_server's trap
        self._trap = Path(self.temp_dir) / "kill-next-session-server"
        paths = [str(Path(__file__).with_name("ray_hooks")), self.env.get("PYTHONPATH", "")]
        self.env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        self.env["FERRY_TEST_SESSION_SERVER_TRAP"] = str(self._trap)
        self._nodes: list[subprocess.Popen[bytes]] = []
        self._logs: list[Path] = []

    def add_node(self, *, cpus: int, resources: Mapping[str, float] | None = None) -> None:
        """Start one node (the first is the head) and wait until the cluster counts it."""
        ray_cli = str(Path(sys.executable).with_name("ray"))
        cmd = [ray_cli, "start", "--block", "--node-ip-address=127.0.0.1", f"--num-cpus={cpus}", "--num-gpus=0",
               "--disable-usage-stats", *_ports()]  # fmt: skip
        if resources:
            cmd.append(f"--resources={json.dumps(dict(resources))}")
        if not self._nodes:
            port = _free_port()
            self.address = f"127.0.0.1:{port}"
            client_port = _free_port()
            self.client_address = f"ray://127.0.0.1:{client_port}"
            cmd += ["--head", f"--port={port}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                    f"--ray-client-server-port={client_port}"]  # fmt: skip
        else:
            cmd += [f"--address={self.address}"]
        log = Path(self.temp_dir) / f"node{len(self._nodes)}.log"
        self._logs.append(log)
        with open(log, "wb") as out:
            self._nodes.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                start_new_session=True))  # fmt: skip
        self._wait_nodes(len(self._nodes))

    def _wait_nodes(self, n: int) -> None:
        # counted alive by the GCS, and (for a node after the head) a task placed there by its resource: the
        # GCS counts a node before the head's scheduler sees its resources, and a SPREAD scheduled meanwhile
        # stays on the head
        probe = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                 "n = int(sys.argv[2]); alive = sum(1 for x in ray.nodes() if x['Alive']); "
                 "placed = n < 2 or alive < n or ray.get(ray.remote(lambda: 1).options(num_cpus=0, "
                 "resources={f'node{n}': 0.001}).remote(), timeout=20) == 1; "
                 "print(alive if placed else 0)")  # fmt: skip
        deadline = time.monotonic() + _START_TIMEOUT
        last = ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self._nodes):
                raise RuntimeError(f"a Ray node exited while starting: {self.logs()}")
            try:
                got = subprocess.run([sys.executable, "-c", probe, self.address, str(n)], capture_output=True,
                                     text=True, env=self.env, timeout=60)  # fmt: skip
            except subprocess.TimeoutExpired:
                last = "probe timed out"
                continue
            if got.returncode == 0 and got.stdout.strip().isdigit() and int(got.stdout.strip()) >= n:
                return
            last = f"probe exit {got.returncode}: {got.stdout.strip()[-500:]} {got.stderr.strip()[-1500:]}"
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not count {n} nodes within {_START_TIMEOUT}s ({last}): {self.logs()}")

    def kill_next_session_server(self) -> None:
        """The next Ray Client session's server exits as it starts (see ray_hooks/sitecustomize.py)."""
        self._trap.touch()

    def session_server_trap_armed(self) -> bool:
        """Whether the trap :meth:`kill_next_session_server` set is still waiting for a server."""
        return self._trap.exists()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self._logs if p.exists())

    def _ours(self, node: int | None = None) -> list[int]:
        """This cluster's processes (or node ``node``'s): the node groups' descendants, and (for the whole
        cluster) any process naming its temp dir."""
        parents: dict[int, int] = {}
        named: set[int] = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                parents[int(proc.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
                if node is None and self._names_temp_dir(proc):
                    named.add(int(proc.name))
            except (OSError, ValueError, IndexError):
                continue
        ours = ({p.pid for p in self._nodes} if node is None else {self._nodes[node].pid}) | named
        grew = True
        while grew:
            more = {pid for pid, ppid in parents.items() if ppid in ours and pid not in ours}
            ours |= more
            grew = bool(more)
        return sorted(pid for pid in ours if pid in parents and pid != os.getpid())

    def _names_temp_dir(self, proc: Path) -> bool:
        """Whether the process names this cluster's temp dir in its command line or has a file open there
        (a worker, whose title Ray rewrites, keeps its log files there open)."""
        if self.temp_dir.encode() in (proc / "cmdline").read_bytes():
            return True
        try:
            return any(os.readlink(fd).startswith(self.temp_dir) for fd in (proc / "fd").iterdir())
        except OSError:
            return False

    def task_pids(self, name: str, node: int | None = None) -> list[int]:
        """This cluster's (or node ``node``'s) worker processes running a task called ``name`` (Ray retitles
        them ``ray::name``)."""
        pids = []
        for pid in self._ours(node):
            try:
                if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"ray::{name}".encode()):
                    pids.append(pid)
            except OSError:
                continue
        return pids

    def kill_node(self, i: int) -> None:
        """SIGKILL node ``i``'s whole process group (its raylet, agents and workers): a node dying."""
        os.killpg(self._nodes[i].pid, signal.SIGKILL)
        self._nodes[i].wait(30)

    def stop(self) -> None:
        """SIGKILL every node's group (a test cluster needs no graceful stop), then any straggler."""
        before = self._ours()
        for p in self._nodes:
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self._nodes:
            with suppress(subprocess.TimeoutExpired):
                p.wait(30)
        deadline = time.monotonic() + 20
        while (left := [p for p in set(before) | set(self._ours()) if _alive(p)]) and time.monotonic() < deadline:
            for pid in left:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextmanager
def ray_cluster(nodes: int = 2, *, cpus: int = 2, env: Mapping[str, str] | None = None) -> Iterator[RayCluster]:
    """A head and ``nodes - 1`` more nodes (node ``i`` > 0 has the custom resource ``node<i+1>``)."""
    cluster = RayCluster(env)
    before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # this process' drivers, as the nodes
    try:
        cluster.add_node(cpus=cpus)
        for i in range(1, nodes):
            cluster.add_node(cpus=cpus, resources={f"node{i + 1}": 1})
        yield cluster
    finally:
        _disconnect_this_process()
        cluster.stop()
        if before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = before


def _disconnect_this_process() -> None:
    """Leave the cluster before it stops: a driver still connected when its GCS goes away ends the whole
    process (the test run) a minute later, which a test that failed while connected would otherwise cause."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count: its parent reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
