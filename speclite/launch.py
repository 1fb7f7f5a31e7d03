"""The `speclite` command's entry point: Ctrl-C while the modules load (torch's import takes a second
or two) ends it as a Ctrl-C later does, with one line and exit code 130, not an import's traceback.

The signal is only noted while they load and answered once they have: a KeyboardInterrupt raised in
Python code that a C++ extension's import calls (pybind11) aborted the process instead (exit -6,
"terminate called after throwing an instance of 'pybind11::error_already_set'")."""

import signal
import sys


def main() -> None:
    pressed: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        from speclite.cli import main as run
    finally:
        signal.signal(signal.SIGINT, before)
    if pressed:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
