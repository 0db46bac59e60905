"""MLflow's tracking server with one workspace per project and logins, as fedtune needs it.

``fedtune mlflow-server`` runs it on one machine with what the Helm chart's MLflow Deployment
sets, so that nobody copies the recipe by hand (``docs/how-to/team-one-machine.md``):

* what ``mlflow server --enable-workspaces --app-name fedtune`` runs (MLflow's basic-auth app
  with the user list scoped to a caller's workspaces: :mod:`.mlflow_app`), serving artifacts, in
  one process of its own (:mod:`.mlflow_run`: the variables and uvicorn settings MLflow's command
  gives its worker, without that command and its prepare step as processes of their own);
* a basic-auth config where nobody may do anything by default (``NO_PERMISSIONS``, no default
  workspace): fedtune's service grants each project's members their workspace
  (:mod:`.mlflow_tenancy`);
* the admin login: ``MLFLOW_AUTH_ADMIN_PASSWORD`` when set, else a random password made once
  and kept in ``<dir>/admin-password`` (0600), which the service is then given as
  ``FEDTUNE_MLFLOW_ADMIN_PASSWORD``; the Flask session key is derived from it, as the chart does;
* ``mlflow db upgrade`` of the store before the server starts (the chart's init container),
  then its login store (tables, admin) made once, before the workers start (a failure: one
  line, exit 2);
* no jobs run by the server, and MLflow's default roles not seeded;
* MLflow's Host and origin checks on, accepting loopback (the service's own connection), the
  bind address and the URLs the members' browsers open (``--public-url``), computed once in
  :mod:`.mlflow_access`.

The server gets only what :func:`.child_env.mlflow_server_env` keeps of the caller's environment:
none of fedtune's settings or tokens, no MLflow login.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from . import mlflow_access as access
from .mlflow_access import PublicUrl

__all__ = ["AUTH_INI", "MlflowServer"]

#: MLflow's basic-auth config (``MLFLOW_AUTH_CONFIG_PATH``); the chart writes the same keys
AUTH_INI = """[mlflow]
default_permission = NO_PERMISSIONS
database_uri = {database_uri}
admin_username = {admin_username}
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
auth_cache_ttl_seconds = {cache_seconds}
"""


@dataclass(frozen=True)
class MlflowServer:
    """One MLflow tracking server with workspaces and logins.

    Attributes:
        root: its folder: the default stores, the auth config and the admin password.
        host: bind address.
        port: port.
        workers: the server's worker processes.
        backend_store_uri: the tracking store (default: ``sqlite:///<root>/mlflow.db``); also
            the auth store, as in the chart.
        artifacts_destination: where served artifacts go (default: ``<root>/artifacts``).
        admin_username: the admin user.
        cache_seconds: how long a revoked login or a changed role may still be honoured.
        allowed_hosts: more Host headers MLflow accepts (``host:port``), besides its defaults
            (loopback and private addresses) and the public URLs'.
        public_urls: the URLs browsers open it at: their Host headers and origins are accepted.
        cors_allowed_origins: more origins whose API requests MLflow accepts.
    """

    root: Path
    host: str = "127.0.0.1"
    port: int = 5000
    workers: int = 1
    backend_store_uri: str | None = None
    artifacts_destination: str | None = None
    admin_username: str = "admin"
    cache_seconds: int = 30
    allowed_hosts: tuple[str, ...] = ()
    public_urls: tuple[PublicUrl, ...] = ()
    cors_allowed_origins: tuple[str, ...] = ()

    @property
    def served(self) -> tuple[PublicUrl, ...]:
        """The addresses browsers may open it at: the public URLs, then the bind address when
        it is one machine's name or address (loopback needs no entry; a wildcard has no name)."""
        bound = access.bind_url(self.host, self.port)
        return (*self.public_urls, *([bound] if bound and bound not in self.public_urls else []))

    @property
    def store_uri(self) -> str:
        """The tracking (and auth) store's URI."""
        return self.backend_store_uri or f"sqlite:///{self.root.resolve() / 'mlflow.db'}"

    @property
    def password_path(self) -> Path:
        """Where a password this command made is kept."""
        return self.root.resolve() / "admin-password"

    def auth_ini(self) -> str:
        """The basic-auth config's text (``%`` escaped: it is an ini file with interpolation)."""
        return AUTH_INI.format(
            database_uri=self.store_uri.replace("%", "%%"),
            admin_username=self.admin_username,
            cache_seconds=self.cache_seconds,
        )

    def env(self, password: str, environ: Mapping[str, str]) -> dict[str, str]:
        """The server's environment.

        Args:
            password: the admin password.
            environ: what it keeps of the caller's (``child_env.mlflow_server_env``).

        Returns:
            Variable -> value.
        """
        env = dict(environ)
        flask_key = hashlib.sha256(f"fedtune-mlflow-flask:{password}".encode()).hexdigest()
        env.update(
            MLFLOW_AUTH_CONFIG_PATH=str(self.root.resolve() / "auth.ini"),
            MLFLOW_AUTH_ADMIN_USERNAME=self.admin_username,
            MLFLOW_AUTH_ADMIN_PASSWORD=password,
            MLFLOW_FLASK_SERVER_SECRET_KEY=flask_key,
            MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
            MLFLOW_RBAC_SEED_DEFAULT_ROLES="false",
            MLFLOW_BACKEND_STORE_URI=self.store_uri,
        )
        return env

    def argv(self, mlflow: str) -> list[str]:
        """The ``mlflow server`` command this server is (the store comes from the environment,
        not argv, which every user of the machine can read). ``fedtune mlflow-server`` runs its
        :meth:`options` in one process of its own (:mod:`.mlflow_run`) instead.

        Args:
            mlflow: the ``mlflow`` executable.

        Returns:
            The argv.
        """
        return [mlflow, "server", *self.options()]

    def options(self) -> list[str]:
        """``mlflow server``'s options for this server.

        Returns:
            The options, each ``--name=value`` or a flag.
        """
        artifacts = self.artifacts_destination or str(self.root.resolve() / "artifacts")
        options = [
            "--enable-workspaces",
            "--app-name=fedtune",
            f"--host={self.host}",
            f"--port={self.port}",
            f"--workers={self.workers}",
            "--serve-artifacts",
            f"--artifacts-destination={artifacts}",
        ]
        hosts = access.allowed_hosts(self.served, self.allowed_hosts)
        if hosts:
            options.append(f"--allowed-hosts={','.join(hosts)}")
        origins = access.cors_origins(self.served, self.cors_allowed_origins)
        if origins:
            options.append(f"--cors-allowed-origins={','.join(origins)}")
        return options

    def prepare(self, environ: Mapping[str, str]) -> str:
        """Make its folder (0700), its admin password when none is given, and its auth config.

        Args:
            environ: what it keeps of the caller's (``MLFLOW_AUTH_ADMIN_PASSWORD``).

        Returns:
            The admin password.
        """
        from .admin_token import read_or_make_secret

        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)
        password = environ.get("MLFLOW_AUTH_ADMIN_PASSWORD") or read_or_make_secret(
            self.password_path, "MLFLOW_AUTH_ADMIN_PASSWORD"
        )
        ini = self.root.resolve() / "auth.ini"
        fd = os.open(ini, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.auth_ini())
        return password
