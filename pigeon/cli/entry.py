"""The `pigeon` command's entry point. `pigeon serve` — a server's start, which every restart waits for — goes
to a command line of its one command (pigeon.cli.serve); everything else to the whole one (pigeon.cli.main), whose
import and first parse build every command's options (~0.1 s)."""

from __future__ import annotations

import sys


def main() -> None:
    if sys.argv[1:2] == ["serve"] and not {"--help", "-h"} & set(sys.argv[2:]):
        from pigeon.cli.serve import main as run
    else:  # (serve's help is the whole command line's)
        from pigeon.cli.main import main as run
    run()
