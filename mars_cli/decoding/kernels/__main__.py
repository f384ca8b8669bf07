"""`python -m mars_cli.decoding.kernels`: build the q4 kernel now (`make setup` runs it)."""

from . import main

main()
