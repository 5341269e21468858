"""The package's types as a type checker reads them (PEP 561: the package ships ``py.typed``).

A pure-Python module is its own stub: it carries inline annotations (every parameter and return
of its public functions and methods) and has no ``.pyi`` beside it, which would repeat its
docstrings and signatures. The one stub is ``_custody.pyi``, for the compiled extension
``custody._custody``, whose signatures and types no Python source shows. It matches the
extension: every name it stubs exists, every public name and class member of the extension is
stubbed, every stub item has a docstring, parameter names and kinds agree with the runtime
signatures, and each stub docstring is the runtime ``__doc__`` of the same name, word for word.
Every name a public module exports (``__all__``) is typed one of the two ways.

The extension's docstrings are the source: the Rust doc comments on the ``#[pyclass]`` /
``#[pymethods]`` items in ``pybind/src/``. After changing one, copy the texts into the stub with
the package built from this tree and installed editable (``maturin develop --manifest-path
pybind/Cargo.toml`` in ``.venv``)::

    CUSTODY_CUDA_DRIVER=$PWD/target/debug/libcuda_emu.so python pybind/tests/test_stubs.py --write

(``--check`` lists the differences without writing). A constructor is documented in its class's
docstring (``help(cls)`` shows it under the signature), so stub ``__init__`` / ``__new__`` have
none. No docstring cites a document a user of the package does not have.
"""

import ast
import inspect
import os
import re
import sys
import types

import pytest

import importlib

import custody
import custody.emulator
import custody.interop
import custody.utils

# The stubbed module: the compiled extension (``_custody.pyi``).
MODULES = ["custody._custody"]

# The public pure-Python modules, each its own stub.
PURE_MODULES = ["custody", "custody.utils", "custody.interop", "custody.emulator"]

# The pure-Python modules that define what those export.
DEFINING_MODULES = PURE_MODULES + ["custody._properties"]


def stub_file(module="custody._custody", folder=None):
    """The stub of ``module`` in ``folder`` (default: the imported package's folder)."""
    folder = folder or os.path.dirname(custody.__file__)
    return os.path.join(folder, module.rsplit(".", 1)[1] + ".pyi")


STUB = stub_file()


def stub_tree(module="custody._custody"):
    with open(stub_file(module)) as f:
        return ast.parse(f.read())


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_protocol(node):
    """Whether a stub class is a typing device (a ``Protocol``), which has no runtime class."""
    return any(getattr(base, "id", None) == "Protocol" for base in node.bases)


def stub_classes(module="custody._custody"):
    return {n.name: n for n in stub_tree(module).body if isinstance(n, ast.ClassDef)}


def stub_members(cls):
    members = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            setter = any(
                isinstance(d, ast.Attribute) and d.attr == "setter" for d in node.decorator_list
            )
            if not setter:
                members[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            members[node.target.id] = node
    return members


def stub_names(module="custody._custody"):
    """The runtime names the stub declares: classes other than typing protocols, functions and
    annotated variables (not type aliases, which exist only for type checkers)."""
    names = set()
    for node in stub_tree(module).body:
        if isinstance(node, ast.ClassDef) and not is_protocol(node):
            names.add(node.name)
        elif isinstance(node, ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_the_typed_marker_ships():
    assert os.path.exists(os.path.join(os.path.dirname(custody.__file__), "py.typed"))


def test_only_the_extension_has_a_stub():
    folder = os.path.dirname(custody.__file__)
    stubs = sorted(name for name in os.listdir(folder) if name.endswith(".pyi"))
    assert stubs == [os.path.basename(stub_file(m)) for m in MODULES], (
        "a pure-Python module is its own stub (inline annotations): remove its .pyi"
    )


@pytest.mark.parametrize("module", MODULES)
def test_every_stubbed_name_exists_and_every_public_name_is_stubbed(module):
    runtime = importlib.import_module(module)
    names = stub_names(module)
    missing = sorted(name for name in names if not hasattr(runtime, name))
    assert missing == [], f"stubbed but not in {module}: {missing}"
    public = {name for name in vars(runtime) if not name.startswith("_")}
    assert public <= names, f"{module}: public names without stubs: {sorted(public - names)}"


def source_tree(module):
    with open(importlib.import_module(module).__file__) as f:
        return ast.parse(f.read())


def unannotated(module):
    """The public functions and methods (constructors and ``__call__`` included) defined in
    ``module``'s source that leave a parameter (other than ``self`` / ``cls``) or the return
    without an annotation."""
    out = []

    def check(fn, where):
        args = fn.args
        params = args.posonlyargs + args.args + args.kwonlyargs
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        for i, param in enumerate(params):
            if i == 0 and param.arg in ("self", "cls"):
                continue
            if param.annotation is None:
                out.append(f"{where}({param.arg})")
        if fn.returns is None:
            out.append(f"{where} -> ?")

    for node in source_tree(module).body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            check(node, node.name)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for member in node.body:
                if isinstance(member, ast.FunctionDef) and (
                    not member.name.startswith("_")
                    or member.name in ("__init__", "__new__", "__call__")
                ):
                    check(member, f"{node.name}.{member.name}")
    return out


@pytest.mark.parametrize("module", DEFINING_MODULES)
def test_pure_python_modules_are_annotated(module):
    assert unannotated(module) == [], (
        f"{module} is its own stub: annotate these {unannotated(module)}"
    )


def defined_names(module):
    """The names ``module``'s source defines at its top level."""
    names = set()
    for node in source_tree(module).body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("module", PURE_MODULES)
def test_every_exported_name_is_typed(module):
    """Each name in ``__all__`` is the extension's (and stubbed), or defined in a custody Python
    module's source (which the annotation test reads)."""
    runtime = importlib.import_module(module)
    extension = vars(custody._custody)
    stubbed = stub_names()
    untyped = []
    for name in runtime.__all__:
        value = getattr(runtime, name)
        if any(value is extension.get(n) for n in (name, getattr(value, "__name__", name))):
            if getattr(value, "__name__", name) not in stubbed and name not in stubbed:
                untyped.append(name)
            continue
        home = getattr(value, "__module__", None) if isinstance(value, (type, types.FunctionType)) else module
        if home is None or not home.startswith("custody") or name not in defined_names(home):
            untyped.append(name)
    assert untyped == [], f"{module}: exported names neither stubbed nor defined in Python: {untyped}"


def test_every_stub_item_has_a_docstring():
    missing = []
    nodes = []
    for node in [n for module in MODULES for n in stub_tree(module).body]:
        if isinstance(node, ast.ClassDef) and node.name == "_CudaStreamLike":
            continue  # a typing device (the __cuda_stream__ protocol), not API
        nodes.extend(ast.walk(node))
    for node in nodes:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Attribute) and d.attr == "setter" for d in node.decorator_list
            ):
                continue
            if isinstance(node, ast.FunctionDef) and node.name in ("__init__", "__new__"):
                continue  # the class's docstring says how to construct it
            if ast.get_docstring(node) is None:
                missing.append(node.name)
    assert missing == [], missing


@pytest.mark.parametrize(
    ("module", "name"),
    sorted((m, n) for m in MODULES for n, node in stub_classes(m).items() if not is_protocol(node)),
)
def test_class_members_match(module, name):
    cls = getattr(importlib.import_module(module), name)
    stub = stub_members(stub_classes(module)[name])
    for member, node in stub.items():
        if isinstance(node, ast.AnnAssign) and issubclass(cls, BaseException):
            continue  # set on each exception instance
        assert hasattr(cls, member), f"{name}.{member} is stubbed but missing"
    runtime = {
        m
        for m in vars(cls)
        if not is_private(m) and not (m.startswith("__") and m.endswith("__"))
    }
    unstubbed = runtime - set(stub)
    assert not unstubbed, f"{name}: public members without stubs: {sorted(unstubbed)}"


def parameters_of(node):
    args = node.args
    params = [(a.arg, "positional") for a in args.posonlyargs + args.args]
    if args.vararg:
        params.append(("*" + args.vararg.arg, "var"))
    params += [(a.arg, "keyword") for a in args.kwonlyargs]
    if args.kwarg:
        params.append(("**" + args.kwarg.arg, "var"))
    return params


def runtime_parameters(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    out = []
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            out.append((p.name, "positional"))
        elif p.kind is p.VAR_POSITIONAL:
            out.append(("*" + p.name, "var"))
        elif p.kind is p.KEYWORD_ONLY:
            out.append((p.name, "keyword"))
        else:
            out.append(("**" + p.name, "var"))
    return out


def test_signatures_match():
    checked = 0
    nodes = [(importlib.import_module(m), n) for m in MODULES for n in stub_tree(m).body]
    for runtime_module, node in nodes:
        if isinstance(node, ast.FunctionDef):
            pairs = [(node, getattr(runtime_module, node.name), False)]
        elif isinstance(node, ast.ClassDef) and not is_protocol(node):
            cls = getattr(runtime_module, node.name)
            pairs = []
            for member in node.body:
                if not isinstance(member, ast.FunctionDef):
                    continue
                decorators = {getattr(d, "id", getattr(d, "attr", None)) for d in member.decorator_list}
                if "property" in decorators or "setter" in decorators:
                    continue
                if member.name in ("__init__", "__new__", "__exit__", "__enter__"):
                    continue
                bound = "staticmethod" not in decorators
                pairs.append((member, inspect.getattr_static(cls, member.name), bound))
        else:
            continue
        for stub_fn, runtime, drop_first in pairs:
            if isinstance(runtime, (staticmethod, classmethod)):
                drop_first = isinstance(runtime, classmethod)
                runtime = runtime.__func__
            expected = parameters_of(stub_fn)
            if drop_first:
                expected = expected[1:]
            got = runtime_parameters(runtime)
            if got is None:
                continue
            if got and got[0][0] in ("self", "cls", "$self", "$cls"):
                got = got[1:]
            if drop_first and got and got[0][0] in ("cls",):
                got = got[1:]
            assert got == expected, f"{stub_fn.name}: runtime {got} != stub {expected}"
            checked += 1
    assert checked >= 20, checked


# --- The docstrings: runtime and stubs say the same ---


def is_setter(node):
    return any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in node.decorator_list)


CONSTRUCTORS = ("__init__", "__new__")


def runtime_doc(obj):
    """The docstring Python shows for a class member as found in the class ``__dict__``."""
    obj = getattr(obj, "__func__", obj)  # staticmethod / classmethod objects
    return obj.__doc__


def documented_pairs(module="custody._custody"):
    """``(qualified name, stub node, runtime docstring)`` for the module and every stubbed
    class, method, property and function whose docstring Python shows at run time: not variables or fields
    (no runtime docstring), setters (the property's), constructors (the class's), C slots
    such as ``__sub__`` (CPython's text) or typing protocols."""
    runtime_module = importlib.import_module(module)
    tree = stub_tree(module)
    prefix = module + "."
    pairs = [(module, tree, runtime_module.__doc__)]
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            pairs.append((prefix + node.name, node, getattr(runtime_module, node.name).__doc__))
        if not isinstance(node, ast.ClassDef) or is_protocol(node):
            continue
        cls = getattr(runtime_module, node.name)
        pairs.append((prefix + node.name, node, cls.__doc__))
        for member in node.body:
            if not isinstance(member, ast.FunctionDef) or is_setter(member):
                continue
            if member.name in CONSTRUCTORS:
                continue
            name = f"{prefix}{node.name}.{member.name}"
            try:
                obj = inspect.getattr_static(cls, member.name)
            except AttributeError:
                pairs.append((name, member, None))
                continue
            if isinstance(obj, types.WrapperDescriptorType):
                continue  # a C slot (`__sub__`): CPython's own text, which no extension sets
            pairs.append((name, member, runtime_doc(obj)))
    return pairs


def clean(doc):
    return inspect.cleandoc(doc).strip() if doc else None


def docstring_differences(module="custody._custody"):
    """``(name, node, stub text, runtime text)`` where the two differ or one is missing."""
    out = []
    for name, node, doc in documented_pairs(module):
        stub = clean(ast.get_docstring(node, clean=True))
        runtime = clean(doc)
        if stub != runtime or runtime is None:
            out.append((name, node, stub, runtime))
    return out


def test_constructors_are_documented_by_their_class():
    with_text = [
        f"{cls.name}.{member.name}"
        for module in MODULES
        for cls in stub_tree(module).body
        if isinstance(cls, ast.ClassDef)
        for member in cls.body
        if isinstance(member, ast.FunctionDef)
        and member.name in CONSTRUCTORS
        and ast.get_docstring(member) is not None
    ]
    assert with_text == [], (
        "help() shows the class docstring for a constructor: move these stub docstrings into "
        f"their class's docstring (in the Rust doc comment or __init__.py): {with_text}"
    )


@pytest.mark.parametrize("module", MODULES)
def test_runtime_docstrings_are_the_stubs(module):
    differences = docstring_differences(module)
    shown = []
    for name, _node, stub, runtime in differences:
        if runtime is None:
            shown.append(f"{name}: no runtime docstring (stub: {stub!r})")
        else:
            shown.append(f"{name}:\n  runtime: {runtime!r}\n  stub:    {stub!r}")
    assert not differences, (
        "the stubs' docstrings must be the runtime ones (write the text in the Rust doc comment "
        "or __init__.py, then `python pybind/tests/test_stubs.py --write`):\n"
        + "\n".join(shown)
    )


# --- No docstring points at a document the package's user does not have ---

# The project's design documents, and how its code cites them: a Markdown file, the docs folder,
# a source folder, a decision (D4), a measured driver fact (F16, G2), a numbered section or
# scenario of the reference notes, an issue. A docstring states the rule itself instead.
REPOSITORY_REFERENCE = re.compile(
    r"\w\.md\b|\bdocs/|\b(?:pybind|handles|memory|cuda-sys|cuda-emu|xtask|src|tests)/"
    r"|\b[DFG]\d{1,2}\b|\bsection \d|\bscenarios? \d|\bissues? #?\d|\bBRIEF\b"
)


def runtime_docstrings():
    """``(name, docstring)`` for the package, its extension module and everything they define:
    every class and every member its ``__dict__`` holds, every function, public or not."""
    modules = [m for n, m in sorted(sys.modules.items()) if n == "custody" or n.startswith("custody.")]
    seen = set()
    out = []

    def add(name, obj):
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and id(obj) not in seen:
            seen.add(id(obj))
            out.append((name, doc))

    for module in modules:
        add(module.__name__, module)
        for attr, value in vars(module).items():
            where = f"{module.__name__}.{attr}"
            if inspect.isclass(value) and value.__module__.split(".")[0] == "custody":
                add(where, value)
                for member, obj in vars(value).items():
                    if member in ("__doc__", "__module__", "__dict__", "__weakref__"):
                        continue
                    add(f"{where}.{member}", getattr(obj, "__func__", obj))
                    if isinstance(obj, property):
                        add(f"{where}.{member}", obj.fget)
            elif inspect.isfunction(value) or inspect.isbuiltin(value):
                if (getattr(value, "__module__", None) or "").split(".")[0] == "custody":
                    add(where, value)
    return out


def test_the_reference_rule_itself():
    cites = REPOSITORY_REFERENCE.search
    for text in (
        "Memory with a recipe (" + "BRI" + "EF.md D1).",
        "see docs/decisions.md",
        "as decided (D10)",
        "the driver does this (F16)",
        "section 6 item 5",
        "scenario 64",
        "pybind/src/buffer.rs",
    ):
        assert cites(text), text
    for text in (
        "The size in bytes; 0 once closed.",
        "``(0, handle)``: the CUDA stream protocol.",
        "kDLCUDAManaged (13)",
        "an int in [0, 256) (8 bits)",
        "``cuMemFreeAsync`` on the recipe's stream",
        "(0xD1F) is an address",
        "built into target/debug/libcuda_emu.so",
    ):
        assert not cites(text), text


def test_no_docstring_cites_the_repository():
    docs = runtime_docstrings()
    assert len(docs) > 100, len(docs)
    found = [
        f"{name}: {match.group(0)!r} in {doc!r}"
        for name, doc in docs
        for match in [REPOSITORY_REFERENCE.search(doc)]
        if match
    ]
    assert found == [], (
        "a docstring cites a document the package's users do not have; say the rule "
        "itself:\n" + "\n".join(found)
    )


@pytest.mark.parametrize("module", MODULES)
def test_no_stub_cites_the_repository(module):
    with open(stub_file(module)) as f:
        lines = f.read().splitlines()
    found = [
        f"{os.path.basename(stub_file(module))}:{n}: {line.strip()}"
        for n, line in enumerate(lines, 1)
        if REPOSITORY_REFERENCE.search(line)
    ]
    assert found == [], "\n".join(found)


# --- Copying the runtime docstrings into the stubs (``--write``) ---


def format_docstring(text, indent):
    """``text`` as a docstring at ``indent`` columns, as lines."""
    if '"""' in text:
        raise ValueError(f"a docstring with triple quotes cannot be written: {text!r}")
    prefix = "r" if "\\" in text else ""
    pad = " " * indent
    lines = text.split("\n")
    if len(lines) == 1:
        return [f'{pad}{prefix}"""{text}"""']
    out = [f'{pad}{prefix}"""{lines[0]}']
    out += [f"{pad}{line}" if line else "" for line in lines[1:]]
    out.append(f'{pad}"""')
    return out


# The stubs of this source tree (``--write`` edits them, not an installed copy).
SOURCE_FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "custody")


def rewrite_stub_docstrings(module="custody._custody"):
    """Writes each runtime docstring into ``module``'s stub where they differ; returns the names
    changed. A stub item with a body of ``...`` gets the docstring in its place."""
    stub = stub_file(module)
    if not os.path.samefile(stub, stub_file(module, SOURCE_FOLDER)):
        sys.exit(
            f"custody is imported from {os.path.dirname(custody.__file__)}, not this tree: "
            "install it editable (maturin develop --manifest-path pybind/Cargo.toml)"
        )
    with open(stub) as f:
        lines = f.read().split("\n")
    edits = []  # (first line index, end line index, replacement lines)
    changed = []
    for name, node, _stub, runtime in docstring_differences(module):
        if runtime is None:
            continue
        first = node.body[0]
        row = first.lineno - 1
        # `def f(self) -> int: ...`: the body shares the header's last line.
        inline = lines[row][: first.col_offset].strip() != ""
        indent = node.col_offset + 4 if inline else first.col_offset
        text = format_docstring(runtime, indent)
        if ast.get_docstring(node) is not None and not inline:
            edits.append((row, first.end_lineno, text))
        elif isinstance(first, ast.Expr) and first.value.value is Ellipsis:
            if inline:
                head = lines[row][: first.col_offset].rstrip()
                edits.append((row, row + 1, [head] + text))
            else:
                edits.append((row, first.end_lineno, text))
        else:
            raise ValueError(f"{name}: cannot place a docstring in the stub")
        changed.append(name)
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = text
    with open(stub, "w") as f:
        f.write("\n".join(lines))
    return changed


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        names = [n for module in MODULES for n in rewrite_stub_docstrings(module)]
        print(f"{len(names)} stub docstrings written" + "".join(f"\n  {n}" for n in names))
        left = [d[0] for module in MODULES for d in docstring_differences(module)]
        if left:
            sys.exit("without a runtime docstring (write one in the source): " + ", ".join(left))
    elif sys.argv[1:] == ["--check"]:
        for module in MODULES:
            for name, _node, stub, runtime in docstring_differences(module):
                print(f"{name}\n  runtime: {runtime!r}\n  stub:    {stub!r}")
    else:
        sys.exit("usage: test_stubs.py --write | --check")
