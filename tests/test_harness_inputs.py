"""The search benchmark's bad inputs: a landscape, a space or a command line it cannot use is
refused with one line naming the file and key (exit code 2), and no result file is written.

A landscape is a user's code (``--landscape FILE.py:FUNCTION``), so each way it can break the
protocol is tried here: it raises, returns the wrong type, a non-finite speed, a failure without
a reason, or module settings (``NOISE``, ``COST_MINUTES``, ``NOT_MODELLED``) of the wrong shape.
"""

from __future__ import annotations

import textwrap

import pytest

from benchmarks import search_efficiency as harness

SPACE = """
parameters:
  mode:
    type: categorical
    choices: [slow, fast]
    baseline: slow
    target: {flag: --mode}
  size:
    type: int
    low: 1
    high: 8
    target: {flag: --size}
"""

GOOD = 'def f(params):\n    return {"tok_s": 2.0 if params.get("mode") == "fast" else 1.0}\n'


def _run(tmp_path, body: str, *extra: str) -> tuple[int, str]:
    space = tmp_path / "space.yaml"
    space.write_text(textwrap.dedent(SPACE))
    land = tmp_path / "land.py"
    land.write_text(body)
    out = tmp_path / "result.json"
    code = harness.main(
        ["--space", str(space), "--landscape", f"{land}:f", "--seeds", "2", "--seed-sets", "1",
         "--budget", "4", "--strategies", "auto", "--out", str(out), *extra]
    )  # fmt: skip
    return code, str(out)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def f(params):\n    raise RuntimeError('boom')\n", "land.py:f raised RuntimeError"),
        # the baseline leaves `size` to the engine: say so, not only "KeyError"
        ("def f(params):\n    return {'tok_s': params['size']}\n", "read it with params.get"),
        ("def f(params):\n    return [1.0]\n", "returned list, not a dict"),
        ("def f(params):\n    return {'tok_s': float('inf')}\n", "finite tok_s > 0"),
        ("def f(params):\n    return {'tok_s': float('nan')}\n", "finite tok_s > 0"),
        ("def f(params):\n    return {'tok_s': -1.0}\n", "finite tok_s > 0"),
        ("def f(params):\n    return {'tok_s': True}\n", "finite tok_s > 0"),
        ("def f(params):\n    return {'failure': None}\n", "a failure needs a reason"),
        ("def f(params):\n    return {'tok_s': 1.0, 'correct': 'yes'}\n", "not a bool"),
        (GOOD + "NOISE = 'high'\n", "land.py: NOISE must be a finite number"),
        (GOOD + "NOISE = -0.1\n", "land.py: NOISE must be a finite number"),
        (GOOD + "COST_MINUTES = {'lod': 3}\n", "COST_MINUTES: unknown key 'lod'"),
        (GOOD + "COST_MINUTES = {'load': float('nan')}\n", "COST_MINUTES['load']"),
        (GOOD + "COST_MINUTES = [1, 2]\n", "COST_MINUTES must be a mapping"),
        (GOOD + "NOT_MODELLED = 'size'\n", "NOT_MODELLED must be a list"),
        (GOOD + "NOT_MODELLED = ['nope']\n", "NOT_MODELLED names 'nope'"),
    ],
)
def test_a_landscape_that_breaks_the_protocol_is_bad_input(tmp_path, capsys, body, expected):
    code, out = _run(tmp_path, body)
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
    assert not (tmp_path / "result.json").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--noise", "-1"), "--noise must be a finite number >= 0"),
        (("--noise", "nan"), "--noise must be a finite number >= 0"),
        (("--noise", "inf"), "--noise must be a finite number >= 0"),
        (("--budget", "0"), "--budget must be >= 1"),
        (("--seeds", "0"), "--seeds must be >= 1"),
        (("--seed-sets", "0"), "--seed-sets must be >= 1"),
        (("--strategies", ","), "name at least one strategy"),
        (("--strategies", "auto,bogus"), "unknown strategy 'bogus'"),
        (("--target-precision", "-0.1"), "--target-precision must be a finite number"),
        (("--confirm-top", "-1"), "--confirm-top must be >= 0"),
        (("--confirm-max-rounds", "0"), "--confirm-max-rounds must be >= 1"),
    ],
)
def test_bad_command_line_values_are_bad_input(tmp_path, capsys, args, expected):
    code, out = _run(tmp_path, GOOD, *args)
    assert code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "result.json").exists()


def test_the_same_landscape_with_good_values_runs(tmp_path, capsys):
    """The control for the two tests above: their landscape and command line, minus the
    fault, is accepted and writes its result."""
    code, out = _run(tmp_path, GOOD + "NOISE = 0.0\nCOST_MINUTES = {'load': 2}\n")
    assert code == 0
    assert (tmp_path / "result.json").exists()


def test_a_landscape_computing_with_numpy_is_accepted(tmp_path, capsys):
    """np.float32, np.int64 and np.bool_ are not Python floats, ints or bools: a landscape
    written with NumPy returns them and must not be refused as "no finite tok_s"."""
    body = (
        "import numpy as np\n"
        "def f(params):\n"
        "    fast = params.get('mode') == 'fast'\n"
        "    if params.get('size') == 8:\n"
        "        return {'tok_s': np.int64(3), 'correct': np.bool_(False)}\n"
        "    return {'tok_s': np.float32(2.0 if fast else 1.0), 'correct': np.bool_(True)}\n"
    )
    code, out = _run(tmp_path, body)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "result.json").exists()
