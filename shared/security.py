"""How a gearbus process proves who it is to NATS and checks the server: a credential (a
NATS ``.creds`` file or an ``.nk`` nkey seed) and TLS files, from command-line options or
the GEARBUS_CREDS / GEARBUS_TLS_CA / GEARBUS_TLS_CERT / GEARBUS_TLS_KEY environment
variables. Everything is read and checked when the process starts, so a missing or
malformed file is a clear error before anything connects.

A process whose credential is a JWT named N uses the inbox prefix ``_INBOX.N``: its
permissions let it receive replies there and nowhere else (see shared/permissions.py)."""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import nats
import nats.errors
from nats.aio.client import RawCredentials

from shared import nats_jwt
from shared.nats_jwt import CredentialsError

ENV_CREDS = "GEARBUS_CREDS"
ENV_TLS_CA = "GEARBUS_TLS_CA"
ENV_TLS_CERT = "GEARBUS_TLS_CERT"
ENV_TLS_KEY = "GEARBUS_TLS_KEY"
SECURITY_ENV = (ENV_CREDS, ENV_TLS_CA, ENV_TLS_CERT, ENV_TLS_KEY)
INBOX_ROOT = "_INBOX"


def _read(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CredentialsError(f"{option} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"{option} {path}: cannot read it ({exc})") from None


@dataclass(frozen=True)
class Security:
    """A process's NATS credential (the file's text, checked) and TLS files (paths, checked).
    The empty default connects anonymously and in plain text."""

    credential: str = ""
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""

    def __post_init__(self):
        if self.credential:
            identity(self.credential)
        if bool(self.tls_cert) != bool(self.tls_key):
            raise CredentialsError("--tls-cert and --tls-key go together: a client certificate needs its key")
        if self.tls_ca or self.tls_cert:
            self.ssl_context()

    @classmethod
    def load(cls, creds: str | None = None, tls_ca: str | None = None, tls_cert: str | None = None,
             tls_key: str | None = None, environ: Mapping[str, str] = os.environ) -> Security:
        """From options, each falling back to its environment variable."""
        creds = creds or environ.get(ENV_CREDS, "")
        return cls(credential=_read(creds, "--creds") if creds else "",
                   tls_ca=tls_ca or environ.get(ENV_TLS_CA, ""), tls_cert=tls_cert or environ.get(ENV_TLS_CERT, ""),
                   tls_key=tls_key or environ.get(ENV_TLS_KEY, ""))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Security:
        return cls.load(args.creds, args.tls_ca, args.tls_cert, args.tls_key)

    @property
    def identity(self) -> str:
        """The credential's name ("" for none or a bare nkey seed)."""
        return identity(self.credential) if self.credential else ""

    @property
    def enabled(self) -> bool:
        return bool(self.credential or self.tls_ca or self.tls_cert)

    def with_credential(self, credential: str) -> Security:
        """The same TLS files with another credential (an app's processes get their app's)."""
        return Security(credential, self.tls_ca, self.tls_cert, self.tls_key)

    def ssl_context(self) -> ssl.SSLContext | None:
        if not (self.tls_ca or self.tls_cert):
            return None
        for option, path in (("--tls-ca", self.tls_ca), ("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key)):
            if path and not os.path.isfile(path):
                raise CredentialsError(f"{option} {path}: no such file")
        try:
            context = ssl.create_default_context(cafile=self.tls_ca or None)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
        except ssl.SSLError as exc:
            raise CredentialsError(f"TLS files {self.tls_ca or '-'}, {self.tls_cert or '-'}, {self.tls_key or '-'}: "
                                   f"{exc.reason or exc}") from None
        return context

    def nats_options(self) -> dict:
        """Keyword arguments for ``nats.connect``."""
        options: dict = {}
        if self.credential:
            if _is_creds(self.credential):
                options["user_credentials"] = RawCredentials(self.credential)
            else:
                options["nkeys_seed_str"] = self.credential.strip()
            if self.identity:
                options["inbox_prefix"] = f"{INBOX_ROOT}.{self.identity}"
        context = self.ssl_context()
        if context is not None:
            options["tls"] = context
        return options

    def tls_env(self) -> dict[str, str]:
        """The TLS files for a child process's environment (its credential comes separately)."""
        return {name: value for name, value in ((ENV_TLS_CA, self.tls_ca), (ENV_TLS_CERT, self.tls_cert),
                                                (ENV_TLS_KEY, self.tls_key)) if value}


def connect_error(exc: BaseException, servers: list[str], security: Security) -> ConnectionError | None:
    """A refused connection explained (credentials or TLS), or None for other failures."""
    where = ", ".join(servers)
    if isinstance(exc, ssl.SSLCertVerificationError):
        hint = "renew it (gearbus security init --tls)" if "expired" in str(exc.verify_message) \
            else "--tls-ca names the CA that signed it"
        return ConnectionError(f"TLS: the certificate of the NATS server at {where} is not trusted: "
                               f"{exc.verify_message} ({hint})")
    if isinstance(exc, ssl.SSLError):
        hint = " (the server asks for a client certificate: --tls-cert and --tls-key)" \
            if "CERTIFICATE_REQUIRED" in str(exc.reason) else ""
        return ConnectionError(f"TLS handshake with the NATS server at {where} failed: {exc.reason or exc}{hint}")
    text = str(exc)
    if "Authorization Violation" in text or "Authentication" in text:
        given = f"the credential of {security.identity!r}" if security.identity else \
            "the credential given" if security.credential else "no credential (pass --creds)"
        return ConnectionError(f"the NATS server at {where} refused {given}: {text.removeprefix('nats: ')}")
    return None


async def nats_connect(servers: list[str], security: Security, **options) -> nats.NATS:
    """``nats.connect`` with ``security``'s options. A refused credential or certificate ends
    the first connection's attempts at once with a ConnectionError that says why (retrying
    cannot help); once connected, errors go to ``options["error_cb"]`` as usual."""
    refused: list[ConnectionError] = []
    error_cb = options.pop("error_cb", None)

    async def on_error(exc: Exception) -> None:
        explained = None if connecting.done() else connect_error(exc, servers, security)
        if explained is not None:
            refused.append(explained)
            connecting.cancel()
        elif error_cb is not None:
            await error_cb(exc)

    connecting = asyncio.ensure_future(nats.connect(servers=servers, error_cb=on_error, **options,
                                                    **security.nats_options()))
    try:
        return await connecting
    except asyncio.CancelledError:
        if refused:
            raise refused[0] from None
        raise
    except (nats.errors.Error, ssl.SSLError) as exc:
        raise connect_error(exc, servers, security) or exc from None


def _is_creds(text: str) -> bool:
    return "BEGIN NATS USER JWT" in text


def identity(credential: str) -> str:
    """The name in a credentials file's JWT ("" for an nkey seed); CredentialsError when the
    text is neither."""
    if _is_creds(credential):
        token, _ = nats_jwt.parse_creds(credential)
        name = nats_jwt.claims(token).get("name", "")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            raise CredentialsError(f"the credential's JWT names a user gearbus cannot use: {name!r}")
        return name
    if credential.strip().startswith("SU"):
        nats_jwt.KeyPair.from_seed(credential)
        return ""
    raise CredentialsError("neither a NATS credentials file (.creds) nor a user nkey seed (.nk, 'SU...')")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--creds and the TLS options, for every role and the CLI."""
    group = parser.add_argument_group("security")
    group.add_argument("--creds", metavar="FILE", help=f"NATS credential: a .creds file or an .nk seed (env {ENV_CREDS})")
    group.add_argument("--tls-ca", metavar="FILE", help=f"CA certificate that signed the server's (env {ENV_TLS_CA})")
    group.add_argument("--tls-cert", metavar="FILE", help=f"client certificate (env {ENV_TLS_CERT})")
    group.add_argument("--tls-key", metavar="FILE", help=f"client certificate's key (env {ENV_TLS_KEY})")
