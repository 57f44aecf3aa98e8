"""Verifies vq entry tokens inside a Python purchase API, exactly as vq's gate does.

Token: ``base64url(payload) "." base64url(HMAC-SHA256(secret, payload))``, no padding, payload
``TYPE|id|user|expiresAtEpochSec`` (vq's ``src/token.rs``). Stdlib only. Also a WSGI
middleware and an ASGI one.

What this cannot do: one-time use of a token and pacing need vq's Redis; only vq's gate (or
``/gate/verify``) does those.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

__all__ = ["Verifier", "Verdict", "Claims", "SecretError", "WSGIGate", "ASGIGate"]

# A target type as vq spells it (any the operator configures): the name in tokens
# (LIMITED_DROP), the slug in URLs (limited-drop), at most 32 characters. ASCII only: \Z, not $,
# so a trailing newline is no match.
_TYPE_NAME = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*\Z", re.ASCII)
_TYPE_SLUG = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z", re.ASCII)
_MAX_TYPE_LEN = 32
# A user id as vq takes it (src/domain/target.rs, is_user_id_byte): 1 to 128 characters, each an
# ASCII letter, a digit or one of - _ . : @ +, compared exactly as sent (no normalising: "007" and
# "7" are two users). None of them is "|", so the payload's four fields stay unambiguous. The
# class is spelt out (no \w), so no non-ASCII letter or digit matches; fullmatch, so no newline.
_USER_ID = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")
_NO_USER = ("X-User-Id is missing or not a user id: expected 1 to 128 characters, each a letter, a digit or one of "
            "- _ . : @ +")
_U64_MAX = (1 << 64) - 1
_MIN_SECRET_LEN = 32
_MIN_DISTINCT_BYTES = 8
_ASCII_WHITESPACE = frozenset(b" \t\n\x0c\r")
_DIGITS = re.compile(r"[0-9]+")
_EXPIRY = re.compile(r"\+?[0-9]+")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")

Secret = Union[str, bytes]


class SecretError(ValueError):
    """A secret vq would refuse at start. ``reason``: too_short, whitespace, low_entropy,
    previous_is_current, missing."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _key_bytes(secret: Secret, origin: str) -> bytes:
    """The key: a str's UTF-8 bytes (never base64-decoded), or bytes as they are."""
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if len(key) < _MIN_SECRET_LEN:
        raise SecretError("too_short", f"{origin} is {len(key)} bytes long: it must be at least 32 bytes")
    if all(b in _ASCII_WHITESPACE for b in key):
        raise SecretError("whitespace", f"{origin} is only whitespace")
    distinct = len(set(key))
    if distinct < _MIN_DISTINCT_BYTES:
        raise SecretError("low_entropy", f"{origin} has only {distinct} distinct characters (at least 8 needed)")
    return key


def _positive(s: object) -> Optional[int]:
    """vq's ids: a u64 above 0 in ASCII digits (leading zeros allowed, no sign)."""
    if isinstance(s, bool):
        return None
    if isinstance(s, int):
        s = str(s)
    if not isinstance(s, str) or not _DIGITS.fullmatch(s):
        return None
    n = _u64(s)
    return n if n else None


def _user_id(user: object) -> Optional[str]:
    """The expected user id as the caller gives it: a str as is, an int as its decimal digits
    (``str(n)``, a convenience for shops with integer ids); None when it is not a user id."""
    if isinstance(user, int) and not isinstance(user, bool):
        try:
            user = str(user)
        except ValueError:  # past sys.get_int_max_str_digits(): far past 128 characters anyway
            return None
    if not isinstance(user, str) or not _USER_ID.fullmatch(user):
        return None
    return user


def _u64(digits: str) -> Optional[int]:
    """ASCII digits as a u64, None past it. Leading zeros may be many (Rust takes them), and
    int() refuses strings over 4300 digits, so they go first."""
    digits = digits.lstrip("0") or "0"
    if len(digits) > 20:
        return None
    n = int(digits)
    return n if n <= _U64_MAX else None


def _b64url(s: str) -> Optional[bytes]:
    """vq's decoder is strict: its alphabet only, no padding, canonical (unused bits zero)."""
    if not _B64URL.fullmatch(s) or len(s) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() == s else None


@dataclass(frozen=True)
class Claims:
    type: str
    id: int
    user: str  # the user id as the token holds it (any vq user id: "7", a UUID, …)
    expires_at: int


@dataclass(frozen=True)
class Verdict:
    """``valid`` with ``claims`` and ``key`` ("current" or "previous"), or why not: ``reason``
    (missing, no_user, malformed, bad_signature, expired, wrong_type, wrong_target,
    wrong_user) and vq's ``detail`` text."""

    valid: bool
    reason: Optional[str] = None
    detail: Optional[str] = None
    claims: Optional[Claims] = None
    key: Optional[str] = None

    def __bool__(self) -> bool:
        return self.valid


class _Malformed(Exception):
    pass


def _decode(raw: str) -> tuple[Claims, bytes, bytes]:
    """Splits and decodes a token without checking its signature (vq's ``token::decode``): the
    one place that knows the payload's fields."""
    p64, sep, s64 = raw.partition(".")
    if not sep:
        raise _Malformed("no `.` separator")
    payload = _b64url(p64)
    if payload is None:
        raise _Malformed("payload is not base64url")
    sig = _b64url(s64)
    if sig is None:
        raise _Malformed("signature is not base64url")
    try:
        text = payload.decode("utf-8")  # strict, and a byte-order mark stays
    except UnicodeDecodeError:
        raise _Malformed("payload is not text") from None
    parts = text.split("|")
    if len(parts) != 4:
        raise _Malformed("payload is not TYPE|id|user|expiry")
    kind, target_id, user, exp = parts
    if len(kind) > _MAX_TYPE_LEN or not _TYPE_NAME.match(kind):
        raise _Malformed("bad target type")
    target_n = _positive(target_id)
    if target_n is None:
        raise _Malformed("bad target id")
    if not _USER_ID.fullmatch(user):
        raise _Malformed("bad user id")
    # Any u64 as Rust parses it: a leading + is accepted.
    expires_at = _u64(exp.removeprefix("+")) if _EXPIRY.fullmatch(exp) else None
    if expires_at is None:
        raise _Malformed("bad expiry")
    return Claims(kind, target_n, user, expires_at), payload, sig


def _refuse(reason: str, detail: str) -> Verdict:
    return Verdict(False, reason=reason, detail=detail)


class Verifier:
    """Holds the keys: the current ``VQ_TOKEN_SECRET`` and, during a rotation, the previous one."""

    def __init__(self, secret: Secret, previous: Optional[Secret] = None):
        keys = [("current", _key_bytes(secret, "the secret"))]
        if previous is not None:
            old = _key_bytes(previous, "the previous secret")
            if old == keys[0][1]:
                raise SecretError("previous_is_current", "the previous secret equals the current one")
            keys.append(("previous", old))
        self._keys = keys

    def __repr__(self) -> str:
        return "Verifier(***)" if len(self._keys) == 1 else "Verifier(***, previous ***)"

    @classmethod
    def from_env(cls, env=None) -> "Verifier":
        """From VQ_TOKEN_SECRET (or the file named by VQ_TOKEN_SECRET_FILE, trailing CR/LF
        dropped) and VQ_TOKEN_SECRET_PREVIOUS(_FILE), as vq reads them."""
        env = os.environ if env is None else env

        def read(name: str) -> Optional[bytes]:
            if env.get(name):
                return env[name].encode("utf-8")
            path = env.get(name + "_FILE")
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read().rstrip(b"\r\n")

        secret = read("VQ_TOKEN_SECRET")
        if secret is None:
            raise SecretError("missing", "VQ_TOKEN_SECRET is not set (nor VQ_TOKEN_SECRET_FILE)")
        return cls(secret, read("VQ_TOKEN_SECRET_PREVIOUS"))

    def verify(self, type: str, id: Union[str, int], user: Union[str, int, None], token: Optional[str],
               now: Optional[int] = None) -> Verdict:
        """Every check vq's gate makes, in its order: a user id, a token, well-formed, signed by
        one of the keys (constant time), unexpired, for this type, target id and user.

        ``type``: the target type's name, LIMITED_DROP (or its slug, limited-drop); ``id``: the target id the request
        is for (not one: ValueError, the caller's error); ``user``: the buyer's id (X-User-Id), 1 to
        128 characters, each an ASCII letter, a digit or one of ``- _ . : @ +``, compared exactly
        (an int stands for its decimal digits; anything else is ``no_user``); ``now``: epoch
        seconds (default: the clock, as vq reads it)."""
        if not isinstance(type, str) or len(type) > _MAX_TYPE_LEN or not (
                _TYPE_NAME.match(type) or _TYPE_SLUG.match(type)):
            raise ValueError(f"`{type}` is not a target type: expected a slug such as limited-drop or its name, "
                             "LIMITED_DROP")
        kind = type.upper().replace("-", "_")
        target_id = _positive(id)
        if target_id is None:
            raise ValueError(f"`{id}` is not a positive 64-bit integer id")
        user_id = _user_id(user)
        if user_id is None:
            return _refuse("no_user", _NO_USER)
        if not token:
            return _refuse("missing", "no entry token: send the X-Entry-Token header")
        try:
            claims, payload, sig = _decode(token)
        except _Malformed as e:
            return _refuse("malformed", f"the entry token is malformed: {e}")
        key = next(
            (name for name, k in self._keys
             if hmac.compare_digest(hmac.new(k, payload, hashlib.sha256).digest(), sig)),
            None,
        )
        if key is None:
            return _refuse("bad_signature", "the entry token's signature does not match")
        if now is None:
            now = time.time_ns() // 1_000_000_000
        if claims.expires_at <= now:
            return _refuse("expired", f"the entry token expired at {claims.expires_at} (epoch seconds)")
        if claims.type != kind:
            return _refuse("wrong_type", f"the entry token is for {claims.type}, not {kind}")
        if claims.id != target_id:
            return _refuse("wrong_target",
                           f"the entry token is for {claims.type}:{claims.id}, not {kind}:{target_id}")
        if claims.user != user_id:
            return _refuse("wrong_user", "the entry token belongs to another user")
        return Verdict(True, claims=claims, key=key)


def _body(code: str, detail: str) -> bytes:
    return json.dumps({"code": code, "detail": detail}).encode()


Target = Optional[tuple]


class WSGIGate:
    """WSGI middleware: ``target(environ)`` says which target a request buys from, as
    ``(type, id)``, or None for requests that are not purchases (passed unchecked: write it on
    the path your framework routes on). ``user(environ)``: the buyer's id, by default the
    X-User-Id header (which the proxy in front must set from the login). Refuses with vq's
    answers (403 QUEUE_BYPASS_DENIED, 400 INVALID_REQUEST for a target id that is not one);
    passes with ``environ["vq.entry_token"]`` = the verdict. A WSGI server joins a repeated
    header into one value, which then fails to parse: refused."""

    def __init__(self, app, verifier: Verifier, target: Callable[[dict], Target],
                 user: Optional[Callable[[dict], Optional[str]]] = None):
        self.app, self.verifier, self.target = app, verifier, target
        self.user = user or (lambda environ: environ.get("HTTP_X_USER_ID"))

    def __call__(self, environ, start_response):
        t = self.target(environ)
        if t is None:
            return self.app(environ, start_response)
        try:
            verdict = self.verifier.verify(t[0], t[1], self.user(environ), environ.get("HTTP_X_ENTRY_TOKEN"))
        except ValueError as e:
            return self._deny(start_response, "400 Bad Request", "INVALID_REQUEST", str(e))
        if not verdict:
            return self._deny(start_response, "403 Forbidden", "QUEUE_BYPASS_DENIED", verdict.detail)
        environ["vq.entry_token"] = verdict
        return self.app(environ, start_response)

    @staticmethod
    def _deny(start_response, status: str, code: str, detail: str):
        body = _body(code, detail)
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


class ASGIGate:
    """ASGI middleware (Starlette, FastAPI, Django's ASGI app): as :class:`WSGIGate`, with
    ``target(scope)`` and ``user(scope)``; X-User-Id or X-Entry-Token sent twice is refused with
    400 as vq does. Passes with ``scope["state"]["vq_entry_token"]`` = the verdict. In one
    FastAPI route, ``Verifier.verify`` in a dependency does the same."""

    def __init__(self, app, verifier: Verifier, target: Callable[[dict], Target],
                 user: Optional[Callable[[dict], Optional[str]]] = None):
        self.app, self.verifier, self.target, self.user = app, verifier, target, user

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t = self.target(scope)
        if t is None:
            return await self.app(scope, receive, send)
        seen: dict = {}
        for name, value in scope.get("headers", []):
            name = name.lower()
            if name in (b"x-user-id", b"x-entry-token"):
                if name in seen:
                    shown = "X-User-Id" if name == b"x-user-id" else "X-Entry-Token"
                    return await self._deny(send, 400, "INVALID_REQUEST", f"{shown} sent more than once: send it once")
                seen[name] = value.decode("latin-1")
        user = self.user(scope) if self.user else seen.get(b"x-user-id")
        try:
            verdict = self.verifier.verify(t[0], t[1], user, seen.get(b"x-entry-token"))
        except ValueError as e:
            return await self._deny(send, 400, "INVALID_REQUEST", str(e))
        if not verdict:
            return await self._deny(send, 403, "QUEUE_BYPASS_DENIED", verdict.detail)
        scope.setdefault("state", {})["vq_entry_token"] = verdict
        return await self.app(scope, receive, send)

    @staticmethod
    async def _deny(send, status: int, code: str, detail: str):
        body = _body(code, detail)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def main(argv=None) -> int:
    """``python -m vq_token TYPE ID USER TOKEN``: the verdict as JSON, keys from the environment
    as vq reads them; exit 0 valid, 1 invalid, 2 usage. USER is the user id as X-User-Id gives it
    (a string: a UUID, user_8f3k or 7 alike)."""
    import sys
    from dataclasses import asdict

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        print("usage: python -m vq_token TYPE ID USER TOKEN", file=sys.stderr)
        return 2
    verdict = Verifier.from_env().verify(*args)
    print(json.dumps({k: v for k, v in asdict(verdict).items() if v is not None}, default=str))
    return 0 if verdict else 1

