"""storage.py: URLs, opening a study, artifact paths."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from autotune.errors import SpecError
from autotune.storage import (
    artifact_dir_for,
    check_study_name,
    check_url,
    is_sqlite,
    load_study,
    open_storage,
    resolve_url,
    safe_url,
    sqlite_file,
)
from tests.helpers import needs_pg


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'studies.db'}"


def test_load_study_opens_an_existing_study(tmp_path: Path) -> None:
    url = _url(tmp_path)
    optuna.create_study(storage=url, study_name="s1").set_user_attr("x", 1)
    study = load_study(url, "s1")
    assert study.study_name == "s1" and study.user_attrs["x"] == 1


def test_load_study_never_creates_a_mistyped_study(tmp_path: Path) -> None:
    url = _url(tmp_path)
    optuna.create_study(storage=url, study_name="real")
    with pytest.raises(SpecError) as caught:
        load_study(url, "typo")
    assert caught.value.key == "--study"
    assert "no study named 'typo'" in str(caught.value)
    assert "(studies: real)" in str(caught.value)
    assert optuna.study.get_all_study_names(storage=url) == ["real"]


def test_load_study_hides_a_database_password() -> None:
    # a server URL that does not answer fails before a study is looked up, naming no password
    with pytest.raises(SpecError) as caught:
        load_study("postgresql+psycopg://u:secret@127.0.0.1:1/db", "x")
    assert "secret" not in str(caught.value)


#: psycopg2, psycopg and libpq take a password from the URL's query string too
QUERY_PW = "postgresql+psycopg2://postgres@/rt?host=/tmp/x&password=SeCrEtPw123"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (QUERY_PW, "postgresql+psycopg2://postgres@/rt?host=%2Ftmp%2Fx&password=***"),
        (
            "postgresql://u:SeCrEtPw123@h/db?sslpassword=SeCrEtPw123&sslmode=require",
            "postgresql://u:***@h/db?sslmode=require&sslpassword=***",
        ),
        # any case, a percent-encoded name, a value given twice
        ("postgresql://h/db?PassWord=SeCrEtPw123", "postgresql://h/db?PassWord=***"),
        ("postgresql://h/db?pass%77ord=SeCrEtPw123", "postgresql://h/db?password=***"),
        ("postgresql://h/db?password=SeCrEtPw123&password=2", "postgresql://h/db?password=***"),
        ("mysql+mysqldb://u@h/db?passwd=SeCrEtPw123", "mysql+mysqldb://u@h/db?passwd=***"),
    ],
)
def test_safe_url_hides_a_password_in_the_query(url: str, shown: str) -> None:
    assert safe_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h:abc/db?password=SeCrEtPw123",  # the port is not a number
        "postgresql://u@h:abc/db?x=1&SSLPASSWORD=SeCrEtPw123",
        "postgresql://h:99999/db?password=SeCrEtPw123",  # out of range
        "sqlite://?password=SeCrEtPw123",  # in memory
        "postgresql://h/db?password=SeCrEtPw123%00",  # NUL
    ],
)
def test_a_refused_url_never_shows_its_query_password(url: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_url(url)
    assert "SeCrEtPw123" not in str(caught.value)


@needs_pg
def test_load_study_hides_a_query_password(pg_url: str) -> None:
    """``autotune show --study nope --storage URL`` named the URL's ``?password=`` as typed.
    (The test's PostgreSQL trusts its socket: the password is accepted and ignored.)"""
    with pytest.raises(SpecError) as caught:
        load_study(f"{pg_url}&password=SeCrEtPw123", "no-such-study")
    assert "no study named 'no-such-study'" in str(caught.value)
    assert "SeCrEtPw123" not in str(caught.value) and "password=***" in str(caught.value)


@needs_pg
def test_a_plain_postgresql_url_opens(pg_url: str) -> None:
    """``postgresql://`` is what users write (and what Optuna's docs show); SQLAlchemy 2.1 reads
    it as the psycopg 3 driver, which the postgres extra did not install: "No module named
    'psycopg'". Both drivers are installed now, so both spellings open the same database."""
    plain = pg_url.replace("postgresql+psycopg2://", "postgresql://", 1)
    assert plain != pg_url
    name = "plain-url-study"
    optuna.create_study(storage=open_storage(plain), study_name=name, load_if_exists=True)
    assert name in optuna.study.get_all_study_names(storage=open_storage(pg_url))


@pytest.mark.parametrize(
    "url",
    ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared"],
)
def test_in_memory_sqlite_is_refused(url: str) -> None:
    with pytest.raises(SpecError, match="in-memory SQLite"):
        check_url(url)


def test_not_a_url_is_refused() -> None:
    with pytest.raises(SpecError, match="not a valid SQLAlchemy storage URL"):
        check_url("::nonsense::")


def test_resolve_url_needs_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist"):
        resolve_url(f"sqlite:///{tmp_path / 'missing' / 'x.db'}")
    assert resolve_url(_url(tmp_path)) == _url(tmp_path)


@pytest.mark.parametrize("name", ["demo", "my.study-1", "A_b", "9"])
def test_good_study_names(name: str) -> None:
    assert check_study_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "../x", "a/b", "a b", "x" * 129, "-x"])
def test_bad_study_names(name: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_study_name(name)
    assert caught.value.key == "--study"


def test_artifacts_live_beside_the_sqlite_file(tmp_path: Path) -> None:
    url = _url(tmp_path)
    assert artifact_dir_for(url, "s1") == tmp_path / "s1-artifacts"
    assert artifact_dir_for(url, "s1", str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"
    with pytest.raises(SpecError):
        artifact_dir_for(url, "../escape")


def test_sqlite_helpers(tmp_path: Path) -> None:
    url = _url(tmp_path)
    assert is_sqlite(url) and sqlite_file(url) == tmp_path / "studies.db"
    assert not is_sqlite("postgresql://h/db") and sqlite_file("postgresql://h/db") is None
