"""pskv's version (kept equal to project(VERSION) in CMakeLists.txt; a test checks)."""
__version__ = '0.1.0'
