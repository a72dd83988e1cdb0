"""Fleet chaos (issue 24): ferry's own fleet under a seeded schedule of faults.

origin (a directory) → hub (S3, moto server over HTTP; ``keep_versions`` retention) → far (a
directory), or origin → hub and far filled as a swarm, one ``ferry serve`` per cluster, a ``ferry
sync`` follower of the hub into /nvme,
``ferry pack --append`` packers at the origin (other compression and frame sizes, re-packs,
separate PID namespaces when run as root), loaders reading a pinned version through the
replicas; SIGKILL, SIGTERM, SIGSTOP past the lease ttl, a slow-client flood on the hub's API.
The invariants (``tests/fleet.py``, ``inv_*``): no version lost or rolled back, no published
object rewritten, every loader's stream the reference stream, nothing left running, every
replica at the origin's version within ``Sizes.converge_s`` of the faults stopping, ``ferry
verify`` passing everywhere, the daemons answering through the flood.

``FERRY_CHAOS_SEED=N`` replays a run's schedule (the seed is printed in every report);
``FERRY_CHAOS_OFF=repack,flood`` leaves kinds of actions out (see ``fleet.make_schedule``), to
tell which one a finding needs. ``FERRY_CHAOS_REPORT=1`` prints the report of a run that passed too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import Backend
from fleet import BOUNDED, SLOW, Sizes, Topology, run_fleet


def _namespaces() -> tuple[bool, str]:
    """Whether packers and syncs can run in PID namespaces of their own here, and why not."""
    if os.geteuid() != 0:
        return False, "not root: every writer runs in this PID namespace (unshare -p needs root)"
    if shutil.which("unshare") is None:
        return False, "no unshare(1): every writer runs in this PID namespace"
    probe = subprocess.run(["unshare", "-pf", "--mount-proc", "true"], capture_output=True, timeout=30, check=False)
    if probe.returncode != 0:
        return False, f"unshare -pf fails here ({probe.stderr.decode(errors='replace').strip()}): one PID namespace"
    return True, "some packers and syncs run in PID namespaces of their own"


def _fleet(
    tmp_path: Path,
    s3_backend: Backend,
    sizes: Sizes,
    default_seed: int,
    *,
    swarm: bool = False,
    routed: bool = False,
    ray_address: str | None = None,
) -> None:
    seed = int(os.environ.get("FERRY_CHAOS_SEED", default_seed))
    namespaces, why = _namespaces()
    kind = " (routed swarm)" if routed else " (swarm)" if swarm else ""
    print(f"fleet chaos{kind}{' on Ray' if ray_address else ''}: seed {seed}; {why}")
    topo = Topology(tmp_path, s3_backend.base, s3_backend.storage_options, swarm=swarm or routed, routed=routed,
                    ray_address=ray_address)  # fmt: skip
    off = frozenset(filter(None, os.environ.get("FERRY_CHAOS_OFF", "").split(",")))
    fleet = run_fleet(topo, sizes, seed, dict(os.environ), namespaces, off)
    if os.environ.get("FERRY_CHAOS_REPORT"):
        print(fleet.report())
    assert not fleet.findings, f"{why}\n{fleet.report()}"


@pytest.mark.timeout(300)
def test_fleet_chaos(tmp_path: Path, s3_backend: Backend) -> None:
    _fleet(tmp_path, s3_backend, BOUNDED, 20261202)


@pytest.mark.timeout(300)
def test_fleet_chaos_swarm(tmp_path: Path, s3_backend: Backend) -> None:
    """The same faults with hub and far filling each version as a swarm: far pulls from the hub's
    unpublished shards while the hub's retention runs and its daemon is killed, stopped and flooded."""
    _fleet(tmp_path, s3_backend, BOUNDED, 20261205, swarm=True)


@pytest.mark.soak
@pytest.mark.timeout(300)
def test_fleet_chaos_routed_swarm(tmp_path: Path, s3_backend: Backend) -> None:
    """The same faults with the swarm routed (``tests/fleet.py``'s ROUTED_LINKS): far waits on the hub for
    most shards, and must stop waiting when the hub is killed or stopped."""
    _fleet(tmp_path, s3_backend, BOUNDED, 20261206, routed=True)


@pytest.mark.soak
@pytest.mark.timeout(600)
def test_fleet_chaos_on_ray(tmp_path: Path, s3_backend: Backend) -> None:
    """The same faults with every daemon copying as Ray tasks on a local two-node Ray cluster (one cluster
    for the three daemons: each a driver of its own): SIGKILLed and SIGSTOPped drivers leave their tasks
    and governor to Ray, and a restarted daemon starts new ones."""
    pytest.importorskip("ray", reason="Ray is not installed (optional extra: pip install 'ferry-data[ray]')")
    from ray_cluster import ray_cluster

    with ray_cluster(2, cpus=2, env=s3_backend.env) as cluster:
        _fleet(tmp_path, s3_backend, BOUNDED, 20261207, swarm=True, ray_address=cluster.address)


@pytest.mark.soak
@pytest.mark.timeout(1500)
def test_fleet_chaos_long(tmp_path: Path, s3_backend: Backend) -> None:
    _fleet(tmp_path, s3_backend, SLOW, 24)
