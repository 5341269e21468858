"""What the package tells a user who got something wrong: no driver to load, a stream passed
positionally where it is keyword-only, and the reprs that show what an object holds."""

import os
import subprocess
import sys
import textwrap


def test_no_driver_names_the_variable_and_the_emulated_driver(tmp_path):
    missing = tmp_path / "no-driver-here" / "libcuda.so.1"
    script = textwrap.dedent(
        """
        import custody
        try:
            custody.system.num_devices
        except custody.CUDAError as error:
            print(type(error).__name__, error.name, error.code)
            print(error)
        else:
            print("no error")
        """
    )
    env = dict(os.environ, CUSTODY_CUDA_DRIVER=str(missing))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    first, message = out.stdout.split("\n", 1)
    assert first == "CUDAError CUDA_ERROR_NOT_FOUND 500", out.stdout
    # What was tried, which variable names a driver, and how to get the emulated one.
    for part in (
        str(missing),
        "CUSTODY_CUDA_DRIVER",
        "libcuda_emu.so",
        "cargo build -p cuda-custody-emu",
    ):
        assert part in message, (part, message)
