"""The package's shape: no import circle, public paths that keep working, a front importable
before Django is set up."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import chatstream

PACKAGE = Path(chatstream.__file__).parent


def modules() -> dict[str, Path]:
    """Every module of the app (its migrations and its test kit aside), by dotted name."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if "migrations" in parts or "testing" in parts:
            continue
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The app's modules ``name`` imports, at any level (inside functions too), with the
    packages that importing them imports first."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets |= {f"{module}.{a.name}" if f"{module}.{a.name}" in known else module
                        for a in node.names}
        elif isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
    found = set()
    for target in targets:
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        parts = target.split(".")
        found |= {p for i in range(2, len(parts) + 1)
                  if (p := ".".join(parts[:i])) in known and not f"{name}.".startswith(f"{p}.")}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph`` (its strongly connected components of two or more)."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(node: str, edges: dict[str, set[str]], out: list[str]) -> None:
        stack = [(node, iter(sorted(edges[node])))]
        seen.add(node)
        while stack:
            current, rest = stack[-1]
            for target in rest:
                if target not in seen:
                    seen.add(target)
                    stack.append((target, iter(sorted(edges[target]))))
                    break
            else:
                stack.pop()
                out.append(current)

    for node in sorted(graph):
        if node not in seen:
            visit(node, graph, order)
    reverse: dict[str, set[str]] = {node: set() for node in graph}
    for node, targets in graph.items():
        for target in targets:
            reverse[target].add(node)
    seen.clear()
    found = []
    for node in reversed(order):
        if node not in seen:
            component: list[str] = []
            visit(node, reverse, component)
            if len(component) > 1:
                found.append(sorted(component))
    return found


def test_no_module_of_the_app_imports_itself_round_a_circle():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert graph["chatstream.stream._pump"] >= {"chatstream.provider", "chatstream.sse"}
    assert circles(graph) == []


def test_the_json_api_shares_the_pages_parts_not_their_views():
    """The JSON API reads transcripts and answers streams with the modules the pages use
    (chatstream.web.transcripts, chatstream.web.streaming), never through the pages' views."""
    known = modules()
    api = {name: imports(name, path, known) for name, path in known.items()
           if name.startswith("chatstream.json_api")}
    assert {"chatstream.web.streaming", "chatstream.web.transcripts"} <= (
        api["chatstream.json_api.views"])
    assert {name for name, found in api.items() if "chatstream.web.views" in found} == set()


def test_the_store_is_persistence_only():
    """The store saves what it is handed: it imports no engine, page, rendering, quota policy
    or reporting, only the models, the settings and its own helpers."""
    known = modules()
    allowed = {"chatstream.models", "chatstream.conf", "chatstream._loops", "chatstream._failures"}
    found = {target for name, path in known.items() if name.startswith("chatstream.store")
             for target in imports(name, path, known)
             if not target.startswith("chatstream.store")}
    assert found <= allowed, sorted(found - allowed)


def test_the_domain_imports_no_web_module():
    """The chat's rules (``chatstream.domain``) are below the pages: the pages and the JSON API
    use them, never the other way round."""
    known = modules()
    found = {f"{name} -> {target}" for name, path in known.items()
             if name.startswith("chatstream.domain")
             for target in imports(name, path, known) if target.startswith("chatstream.web")}
    assert found == set()


def test_the_engine_writes_no_html_of_its_own():
    """The engine (``chatstream.stream``) leaves HTML to the web layer: the page's events are
    written by its ``PageWire`` (``chatstream.web.wire``), handed to the engine by the views;
    the engine asks the web layer only for a finished reply's HTML to keep on its row
    (``chatstream.web.rendered``)."""
    known = modules()
    found = {f"{name} -> {target}" for name, path in known.items()
             if name.startswith("chatstream.stream")
             for target in imports(name, path, known)
             if target.startswith("chatstream.web")
             and target not in {"chatstream.web", "chatstream.web.rendered"}}
    assert found == set()
    wire = (PACKAGE / "stream" / "_wire.py").read_text()
    assert "django.utils.html" not in wire


def test_no_private_module_of_a_subpackage_is_imported_from_outside_it():
    """``chatstream.stream._run`` is the engine's own: the rest of the app imports the
    engine's front (``chatstream.stream``), never a module behind it."""
    known = modules()
    reached = []
    for name, path in known.items():
        for target in imports(name, path, known):
            package, _, module = target.rpartition(".")
            inside = name == package or name.startswith(f"{package}.")
            if module.startswith("_") and package != "chatstream" and not inside:
                reached.append(f"{name} -> {target}")
    assert reached == []


def test_the_parsers_import_neither_django_nor_httpx():
    done = subprocess.run(
        [sys.executable, "-c", "import sys, chatstream.sse, chatstream.completions; "
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'httpx'}))"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "[]", done.stderr


def test_no_class_is_over_250_lines_and_no_function_over_80():
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            limit = {ast.ClassDef: 250, ast.FunctionDef: 80, ast.AsyncFunctionDef: 80}.get(
                type(node))
            if limit and node.end_lineno - node.lineno + 1 > limit:  # type: ignore[attr-defined]
                long.append(f"{name}.{node.name}")  # type: ignore[attr-defined]
    assert long == []


def test_a_circle_is_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_the_public_paths_import():
    from chatstream.asgi import with_fast_streams
    from chatstream.completions import ChatCompletionAccumulator
    from chatstream.sse import ServerSentEvent, SSEDecoder
    from chatstream.testing import Script, Simulator

    assert all((with_fast_streams, ChatCompletionAccumulator, ServerSentEvent, SSEDecoder,
                Script, Simulator))


def test_the_asgi_front_imports_before_django_is_set_up():
    """As a site's asgi.py does: the import comes before ``get_asgi_application()``."""
    done = subprocess.run(
        [sys.executable, "-c", "import chatstream.asgi, django.apps as a; "
         "assert not a.apps.ready; print('imported')"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert done.stdout.strip() == "imported", done.stderr
