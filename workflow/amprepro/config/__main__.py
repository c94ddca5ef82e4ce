"""`python -m amprepro.config check FILE [FILE ...]`: the command line of amprepro.config.cli."""

import sys

from amprepro.config.cli import main

if __name__ == "__main__":
    sys.exit(main())
