"""The installed lpes version, for the files lpes writes (provenance, markers, the Hub folder's code)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("lpes")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
