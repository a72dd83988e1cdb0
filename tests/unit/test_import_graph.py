"""The packages' import graph, read from the source with ast (nothing is imported): the rooms of each package
(its subpackages, and each top-level module as a room of its own) import each other without a cycle;
ferry.service's transfer never imports replication, ferry.client never imports ferry.service, and
ferry.shard_tools imports neither ferry.client nor ferry.service.

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import is still a
dependency between rooms."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "ferry.client": ROOT / "client",
    "ferry.service": ROOT / "service",
    "ferry.shard_tools": ROOT / "shard_tools",
}
# each package's subpackages; every other module of the package is a room of its own
ROOMS = {
    "ferry.client": ("sampling", "fetching", "resume", "stream", "service", "integrations", "media"),
    "ferry.service": ("replication", "transfer", "api", "jobs"),
    "ferry.shard_tools": ("format", "storage", "sources", "packer"),
}


def module_name(package: str, path: Path) -> str:
    rel = path.relative_to(FOLDERS[package]).with_suffix("").parts
    if rel[-1] == "__init__":
        rel = rel[:-1]
    return ".".join((package, *rel))


def imported_modules(package: str, path: Path) -> Iterator[str]:
    """Absolute names of the modules ``path`` imports (``from a import b`` yields ``a`` and ``a.b``)."""
    name = module_name(package, path)
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def room_of(package: str, module: str) -> str | None:
    """The room of a module of ``package`` (None outside it, and for the package itself)."""
    prefix = package.split(".")
    parts = module.split(".")
    if parts[: len(prefix)] != prefix or len(parts) <= len(prefix):
        return None
    first = parts[len(prefix)]
    return first if first in ROOMS[package] else ".".join(parts[: len(prefix) + 1])


def is_room(package: str, room: str) -> bool:
    """A subpackage, or a top-level module (``from ferry.service import Config`` names no module)."""
    return room in ROOMS[package] or (FOLDERS[package] / f"{room.rpartition('.')[2]}.py").is_file()


def room_graph(package: str) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(FOLDERS[package].rglob("*.py")):
        source = room_of(package, module_name(package, path))
        if source is None:
            continue
        edges = graph.setdefault(source, set())
        for target in imported_modules(package, path):
            room = room_of(package, target)
            if room is not None and room != source and is_room(package, room):
                edges.add(room)
    return graph


def service_room_graph() -> dict[str, set[str]]:
    return room_graph("ferry.service")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first node repeated at the end), or None (depth-first search)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):  # bounded: each node is expanded once (then it is done)
            cycle = visit(nxt, [*path, node])
            if cycle:
                return cycle
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start, [])
        if cycle:
            return cycle
    return None


def test_the_service_rooms_import_each_other_without_a_cycle() -> None:
    graph = service_room_graph()
    assert {"replication", "transfer", "api", "ferry.service.daemon"} <= graph.keys()
    assert "transfer" in graph["replication"]  # the graph sees real edges
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between ferry.service's rooms: {' -> '.join(cycle or [])}"


def test_transfer_never_imports_replication_or_api() -> None:
    graph = service_room_graph()
    assert not graph["transfer"] & {"replication", "api"}, graph["transfer"]
    assert "api" not in graph["replication"], graph["replication"]


def test_jobs_sit_below_the_api() -> None:
    """The jobs room (registry, staging) is served by the API and never imports it."""
    graph = service_room_graph()
    assert "jobs" in graph["api"], graph["api"]  # the graph sees real edges
    assert "api" not in graph["jobs"], graph["jobs"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_client_never_imports_service() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {target}"
        for path in sorted(FOLDERS["ferry.client"].rglob("*.py"))
        for target in imported_modules("ferry.client", path)
        if target == "ferry.service" or target.startswith("ferry.service.")
    ]
    assert offenders == []


def test_every_subpackage_is_a_room() -> None:
    for package, folder in FOLDERS.items():
        found = {init.parent.name for init in folder.glob("*/__init__.py")}
        assert found == set(ROOMS[package]), f"{package}: subpackages {sorted(found)}, rooms {ROOMS[package]}"


@pytest.mark.parametrize("package", ["ferry.client", "ferry.shard_tools"])
def test_the_rooms_import_each_other_without_a_cycle(package: str) -> None:
    graph = room_graph(package)
    assert set(ROOMS[package]) <= graph.keys()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle between {package}'s rooms: {' -> '.join(cycle or [])}"


def test_the_client_rooms_import_downward() -> None:
    graph = room_graph("ferry.client")
    assert "fetching" in graph["stream"] and "sampling" in graph["resume"]  # the graph sees real edges
    assert graph["sampling"] == set(), graph["sampling"]
    assert not graph["fetching"] & set(ROOMS["ferry.client"]), graph["fetching"]
    assert not graph["resume"] & {"stream", "service", "integrations"}, graph["resume"]
    assert not graph["service"] & set(ROOMS["ferry.client"]), graph["service"]


def test_the_shard_tools_rooms_import_downward() -> None:
    graph = room_graph("ferry.shard_tools")
    assert "format" in graph["packer"] and "storage" in graph["packer"]  # the graph sees real edges
    assert not graph["format"] & set(ROOMS["ferry.shard_tools"]), graph["format"]
    assert not graph["storage"] & {"sources", "packer"}, graph["storage"]
    assert not graph["sources"] & {"storage", "packer"}, graph["sources"]


def test_shard_tools_never_imports_client_or_service() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {target}"
        for path in sorted(FOLDERS["ferry.shard_tools"].rglob("*.py"))
        for target in imported_modules("ferry.shard_tools", path)
        if target.split(".")[:2] in (["ferry", "client"], ["ferry", "service"])
    ]
    assert offenders == []
