"""Install check: the custody wheel, installed by pip into a fresh virtual environment, works.

Run with that environment's interpreter, isolated from the source tree (``python -I``), with a
driver to load (``CUSTODY_CUDA_DRIVER`` pointing at the emulated driver, or a GPU host's
``libcuda.so.1``). It checks what a user's ``pip install custody-*.whl`` gets:

- ``custody`` is imported from the environment's site-packages, with its compiled extension
  ``custody._custody`` beside it (not from a source checkout or ``PYTHONPATH``);
- the extension's stub ``_custody.pyi`` and the ``py.typed`` marker are installed and listed in
  the wheel's ``RECORD``; the stub parses and describes ``Buffer`` (the pure-Python modules are
  their own stubs: inline annotations);
- the metadata a package index shows: summary, a Markdown long description, project URLs,
  ``Requires-Python``, the license;
- allocate, fill, copy device to device and to pinned host memory, read the bytes back, close;
- ``help()`` renders the package and ``Buffer.close``.

Prints one line per check and exits 0, or raises (exit status 1) at the first failure.
``cargo xtask test`` runs it against the emulator; the GPU bundle's ``run.py`` on the GPU host.
"""

import ast
import contextlib
import ctypes
import importlib.machinery
import importlib.metadata
import io
import os
import pydoc
import sys
import sysconfig

CHECKS = []


def check(what):
    """Records a passed check and prints it."""
    CHECKS.append(what)
    print(f"ok: {what}")


def installed_package():
    import custody

    package_dir = os.path.dirname(os.path.realpath(custody.__file__))
    site_dirs = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
    assert os.path.dirname(package_dir) in site_dirs, (
        f"custody was imported from {package_dir}, not from this environment's site-packages "
        f"{sorted(site_dirs)}"
    )
    check(f"import custody from {package_dir}")

    extension = os.path.realpath(custody._custody.__file__)
    assert os.path.dirname(extension) == package_dir, f"the extension is at {extension}"
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    assert any(extension.endswith(s) for s in suffixes), (
        f"{extension} does not end with one of this interpreter's extension suffixes {suffixes}"
    )
    check(f"compiled extension {os.path.basename(extension)}")
    return custody, package_dir


def stubs_and_marker(package_dir):
    stub = os.path.join(package_dir, "_custody.pyi")
    marker = os.path.join(package_dir, "py.typed")
    assert os.path.isfile(stub), f"no stub of the extension: {stub} is missing"
    assert os.path.isfile(marker), f"no py.typed marker: {marker} is missing"
    with open(stub, encoding="utf-8") as f:
        tree = ast.parse(f.read(), stub)
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert "Buffer" in classes and "DeviceMemoryResource" in classes, (
        f"the stub describes no Buffer / DeviceMemoryResource (classes: {sorted(classes)})"
    )
    recorded = {str(path) for path in importlib.metadata.files("custody") or []}
    for name in ("custody/_custody.pyi", "custody/py.typed"):
        assert name in recorded, f"{name} is not in the wheel's RECORD"
    assert any(p.startswith("custody/_custody") for p in recorded), (
        "the extension is not in the wheel's RECORD"
    )
    check(f"the extension's stub ({len(classes)} classes) and py.typed installed and recorded")


def metadata(custody):
    meta = importlib.metadata.metadata("custody")
    assert meta["Name"] == "custody", meta["Name"]
    assert meta["Version"] == custody.__version__, (meta["Version"], custody.__version__)
    assert meta["Summary"], "no summary"
    assert meta["Requires-Python"] == ">=3.11", meta["Requires-Python"]
    content_type = meta["Description-Content-Type"] or ""
    assert content_type.startswith("text/markdown"), content_type
    description = meta.get_payload() or meta["Description"] or ""
    assert description.lstrip().startswith("# custody"), (
        f"the long description does not start with the README's title: {description[:80]!r}"
    )
    urls = meta.get_all("Project-URL") or []
    assert urls, "no project URLs"
    assert meta["License"] or meta["License-Expression"], "no license"
    check(
        f"metadata: {meta['Name']} {meta['Version']}, Requires-Python {meta['Requires-Python']}, "
        f"a {len(description)}-character Markdown description, {len(urls)} project URL(s)"
    )


def allocate_copy_close(custody):
    size = 1 << 16
    device = custody.Device(0)
    device.set_current()
    stream = device.create_stream()
    mr = custody.DeviceMemoryResource(device)
    pinned = custody.LegacyPinnedMemoryResource()
    src = mr.allocate(size, stream=stream)
    src.fill(0x5A, stream=stream)
    dst = src.copy_to(stream=stream)
    host = pinned.allocate(size, stream=stream)
    host.copy_from(dst, stream=stream)
    stream.sync()
    data = ctypes.string_at(host.handle, size)
    assert data == b"\x5a" * size, "the bytes read back are not the bytes filled"
    for buffer in (src, dst, host):
        buffer.close()
        assert buffer.is_closed and buffer.handle == 0
    stream.close()
    check(f"allocate, fill, copy device -> device -> pinned host, read back, close ({size} bytes)")


def help_works(custody):
    text = pydoc.render_doc(custody, renderer=pydoc.plaintext)
    for name in ("Buffer", "DeviceMemoryResource", "CUDAError"):
        assert name in text, f"help(custody) does not mention {name}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        help(custody.Buffer.close)
    shown = out.getvalue()
    assert "close" in shown and custody.Buffer.close.__doc__, (
        f"help(custody.Buffer.close) shows no documentation: {shown!r}"
    )
    check(f"help(custody) ({len(text)} characters) and help(custody.Buffer.close)")


def main():
    gil = getattr(sys, "_is_gil_enabled", None)
    print(
        f"install check: Python {sys.version.split()[0]} at {sys.executable}"
        + (f", GIL {'enabled' if gil() else 'disabled'}" if gil else "")
    )
    custody, package_dir = installed_package()
    stubs_and_marker(package_dir)
    metadata(custody)
    allocate_copy_close(custody)
    help_works(custody)
    print(f"install check: {len(CHECKS)} checks passed")


if __name__ == "__main__":
    main()
