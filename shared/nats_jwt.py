"""NATS's decentralised identities: nkeys and the JWTs that chain an operator, an account and
its users (the format nats-server verifies; see docs.nats.io "JWT"). gearbus mints them for
`gearbus security init` and, in the master, for each application's own processes, which is
why a user can be issued at run time without reloading the server's configuration.

Users carry their subject permissions in their JWT; the server enforces them."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass

import nkeys

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIXES = {"operator": nkeys.PREFIX_BYTE_OPERATOR, "account": nkeys.PREFIX_BYTE_ACCOUNT,
             "user": nkeys.PREFIX_BYTE_USER}
_CREDS = re.compile(r"-{3,}BEGIN NATS USER JWT-{3,}\s*\n\s*(?P<jwt>\S+)\s*\n.*?"
                    r"-{3,}BEGIN USER NKEY SEED-{3,}\s*\n\s*(?P<seed>\S+)\s*\n", re.DOTALL)


class CredentialsError(ValueError):
    """A credential (JWT, seed or creds file) that cannot be used, with what is wrong."""


@dataclass(frozen=True)
class KeyPair:
    """An nkey: its seed (the secret, ``S...``) and public key (``O...``, ``A...``, ``U...``)."""

    seed: str
    public: str

    @classmethod
    def create(cls, kind: str) -> KeyPair:
        seed = nkeys.encode_seed(os.urandom(32), _PREFIXES[kind]).decode()
        return cls.from_seed(seed)

    @classmethod
    def from_seed(cls, seed: str) -> KeyPair:
        try:
            pair = nkeys.from_seed(bytearray(seed.strip().encode()))
            return cls(seed.strip(), pair.public_key.decode())
        except (nkeys.NkeysError, ValueError, TypeError, IndexError) as exc:
            raise CredentialsError(f"not an nkey seed: {exc or type(exc).__name__}") from None

    def sign(self, data: bytes) -> bytes:
        return nkeys.from_seed(bytearray(self.seed.encode())).sign(data)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(signer: KeyPair, subject: str, name: str, nats: dict, expires_s: int | None = None) -> str:
    """A JWT for ``subject`` signed by ``signer``: the claims nats-server reads (``nats``
    holds the type-specific part), with ``jti`` the hash of the rest, as nats-io/jwt does."""
    claims = {"iat": int(time.time()), "iss": signer.public, "name": name, "sub": subject, "nats": nats}
    if expires_s is not None:
        claims["exp"] = claims["iat"] + expires_s
    digest = hashlib.new("sha512_256", json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims = {"jti": base64.b32encode(digest).decode().rstrip("="), **claims}
    body = _b64(json.dumps(_HEADER, separators=(",", ":")).encode()) + "." + \
        _b64(json.dumps(claims, separators=(",", ":")).encode())
    return body + "." + _b64(signer.sign(body.encode()))


def claims(token: str) -> dict:
    """The claims of a JWT, unverified (the server verifies; a process reads its own name)."""
    try:
        _, body, _ = token.split(".")
        decoded = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CredentialsError(f"not a NATS JWT: {exc}") from None
    if not isinstance(decoded, dict):
        raise CredentialsError("not a NATS JWT: its claims are not an object")
    return decoded


def operator_jwt(operator: KeyPair, name: str, system_account: str) -> str:
    return encode(operator, operator.public, name,
                  {"type": "operator", "version": 2, "system_account": system_account})


def account_jwt(operator: KeyPair, account: str, name: str, signing_keys: list[str] = (),
                jetstream: bool = True) -> str:
    storage = -1 if jetstream else 0
    limits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
              "conn": -1, "leaf": -1, "mem_storage": storage, "disk_storage": storage,
              "streams": -1 if jetstream else 0, "consumer": -1 if jetstream else 0}
    return encode(operator, account, name, {"type": "account", "version": 2, "limits": limits,
                                            "signing_keys": list(signing_keys),
                                            "default_permissions": {"pub": {}, "sub": {}}})


def user_jwt(signer: KeyPair, user: str, name: str, publish: list[str], subscribe: list[str],
             account: str | None = None, expires_s: int | None = None) -> str:
    """A user allowed to publish and subscribe to these subjects only (and to answer the
    requests it receives). ``account``: the account's key when ``signer`` is its signing key."""
    nats = {"type": "user", "version": 2, "pub": {"allow": sorted(set(publish))}, "sub": {"allow": sorted(set(subscribe))},
            "resp": {"max": 1, "ttl": 0}, "subs": -1, "data": -1, "payload": -1}
    if account:
        nats["issuer_account"] = account
    return encode(signer, user, name, nats, expires_s)


def new_user_creds(signer: KeyPair, name: str, publish: list[str], subscribe: list[str],
                   account: str | None = None) -> str:
    """A new user with these permissions, as the text of its credentials file."""
    user = KeyPair.create("user")
    return creds_file(user_jwt(signer, user.public, name, publish, subscribe, account), user.seed)


def creds_file(jwt: str, seed: str) -> str:
    """A NATS credentials file (what nats-py's ``user_credentials`` and the nats CLI read)."""
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


def parse_creds(text: str) -> tuple[str, KeyPair]:
    """The user JWT and key pair in a credentials file; CredentialsError when it is not one."""
    match = _CREDS.search(text)
    if not match:
        raise CredentialsError("not a NATS credentials file (no 'BEGIN NATS USER JWT' and 'BEGIN USER NKEY SEED' blocks)")
    token, pair = match["jwt"], KeyPair.from_seed(match["seed"])
    if claims(token).get("sub") != pair.public:
        raise CredentialsError("its JWT and seed belong to different users")
    return token, pair
