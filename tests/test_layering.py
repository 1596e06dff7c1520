"""Layers: the FTN3 core stays free of I/O so every transport can share it, nothing above
storage sees a backend, dependencies point one way (down the table below), and no modules
import each other in a circle (nor packages)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import futoin_evt
import futoin_evt.ftn3

FORBIDDEN = {"asyncio", "websockets", "sqlite3", "aiosqlite", "socket", "ssl"}


def test_ftn3_core_imports_no_io() -> None:
    package = Path(futoin_evt.ftn3.__file__).parent
    for module in package.glob("*.py"):
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{module.name} imports {name}"


BACKENDS = {"aiosqlite", "psycopg", "psycopg_pool"}
BACKEND_MODULES = (
    "storage.sqlite",
    "storage.sqlite.store",
    "storage.sqlite.native",
    "storage.sqlite.schema",
    "storage.postgres",
)


def test_nothing_above_storage_imports_a_backend() -> None:
    """Services, transports and the CLI reach a store through the contract and open_store."""
    package = Path(futoin_evt.ftn3.__file__).parent.parent
    for module in package.rglob("*.py"):
        if module.parent.name == "storage" or "storage" in module.parent.parts[-2:]:
            continue
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in BACKENDS, f"{module} imports {name}"
                assert not name.endswith(BACKEND_MODULES), f"{module} imports {name}"


def test_the_amqp_door_knows_no_other_door() -> None:
    """The AMQP listener reaches the log through the event log calls, not through FTN3's
    services or the WebSocket transport."""
    others = {"websockets", "wsio", "websocket", "http", "executor", "server", "ftn18", "feed"}
    for module, imported in _imports():
        if not module.startswith("futoin_evt.amqp."):
            continue
        parts = set(imported.split("."))
        assert not parts & others, f"{module} imports {imported}"
        assert "storage" not in parts, f"{module} uses the store"


#: The doors: their packages, and the server's modules that carry a door's wire.
DOORS: tuple[str, ...] = (
    "ftn18", "feed", "dcb", "console", "notify", "amqp", "kafka", "server"
)  # fmt: skip
#: Imports of storage/ by a door module, each for a reason: every other call of a door goes
#: down through log/, where a right on a stream is checked.
DOORS_TO_STORAGE: dict[tuple[str, str], str] = {
    ("futoin_evt.server.app", "futoin_evt.storage"): "the composition root opens the store",
    ("futoin_evt.server.app", "futoin_evt.storage.base"): "with its settings, and hands it to"
    " log/ and auth/ (never to a door: see test_the_composition_root_hands_no_door_a_store)",
    ("futoin_evt.server.peers", "futoin_evt.storage.base"): "the channel between the workers"
    " carries the store's own news (PeerNews), not a user's call",
    ("futoin_evt.ftn18.push", "futoin_evt.storage.head"): "a push stream's durable position is"
    " a HeadWatch, the generic wake-up that stands in storage/",
}


def test_the_doors_go_down_through_log() -> None:
    """A door reaches the events, the consumers and the streams through log/ only, so the
    acting user meets every rule in one place and the door maps a refusal to its wire."""
    wrong = []
    for module, imported in _imports():
        if _package(module) not in DOORS or _package(imported) != "storage":
            continue
        if (module, imported) not in DOORS_TO_STORAGE:
            wrong.append(f"{module} imports {imported}")
    assert not wrong, "doors that bypass log/:\n" + "\n".join(wrong)


def test_every_door_to_storage_is_still_there() -> None:
    """The list of reasons names only imports that exist (it shrinks as they go)."""
    found = set(_imports())
    assert not DOORS_TO_STORAGE.keys() - found, DOORS_TO_STORAGE.keys() - found


#: Where the server is put together: the one module that holds the store beside the doors.
COMPOSITION_ROOT: Final = "futoin_evt.server.app"


def test_the_composition_root_hands_no_door_a_store() -> None:
    """What the composition root gives a door (a class or function of a door's package) is
    an object of ``log/`` or ``auth/``, never the store: no argument of such a call is a
    name the root holds a store as (typed with a role of ``storage/base.py``, or opened with
    ``open_store``), nor a ``.store`` attribute."""
    tree = ast.parse(_source(COMPOSITION_ROOT))
    from_doors = {
        name: module
        for name, module in _imported_names(COMPOSITION_ROOT, tree).items()
        if _package(module) in DOORS
    }
    stores = _store_names(COMPOSITION_ROOT, tree)
    wrong = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        door = from_doors.get(node.func.id)
        if door is None:
            continue
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
            if isinstance(argument, ast.Starred):
                argument = argument.value
            if (isinstance(argument, ast.Name) and argument.id in stores) or (
                isinstance(argument, ast.Attribute) and argument.attr == "store"
            ):
                wrong.append(f"line {node.lineno}: {door}.{node.func.id}({ast.unparse(argument)})")
    assert not wrong, "a door handed the store:\n" + "\n".join(wrong)


def test_no_door_constructor_takes_a_store_role() -> None:
    """No class of a door's package takes a parameter typed with a role of
    ``storage/base.py``: a door holds what ``log/`` (or ``auth/``) gives it."""
    roles = _store_roles()
    wrong = []
    for module in _modules():
        if _package(module) not in DOORS or module == COMPOSITION_ROOT:
            continue
        tree = ast.parse(_source(module))
        local = {n for n, m in _imported_names(module, tree).items() if m in _STORAGE_BASE}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    for arg in [*item.args.args, *item.args.kwonlyargs]:
                        named = _annotation_names(arg.annotation)
                        if named & local or named & {f"base.{role}" for role in roles}:
                            wrong.append(f"{module}.{node.name}({arg.arg})")
    assert not wrong, "doors that take a store role:\n" + "\n".join(wrong)


_STORAGE_BASE: Final = ("futoin_evt.storage.base", "futoin_evt.storage")


def _store_roles() -> set[str]:
    """The Protocols of ``storage/base.py``: the roles a store plays."""
    tree = ast.parse(_source("futoin_evt.storage.base"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(_annotation_names(base) & {"Protocol"} for base in node.bases)
    }


def _store_names(module: str, tree: ast.Module) -> set[str]:
    """The names ``module`` holds a store as: parameters and variables typed with a role of
    ``storage/base.py``, and what ``open_store`` returned."""
    roles = _store_roles()
    typed = {
        name
        for name, imported in _imported_names(module, tree).items()
        if imported in _STORAGE_BASE and name in roles
    }
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign):
            target = node.arg if isinstance(node, ast.arg) else ast.unparse(node.target)
            if _annotation_names(node.annotation) & typed:
                names.add(target)
        elif isinstance(node, ast.Assign):
            value = node.value.value if isinstance(node.value, ast.Await) else node.value
            if (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id == "open_store"
            ):
                names.update(ast.unparse(target) for target in node.targets)
    return names


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    """The names an annotation mentions (``Store | None`` -> Store, None; a string too)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return {
        ast.unparse(node)
        for node in ast.walk(annotation)
        if isinstance(node, ast.Name | ast.Attribute)
    }


def _imported_names(module: str, tree: ast.Module) -> dict[str, str]:
    """Name bound -> the module of ours it comes from, for every ``from ... import`` of
    ``module`` (those inside functions and for typing only included)."""
    package = module.split(".") if _is_module_package(module) else module.split(".")[:-1]
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                above = package[: len(package) - node.level + 1]
                base = ".".join([*above, *([base] if base else [])])
            for alias in node.names:
                found[alias.asname or alias.name] = base
    return found


#: The doors for :func:`test_no_door_imports_another`: the packages that each serve one wire
#: (the web console's pages with the endpoint that serves them), and the server's modules that
#: carry one door's wire. ``dcb/`` and ``feed/`` are services below the doors, ``notify/`` is
#: shared; the composition root, the metrics listener and the workers' channel are no door:
#: they start or read every door.
DOOR_OF: dict[str, str] = {
    "futoin_evt.ftn18": "FTN18",
    "futoin_evt.amqp": "AMQP",
    "futoin_evt.kafka": "Kafka",
    "futoin_evt.console": "console",
    "futoin_evt.server.console_http": "console",
    "futoin_evt.server.websocket": "WebSocket",
    "futoin_evt.server.executor": "WebSocket",
    "futoin_evt.server.http": "HTTP",
    "futoin_evt.server.dcb_http": "HTTP",
    "futoin_evt.server.schemas_http": "HTTP",
    "futoin_evt.server.asyncapi": "HTTP",
}
#: Imports of one door by another, each for a reason.
DOOR_TO_DOOR: dict[tuple[str, str], str] = {
    ("futoin_evt.server.console_http", "futoin_evt.amqp.listener"): "the console's overview"
    " counts each door's connections off the running server (a type only)",
    ("futoin_evt.server.console_http", "futoin_evt.kafka.listener"): "and the Kafka door's"
    " (a type only)",
    ("futoin_evt.server.console_http", "futoin_evt.ftn18.notify"): "and those of event"
    " notification (a type only)",
    ("futoin_evt.server.console_http", "futoin_evt.server.websocket"): "the console's tails"
    " and connections page are on the WebSocket port (types only)",
    ("futoin_evt.server.console_http", "futoin_evt.server.http"): "the console is served as one"
    " of the HTTP endpoints on the WebSocket port (HttpEndpoint, Exchange)",
    ("futoin_evt.server.console_http", "futoin_evt.server.executor"): "a console request's"
    " peer address is the WebSocket port's (peer_host)",
    ("futoin_evt.server.http", "futoin_evt.server.executor"): "the HTTP doors share the"
    " WebSocket port's executor helpers (peer addresses, limits)",
}


def _door(module: str) -> str | None:
    for prefix, door in DOOR_OF.items():
        if module == prefix or module.startswith(prefix + "."):
            return door
    return None


def test_no_door_imports_another() -> None:
    """A door reaches the others' work through ``log/``, ``auth/`` and ``notify/``, never
    through their modules (but where DOOR_TO_DOOR says why)."""
    wrong = []
    for module, imported in sorted(set(_imports())):
        mine, theirs = _door(module), _door(imported)
        if mine is None or theirs is None or mine == theirs:
            continue
        if (module, imported) not in DOOR_TO_DOOR:
            wrong.append(f"{module} ({mine}) imports {imported} ({theirs})")
    assert not wrong, "doors that import another door:\n" + "\n".join(wrong)


def test_every_door_to_door_is_still_there() -> None:
    found = set(_imports())
    assert not DOOR_TO_DOOR.keys() - found, DOOR_TO_DOOR.keys() - found


#: futoin_evt's packages from the bottom up. A package imports its own modules and those of the
#: layers below it; never a layer above, nor a sibling in its layer (but in "shared").
LAYERS: dict[str, set[str]] = {
    # how input is quoted in error messages
    "quoting": {"quoting"},
    # the FTN3 core (no I/O), connection slots, the counters the metrics read, the version,
    # the error of a closed connection
    "floor": {"ftn3", "slots", "stats", "__init__", "closed"},
    # WebSocket I/O, shared by the server and the client
    "wire": {"wsio"},
    # the domain's values: the event stream's, the DCB store's
    "domain": {"domain"},
    "storage": {"storage"},
    # what the doors share: the event log calls, retention and the archive; users and SAS;
    # event notification (selectors, the shared reader, management events)
    "shared": {"log", "auth", "notify"},
    # services with no wire in them: the DCB store's, the HTTP feed's protocols
    "services": {"dcb", "feed"},
    # the doors: FTN3 (FTN18, and the FTN3 adapters of DCB and notification), AMQP, Kafka
    "doors": {"ftn18", "amqp", "kafka"},
    # the web console: pages over the services and doors, no wire in it
    "console": {"console"},
    # the composition root with the WebSocket and HTTP listeners; the client
    "top": {"server", "client", "eventhubs"},
    "cli": {"cli", "__main__"},
}
#: Arrows that go up, each for a reason.
UPWARDS: dict[tuple[str, str], str] = {
    ("futoin_evt.log.archive", "client"): "the archiver of a remote server is a push receiver",
}


def _layer(package: str) -> int:
    for index, packages in enumerate(LAYERS.values()):
        if package in packages:
            return index
    raise AssertionError(f"futoin_evt.{package} is in no layer of test_layering.LAYERS")


def _imports() -> Iterator[tuple[str, str]]:
    """(module, imported module of ours) for every import, those only for typing included."""
    root = Path(futoin_evt.__file__).parent
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        module = ".".join(parts)
        package = parts if is_package else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    above = package[: len(package) - node.level + 1]
                    base = ".".join([*above, *([base] if base else [])])
                # ``from . import x`` imports the module x when there is one
                names = [f"{base}.{a.name}" for a in node.names if _is_module(f"{base}.{a.name}")]
                names = names or [base]
            else:
                continue
            for name in names:
                if name == "futoin_evt" or name.startswith("futoin_evt."):
                    yield module, name


def _modules() -> Iterator[str]:
    """Every module of futoin_evt, by name."""
    root = Path(futoin_evt.__file__).parent
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts)


def _source(module: str) -> str:
    path = Path(futoin_evt.__file__).parent.parent.joinpath(*module.split("."))
    package = path / "__init__.py"
    return (package if package.exists() else path.with_suffix(".py")).read_text()


def _is_module_package(module: str) -> bool:
    path = Path(futoin_evt.__file__).parent.parent.joinpath(*module.split("."))
    return (path / "__init__.py").exists()


def _is_module(name: str) -> bool:
    path = Path(futoin_evt.__file__).parent.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_dependencies_point_one_way() -> None:
    wrong = []
    for module, imported in _imports():
        mine, theirs = _package(module), _package(imported)
        if mine == theirs or (mine, theirs) == ("__main__", "cli"):
            continue
        if (module, theirs) in UPWARDS:
            continue
        low, high = _layer(theirs), _layer(mine)
        if low < high or (low == high and mine in LAYERS["shared"]):
            continue
        wrong.append(f"{module} imports {imported}")
    assert not wrong, "arrows that run up or sideways:\n" + "\n".join(wrong)


def test_no_import_circle() -> None:
    """Not even through imports for typing only: a circle there is a layer that is missing."""
    graph: dict[str, set[str]] = {}
    for module, imported in _imports():
        if imported != module:
            graph.setdefault(module, set()).add(imported)
    _no_circle(graph, "import circle")


def test_no_package_import_circle() -> None:
    """Nor between packages, though each module's imports are free of circles: the packages
    of one layer may import each other ("shared"), but never both ways (``log/`` publishes the
    management events that ``notify/`` reads, so their bus stands in ``domain/``)."""
    graph: dict[str, set[str]] = {}
    for module, imported in _imports():
        mine, theirs = _package(module), _package(imported)
        if mine != theirs:
            graph.setdefault(mine, set()).add(theirs)
    _no_circle(graph, "package import circle")


def _no_circle(graph: dict[str, set[str]], what: str) -> None:
    """AssertionError naming the first circle of ``graph`` (node -> the nodes it imports)."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            circle = [*path[path.index(node) :], node]
            raise AssertionError(f"{what}: " + " -> ".join(circle))
        if node in done:
            return
        for imported in sorted(graph.get(node, ())):
            visit(imported, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])


#: The AMQP door's modules from the bottom up: the engine knows no server; the table maps
#: addresses to nodes and says what a node sees of a connection; the nodes (and the
#: connection, beside them) import the table, never each other (but where SIDEWAYS says);
#: the listener builds the table and the connections.
AMQP_LAYERS: dict[str, set[str]] = {
    "engine": {"engine"},
    # the door's values, no link in them: settings, SASL frames, messages and offsets, the
    # filters, the quick decoder, the checkpoint store's codec, the kept termini
    "values": {
        "config",
        "sasl",
        "codec",
        "filters",
        "quickdecode",
        "checkpoints",
        "resume",
        "faults",  # the condition of each kind of failure of the log
    },
    "table": {"table"},
    # what the links the nodes send on share
    "links": {"links"},
    # the event log node's parts: addressing, consumer groups, durable recovery, its links
    "streams": {"streams"},
    "nodes": {"node", "cbs", "management", "notify", "connection"},
    "top": {"listener", "__init__"},
}
#: Arrows inside a layer, each for a reason.
AMQP_SIDEWAYS: dict[tuple[str, str], str] = {
    ("filters", "codec"): "a filter's start position is the codec's",
    ("quickdecode", "codec"): "the quick decoder makes the codec's incoming events",
    ("cbs", "management"): "$cbs answers requests as $management does",
}


def _amqp_unit(module: str) -> str | None:
    """``node`` for futoin_evt.amqp.node, ``engine`` for anything in the engine's package."""
    prefix = "futoin_evt.amqp"
    if module == prefix:
        return "__init__"
    if not module.startswith(prefix + "."):
        return None
    return module[len(prefix) + 1 :].split(".")[0]


def _amqp_layer(unit: str) -> int:
    for index, units in enumerate(AMQP_LAYERS.values()):
        if unit in units:
            return index
    raise AssertionError(f"futoin_evt.amqp.{unit} is in no layer of test_layering.AMQP_LAYERS")


def test_the_amqp_door_points_one_way() -> None:
    """Engine, values, table, links, nodes, listener: no arrow up or sideways, imports for
    typing included (no node imports the connection, not even for its type)."""
    wrong = []
    for module, imported in _imports():
        mine, theirs = _amqp_unit(module), _amqp_unit(imported)
        if mine == "engine" and theirs != "engine":
            wrong.append(f"{module} imports {imported} (the engine knows no server)")
            continue
        if mine is None or theirs is None or mine == theirs:
            continue
        low, high = _amqp_layer(theirs), _amqp_layer(mine)
        if low < high or (mine, theirs) in AMQP_SIDEWAYS:
            continue
        wrong.append(f"{module} imports {imported}")
    assert not wrong, "AMQP arrows that run up or sideways:\n" + "\n".join(wrong)
