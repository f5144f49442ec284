"""The master issues each application's AppMaster and executors a NATS user of their own,
scoped to that app's subjects (shared/permissions.py), signed with the account's signing key
given to the master (``--app-signer``). Users signed by that key are valid at once: the
server needs no reload, and one app's processes cannot speak for another's."""

from __future__ import annotations

from shared import nats_jwt, permissions
from shared.nats_jwt import CredentialsError, KeyPair
from shared.security import Security

APP_SIGNER_ENV = "GEARBUS_APP_SIGNER"


class AppCredentials:
    """Mints app credentials; without a signer (an open cluster) every app gets none."""

    def __init__(self, signer: KeyPair | None = None, account: str = ""):
        self.signer = signer
        self.account = account

    @classmethod
    def load(cls, signer_path: str, security: Security) -> AppCredentials:
        """From the signing key's file; the account is the issuer of the master's own JWT.
        A master whose credential is a JWT (a server in operator mode) needs the key: the
        server would refuse every app's processes a credential it did not issue."""
        if not signer_path:
            if security.identity:
                raise CredentialsError(
                    f"--creds is the JWT of user {security.identity!r} (a secured cluster), so this master must "
                    "issue each app's processes a credential: pass --app-signer FILE, the account signing key "
                    f"(apps-signer.nk, written by `gearbus security init`; env {APP_SIGNER_ENV})")
            return cls()
        if not security.identity:
            raise CredentialsError("--app-signer needs the master's --creds to be a .creds file (a JWT of the "
                                   "account the app users join)")
        try:
            with open(signer_path, encoding="utf-8") as f:
                signer = KeyPair.from_seed(f.read())
        except OSError as exc:
            raise CredentialsError(f"--app-signer {signer_path}: {exc.strerror or exc}") from None
        if not signer.public.startswith("A"):
            raise CredentialsError(f"--app-signer {signer_path}: not an account signing key (its seed starts 'SA')")
        token, _ = nats_jwt.parse_creds(security.credential)
        return cls(signer, nats_jwt.claims(token)["iss"])

    def issue(self, app_id: int, savepoint_of: int | None = None, streams: list[str] = ()) -> str:
        """``savepoint_of``: the app whose savepoint this one starts from (read access);
        ``streams``: a stage's intermediate streams."""
        if self.signer is None:
            return ""
        allowed = permissions.app(app_id, savepoint_of, streams)
        return nats_jwt.new_user_creds(self.signer, permissions.app_identity(app_id), allowed.publish,
                                       allowed.subscribe, account=self.account)
