"""The layout of the package: the library never imports the CLI, each room imports only the
rooms it may (docs/architecture.md), and a long module is justified there as one concept."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fedalign

ROOT = Path(fedalign.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"
#: Lines above which a library module must be justified in docs/architecture.md.
MAX_LINES = 450


def _imports(tree: ast.AST, package: str) -> set:
    """Absolute names of the modules a module imports (relative imports resolved)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _library_files() -> list:
    """Every module outside ``cli/`` (``__main__.py`` is the CLI's entry point)."""
    return sorted(p for p in ROOT.rglob("*.py")
                  if "cli" not in p.relative_to(ROOT).parts and p.name != "__main__.py")


def _module_imports(p: Path) -> set:
    """Imports of a module, and the module names it spells in strings (import_module)."""
    package = ".".join(p.relative_to(ROOT.parent).parts[:-1])
    tree = ast.parse(p.read_text())
    strings = {n.value for n in ast.walk(tree)
               if isinstance(n, ast.Constant) and isinstance(n.value, str)
               and re.fullmatch(r"fedalign(\.\w+)+", n.value)}
    return _imports(tree, package) | strings


def _name(p: Path) -> str:
    return ".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")


def test_library_modules_never_import_the_cli():
    files = _library_files()
    assert ROOT / "dadil" / "evaluation.py" in files and ROOT / "evaluate.py" in files
    bad = [str(p.relative_to(ROOT)) for p in files
           if any(n == "fedalign.cli" or n.startswith("fedalign.cli.") for n in _module_imports(p))]
    assert bad == []


def test_import_checker_sees_relative_and_absolute_cli_imports():
    src = "from .cli import app\nimport fedalign.cli.app\nfrom . import cli\n"
    names = _imports(ast.parse(src), "fedalign")
    assert {"fedalign.cli", "fedalign.cli.app"} <= names


def test_the_flower_app_imports_the_library_only_through_its_lib_module():
    """fedalign/flower/_lib.py is the one door of the Flower app into the rest of fedalign
    (docs/architecture.md): no other module of fedalign/flower/ imports ``fedalign.X`` outside
    ``fedalign.flower``, at the top or inside a function."""
    flower = sorted((ROOT / "flower").glob("*.py"))
    assert {"_lib.py", "server_app.py", "handlers.py"} <= {p.name for p in flower}
    bad = [f"{p.name} imports {n}" for p in flower if p.name != "_lib.py"
           for n in sorted(_module_imports(p))
           if (n == "fedalign" or n.startswith("fedalign."))
           and n != "fedalign.flower" and not n.startswith("fedalign.flower.")]
    assert bad == []
    src = "def f():\n    from fedalign.errors import FedalignError\nfrom fedalign import files\n"
    assert {"fedalign.errors", "fedalign", "fedalign.files"} <= _imports(ast.parse(src),
                                                                         "fedalign.flower")
    assert "fedalign.files" in _imports(ast.parse("from .. import files\n"), "fedalign.flower")


def _room_of(name: str, rooms) -> str | None:
    best = None
    for r in rooms:
        if name == r or name.startswith(r + "."):
            best = r if best is None or len(r) > len(best) else best
    return best


#: Rooms every room may use (the page's opening paragraph says so).
EVERYWHERE = {"fedalign.errors", "fedalign.defaults", "fedalign.version"}
#: The page's words for "any room" in a "May import" sentence.
ANY = ("everything", "the library")


def _rooms() -> set:
    """Every room of the package: its top-level modules and subpackages, the subpackages'
    modules (``fedalign.dadil.gossip``) and the package face ``fedalign``."""
    return {"fedalign"} | {_name(p) for p in ROOT.rglob("*.py") if "__pycache__" not in p.parts}


def _paragraphs(text: str) -> list:
    return [" ".join(b.split()) for b in re.split(r"\n\s*\n", text) if b.strip()]


def _rule_subject(paragraph: str, before: str) -> list:
    """The rooms a "may import" sentence is about: the backticked room named just before
    it in the same sentence ("The subpackage `fedalign.dadil` may import …", "the private
    `fedalign._bures_fixed_point` (may import: …"), else the paragraph's bold headings."""
    sentence = re.split(r"(?<=[.;])\s", before)[-1]
    own = re.findall(r"`(fedalign(?:\.\w+)*)`[^`]*$", sentence)
    if own:
        return own[-1:]
    return re.findall(r"\*\*`(fedalign(?:\.\w+)*)`\*\*", paragraph)


def _clause(text: str) -> str:
    """``text`` up to the end of its sentence: a full stop before a capital (or the end), or
    a semicolon outside parentheses."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == ";" and depth == 0:
            return text[:i]
        if ch == "." and re.match(r"\.(\s+[A-Z*]|\s*$)", text[i:]):
            return text[:i]
    return text


def page_rules(text: str, rooms: set) -> dict:
    """{room: the rooms docs/architecture.md lets it import}: a set, None for any room, or
    ("not", rooms) for any room but those.

    Every "May import: …" (any case) up to the end of its sentence; each backticked name
    in it that is a room (``files`` or ``fedalign.files``) is allowed, except those the
    sentence says "never" of; "nothing" allows none; "everything" / "the library" allow any
    room but the "never" ones."""
    rules = {}
    for par in _paragraphs(text):
        for m in re.finditer(r"may import:?", par, flags=re.I):
            subjects = _rule_subject(par, par[:m.start()])
            clause = _clause(par[m.end():])
            names, never = set(), set()
            for w in re.findall(r"`([\w.]+)`", clause):
                full = w if w.startswith("fedalign") else f"fedalign.{w}"
                if full in rooms:
                    names.add(full)
                    if re.search(rf"never `{re.escape(w)}`", clause):
                        never.add(full)
            if any(a in clause for a in ANY):
                allowed = ("not", frozenset(never)) if never else None
            else:
                allowed = names - never
            for subj in subjects:
                rules[subj] = allowed
    return rules


def _allowed(rule, target: str) -> bool:
    if rule is None:
        return True
    if isinstance(rule, tuple):
        return _room_of(target, rule[1]) is None
    return _room_of(target, rule) is not None


def _violations(rules: dict, files=None) -> list:
    """Every import of a library module that its room's rule on the page does not allow (its
    room: the longest name with a rule that the module is, or is inside of)."""
    bad = []
    for p in files or _library_files():
        name = _name(p)
        room = _room_of(name, rules)
        if room is None:
            bad.append(f"{name}: no sentence of the page says what it may import")
            continue
        for imp in _module_imports(p):
            if not imp.startswith("fedalign.") or _room_of(imp, [room]) == room:
                continue
            if _room_of(imp, EVERYWHERE) or _allowed(rules[room], imp):
                continue
            bad.append(f"{name} imports {imp} (the page allows {_show(rules[room])})")
    return sorted(set(bad))


def _show(rule) -> str:
    if rule is None:
        return "anything"
    if isinstance(rule, tuple):
        return "anything but " + ", ".join(sorted(rule[1]))
    return ", ".join(sorted(rule)) or "nothing"


def test_rooms_import_only_what_the_page_allows():
    """Every "May import" sentence of docs/architecture.md, parsed, against every import
    (lazy ones and ``import_module`` strings included) of every library module."""
    rules = page_rules(DOC.read_text(), _rooms())
    assert len(rules) >= 30 and rules["fedalign.errors"] == set()
    assert rules["fedalign.linalg"] == {"fedalign.backend"}   # "(never `files`, …)"
    assert _violations(rules) == []


def test_page_rules_catch_a_planted_import(tmp_path, monkeypatch):
    """The check can fail: an import its room's sentence does not name is reported, and so
    is a module no sentence covers; the sentence forms of the page parse as meant."""
    rules = page_rules(DOC.read_text(), _rooms())
    fake = tmp_path / "results.py"
    fake.write_text((ROOT / "results.py").read_text() + "\nfrom fedalign.stats import x\n")
    monkeypatch.setattr(f"{__name__}._name", lambda p: "fedalign.results")
    monkeypatch.setattr(f"{__name__}._module_imports",
                        lambda p: _imports(ast.parse(p.read_text()), "fedalign"))
    assert [b for b in _violations(rules, [fake]) if "fedalign.stats" in b]
    monkeypatch.setattr(f"{__name__}._name", lambda p: "fedalign.nowhere")
    assert "no sentence" in _violations({"fedalign.x": set()}, [fake])[0]
    sample = ("**`fedalign.a`** — x. May import: `b`, `c` (notes). More.\n\n"
              "**`fedalign.cli`** — y. May import: everything. Nothing imports it.\n\n"
              "**`fedalign.flower`** — z. May import: the library, never `fedalign.cli`.\n\n"
              "The subpackage `fedalign.d` may import `b`; inside it, `c` is never used.\n")
    r = page_rules(sample, {"fedalign.a", "fedalign.b", "fedalign.c", "fedalign.cli",
                            "fedalign.d", "fedalign.flower"})
    assert r["fedalign.a"] == {"fedalign.b", "fedalign.c"} and r["fedalign.cli"] is None
    assert r["fedalign.d"] == {"fedalign.b"}
    assert not _allowed(r["fedalign.flower"], "fedalign.cli.app")
    assert _allowed(r["fedalign.flower"], "fedalign.stats")


def test_dadil_never_imports_evaluate_and_results_imports_nothing():
    """The shared result types live in fedalign.results, which imports nothing of fedalign but
    its errors; DaDiL's evaluation takes them from there, never from fedalign.evaluate (the
    direction evaluate → dadil, for ``evaluate --method dadil``, is the only one)."""
    bad = [f"{_name(p)} imports {imp}" for p in sorted((ROOT / "dadil").rglob("*.py"))
           for imp in _module_imports(p) if _room_of(imp, ["fedalign.evaluate"])]
    assert bad == []
    names = _module_imports(ROOT / "results.py")
    assert {n for n in names if n == "fedalign" or n.startswith("fedalign.")} <= {
        "fedalign.errors", "fedalign.errors.FedalignError"}


def _top_room(name: str, rooms: set) -> str | None:
    """The top-level room of a module name: ``fedalign.X`` for a module or package X of
    fedalign, ``fedalign`` (the package face) for a name of the face (``fedalign.__version__``)."""
    parts = name.split(".")
    if parts[0] != "fedalign" or len(parts) == 1:
        return None  # not fedalign; or ``from fedalign import X`` (the room X counts)
    return f"fedalign.{parts[1]}" if parts[1] in rooms else "fedalign"


def _room_graph() -> dict:
    """{room: rooms it imports}, lazy (inside functions) and top-level imports alike."""
    rooms = {p.stem for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    graph = {}
    for p in ROOT.rglob("*.py"):
        room = _top_room(_name(p), rooms) or "fedalign"
        for imp in _module_imports(p):
            target = _top_room(imp, rooms)
            if target is not None and target != room:
                graph.setdefault(room, set()).add(target)
    return graph


def _cycle(graph: dict) -> list | None:
    """One cycle of ``graph`` as [a, b, …, a], or None."""
    import graphlib

    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_no_import_cycle_between_top_level_rooms():
    graph = _room_graph()
    assert "fedalign.dadil" in graph["fedalign.evaluate"]  # lazy imports are counted
    assert _cycle(graph) is None
    assert _cycle({"a": {"b"}, "b": {"a"}}) is not None


def test_dadil_rooms_import_only_rooms_above_them():
    """Inside fedalign.dadil, the order of docs/architecture.md (and of the package docstring)
    is a layering: a room imports only rooms listed before it."""
    order = ["distances", "barycenter", "atoms", "gradients", "optim", "dictionary", "rng", "state",
             "gossip", "simulation", "consensus", "classification_em", "target_head",
             "classifiers", "evaluation",
             "envelope"]
    bad = []
    for i, room in enumerate(order):
        p = ROOT / "dadil" / f"{room}.py"
        for imp in _module_imports(p):
            parts = imp.split(".")
            if parts[:2] == ["fedalign", "dadil"] and len(parts) > 2 and parts[2] in order:
                if order.index(parts[2]) >= i:
                    bad.append(f"{room} imports {parts[2]}")
    assert sorted(set(bad)) == []
    listed = sorted(p.stem for p in (ROOT / "dadil").glob("*.py") if p.stem != "__init__")
    assert listed == sorted(order)


def test_long_modules_are_justified_in_the_architecture_page():
    text = DOC.read_text()
    section = text.partition("## Modules over 450 lines")[2].partition("\n## ")[0]
    justified = set(re.findall(r"`(fedalign/[\w/]+\.py)`", section))
    long = {str(p.relative_to(ROOT.parent)) for p in _library_files()
            if len(p.read_text().splitlines()) > MAX_LINES}
    assert long - justified == set(), "over 450 lines and not justified in docs/architecture.md"
    assert justified - long == set(), "justified in docs/architecture.md but no longer long"


def test_every_dadil_room_has_a_paragraph():
    text = DOC.read_text()
    for p in sorted((ROOT / "dadil").glob("*.py")):
        if p.stem != "__init__":
            assert f"`fedalign.dadil.{p.stem}`" in text, p.stem


def test_readme_library_example_runs(tmp_path, monkeypatch):
    """The README's "Library" section: its example runs as written and the target scores."""
    import contextlib
    import io

    readme = (ROOT.parent / "README.md").read_text(encoding="utf-8")
    section = readme.partition("\n## Library\n")[2].partition("\n## ")[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 11
    for room in ("fedalign.dadil", "docs/architecture.md"):
        assert room in section
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert float(out.getvalue()) >= 0.9
    assert sorted(p.name for p in (tmp_path / "fed" / "state").iterdir()) == [
        "a.state.npz", "b.state.npz", "t.state.npz"]


def test_dadil_has_one_numpy_implementation_per_algorithm():
    """No torch in fedalign.dadil (the autograd twins are tests/dadil_torch_reference.py), and
    no second barycenter builder or numpy/torch pair of names."""
    for p in sorted((ROOT / "dadil").glob("*.py")):
        names = _module_imports(p)
        assert not any(n == "torch" or n.startswith("torch.") for n in names), p.name
        text = p.read_text()
        for twin in ("_np(", "backend=", "barycenter_gmm(", "labeled_barycenter_np"):
            assert twin not in text, (p.name, twin)
