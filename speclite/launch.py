"""The `speclite` command's entry point: Ctrl-C while the modules load (torch's import takes a second
or two) ends it as a Ctrl-C later does, with one line and exit code 130, not an import's traceback."""

import sys


def main() -> None:
    try:
        from speclite.cli import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()


if __name__ == "__main__":
    main()
