import subprocess
import sys


def test_package_and_reference_do_not_import_triton() -> None:
    # Triton fixes interpreter mode at its first import, and the CPU engine path uses only the
    # references.
    code = (
        "import sys, baton.kernels, baton.kernels.reference; assert 'triton' not in sys.modules, "
        "'triton imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
