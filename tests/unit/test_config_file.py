"""The settings file (``fedtune.service.config_file``): precedence, paths, refusals.

An option wins over a variable, a variable over the file, the file over the default; relative
paths, written or default, are relative to the file's folder; an unknown key names the closest
known one; a bad value names its key; a secret inline needs a file only its owner reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fedtune.cli import build_parser
from fedtune.cli.config_option import apply_config
from fedtune.errors import ConfigError
from fedtune.service.config_file import MLFLOW_DIR, anchor_sqlite, load_config
from fedtune.service.settings import load_settings

PASSWORD = "mlflow-admin-password-0123456789"


@pytest.fixture(autouse=True)
def _no_settings_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("FEDTUNE_", "MLFLOW_", "RAY_")):
            monkeypatch.delenv(name)


def write(folder: Path, text: str, mode: int = 0o644) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "team.toml"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_relative_paths_and_defaults_are_relative_to_the_files_folder(tmp_path, monkeypatch):
    team = tmp_path / "srv"
    path = write(team, '[serve]\ndatabase_url = "sqlite:///state/fedtune.db"\n')
    monkeypatch.chdir(tmp_path)  # a cd changes nothing
    settings = load_settings(load_config("srv/team.toml"))
    assert settings.database_url == f"sqlite:///{team / 'state' / 'fedtune.db'}"
    assert settings.workdir == team / "fedtune-work"  # the default, anchored too
    write(team, '[serve]\nworkdir = "../work"\ndata_roots = ["data"]\n')
    settings = load_settings(load_config(path))
    assert settings.database_url == f"sqlite:///{team / 'fedtune.db'}"
    assert Path(settings.workdir) == team / ".." / "work"
    assert settings.data_roots == [team / "data"]


def test_an_option_beats_a_variable_which_beats_the_file(tmp_path, monkeypatch):
    path = write(tmp_path, '[serve]\nbackend = "none"\nmax_concurrent_studies = 7\nworkdir = "w"\n')
    config = load_config(path)
    assert load_settings(config).backend == "none"  # the file over the default
    monkeypatch.setenv("FEDTUNE_BACKEND", "local")
    settings = load_settings(config)
    assert (settings.backend, settings.max_concurrent_studies) == ("local", 7)
    assert load_settings(config, backend="ray", ray_address="http://r:8265").backend == "ray"
    monkeypatch.setenv("FEDTUNE_WORKDIR", "relative-to-the-cwd")  # a variable is not anchored
    assert str(load_settings(config).workdir) == "relative-to-the-cwd"


def test_an_mlflow_section_gives_the_service_its_server(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        '[mlflow]\nhost = "0.0.0.0"\nport = 5123\npublic_url = "http://box.lan:5123"\n',
    )
    (tmp_path / MLFLOW_DIR).mkdir()
    (tmp_path / MLFLOW_DIR / "admin-password").write_text(PASSWORD + "\n")
    settings = load_settings(load_config(path))
    assert settings.mlflow_tracking_uri == "http://127.0.0.1:5123"  # a wildcard: loopback
    assert settings.mlflow_workspaces is True
    assert settings.mlflow_admin_password.get_secret_value() == PASSWORD
    assert settings.mlflow_public_url == "http://box.lan:5123"
    monkeypatch.setenv("FEDTUNE_MLFLOW_ADMIN_PASSWORD", "from-the-environment-0123")
    (tmp_path / MLFLOW_DIR / "admin-password").unlink()  # not read: the variable wins
    assert load_settings(load_config(path)).mlflow_admin_password.get_secret_value() == (
        "from-the-environment-0123"
    )
    monkeypatch.delenv("FEDTUNE_MLFLOW_ADMIN_PASSWORD")
    with pytest.raises(ConfigError) as err:
        load_settings(load_config(path))
    assert str(err.value).startswith(f"{path}: [mlflow] dir: cannot read {tmp_path / MLFLOW_DIR}")
    assert "start `fedtune mlflow-server --config" in str(err.value)


def test_mlflow_server_options_come_from_the_file_unless_given(tmp_path, monkeypatch):
    path = write(
        tmp_path,
        '[mlflow]\nport = 5123\nbackend_store_uri = "sqlite:///m.db"\nallowed_hosts = ["a", "b"]\n',
    )
    parser = build_parser()

    def parsed(*argv: str) -> argparse.Namespace:
        args = parser.parse_args(["mlflow-server", "--config", path, *argv])
        apply_config(args)
        return args

    args = parsed()
    assert (args.port, args.host, args.workers) == (5123, "127.0.0.1", 1)  # file, defaults
    assert args.dir == tmp_path / MLFLOW_DIR  # a relative default, anchored to the file
    assert args.backend_store_uri == f"sqlite:///{tmp_path / 'm.db'}"
    assert args.allowed_hosts == "a,b"
    assert parsed("--port", "5000", "--dir", "here").port == 5000  # the option wins
    assert parsed("--dir", "here").dir == Path("here")  # relative to the working directory
    monkeypatch.setenv("MLFLOW_BACKEND_STORE_URI", "postgresql://db/m")
    assert parsed().backend_store_uri is None  # the verb reads the variable, which wins
    no_file = parser.parse_args(["mlflow-server"])
    apply_config(no_file)
    assert (no_file.port, no_file.dir) == (5000, Path(MLFLOW_DIR))


def test_the_cli_default_of_the_mlflow_folder_is_the_files(tmp_path) -> None:
    args = build_parser().parse_args(["mlflow-server"])
    assert args.config_defaults["dir"] == Path(MLFLOW_DIR)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            '[serve]\ndatabse_url = "x"\n',
            "[serve] databse_url: unknown key; did you mean database_url?",
        ),
        (
            '[serve]\nFEDTUNE_WORKDIR = "w"\n',
            "[serve] FEDTUNE_WORKDIR: unknown key; did you mean workdir? (a key is its "
            "variable's name in lower case, without FEDTUNE_)",
        ),
        (
            '[mlflow]\npublic_urls = ["http://a"]\n',
            "[mlflow] public_urls: unknown key; did you mean public_url?",
        ),
        ("[serv]\nport = 1\n", "[serv]: unknown section; did you mean serve?"),
        ("port = 8000\n", "port: a key outside a section: put it under [serve] or [mlflow]"),
        ("[serve]\nport = 0\n", "[serve] port: must be a port number, 1 to 65535, got 0"),
        ('[serve]\nport = "8000"\n', "[serve] port: must be a port number, 1 to 65535, got '8000'"),
        (
            '[mlflow]\npublic_url = ["box:5000"]\n',
            "[mlflow] public_url: must be a list of http(s) URLs",
        ),
        ("[mlflow]\nworkers = 0\n", "[mlflow] workers: must be a number of processes, at least 1"),
        ("[serve]\nworkdir = 3\n", "[serve] workdir: must be a path, got 3"),
        ("[serve\n", "<file>: invalid TOML"),
    ],
)
def test_a_bad_file_names_the_key(tmp_path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_a_bad_value_for_a_setting_names_its_key_not_a_variable(tmp_path) -> None:
    path = write(tmp_path, '[serve]\nbackend = "lokal"\n')
    with pytest.raises(ConfigError) as err:
        load_settings(load_config(path))
    assert str(err.value).startswith(f"{path}: [serve] backend: Input should be 'local'")


def test_a_secret_inline_needs_a_file_only_its_owner_reads(tmp_path) -> None:
    text = f'[serve]\napi_token = "{PASSWORD}"\n'
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path / "open", text, 0o644))
    assert "[serve] api_token: a secret in a file others can read: name a file with " in str(
        err.value
    )
    assert PASSWORD not in str(err.value)
    assert load_settings(load_config(write(tmp_path / "closed", text, 0o600))).token == PASSWORD
    url = '[serve]\ndatabase_url = "postgresql+psycopg://u:real-pass-0123@db/f"\n'
    with pytest.raises(ConfigError, match="database_url: a password in a file others can read"):
        load_config(write(tmp_path / "db", url, 0o640))
    (tmp_path / "token").write_text(PASSWORD + "\n")
    path = write(tmp_path, '[serve]\napi_token_file = "token"\n')
    assert load_settings(load_config(path)).token == PASSWORD  # a file named: fine in 0644


@pytest.mark.parametrize(
    "url, expected",
    [
        ("sqlite:///./fedtune.db", "sqlite:////srv/t/fedtune.db"),
        ("sqlite+pysqlite:///db/f.db?timeout=5", "sqlite+pysqlite:////srv/t/db/f.db?timeout=5"),
        ("sqlite:////abs/f.db", "sqlite:////abs/f.db"),
        ("sqlite://", "sqlite://"),
        ("sqlite:///:memory:", "sqlite:///:memory:"),
        ("postgresql+psycopg://u@db/f", "postgresql+psycopg://u@db/f"),
    ],
)
def test_a_relative_sqlite_file_is_anchored(url: str, expected: str) -> None:
    assert anchor_sqlite(url, Path("/srv/t")) == expected


def test_every_key_of_the_file_is_documented_and_an_option_of_its_verb() -> None:
    from fedtune.service.config_file import MLFLOW_KEYS, SERVE_OPTIONS

    page = (Path(__file__).resolve().parents[2] / "docs/reference/config-file.md").read_text()
    for key in (*MLFLOW_KEYS, *SERVE_OPTIONS):
        assert f"`{key}`" in page, key
    parser = build_parser()
    for verb, keys in (("serve", SERVE_OPTIONS), ("mlflow-server", MLFLOW_KEYS)):
        args = parser.parse_args([verb])
        assert not set(keys) - set(vars(args)), verb
