"""The rng fixture of python/tests/conftest.py (a fresh seed each run, printed; QGEMM_TEST_SEED
replays one), loaded from that file."""

import importlib.util
import os

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                     "conftest.py")
_spec = importlib.util.spec_from_file_location("qgemm_tests_conftest", _path)
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
rng = _module.rng
