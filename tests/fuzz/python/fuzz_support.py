"""Shared by the Python fuzz targets of tests/fuzz/python (issue #19), run by atheris (libFuzzer
for Python) from scripts/fuzz.sh. Each target feeds its input to qgemm's checkpoint code and
asserts the contract the C++ targets assert (tests/fuzz/fuzz_support.hpp): it returns a valid
result, or it raises qgemm.Error. Any other exception (KeyError, TypeError, IndexError,
RecursionError, a ValueError that is not qgemm.Error, ...), a failed check of the result, a hang
(-timeout) or running out of memory (-rss_limit_mb) is a finding: libFuzzer stops and writes
the input.

The targets import qgemm from the build tree (PYTHONPATH=<build>/python, as scripts/fuzz.sh
sets it). Without atheris, `python fuzz_<target>.py FILE...` replays inputs (the seeds, a
reproducer) through the same checks.
"""

import os
import shutil
import sys
import tempfile

import numpy as np  # imported before atheris instruments qgemm, so that numpy is not instrumented

try:
    import atheris
except ImportError:  # replay only
    atheris = None


def import_qgemm():
    """qgemm's modules, coverage-instrumented where atheris runs the target."""
    if atheris is None:
        import qgemm
        from qgemm import checkpoint, tensors
        return qgemm, checkpoint, tensors
    with atheris.instrument_imports(include=["qgemm"]):
        import qgemm
        from qgemm import checkpoint, tensors
    return qgemm, checkpoint, tensors


qgemm, checkpoint, tensors = import_qgemm()


class Finding(Exception):
    """A check of a returned result failed."""


def finding(what: str):
    sys.stderr.write(f"\n==qgemm-fuzz== FINDING: {what}\n")
    sys.stderr.flush()


def check(condition, message: str) -> None:
    if not condition:
        raise Finding(f"check failed: {message}")


# Triage: QGEMM_FUZZ_KEEP_GOING=DIR records each distinct finding (its exception type and the
# innermost qgemm line) as DIR/<signature> holding the first input that gave it, and fuzzing
# goes on, so that one run lists them all.
KEEP_GOING = os.environ.get("QGEMM_FUZZ_KEEP_GOING")
current_input = [b""]


def _keep(error: BaseException) -> None:
    import traceback
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "qgemm" in f.filename]
    where = f"{os.path.basename(frames[-1].filename)}_{frames[-1].lineno}" if frames else "harness"
    path = os.path.join(KEEP_GOING, f"{type(error).__name__}-{where}")
    if not os.path.exists(path):
        os.makedirs(KEEP_GOING, exist_ok=True)
        with open(path, "wb") as f:
            f.write(current_input[0])
        sys.stderr.write(f"==qgemm-fuzz== kept {path}: {str(error)[:200]}\n")


def expect_result_or_error(body) -> None:
    """Runs `body`; qgemm.Error is the expected rejection, anything else a finding (re-raised,
    so that libFuzzer writes the input)."""
    try:
        body()
    except qgemm.Error:
        pass  # rejected with qgemm's error: the contract holds
    except Finding as error:
        if KEEP_GOING:
            return _keep(error)
        finding(str(error))
        raise
    except BaseException as error:  # noqa: BLE001 (RecursionError, MemoryError: findings too)
        if isinstance(error, KeyboardInterrupt):
            raise
        if KEEP_GOING:
            return _keep(error)
        text = str(error)
        finding(f"exception other than qgemm.Error: {type(error).__name__}: "
                f"{text[:500]}{'...' if len(text) > 500 else ''}")
        raise


def check_layer(layer, what: str) -> None:
    """An imported layer is consistent: a scheme, a packed weight that dequantizes to [n, k],
    an input permutation of range(k) or None."""
    check(isinstance(layer, checkpoint.ImportedLinear), f"{what}: {type(layer).__name__}")
    check(isinstance(layer.scheme, qgemm.Scheme), f"{what}: scheme {layer.scheme!r}")
    w = layer.weight
    check(w.n > 0 and w.k > 0, f"{what}: weight [{w.n}, {w.k}]")
    weight_part = lambda scheme: str(scheme).split(";")[0]  # PackedWeight keeps the w= part
    check(weight_part(w.scheme) == weight_part(layer.scheme), f"{what}: {w.scheme} holds "
          f"another weight than {layer.scheme}")
    check(np.isfinite(w.global_scale) and w.global_scale > 0,
          f"{what}: global scale {w.global_scale}")
    if layer.input_permutation is not None:
        p = np.asarray(layer.input_permutation)
        check(p.shape == (w.k,) and np.array_equal(np.sort(p), np.arange(w.k)),
              f"{what}: input_permutation is no permutation of range({w.k})")
    if w.n * w.k <= 1 << 16:
        values = np.asarray(qgemm.dequantize_weight(w))
        check(values.shape == (w.n, w.k), f"{what}: dequantized shape {values.shape}")


class Scratch:
    """A directory for the files an input becomes: $QGEMM_FUZZ_SCRATCH (scripts/fuzz.sh makes
    it, on tmpfs where there is one, and removes it after the run: libFuzzer ends the process
    without Python's exit handlers), else a new one removed at a normal exit (a replay)."""

    def __init__(self):
        self.path = os.environ.get("QGEMM_FUZZ_SCRATCH")
        if self.path:
            os.makedirs(self.path, exist_ok=True)
            return
        base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.path = tempfile.mkdtemp(prefix="qgemm-fuzz-", dir=base)
        import atexit
        atexit.register(shutil.rmtree, self.path, True)

    def write(self, name: str, data: bytes) -> str:
        path = os.path.join(self.path, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def remove(self, name: str) -> None:
        path = os.path.join(self.path, name)
        if os.path.exists(path):
            os.remove(path)


def main(test_one_input, custom_mutator=None) -> None:
    """libFuzzer through atheris (argv: libFuzzer's flags, corpus directories, or files to
    replay); without atheris, replays the files and directories named."""
    def run(data: bytes) -> None:
        current_input[0] = data
        test_one_input(data)

    if atheris is not None:
        kwargs = {} if custom_mutator is None else {"custom_mutator": custom_mutator}
        atheris.Setup(sys.argv, run if KEEP_GOING else test_one_input, **kwargs)
        atheris.Fuzz()
        return
    paths = [a for a in sys.argv[1:] if not a.startswith("-")]
    count = 0
    for path in paths:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path))] \
            if os.path.isdir(path) else [path]
        for name in files:
            with open(name, "rb") as f:
                test_one_input(f.read())
            count += 1
    print(f"replayed {count} inputs without atheris: 0 findings")
