"""`python -m mars_cli.decoding.kernels`: build the q4 kernel now (`make setup` runs it). Exits 1,
with the reason in one line, where it could not be built or loaded; 0 where this CPU cannot run
it (the kernels are optional there)."""

import sys

from . import main

sys.exit(main())
