"""A Starlette signed session cookie (`SessionMiddleware`): the session a gateway keeps in it, and one signed again.

NeMo Gym's model server keys its session by such a cookie (`VLLMModel___policy_model`, its signing key the same
string: `nemo_gym/server_utils.py`), holding `{"session_id": ...}`. Its value is
`base64(json payload).<timestamp>.<signature>` (itsdangerous' `TimestampSigner`), signed again at every response, so
the value changes from one turn to the next while the `session_id` inside stays: that id, not the value, names the
session (`--session-from session-cookie:NAME`). A replay signs the recorded id again with the key, at the replay's
time, as the gateway's own middleware would have (`tests/test_signed_cookie.py` checks it against itsdangerous).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json

FIELD = "session_id"  # the payload key NeMo Gym keeps its session in (`SESSION_ID_KEY`)
_SALT = b"itsdangerous.Signer"  # itsdangerous' defaults: salt, "django-concat" key derivation, HMAC-SHA1


def payload_session(value: str, field: str = FIELD) -> str | None:
    """The `field` of a signed session cookie's payload (the signature is not checked: tito names sessions, it does
    not authenticate them); None for a value that is not one."""
    data = value.strip().strip('"').split(".", 1)[0]
    try:
        payload = json.loads(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        return None
    found = payload.get(field) if isinstance(payload, dict) else None
    return found if isinstance(found, str) and found else None


def sign_session(session: str, key: str, now: int, field: str = FIELD) -> str:
    """A cookie value Starlette's `SessionMiddleware(secret_key=key)` accepts at time `now` (seconds), holding
    `{field: session}`."""
    data = base64.b64encode(json.dumps({field: session}).encode("utf-8"))
    stamp = _b64(now.to_bytes((now.bit_length() + 7) // 8 or 1, "big"))
    signed = data + b"." + stamp
    derived = hashlib.sha1(_SALT + b"signer" + key.encode("utf-8")).digest()
    signature = _b64(hmac.new(derived, signed, hashlib.sha1).digest())
    return (signed + b"." + signature).decode("ascii")


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")
