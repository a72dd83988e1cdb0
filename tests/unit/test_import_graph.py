"""The packages' import graph, read from the source with ast (nothing is imported): ferry.service's rooms
(its top-level modules, replication, transfer, api) import each other without a cycle, transfer never
imports replication, and ferry.client never imports ferry.service.

Every import counts, also one inside a function or under TYPE_CHECKING: a lazy import is still a
dependency between rooms."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"ferry.client": ROOT / "client", "ferry.service": ROOT / "service"}
ROOMS = ("replication", "transfer", "api")  # subpackages of ferry.service; every other module is a room of its own


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


def room_of(module: str) -> str | None:
    """The room of a ferry.service module (None outside ferry.service, and for the package itself)."""
    parts = module.split(".")
    if parts[:2] != ["ferry", "service"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in ROOMS else ".".join(parts[:3])


def is_room(room: str) -> bool:
    """A subpackage, or a top-level module (``from ferry.service import Config`` names no module)."""
    return room in ROOMS or (ROOT / "service" / f"{room.rpartition('.')[2]}.py").is_file()


def service_room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(FOLDERS["ferry.service"].rglob("*.py")):
        source = room_of(module_name("ferry.service", path))
        if source is None:
            continue
        edges = graph.setdefault(source, set())
        for target in imported_modules("ferry.service", path):
            room = room_of(target)
            if room is not None and room != source and is_room(room):
                edges.add(room)
    return graph


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
