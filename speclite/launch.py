"""The `speclite` command's entry point: Ctrl-C while the modules load (torch's import takes a second
or two) ends it as a Ctrl-C later does, with one line and exit code 130, not an import's traceback."""

import os
import sys


def main() -> None:
    try:
        from speclite.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        os._exit(130)  # nothing ran; the finalization of modules imported halfway could end it by the signal
    run()


if __name__ == "__main__":
    main()
