"""Project secrets (the Hugging Face token, ...), encrypted at rest with Fernet; webhook signing
secrets and captured traffic are encrypted with the same key.

The key comes from SPECDECK_SECRET_KEY. To rotate it, set the new value and move the old one to
SPECDECK_SECRET_KEY_PREVIOUS (comma-separated for several), then run `specdeck admin secrets rotate`:
every value (project secrets, webhook secrets, captured rows) is re-encrypted under the new key, after
which the previous keys can be dropped.
"""

from __future__ import annotations

import base64
import hashlib
import re

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from app.db.models import CapturedRow, Secret, Webhook, utcnow
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
    return decrypt(ciphertext, settings, f"secret {name}")


def decrypt(ciphertext: str, settings: Settings, what: str) -> str:
    """The plaintext of a value encrypted by ``cipher``; ``what`` names it in the error."""
    try:
        return cipher(settings).decrypt(ciphertext.encode()).decode()
    except InvalidToken as exc:
        raise RuntimeError(f"{what} cannot be decrypted with SPECDECK_SECRET_KEY or "
                           "SPECDECK_SECRET_KEY_PREVIOUS") from exc


def rotate(session: Session, settings: Settings) -> int:
    """Re-encrypt every project secret and webhook secret under the current key; how many."""
    rotated = 0
    fernet = cipher(settings)
    for secret in session.scalars(select(Secret)):
        secret.ciphertext = fernet.rotate(secret.ciphertext.encode()).decode()
        rotated += 1
    for webhook in session.scalars(select(Webhook)):
        webhook.secret_ciphertext = fernet.rotate(webhook.secret_ciphertext.encode()).decode()
        rotated += 1
    table = CapturedRow.__table__  # captured traffic (app/services/capture.py), in batches
    last = 0
    while batch := session.execute(select(table.c.id, table.c.ciphertext).where(
            table.c.id > last).order_by(table.c.id).limit(1000)).all():
        session.execute(update(table).where(table.c.id == bindparam("row_id")), [
            {"row_id": row_id, "ciphertext": fernet.rotate(ciphertext.encode()).decode()}
            for row_id, ciphertext in batch])
        rotated += len(batch)
        last = batch[-1][0]
    return rotated
