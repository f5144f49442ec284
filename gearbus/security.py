"""`gearbus security init DIR [--tls]`: a NATS server configuration and one credential per
role, with NATS's decentralised JWT model: an operator, a system account and the gearbus
account, whose users carry least-privilege subject permissions (shared/permissions.py).

The account also gets a signing key (``apps-signer.nk``) that only masters hold: with it they
issue each application's processes a user scoped to that app, which the server accepts
without a reload (static users in a config file could not be added at run time).

With ``--tls`` a CA, a server certificate and a client certificate are generated (with the
``cryptography`` package); the server requires TLS and verifies client certificates, and every
role verifies the server against the CA."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import socket
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared import nats_jwt, permissions
from shared.nats_jwt import KeyPair
from shared.security import Security

SERVER_CONFIG = "nats-server.conf"
AUTH_CONFIG = "auth.conf"  # operator, accounts and TLS: included by nats-server.conf (and by embedded servers)
APP_SIGNER = "apps-signer.nk"
TLS_FILES = ("ca.pem", "server-cert.pem", "server-key.pem", "client-cert.pem", "client-key.pem")
DEFAULT_HOSTNAMES = ("localhost", "127.0.0.1", "::1", "nats")
CERT_DAYS = 825  # what browsers and most TLS stacks still accept for a leaf certificate


@dataclass(frozen=True)
class SecurityDir:
    """A directory written by :func:`init`: where each role finds its files."""

    path: str

    def creds(self, role: str) -> str:
        return os.path.join(self.path, f"{role}.creds")

    @property
    def app_signer(self) -> str:
        return os.path.join(self.path, APP_SIGNER)

    @property
    def auth_config(self) -> str:
        return os.path.join(self.path, AUTH_CONFIG)

    @property
    def tls(self) -> bool:
        return os.path.exists(os.path.join(self.path, "ca.pem"))

    def _tls_files(self) -> dict[str, str]:
        if not self.tls:
            return {}
        return {"tls_ca": os.path.join(self.path, "ca.pem"), "tls_cert": os.path.join(self.path, "client-cert.pem"),
                "tls_key": os.path.join(self.path, "client-key.pem")}

    def security(self, role: str) -> Security:
        return Security.load(self.creds(role), environ={}, **self._tls_files())

    def role_args(self, role: str) -> list[str]:
        """Command-line options giving a role its credential (and a master the app signer)."""
        args = ["--creds", self.creds(role)]
        for option, path in self._tls_files().items():
            args += ["--" + option.replace("_", "-"), path]
        if role == "master":
            args += ["--app-signer", self.app_signer]
        return args


def _write(path: str, text: str | bytes, secret: bool = False) -> None:
    mode = "wb" if isinstance(text, bytes) else "w"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, mode) as f:
        f.write(text)


def init(directory: str, tls: bool = False, listen: str = "127.0.0.1:4222",
         hostnames: tuple[str, ...] = (), cert_days: int = CERT_DAYS, store_dir: str = "",
         if_missing: bool = False) -> SecurityDir:
    """Write the server configuration and the role credentials (and TLS files, valid for
    ``cert_days``) into ``directory``, which must not hold a previous set (with
    ``if_missing``, a previous set is kept as it is). ``store_dir``: JetStream's directory
    in nats-server.conf (default DIR/jetstream)."""
    os.makedirs(directory, exist_ok=True)
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, AUTH_CONFIG)):
        if if_missing:
            return SecurityDir(directory)
        raise FileExistsError(f"{directory} already holds a gearbus security set ({AUTH_CONFIG}): "
                              "use a new directory, or remove it to start over")
    operator, system, account, signer = (KeyPair.create("operator"), KeyPair.create("account"),
                                         KeyPair.create("account"), KeyPair.create("account"))
    accounts = {system.public: nats_jwt.account_jwt(operator, system.public, "SYS", jetstream=False),
                account.public: nats_jwt.account_jwt(operator, account.public, "gearbus", [signer.public])}
    auth = [f"operator: {nats_jwt.operator_jwt(operator, 'gearbus', system.public)}",
            f"system_account: {system.public}", "resolver: MEMORY", "resolver_preload: {",
            *(f"  {key}: {token}" for key, token in accounts.items()), "}"]
    if tls:
        _write_tls(directory, (*DEFAULT_HOSTNAMES, socket.gethostname(), *hostnames), cert_days)
        auth += ["tls {", f'  cert_file: "{os.path.join(directory, "server-cert.pem")}"',
                 f'  key_file: "{os.path.join(directory, "server-key.pem")}"',
                 f'  ca_file: "{os.path.join(directory, "ca.pem")}"', "  verify: true", "  timeout: 5", "}"]
    _write(os.path.join(directory, AUTH_CONFIG), "\n".join(auth) + "\n", secret=False)
    _write(os.path.join(directory, SERVER_CONFIG),
           f"# gearbus: nats-server -c {SERVER_CONFIG}\nlisten: {listen}\nmax_payload: 8MB\n"
           f'jetstream {{ store_dir: "{store_dir or os.path.join(directory, "jetstream")}" }}\ninclude {AUTH_CONFIG}\n')
    for role in permissions.ROLES:
        allowed = permissions.role(role)
        _write(os.path.join(directory, f"{role}.creds"),
               nats_jwt.new_user_creds(account, role, allowed.publish, allowed.subscribe), secret=True)
    _write(os.path.join(directory, APP_SIGNER), signer.seed + "\n", secret=True)
    return SecurityDir(directory)


def add_user(directory: str, name: str, publish: list[str] = (), subscribe: list[str] = (),
             streams: list[str] = (), allow_shell: bool = False) -> str:
    """A user for your own data: it may publish and subscribe to these subjects and use these
    JetStream streams, nothing of gearbus's; with ``allow_shell``, also all a client may do and
    submit shell apps (`gearbus shell`: a command on every worker it names). Signed with the
    account's signing key, so the running server accepts it at once. Returns the path of NAME.creds."""
    made = SecurityDir(os.path.abspath(directory))
    if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in permissions.ROLES or re.fullmatch(r"app\d+", name):
        raise ValueError(f"user name {name!r}: use letters, digits, - and _, and neither a role's name nor app<N>")
    path = made.creds(name)
    if os.path.exists(path):
        raise FileExistsError(f"{path} exists: choose another name")
    with open(made.app_signer, encoding="utf-8") as f:
        signer = KeyPair.from_seed(f.read())
    token, _ = nats_jwt.parse_creds(made.security("master").credential)
    allowed = permissions.data_user(name, list(publish), list(subscribe), list(streams), allow_shell)
    _write(path, nats_jwt.new_user_creds(signer, name, allowed.publish, allowed.subscribe,
                                         account=nats_jwt.claims(token)["iss"]), secret=True)
    return path


def _write_tls(directory: str, hostnames: tuple[str, ...], days: int) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    not_after = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gearbus CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(max(not_after, now + datetime.timedelta(days=1)))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    _write(os.path.join(directory, "ca.pem"), ca.public_bytes(serialization.Encoding.PEM))
    names = []
    for name in dict.fromkeys(hostnames):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    for kind, usage, alt_names in (("server", ExtendedKeyUsageOID.SERVER_AUTH, names),
                                   ("client", ExtendedKeyUsageOID.CLIENT_AUTH, [])):
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gearbus {kind}")]))
                   .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(min(now, not_after) - datetime.timedelta(minutes=5))
                   .not_valid_after(not_after)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        _write(os.path.join(directory, f"{kind}-cert.pem"), cert.public_bytes(serialization.Encoding.PEM))
        _write(os.path.join(directory, f"{kind}-key.pem"),
               key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption()), secret=True)


def summary(made: SecurityDir) -> str:
    """What `gearbus security init` wrote and how each role uses it."""
    d = made.path
    tls = ""
    if made.tls:
        tls = f" --tls-ca {d}/ca.pem --tls-cert {d}/client-cert.pem --tls-key {d}/client-key.pem"
    return "\n".join([
        f"wrote {d}:",
        f"  {SERVER_CONFIG} (with {AUTH_CONFIG}): nats-server -c {d}/{SERVER_CONFIG}",
        "  " + ", ".join(f"{role}.creds" for role in permissions.ROLES) + f", {APP_SIGNER} (masters only)"
        + (", ca.pem, server-*.pem, client-*.pem" if made.tls else ""),
        "run each role with its credential:",
        f"  python -m services.master --creds {d}/master.creds --app-signer {d}/{APP_SIGNER}{tls}",
        f"  python -m services.worker --creds {d}/worker.creds{tls}",
        f"  gearbus submit --creds {d}/client.creds{tls} app.py",
        f"  gearbus dashboard --creds {d}/dashboard.creds{tls}",
    ])
