"""Run the whole test suite: `python test_all.py` (extra arguments go to pytest, e.g. `-k tabletop` or `-x`)."""
import os
import sys

import pytest

if __name__ == "__main__":
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    sys.exit(pytest.main(["tests", "-q", "-rs", "--durations=15", *sys.argv[1:]]))
