"""``python -m mxq``: runs the C++ ``mxq`` command-line tool shipped inside this package.

The package carries the executable CMake built (``mxq/bin/mxq``) instead of binding the CLI's
``main``: the tool then behaves exactly as the C++ one (its own exit codes, stdout/stderr
buffering, signals, ``isatty`` checks), and a crash or ``exit()`` inside it cannot take the
calling Python process down.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def executable() -> Path:
    """Path of the bundled ``mxq`` executable."""
    return Path(__file__).resolve().parent / "bin" / "mxq"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    exe = executable()
    if not exe.is_file():
        sys.stderr.write(f"mxq: the bundled executable is missing: {exe}\n")
        return 1
    if argv is None:
        # Replace this process: signals, exit code and terminal handling are the tool's own.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(str(exe), [str(exe), *args])
    import subprocess

    return subprocess.call([str(exe), *args])


if __name__ == "__main__":
    sys.exit(main())
