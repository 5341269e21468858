"""The .pyi stubs match the module: every public name, method and property exists on both sides,
every stub item has a docstring, and parameter names and kinds agree with the runtime
signatures."""

import ast
import inspect
import os

import pytest

import custody

STUB = os.path.join(os.path.dirname(custody.__file__), "__init__.pyi")


def stub_tree():
    with open(STUB) as f:
        return ast.parse(f.read())


def is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def stub_classes():
    return {n.name: n for n in stub_tree().body if isinstance(n, ast.ClassDef)}


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


def test_the_typed_marker_ships():
    assert os.path.exists(os.path.join(os.path.dirname(custody.__file__), "py.typed"))


def test_every_public_name_is_stubbed_and_exists():
    tree = stub_tree()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    assert set(custody.__all__) <= names, set(custody.__all__) - names
    for name in names:
        if name.startswith("_") and name != "__version__":
            continue
        assert hasattr(custody, name), name


def test_every_stub_item_has_a_docstring():
    missing = []
    nodes = []
    for node in stub_tree().body:
        if isinstance(node, ast.ClassDef) and node.name == "_CudaStreamLike":
            continue  # a typing device (the __cuda_stream__ protocol), not API
        nodes.extend(ast.walk(node))
    for node in nodes:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Attribute) and d.attr == "setter" for d in node.decorator_list
            ):
                continue
            if ast.get_docstring(node) is None:
                missing.append(node.name)
    assert missing == [], missing


@pytest.mark.parametrize("name", sorted(n for n in stub_classes() if not n.startswith("_")))
def test_class_members_match(name):
    cls = getattr(custody, name)
    stub = stub_members(stub_classes()[name])
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
    tree = stub_tree()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            pairs = [(node, getattr(custody, node.name), False)]
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            cls = getattr(custody, node.name)
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
