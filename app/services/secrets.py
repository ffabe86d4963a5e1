"""Project secrets (the Hugging Face token, ...), encrypted at rest with Fernet.

The key comes from SPECDECK_SECRET_KEY. To rotate it, set the new value and move the old one to
SPECDECK_SECRET_KEY_PREVIOUS (comma-separated for several), then run `specdeck admin secrets rotate`:
every value is re-encrypted under the new key, after which the previous keys can be dropped.
"""

from __future__ import annotations

import base64
import hashlib
import re

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import Secret, utcnow
from app.errors import APIError
from app.settings import Settings

# Matched whole (fullmatch: "$" alone would let a trailing newline through); the same text is the
# path parameter's pattern in the OpenAPI document.
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
HF_TOKEN = "HF_TOKEN"


def _fernet(key: str) -> Fernet:
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()))


def cipher(settings: Settings) -> MultiFernet:
    """Encrypts with the current key; decrypts with it or any previous one."""
    previous = [k for k in (settings.secret_key_previous or "").split(",") if k]
    return MultiFernet([_fernet(settings.secret_key), *(_fernet(k) for k in previous)])


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise APIError(422, "secret names are 1-64 letters, digits and underscores, not starting "
                       "with a digit", code="invalid_secret_name", param="name")
    return name


def put_secret(session: Session, project_id: str, name: str, value: str, settings: Settings) -> Secret:
    check_name(name)
    secret = session.scalars(select(Secret).where(Secret.project_id == project_id,
                                                  Secret.name == name)).first()
    ciphertext = cipher(settings).encrypt(value.encode()).decode()
    if secret is None:
        secret = Secret(project_id=project_id, name=name, ciphertext=ciphertext)
        session.add(secret)
    else:
        secret.ciphertext, secret.updated_at = ciphertext, utcnow()
    session.flush()
    return secret


def list_secrets(session: Session, project_id: str) -> list[Secret]:
    return list(session.scalars(select(Secret).where(Secret.project_id == project_id)
                                .order_by(Secret.name)))


def delete_secret(session: Session, project_id: str, name: str) -> None:
    secret = session.scalars(select(Secret).where(Secret.project_id == project_id,
                                                  Secret.name == check_name(name))).first()
    if secret is None:
        raise APIError(404, f"No secret named '{name}'", code="not_found", param="name")
    session.delete(secret)


def reveal(session: Session, project_id: str, name: str, settings: Settings) -> str | None:
    """The plaintext, for handing to a subprocess's environment. Never log or return it."""
    ciphertext = session.scalar(select(Secret.ciphertext).where(Secret.project_id == project_id,
                                                                Secret.name == name))
    if ciphertext is None:
        return None
    try:
        return cipher(settings).decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise RuntimeError(f"secret {name} cannot be decrypted with SPECDECK_SECRET_KEY or "
                           "SPECDECK_SECRET_KEY_PREVIOUS") from exc


def rotate(session: Session, settings: Settings) -> int:
    rotated = 0
    fernet = cipher(settings)
    for secret in session.scalars(select(Secret)):
        secret.ciphertext = fernet.rotate(secret.ciphertext.encode()).decode()
        rotated += 1
    return rotated
