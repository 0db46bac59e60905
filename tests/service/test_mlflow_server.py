"""``fedtune mlflow-server``'s recipe: what MLflow is started with (the server itself runs in
``tests/integration/test_mlflow_tenancy.py`` and the e2e tenancy tests)."""

from __future__ import annotations

import configparser
import socket
import stat
import subprocess
import sys
from pathlib import Path

from fedtune.service.child_env import mlflow_server_env
from fedtune.service.mlflow_server import MlflowServer

SECRETS = {
    "FEDTUNE_API_TOKEN": "service-token",
    "FEDTUNE_MLFLOW_ADMIN_PASSWORD": "other",
    "MLFLOW_TRACKING_PASSWORD": "a-login",
    "MLFLOW_WORKSPACE": "team",
}


def test_the_server_runs_closed_with_workspaces_and_the_store_off_its_command_line(tmp_path):
    server = MlflowServer(tmp_path / "m", port=5123, backend_store_uri="postgresql://u:p%40ss@db/m")
    ini = configparser.ConfigParser()
    ini.read_string(server.auth_ini())
    assert ini["mlflow"]["default_permission"] == "NO_PERMISSIONS"
    assert ini["mlflow"]["grant_default_workspace_access"] == "false"
    assert ini["mlflow"]["database_uri"] == "postgresql://u:p%40ss@db/m"  # % survives the ini
    argv = server.argv("mlflow")
    assert {"--enable-workspaces", "--app-name=fedtune", "--port=5123"} <= set(argv)
    assert not any("p%40ss" in arg for arg in argv)  # the store's password: env only
    kept = mlflow_server_env({"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "k", **SECRETS})
    assert kept == {"PATH": "/usr/bin", "AWS_ACCESS_KEY_ID": "k"}  # an allowlist
    env = server.env("pw-0123456789abcdef", kept)
    assert env["MLFLOW_BACKEND_STORE_URI"] == "postgresql://u:p%40ss@db/m"
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"] == "pw-0123456789abcdef"
    assert env["MLFLOW_RBAC_SEED_DEFAULT_ROLES"] == "false" and env["PATH"] == "/usr/bin"
    assert not set(SECRETS) & set(env)  # none of the caller's fedtune settings or logins


def test_a_password_is_made_once_and_kept_private_unless_one_is_given(tmp_path):
    server = MlflowServer(tmp_path / "m")
    made = server.prepare({})
    assert len(made) >= 32 and server.prepare({}) == made  # the same after a restart
    assert stat.S_IMODE(server.password_path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "m" / "auth.ini").stat().st_mode) == 0o600
    given = MlflowServer(tmp_path / "g")
    assert given.prepare({"MLFLOW_AUTH_ADMIN_PASSWORD": "from-the-env-0123"}) == "from-the-env-0123"
    assert not given.password_path.exists()


def test_a_port_in_use_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cli = [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--dir", str(tmp_path / "m")]
        out = subprocess.run([*cli, "--port", str(port)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"fedtune: error: --port: 127.0.0.1:{port} is in use: another process (another MLflow "
        "server?) listens there; stop it, or pick another port with --port"
    ]
    assert not (tmp_path / "m").exists()  # refused before anything was made


# ---- who MLflow lets in: Host headers and origins (fedtune/service/mlflow_access.py) ----------


def _server(*argv: str, environ: dict[str, str] | None = None) -> MlflowServer:
    from fedtune.cli import build_parser
    from fedtune.cli.config_option import apply_config
    from fedtune.cli.mlflow_server import make_server

    args = build_parser().parse_args(["mlflow-server", "--dir", "/tmp/m", *argv])
    apply_config(args)  # the defaults of what no option, variable or file gives, as run() does
    return make_server(args, environ or {})


def _flag(argv: list[str], name: str) -> list[str] | None:
    found = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    assert len(found) <= 1
    return found[0].split(",") if found else None


def test_mlflows_own_default_hosts_are_what_fedtune_keeps():
    """``--allowed-hosts`` replaces MLflow's list: fedtune passes it MLflow's defaults plus the
    additions, so this copy must equal the installed MLflow's."""
    from mlflow.server.security_utils import get_default_allowed_hosts

    from fedtune.service.mlflow_access import MLFLOW_DEFAULT_HOSTS

    assert list(MLFLOW_DEFAULT_HOSTS) == get_default_allowed_hosts()


def test_a_public_url_gives_its_host_with_its_port_and_its_origin():
    from fedtune.service.mlflow_access import parse_public_url

    cases = {
        "http://box.test:5123": (("box.test:5123",), "http://box.test:5123"),
        " https://MLflow.Example.com/ ": (
            ("mlflow.example.com", "mlflow.example.com:443"),
            "https://mlflow.example.com",
        ),
        "https://m.example.com:443": (
            ("m.example.com", "m.example.com:443"),
            "https://m.example.com",
        ),
        "http://box:80": (("box", "box:80"), "http://box"),
        "https://box:8443": (("box:8443",), "https://box:8443"),
        "http://[FD00::5]:5000": (("[fd00::5]:5000",), "http://[fd00::5]:5000"),
        "http://192.168.1.7:5000": (("192.168.1.7:5000",), "http://192.168.1.7:5000"),
    }
    for value, (hosts, origin) in cases.items():
        parsed = parse_public_url(value)
        assert (parsed.hosts, parsed.origin, parsed.url) == (hosts, origin, origin), value


def test_a_bad_public_url_is_one_line_naming_the_flag_and_never_its_password(tmp_path):
    bad = {
        "box:5000": "must start with http:// or https://",
        "ftp://box": "must start with http:// or https://",
        "http://box:5000/mlflow": "without a path",
        "http://box:5000/?x=1": "without a path",
        "http://box:5000#top": "without a path",
        "http://*.lan:5000": "is not a host name",
        "http://box:0": "port 0",
        "http://box:99999": "is not a URL",
        "http://bøx:5000": "ASCII (punycode)",
        "http://ana:s3cret-pw@box:5000": "must not hold a user name or password",
    }
    cli = [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--dir", str(tmp_path / "m")]
    for value, reason in bad.items():
        out = subprocess.run([*cli, "--public-url", f"http://ok:1,{value}"], capture_output=True)
        lines = out.stderr.decode().strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, (value, lines)
        assert lines[0].startswith("fedtune: error: --public-url: ") and reason in lines[0]
        assert "s3cret-pw" not in lines[0]
    assert not (tmp_path / "m").exists()  # refused before anything was made


def test_public_urls_add_to_mlflows_defaults_and_the_ui_may_post_from_them():
    server = _server(
        "--host=0.0.0.0",
        "--port=5123",
        "--public-url=http://box.test:5123,https://mlflow.example.com",
        "--public-url",
        "http://box.test:5123/",  # the same URL once more: kept once
        "--allowed-hosts=box:5000",
    )
    argv = server.argv("mlflow")
    hosts = _flag(argv, "--allowed-hosts")
    assert hosts is not None and len(hosts) == len(set(hosts))
    from fedtune.service.mlflow_access import MLFLOW_DEFAULT_HOSTS

    assert hosts[: len(MLFLOW_DEFAULT_HOSTS)] == list(MLFLOW_DEFAULT_HOSTS)  # loopback kept
    added = hosts[len(MLFLOW_DEFAULT_HOSTS) :]
    assert added == ["box.test:5123", "mlflow.example.com", "mlflow.example.com:443", "box:5000"]
    origins = _flag(argv, "--cors-allowed-origins")
    assert origins == ["http://box.test:5123", "https://mlflow.example.com"]
    assert "*" not in hosts and "*" not in origins  # every other check stays on
    assert not any("disable-security" in a for a in argv)


def test_without_additions_mlflow_keeps_its_own_defaults():
    argv = _server().argv("mlflow")
    assert _flag(argv, "--allowed-hosts") is None and _flag(argv, "--cors-allowed-origins") is None
    wildcard = _server("--host=0.0.0.0").argv("mlflow")
    assert _flag(wildcard, "--allowed-hosts") is None  # no name to add: loopback and private


def test_a_named_bind_address_is_served_to_browsers_too():
    argv = _server("--host=box.lan", "--port=5001").argv("mlflow")
    assert "box.lan:5001" in _flag(argv, "--allowed-hosts")
    assert _flag(argv, "--cors-allowed-origins") == ["http://box.lan:5001"]
    out = subprocess.run(
        [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--host", "a b"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == "fedtune: error: --host: 'a b' is not an address or a host name"


def test_mlflows_own_variables_add_to_the_lists_instead_of_being_dropped():
    environ = {
        "MLFLOW_SERVER_ALLOWED_HOSTS": "proxy.lan:8080, other:1",
        "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS": "https://notebooks.example.com",
    }
    argv = _server("--allowed-hosts=box:5000", environ=environ).argv("mlflow")
    assert _flag(argv, "--allowed-hosts")[-3:] == ["box:5000", "proxy.lan:8080", "other:1"]
    assert _flag(argv, "--cors-allowed-origins") == ["https://notebooks.example.com"]


def test_the_banner_names_the_addresses_it_serves():
    from fedtune.cli.mlflow_server import banner

    public = _server("--host=0.0.0.0", "--port=5123", "--public-url=http://box.test:5123")
    lines = banner(public, given=True).splitlines()
    assert lines[0].startswith(
        "MLflow at http://box.test:5123 and http://127.0.0.1:5123 (this machine), "
    )
    assert lines[1:] == [
        "Start the service against it with:",
        "  MLFLOW_TRACKING_URI=http://127.0.0.1:5123 FEDTUNE_MLFLOW_WORKSPACES=true \\",
        "  FEDTUNE_MLFLOW_PUBLIC_URL=http://box.test:5123 \\",
        "  FEDTUNE_MLFLOW_ADMIN_PASSWORD=$MLFLOW_AUTH_ADMIN_PASSWORD fedtune serve",
    ]
    alone = banner(_server("--host=0.0.0.0", "--port=5123"), given=True)
    assert alone.startswith(
        "MLflow at http://127.0.0.1:5123 (this machine; other machines' browsers need "
        "--public-url), "
    )
    assert "FEDTUNE_MLFLOW_PUBLIC_URL" not in alone
    local = banner(_server("--port=5123"), given=False).splitlines()
    assert local[0].startswith("MLflow at http://127.0.0.1:5123, one workspace per project")
    assert local[3] == "  FEDTUNE_MLFLOW_ADMIN_PASSWORD=$(cat /tmp/m/admin-password) fedtune serve"
    named = banner(_server("--host=box.lan", "--port=5001"), given=True)
    assert named.startswith("MLflow at http://box.lan:5001, one workspace")


def test_the_settings_files_public_url_is_served_as_the_option_would(tmp_path: Path) -> None:
    from fedtune.cli import build_parser
    from fedtune.cli.config_option import apply_config
    from fedtune.cli.mlflow_server import make_server

    config = tmp_path / "team.toml"
    config.write_text('[mlflow]\nhost = "0.0.0.0"\npublic_url = ["http://box.lan:5000"]\n')
    args = build_parser().parse_args(["mlflow-server", "--config", str(config)])
    apply_config(args)
    from_file = make_server(args, {})
    assert [url.url for url in from_file.public_urls] == ["http://box.lan:5000"]
    assert from_file.root == tmp_path / "mlflow-server"  # relative to the file's folder
    given = build_parser().parse_args(
        ["mlflow-server", "--config", str(config), "--public-url", "http://other.lan:5000"]
    )
    apply_config(given)  # the option wins over the file
    assert [url.url for url in make_server(given, {}).public_urls] == ["http://other.lan:5000"]


# ---- the one process fedtune mlflow-server becomes (fedtune/service/mlflow_run.py) -------------

#: runs MLflow's own ``mlflow server`` command with fedtune's options up to where it would spawn
#: uvicorn, and prints that command and the environment it would give it
_MLFLOWS_OWN = """
import json, os, sys
import mlflow.server
from mlflow.cli import server
before = dict(os.environ)
seen = {}
class Done:
    pid = 0
    def poll(self): return 0
    def wait(self): return 0
def spawn(cmd, extra_env=None, **kwargs):
    seen.update(cmd=cmd, env={**os.environ, **(extra_env or {})})
    return Done()
mlflow.server._exec_cmd = spawn
server.main(sys.argv[1:], standalone_mode=False)
added = {k: v for k, v in seen["env"].items() if before.get(k) != v}
print(json.dumps({"cmd": seen["cmd"], "env": added}))
"""


def test_the_one_process_serves_what_mlflow_server_would_start(tmp_path):
    """The variables and uvicorn settings of :mod:`fedtune.service.mlflow_run` are those MLflow's
    own command gives its uvicorn worker, for the same options (so an MLflow upgrade that adds
    one fails here)."""
    from fedtune.service import mlflow_run

    server = _server(
        "--host=0.0.0.0",
        "--port=5123",
        "--workers=2",
        "--public-url=http://box.test:5123",
        "--allowed-hosts=box:5000",
    )
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {
        **mlflow_server_env(),
        "MLFLOW_BACKEND_STORE_URI": store,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", _MLFLOWS_OWN, *server.options()],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    mlflows = json_line(done.stdout)
    options = mlflow_run.parse_options(server.options())
    ours = mlflow_run.worker_env(options, store)
    # made here before any worker, as MLflow does for its own basic-auth app
    assert ours.pop("_MLFLOW_AUTH_ADMIN_BOOTSTRAPPED") == "true"
    theirs = mlflows["env"]
    assert (
        len(ours.pop("_MLFLOW_SERVER_BOOT_ID")) == len(theirs.pop("_MLFLOW_SERVER_BOOT_ID")) == 32
    )
    assert ours == theirs
    from mlflow.server import _UVICORN_LOG_CONFIG

    # what mlflow_run passes uvicorn.run: the same app, log config, address and workers
    assert mlflows["cmd"][1:] == [
        *("-m", "uvicorn", "--log-config", str(_UVICORN_LOG_CONFIG)),
        *("--host", options.host, "--port", str(options.port), "--workers", str(options.workers)),
        *("--factory", mlflow_run.APP),
    ]
    assert (options.host, options.port, options.workers) == ("0.0.0.0", 5123, 2)
    notice = done.stderr.strip().splitlines()[-1]
    assert notice == mlflow_run.security_notice(options)


def test_import_server_freezes_only_once_everything_imported(collector, monkeypatch):
    """``mlflow_run.import_server``: MLflow's server imported, then every object alive frozen;
    a module that fails to import freezes nothing (the step that needs it says why)."""
    import gc

    from fedtune.service import mlflow_run

    gc.unfreeze()
    monkeypatch.setattr(mlflow_run, "SERVER_MODULES", ("json", "fedtune_no_such_module"))
    assert mlflow_run.import_server() is False and gc.get_freeze_count() == 0
    monkeypatch.setattr(mlflow_run, "SERVER_MODULES", ("json",))
    assert mlflow_run.import_server() is True and gc.get_freeze_count() > 1000


def json_line(stdout: str) -> dict:
    """The last line of a process's output, parsed as JSON."""
    import json

    return json.loads(stdout.strip().splitlines()[-1])


def test_a_store_that_fails_to_upgrade_or_to_take_its_admin_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as probe:  # a port nobody listens on: it fails before it binds
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cli = [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--port", str(port)]
    (tmp_path / "a-file").write_text("")
    env = {
        **mlflow_server_env(),
        "MLFLOW_AUTH_ADMIN_PASSWORD": "an-admin-password-0123",
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}",
    }
    bad_store = subprocess.run(
        [*cli, "--dir", str(tmp_path / "s")], env=env, capture_output=True, text=True
    )
    assert bad_store.returncode == 2, bad_store.stderr[-2000:]
    assert bad_store.stderr.strip().splitlines() == [
        "fedtune: error: --backend-store-uri: mlflow db upgrade failed: FileExistsError: "
        f"[Errno 17] File exists: '{tmp_path / 'a-file'}'"
    ]
    assert bad_store.stdout == ""  # no banner: nothing serves
    env.update(
        MLFLOW_AUTH_ADMIN_PASSWORD="short", MLFLOW_BACKEND_STORE_URI=f"sqlite:///{tmp_path}/m.db"
    )
    bad_admin = subprocess.run(
        [*cli, "--dir", str(tmp_path / "a")], env=env, capture_output=True, text=True
    )
    assert bad_admin.returncode == 2, bad_admin.stderr[-2000:]
    lines = bad_admin.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "fedtune: error: --backend-store-uri: its login store failed: MlflowException: "
    )
    assert "at least 12 characters" in lines[0]
    assert bad_admin.stdout == ""


def test_the_start_runs_with_the_collector_paused_and_serves_with_it_on(monkeypatch):
    """The store's preparation and the stores' opening run with Python's cyclic garbage collector
    paused, uvicorn with it on; the banner still comes between them, and each failure keeps its
    exit code with the collector back as it was."""
    import gc
    import os

    from fedtune.service import mlflow_run

    seen: list[tuple[str, bool]] = []
    outcome = {"prepare": None, "open": True}

    def prepare_store(store_uri):
        seen.append(("prepare " + store_uri, gc.isenabled()))
        return outcome["prepare"]

    def open_stores(options, store_uri):
        seen.append((f"open {options.port}", gc.isenabled()))
        return outcome["open"]

    monkeypatch.setattr(mlflow_run, "prepare_store", prepare_store)
    monkeypatch.setattr(mlflow_run, "_open_stores", open_stores)
    monkeypatch.setattr(
        mlflow_run, "_run_uvicorn", lambda options: seen.append(("serve", gc.isenabled()))
    )
    monkeypatch.setattr(
        "builtins.print", lambda *a, **k: seen.append(("print " + " ".join(a), gc.isenabled()))
    )
    monkeypatch.setattr(os, "environ", {})  # main sets the worker's variables: not this process's
    argv = [
        *("--enable-workspaces", "--app-name=fedtune", "--host=127.0.0.1", "--port=5123"),
        *("--workers=1", "--serve-artifacts", "--artifacts-destination=/a"),
    ]
    assert gc.isenabled()
    for prepared, opened, code in ((None, True, 0), (None, False, 1), ("it broke", True, 2)):
        outcome.update(prepare=prepared, open=opened)
        os.environ.update(MLFLOW_BACKEND_STORE_URI="sqlite:///s.db", _FEDTUNE_MLFLOW_BANNER="hi")
        seen.clear()
        assert mlflow_run.main(argv) == code
        assert gc.isenabled()
        steps = [("prepare sqlite:///s.db", False)]
        if prepared is None:
            steps += [("print hi", False), ("open 5123", False)]
            steps += [("serve", True)] if opened else []
        else:
            steps += [("print fedtune: error: --backend-store-uri: it broke", True)]
        assert seen == steps
