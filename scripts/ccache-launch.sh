#!/bin/sh
# The compiler launcher `make` configures where ccache is installed. Objects are cached
# by their sources and flags only, not by the build directory (hash_dir off, no base_dir):
# the pip build of the tests (tests/python/test_readme_quickstart.py), which compiles the
# same sources with the same flags in another directory, then takes libpskv from the cache.
CCACHE_NOHASHDIR=1 CCACHE_BASEDIR= exec ccache "$@"
