"""mars-cli: margin-aware speculative decoding (MARS) as a command-line toolkit."""

__version__ = "0.1.0"
