"""Bad input to ``run`` (and the commands sharing its storage URL, ``bench --url``, ``inspect``)
found by an audit: exit code 2, one error line naming the option or the spec key, no traceback,
and nothing written (no study database, no study, no artifact directory).

Driven through ``autotune.cli.app.app`` with typer's CliRunner. The engine is ``/bin/false``:
every refusal here comes before a server would start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli.app import app
from autotune.errors import SpecError
from autotune.model import roofline_cli
from autotune.search.gp import GP_MAX_VALUES
from autotune.search.strategy import SAMPLER_ATTR, build_sampler, check_space
from autotune.spec.load import load_spec
from autotune.spec.workload import check_workload
from autotune.storage import check_url
from autotune.study import loop
from autotune.study.budget import plan_budget
from autotune.study.loop import open_study
from autotune.study.parallel import MAX_IDS, parse_ids
from tests.builders import DEMO_MODEL, fake_spec, save_spec, write_fake_spec

SPACE = """
parameters:
  n:
    type: int
    low: 1
    high: 4
    target: {flag: --n}
"""


#: a server that never starts: every refusal here comes before one would
FALSE_COMMAND = ["/bin/false", "--host", "{host}", "--port", "{port}"]


def write(tmp: Path, **keys) -> Path:
    """A spec whose engine is ``/bin/false`` (study ``ws``), with ``keys`` replacing its own."""
    spec = fake_spec("ws", command=FALSE_COMMAND)
    spec.update(keys)
    return save_spec(tmp, spec, SPACE, file="ws.yaml")


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "AUTOTUNE_API_KEY": ""})


def assert_refused(result, *needles: str) -> str:
    """Exit 2 and exactly one error line on stderr holding every needle; no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def assert_nothing_written(tmp: Path, *also: Path) -> None:
    """No database file and no artifact directory anywhere under ``tmp``, nor at ``also``."""
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert not [n for n in left if n.endswith(".db") or n.endswith("-artifacts")], left
    assert not (tmp / "studies").exists(), left
    for path in also:
        assert not path.exists(), path


@pytest.fixture(autouse=True)
def _work_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Relative paths the tool derives (``studies/...``) land in the test's own folder."""
    monkeypatch.chdir(tmp_path)


# --- 1. --warm-start from a study that is not there ---------------------------------------------


def test_warm_start_from_a_missing_study_writes_nothing(tmp_path: Path) -> None:
    spec = write(tmp_path)
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--warm-start", "nosuch")
    assert_refused(result, "--warm-start", "no study named 'nosuch'")
    assert_nothing_written(tmp_path)


def test_warm_start_from_itself_writes_nothing(tmp_path: Path) -> None:
    spec = write(tmp_path)
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--warm-start", "ws")
    assert_refused(result, "--warm-start", "itself")
    assert_nothing_written(tmp_path)


def test_warm_start_missing_in_an_existing_storage_adds_no_study(tmp_path: Path) -> None:
    """The storage holds another study: the refusal names it, and neither the new study (with
    its queued baseline) nor its artifact directory is created."""
    spec = write(tmp_path)
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'studies.db'}"
    optuna.create_study(storage=url, study_name="other", direction="maximize")
    result = invoke(
        "run", "--spec", str(spec), "--trials", "3", "--storage", url, "--warm-start", "nosuch"
    )
    assert_refused(result, "--warm-start", "no study named 'nosuch'", "studies: other")
    assert optuna.study.get_all_study_names(storage=url) == ["other"]
    assert not (tmp_path / "db" / "ws-artifacts").exists()


def test_warm_start_refusal_hides_the_storage_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "study_names", lambda url: ["a"])
    with pytest.raises(SpecError) as caught:
        loop.check_warm_start_source("postgresql://user:s3cret@db.example/x", "ws", "nosuch")
    assert caught.value.key == "--warm-start"
    assert "s3cret" not in str(caught.value)
    assert "postgresql://user:***@db.example/x" in str(caught.value)


# --- 2. a storage that cannot be opened, a refused resume -----------------------------------


def test_storage_that_is_a_directory_leaves_no_artifacts(tmp_path: Path) -> None:
    spec = write(tmp_path)
    (tmp_path / "st" / "dbdir").mkdir(parents=True)
    url = f"sqlite:///{tmp_path / 'st' / 'dbdir'}"
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--storage", url)
    assert_refused(result, "--storage", "directory")
    assert_nothing_written(tmp_path)
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["dbdir"]


def test_storage_that_is_not_a_database_leaves_no_artifacts(tmp_path: Path) -> None:
    spec = write(tmp_path)
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "notadb.sqlite").write_text("hello\n")
    url = f"sqlite:///{tmp_path / 'st' / 'notadb.sqlite'}"
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--storage", url)
    assert_refused(result, "--storage", "not a database")
    assert_nothing_written(tmp_path)
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["notadb.sqlite"]
    assert (tmp_path / "st" / "notadb.sqlite").read_text() == "hello\n"


def _existing_study(tmp_path: Path) -> tuple[Path, str]:
    """Study ``ws`` made from the spec as a first run makes it: its directions, its queued
    baseline and its workload's hash; returns the spec and the storage URL."""
    spec_path = write(tmp_path)
    (tmp_path / "db").mkdir()
    url = f"sqlite:///{tmp_path / 'db' / 'ws.db'}"
    spec = load_spec(spec_path)
    loop.quiet_optuna()
    study, created = open_study(spec, url)
    assert created
    check_workload(study, spec)
    return spec_path, url


@pytest.mark.parametrize(
    "change, key",
    [
        ({"workload": {"prompts": ["x y z"]}}, "workload"),
        ({"objective": {"metric": "ttft_p95_ms"}}, "objective"),
    ],
)
def test_refused_resume_leaves_no_artifact_dir(tmp_path: Path, change: dict, key: str) -> None:
    _spec, url = _existing_study(tmp_path)
    changed = write(tmp_path, **change)
    artifacts = tmp_path / "newart"
    result = invoke(
        "run", "--spec", str(changed), "--trials", "3", "--storage", url,
        "--artifact-dir", str(artifacts),
    )  # fmt: skip
    assert_refused(result, "ws.yaml", key)
    assert not artifacts.exists()
    assert not (tmp_path / "db" / "ws-artifacts").exists()
    assert len(optuna.load_study(storage=url, study_name="ws").trials) == 1  # the baseline


# --- 3. a percent-encoded NUL in the storage URL ----------------------------------------------


@pytest.mark.parametrize("command", ["run", "show", "export", "report", "cleanup"])
def test_nul_in_the_storage_option(tmp_path: Path, command: str) -> None:
    spec = write(tmp_path)
    result = invoke(command, "--spec", str(spec), "--storage", "sqlite:///%00x.db")
    assert_refused(result, "--storage", "NUL")
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize(
    "url", ["sqlite:///%00x.db", "sqlite:///ok.db?mode=%00", "postgresql://u:p%00w@host/db"]
)
def test_nul_in_the_spec_storage_key(tmp_path: Path, url: str) -> None:
    spec = write(tmp_path, storage=url)
    result = invoke("run", "--spec", str(spec), "--trials", "3")
    line = assert_refused(result, "ws.yaml", "storage", "NUL")
    assert "p%00w" not in line  # a password stays out of the message
    assert_nothing_written(tmp_path)


# --- 4. --worker-env that is not a JSON object of strings ------------------------------------


@pytest.mark.parametrize(
    "value, words",
    [
        ("[1,2]", "JSON object"),
        ('{"A":1}', "must be a string"),
        ('"text"', "JSON object"),
        ("nope", "not JSON"),
        ('{"A=B":"x"}', "not an environment variable name"),
    ],
)
def test_worker_env_is_checked_at_parsing(tmp_path: Path, value: str, words: str) -> None:
    spec = write(tmp_path)
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--worker-env", value)
    assert_refused(result, "--worker-env", words)
    assert_nothing_written(tmp_path)


# --- 5. bench --url that urlparse refuses -----------------------------------------------------


@pytest.mark.parametrize(
    "url, words",
    [("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:99999", "Port out of range")],
)
def test_bench_url_that_cannot_be_parsed(tmp_path: Path, url: str, words: str) -> None:
    spec = write_fake_spec(tmp_path, SPACE, name="badurl")
    out = tmp_path / "bench.json"
    result = invoke("bench", "--spec", str(spec), "--url", url, "--json", str(out))
    assert_refused(result, "--url", words)
    assert not out.exists()


# --- 6. inspect's numbers: finite and above zero ---------------------------------------------


@pytest.mark.parametrize(
    "args, option",
    [
        (["--bandwidth-gbs", "inf"], "--bandwidth-gbs"),
        (["--bandwidth-gbs", "nan"], "--bandwidth-gbs"),
        (["--bandwidth-gbs", "0"], "--bandwidth-gbs"),
        (["--bandwidth-gbs", "-3"], "--bandwidth-gbs"),
        (["--device", "h200", "--measured", "-5"], "--measured"),
        (["--device", "h200", "--measured", "nan"], "--measured"),
        (["--device", "h200", "--measured", "800", "--measured", "inf"], "--measured"),
    ],
)
def test_inspect_numbers_must_be_finite_and_positive(args: list[str], option: str) -> None:
    result = invoke("inspect", str(DEMO_MODEL), *args)
    assert_refused(result, option, "finite number above 0")
    assert "tok/s" not in result.stdout


@pytest.mark.parametrize(
    "args, option",
    [
        (["--bandwidth-gbs", "inf"], "--bandwidth-gbs"),
        (["--bandwidth-gbs", "nan"], "--bandwidth-gbs"),
        (["--device", "h200", "--measured", "-5"], "--measured"),
        (["--device", "h200", "--active-params", "nan"], "--active-params"),
    ],
)
def test_roofline_cli_numbers_must_be_finite_and_positive(
    args: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--active-params", "40e9", "--bits", "4.8"]
    with pytest.raises(SystemExit) as caught:
        roofline_cli.main(base + args)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "finite number above 0" in err and "Traceback" not in err


# --- 7. --gpus/--cpus ranges too long to expand ---------------------------------------------


@contextlib.contextmanager
def _within(seconds: float):
    """Fail (instead of hanging or eating the machine) when the block takes longer."""

    def _late(signum, frame):
        raise TimeoutError(f"took longer than {seconds} s")

    old = signal.signal(signal.SIGALRM, _late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(
    "args, option",
    [
        (["--parallel", "2", "--gpus", "0-999999999"], "--gpus"),  # grew to 23 GB, OOM-killed
        (["--parallel", "2", "--cpus", "0-99999999999", "--cpus-per-trial", "1"], "--cpus"),
        (["--parallel", "2", "--gpus", "0-99999999999999999999999999"], "--gpus"),
        (["--parallel", "2", "--cpus", "0-40000,40001-70000"], "--cpus"),
    ],
)
def test_a_device_range_too_long_is_refused_at_once(
    tmp_path: Path, args: list[str], option: str
) -> None:
    spec = write(tmp_path)
    with _within(10):
        result = invoke("run", "--spec", str(spec), "--trials", "3", *args)
    assert_refused(result, option, f"more than {MAX_IDS} ids")
    assert_nothing_written(tmp_path)


def test_many_ids_and_their_duplicates_are_checked_in_linear_time() -> None:
    """The duplicate check was quadratic: 0-40000 took 18 s."""
    with _within(5):
        assert parse_ids(f"0-{MAX_IDS - 1}", option="--cpus") == list(range(MAX_IDS))
        with pytest.raises(SpecError, match="--cpus") as caught:
            parse_ids("0-40000,0-20000", option="--cpus")
    assert "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9] and 19991 more more than once" in str(caught.value)


# --- 8. --confirm-top beyond any budget ------------------------------------------------------


def test_an_absurd_confirm_top_plans_as_the_largest_that_fits() -> None:
    """``--confirm-top 99999999999999999999`` counted down one candidate at a time for ever;
    a --confirm-top above what the budget holds is lowered to what fits, as before."""
    huge = 99999999999999999999
    with _within(5):
        for trials in (1, 5, 20, 50, 200, 1000):
            for done in (0, 3, trials):
                assert plan_budget(trials, done, huge) == plan_budget(trials, done, trials)
        with pytest.raises(SpecError, match="--confirm-repeats"):
            plan_budget(50, 0, huge, 2)


def test_an_absurd_confirm_top_on_the_command_line_plans_at_once(tmp_path: Path) -> None:
    spec = write(tmp_path)
    with _within(60):
        result = invoke(
            "run", "--spec", str(spec), "--trials", "30", "--confirm-top", "99999999999999999999"
        )
    expected = plan_budget(30, 0, 30).describe()
    assert expected in result.stdout, result.output
    assert result.exit_code == 3, result.output  # the /bin/false baseline fails its preflight


# --- 9. a storage URL whose port cannot be read --------------------------------------------


BAD_PORTS = [
    "postgresql://bob:pw@host:abc/x",
    "postgresql://bob:pw@[::1/x",
    "postgresql://bob:pw@host:99999/x",
]


@pytest.mark.parametrize("url", BAD_PORTS)
@pytest.mark.parametrize("command", ["run", "show", "export", "report", "cleanup", "confirm"])
def test_a_bad_port_in_the_storage_option(tmp_path: Path, command: str, url: str) -> None:
    spec = write(tmp_path)
    result = invoke(command, "--spec", str(spec), "--storage", url)
    line = assert_refused(result, "--storage", "port")
    assert "pw" not in line  # the password stays out of the message
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize("url", BAD_PORTS)
def test_a_bad_port_with_study_and_storage_and_no_spec(tmp_path: Path, url: str) -> None:
    """``show --study s --storage URL`` named a bad URL by its whole ``s@URL``, password and
    all."""
    result = invoke("show", "--study", "s", "--storage", url)
    line = assert_refused(result, "--storage", "port")
    assert "pw" not in line


@pytest.mark.parametrize("url", BAD_PORTS)
@pytest.mark.parametrize("command", ["run", "show", "validate"])
def test_a_bad_port_in_the_spec_storage_key(tmp_path: Path, command: str, url: str) -> None:
    spec = write(tmp_path, storage=url)
    args = [command, str(spec)] if command == "validate" else [command, "--spec", str(spec)]
    result = invoke(*args)
    line = assert_refused(result, "ws.yaml", "storage", "port")
    assert "pw" not in line
    assert_nothing_written(tmp_path)


@pytest.mark.parametrize(
    "url, shown",
    [
        ("postgresql://bob:pw@host:abc/x", "'postgresql://***@host:abc/x'"),
        ("postgresql://bob:pw@[::1/x", "'postgresql://***@[::1/x'"),
        ("bob:pw@host/x", "'***@host/x'"),  # no scheme: ArgumentError, printed whole before
    ],
)
def test_an_unparsable_storage_url_is_shown_without_its_password(url: str, shown: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_url(url)
    assert caught.value.key == "--storage"
    assert shown in str(caught.value) and "pw" not in str(caught.value)


# --- 10. an SQLite storage that is not a regular file ----------------------------------------


@pytest.mark.parametrize("symlink", [False, True])
@pytest.mark.parametrize("command", ["run", "show", "export", "report"])
def test_sqlite_storage_that_is_a_fifo_is_refused_before_anything(
    tmp_path: Path, command: str, symlink: bool
) -> None:
    """``--storage sqlite:////dev/null`` printed the budget and the live view, then failed with
    "disk I/O error" and left ``/dev/null-journal``. A FIFO in tmp_path stands in for it."""
    spec = write(tmp_path)
    (tmp_path / "st").mkdir()
    fifo = tmp_path / "st" / "pipe"
    os.mkfifo(fifo)
    database = fifo
    if symlink:
        database = tmp_path / "st" / "link"
        database.symlink_to(fifo)
    with _within(30):  # a FIFO opened for reading blocks
        result = invoke(command, "--spec", str(spec), "--storage", f"sqlite:///{database}")
    assert_refused(result, "--storage", "is a FIFO, not an SQLite database file")
    assert "budget" not in result.stdout
    assert_nothing_written(tmp_path)
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == sorted({fifo.name, database.name})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


# --- 11. --sampler gp over an int domain too wide to list ------------------------------------


def _wide(high: str) -> str:
    return f"""
parameters:
  n:
    type: int
    low: 1
    high: 4
    target: {{flag: --n}}
  x:
    type: int
    low: 0
    high: {high}
    target: {{flag: --x}}
"""


@pytest.mark.parametrize("high", ["1.0e+38", "80000000", "1000000"])
def test_gp_sampler_refuses_an_int_domain_too_wide_at_the_start(tmp_path: Path, high: str) -> None:
    """``high: 1e38`` crashed mid-study ("Maximum allowed size exceeded" in np.arange), 8e7
    took 1.6 GB: GPSampler lists every value of an int domain."""
    spec = save_spec(tmp_path, fake_spec("ws", command=FALSE_COMMAND), _wide(high), file="ws.yaml")
    result = invoke("run", "--spec", str(spec), "--trials", "3", "--sampler", "gp")
    assert_refused(result, "--sampler", "parameter 'x'", f"at most {GP_MAX_VALUES:,}")
    assert "budget" not in result.stdout
    assert_nothing_written(tmp_path)


def test_gp_sampler_refusal_holds_for_a_resumed_gp_study(tmp_path: Path) -> None:
    """A study created with gp resumes with gp when --sampler is not given: refused the same
    way, before the budget line, and the study is left as it was."""
    wide = _wide("80000000")
    spec_path = save_spec(tmp_path, fake_spec("ws", command=FALSE_COMMAND), wide, file="ws.yaml")
    url = load_spec(spec_path).default_storage()
    study = optuna.create_study(storage=url, study_name="ws", direction="maximize")
    study.set_user_attr(SAMPLER_ATTR, "gp")
    result = invoke("run", "--spec", str(spec_path), "--trials", "3")
    assert_refused(result, "--sampler", "parameter 'x'")
    assert "budget" not in result.stdout
    assert optuna.load_study(study_name="ws", storage=url).trials == []
    assert not (tmp_path / "studies" / "ws-artifacts").exists()


def test_gp_ceiling_counts_without_listing_and_leaves_other_samplers_alone(tmp_path: Path) -> None:
    at_ceiling = load_spec(
        save_spec(
            tmp_path,
            fake_spec("ws", command=FALSE_COMMAND),
            _wide(str(GP_MAX_VALUES - 1)),
            file="ws.yaml",
        )
    ).space
    check_space("gp", at_ceiling)  # exactly GP_MAX_VALUES values: allowed
    wide = load_spec(
        save_spec(
            tmp_path, fake_spec("ws", command=FALSE_COMMAND), _wide("1.0e+38"), file="ws.yaml"
        )
    ).space
    for name in ("auto", "tpe", "random"):
        check_space(name, wide)  # the default strategy (and the others) are unchanged
        assert build_sampler(name, wide, 0) is not None
    pytest.importorskip("torch")
    pytest.importorskip("scipy")
    with pytest.raises(SpecError, match="--sampler: parameter 'x' has 1e\\+38 values"):
        build_sampler("gp", wide, 0)
