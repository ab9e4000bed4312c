"""The search benchmark's bad inputs: a landscape, a space or a command line it cannot use is
refused with one line naming the file and key (exit code 2), and no result file is written.

A landscape is a user's code (``--landscape FILE.py:FUNCTION``), so each way it can break the
protocol is tried here: it raises, returns the wrong type, a non-finite speed, a failure without
a reason, or module settings (``NOISE``, ``COST_MINUTES``, ``NOT_MODELLED``) of the wrong shape.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from benchmarks.search import truth
from benchmarks.search.cli import main as harness_main

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
    code = harness_main(
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
        ("def f(params):\n    return {'tok_s': True}\n", "tok_s=True (bool), not a number"),
        ("def f(params):\n    return {'failure': None}\n", "a failure needs a reason"),
        ("def f(params):\n    return {'tok_s': 1.0, 'correct': 'yes'}\n", "not a bool"),
        ("def f(params):\n    return {'tok_s': '12.5'}\n", "tok_s='12.5' (str), not a number"),
        ("def f(params):\n    return {'tok_s': None}\n", "tok_s=None (NoneType), not a number"),
        ("def f(params):\n    return {'correct': False}\n", "needs tok_s (or a failure reason)"),
        # a misspelt verdict counted a wrong config as correct
        ("def f(params):\n    return {'tok_s': 1.0, 'corect': False}\n", "returned key 'corect'"),
        ("def f(params):\n    return {'tok_s': 1.0, 'is_correct': False}\n", "mean 'correct'"),
        ("def f(params):\n    return {'tok_s': 1.0, 'ok': False}\n", "mean 'correct'"),
        ("def f(params):\n    return {'toks': 1.0}\n", "mean 'tok_s'"),
        # the noise (x 2 at most) made 1e308 inf, and 5e-324 became 0
        ("def f(params):\n    return {'tok_s': 1e308}\n", "within 1e-300 .. 1e+300"),
        ("def f(params):\n    return {'tok_s': 5e-324}\n", "within 1e-300 .. 1e+300"),
        # the harness adds the noise: a landscape drawing its own made an unreachable target
        (
            "import random\ndef f(params):\n    return {'tok_s': 1 + random.random()}\n",
            "land.py:f is not deterministic",
        ),
        (
            "import random\ndef f(params):\n"
            "    return {'failure': 'flaky'} if random.random() < 0.5 else {'tok_s': 1.0}\n",
            "land.py:f is not deterministic",
        ),
        # sys.exit() in the landscape or at its import ended the harness with that code (0!)
        ("def f(params):\n    raise SystemExit(3)\n", "land.py:f raised SystemExit(3)"),
        ("raise SystemExit(0)\n", "failed: SystemExit(0)"),
        ("def f():\n    return {'tok_s': 1.0}\n", "land.py:f() cannot be called with one"),
        ("def f(params, other):\n    return {}\n", "f(params, other) cannot be called with one"),
        ("f = 5\n", "land.py:f is int, not a function"),
        # no correct config: no target, so no figure; say what the landscape did instead
        ("def f(params):\n    return {'failure': 'oom'}\n", "failed to start (oom "),
        ("def f(params):\n    return {'tok_s': 1.0, 'correct': False}\n", "gave wrong output"),
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
    ("body", "beside"),
    [
        # a module of its own beside it: ModuleNotFoundError before
        (
            "import land_helper\ndef f(params):\n    return {'tok_s': land_helper.speed(params)}\n",
            "def speed(params):\n    return 2.0 if params.get('mode') == 'fast' else 1.0\n",
        ),
        # a dataclass (its module looked up in sys.modules): AttributeError on None before
        (
            "from __future__ import annotations\nfrom dataclasses import dataclass\n"
            "@dataclass\nclass Config:\n    mode: str | None = None\n"
            "def f(params):\n"
            "    return {'tok_s': 2.0 if Config(params.get('mode')).mode == 'fast' else 1.0}\n",
            None,
        ),
    ],
)
def test_a_landscape_imports_as_a_script_would(tmp_path, capsys, body, beside):
    """A landscape is imported as Python imports a script: its folder on the path, itself
    registered as a module."""
    if beside is not None:
        (tmp_path / "land_helper.py").write_text(beside)
    code, out = _run(tmp_path, body)
    assert code == 0, capsys.readouterr().err
    assert json.loads(Path(out).read_text())["true_best"] == 2.0


def test_a_key_of_its_own_is_ignored_and_said_once(tmp_path, capsys):
    """A landscape written for another tool may return more than the harness reads (its
    latency, a note): that is no reason to refuse it, but it is named once."""
    body = "def f(params):\n    return {'tok_s': 1.0 + params.get('size', 1), 'ttft_ms': 3.0}\n"
    code, out = _run(tmp_path, body)
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("returned key 'ttft_ms', ignored") == 1
    assert json.loads(Path(out).read_text())["strategies"]["auto"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--noise", "-1"), "--noise must be a finite number >= 0"),
        (("--noise", "nan"), "--noise must be a finite number >= 0"),
        (("--noise", "inf"), "--noise must be a finite number >= 0"),
        (("--budget", "0"), "--budget must be >= 1"),
        # the reference strategies' runs go on past --budget, never stop short of it
        (("--reference-budget", "3"), "--reference-budget must be >= 4"),
        (("--seeds", "0"), "--seeds must be >= 1"),
        (("--seed-sets", "0"), "--seed-sets must be >= 1"),
        (("--strategies", ","), "name at least one strategy"),
        (("--strategies", "auto,bogus"), "unknown strategy 'bogus'"),
        (("--target-precision", "-0.1"), "--target-precision must be a finite number"),
        (("--confirm-top", "-1"), "--confirm-top must be >= 0"),
        (("--confirm-repeats", "1"), "--confirm-repeats >= 2"),
        (("--call-limit", "-1"), "--call-limit must be a finite number >= 0"),
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
        # np.asarray(x) and some reductions give a 0-d array, not a scalar
        "g = f\n"
        "def f(params):\n"
        "    r = g(params)\n"
        "    return {k: np.asarray(v) for k, v in r.items()}\n"
    )
    code, out = _run(tmp_path, body)
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "result.json").exists()


def test_a_landscape_that_hangs_is_stopped_at_the_call_limit(tmp_path, capsys):
    """A landscape stuck in a loop hung the harness for ever; past ``--call-limit`` it is bad
    input naming the function and the config (even one that catches ``Exception``)."""
    body = (
        "def f(params):\n"
        "    try:\n"
        "        while params.get('mode') == 'fast':\n"
        "            pass\n"
        "    except Exception:\n"
        "        pass\n"
        "    return {'tok_s': 1.0}\n"
    )
    code, out = _run(tmp_path, body, "--call-limit", "0.2")
    err = capsys.readouterr().err
    assert code == 2
    assert "land.py:f took more than 0.2 s on {'mode': 'fast'" in err
    assert len(err.strip().splitlines()) == 1


def test_a_slow_landscape_says_how_long_the_true_best_will_take(tmp_path, capsys, monkeypatch):
    """The true best calls the landscape 2 x 10^4 times or more: a slow one is told up front
    (here every landscape counts as slow)."""
    monkeypatch.setattr(truth, "SLOW_TRUE_BEST_S", 0.0)
    code, out = _run(tmp_path, GOOD)
    assert code == 0
    assert "true best: about 20016 calls of land.py:f at" in capsys.readouterr().err


@pytest.mark.parametrize("scale", [1e-9, 1e12])
def test_tiny_and_huge_speeds_give_the_same_figures(tmp_path, capsys, scale):
    """Only ratios matter: tok_s of 1e-9 or 1e12 gives the figures of tok_s near 1, and the
    result file keeps the true best and the target (``round(x, 4)`` wrote 0.0 for both)."""
    results = {}
    for s in (1.0, scale):
        (tmp_path / str(s)).mkdir()
        code, out = _run(tmp_path / str(s), f"SCALE = {s!r}\n" + _scaled(GOOD))
        assert code == 0, capsys.readouterr().err
        results[s] = json.loads((tmp_path / str(s) / "result.json").read_text())
    one, other = results[1.0], results[scale]
    assert other["true_best"] == pytest.approx(one["true_best"] * scale, rel=1e-5)
    assert other["target"] == pytest.approx(one["target"] * scale, rel=1e-5)
    assert other["strategies"] == one["strategies"]


def _scaled(body: str) -> str:
    return body.replace('return {"tok_s": ', 'return {"tok_s": SCALE * (', 1).replace(
        "1.0}\n", "1.0)}\n", 1
    )


def test_a_wrong_or_failed_baseline_is_said_so(tmp_path, capsys):
    """A baseline with wrong output printed (and wrote) its speed as if it were one to beat."""
    body = (
        "def f(params):\n"
        "    if params.get('mode') == 'slow':\n"
        "        return {'tok_s': 9.0, 'correct': False}\n"
        "    return {'tok_s': 2.0}\n"
    )
    code, out = _run(tmp_path, body)
    assert code == 0
    assert "baseline 9.00 tok/s (wrong output)" in capsys.readouterr().out
    assert json.loads((tmp_path / "result.json").read_text())["baseline_outcome"] == "wrong output"
    code, out = _run(tmp_path, body.replace("'tok_s': 9.0, 'correct': False", "'failure': 'oom'"))
    assert code == 0
    assert "baseline failed to start (oom)" in capsys.readouterr().out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["baseline_outcome"] == "failed to start: oom"


def test_a_run_its_sampler_cannot_place_within_the_constraints_is_said_so(tmp_path, capsys):
    """Random search draws about 200 configs per one that ``a == b`` allows: its runs stop
    after 50 x budget draws, and that "not reached" is reported as such, not as a budget
    spent (it was the figure of random, the reference of every ratio)."""
    space = tmp_path / "space.yaml"
    space.write_text(
        "parameters:\n"
        "  a: {type: int, low: 1, high: 200, target: {flag: --a}}\n"
        "  b: {type: int, low: 1, high: 200, target: {flag: --b}}\n"
        "constraints:\n"
        "  - a == b\n"
    )
    land = tmp_path / "land.py"
    land.write_text("def f(params):\n    return {'tok_s': 1.0 + params.get('a', 1)}\n")
    out = tmp_path / "result.json"
    code = harness_main(
        ["--space", str(space), "--landscape", f"{land}:f", "--seeds", "2", "--seed-sets", "1",
         "--budget", "8", "--reference-budget", "8", "--strategies", "random", "--out", str(out)]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())["strategies"]["random"]
    assert result["runs_stopped_by_constraint_violations"] == 2
    assert "note: 2 runs of random stopped before the budget" in capsys.readouterr().out
