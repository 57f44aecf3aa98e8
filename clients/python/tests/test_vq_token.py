"""The shared vectors (../test-vectors.json: vq's own verdicts) and the middlewares."""

import asyncio
import base64
import hashlib
import hmac
import json
import os
import tempfile
import time
import unittest
from pathlib import Path

from vq_token import ASGIGate, SecretError, Verifier, WSGIGate

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "test-vectors.json").read_text("utf-8"))
SECRETS = VECTORS["secrets"]


def verifier_for(keys):
    return Verifier(SECRETS["current"], SECRETS["previous"] if "previous" in keys else None)


def verdict_of(case):
    e = case["expect"]
    try:
        v = verifier_for(case["keys"]).verify(e["type"], e["id"], e["user"], case["token"], int(case["now"]))
    except ValueError as err:
        return {"verdict": "invalid_target", "detail": str(err)}
    if not v.valid:
        return {"verdict": v.reason, "detail": v.detail}
    c = v.claims
    claims = {"type": c.type, "id": str(c.id), "user": str(c.user), "expiresAt": str(c.expires_at)}
    return {"verdict": "valid", "key": v.key, "claims": claims}


def mint(secret, payload):
    """A token as vq mints one (the format is the contract; the vectors prove it)."""
    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    sig = hmac.new(secret.encode(), payload.encode(), hashlib.sha256).digest()
    return f"{b64(payload.encode())}.{b64(sig)}"


class SharedVectors(unittest.TestCase):
    def test_every_vector_gets_vqs_verdict(self):
        self.assertGreater(len(VECTORS["cases"]), 40)
        for case in VECTORS["cases"]:
            with self.subTest(case["name"]):
                expected = {k: case[k] for k in ("verdict", "detail", "key", "claims") if k in case}
                ours = verdict_of(case)
                if case["verdict"] == "invalid_target":
                    # The caller's error: vq's ParseError text need not be copied.
                    self.assertEqual(ours["verdict"], "invalid_target")
                else:
                    self.assertEqual(ours, expected)

    def test_secrets_are_refused_as_vq_refuses_them(self):
        for rule in VECTORS["secretRules"]:
            with self.subTest(rule["name"]):
                try:
                    Verifier(rule["secret"])
                    verdict = "accepted"
                except SecretError as e:
                    verdict = e.reason
                self.assertEqual(verdict, rule["verdict"])
        with self.assertRaises(SecretError):
            Verifier(SECRETS["current"], SECRETS["current"])
        self.assertNotIn(SECRETS["current"], repr(Verifier(SECRETS["current"])))

    def test_from_env_reads_the_variables_and_files_vq_reads(self):
        with tempfile.TemporaryDirectory() as d:
            old = os.path.join(d, "old")
            Path(old).write_bytes(SECRETS["previous"].encode() + b"\r\n\n")
            v = Verifier.from_env({"VQ_TOKEN_SECRET": SECRETS["current"], "VQ_TOKEN_SECRET_PREVIOUS_FILE": old})
        case = next(c for c in VECTORS["cases"] if c["name"] == "signed with the previous key, during a rotation")
        self.assertEqual(v.verify("LIMITED_DROP", "42", "7", case["token"], int(case["now"])).key, "previous")
        with self.assertRaises(SecretError):
            Verifier.from_env({})


class UserIds(unittest.TestCase):
    NOW = 1767225300
    TOKEN_FOR_7 = mint(SECRETS["current"], "LIMITED_DROP|42|7|1767225600")

    def reason(self, user, token=TOKEN_FOR_7):
        return verifier_for(["current"]).verify("LIMITED_DROP", "42", user, token, self.NOW).reason

    def test_a_user_id_is_1_to_128_of_the_characters_vq_allows(self):
        # vq's is_user_id_byte: ASCII letters, digits and - _ . : @ +. Every other ASCII character,
        # in the middle of an id, makes it no user id; each allowed one makes it another user's.
        allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:@+")
        for b in range(128):
            with self.subTest(byte=b):
                self.assertEqual(self.reason(f"a{chr(b)}b"), "wrong_user" if chr(b) in allowed else "no_user")
        self.assertEqual(self.reason("u" * 128), "wrong_user")
        self.assertEqual(self.reason("u" * 129), "no_user")
        self.assertEqual(self.reason("7\n"), "no_user")  # re's $ would let this through; fullmatch does not
        self.assertEqual(self.reason("\u0667"), "no_user")  # an Arabic-Indic 7: a digit to str.isdigit, not to vq
        bad = mint(SECRETS["current"], "LIMITED_DROP|42|a/b|1767225600")
        v = verifier_for(["current"]).verify("LIMITED_DROP", "42", "7", bad, self.NOW)
        self.assertEqual(v.detail, "the entry token is malformed: bad user id")

    def test_an_int_as_the_user_id_stands_for_its_decimal_digits(self):
        v = verifier_for(["current"]).verify("LIMITED_DROP", "42", 7, self.TOKEN_FOR_7, self.NOW)
        self.assertEqual((v.valid, v.claims.user), (True, "7"))
        self.assertEqual(self.reason(8), "wrong_user")
        for user in (None, True, 7.0, b"7", ["7"], 10 ** 5000):
            with self.subTest(user=type(user).__name__):
                self.assertEqual(self.reason(user), "no_user")


def fresh_token(user=7):
    return mint(SECRETS["current"], f"LIMITED_DROP|42|{user}|{int(time.time()) + 60}")


def drop_target(path):
    parts = path.strip("/").split("/")
    return ("LIMITED_DROP", parts[1]) if len(parts) == 3 and parts[0] == "limited-drops" else None


class Middlewares(unittest.TestCase):
    def wsgi(self, path, headers):
        seen = {}

        def app(environ, start_response):
            seen["claims"] = environ["vq.entry_token"].claims if "vq.entry_token" in environ else None
            start_response("200 OK", [])
            return [b"bought"]

        gate = WSGIGate(app, verifier_for(["current"]), lambda env: drop_target(env["PATH_INFO"]))
        environ = {"PATH_INFO": path, **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}}
        status = []
        body = b"".join(gate(environ, lambda s, h: status.append(s)))
        return status[0], body, seen

    def test_wsgi_passes_a_valid_token_and_refuses_as_vq_does(self):
        token = fresh_token()
        status, body, seen = self.wsgi("/limited-drops/42/orders", {"x-user-id": "7", "x-entry-token": token})
        self.assertEqual((status, body, seen["claims"].user), ("200 OK", b"bought", "7"))
        status, body, _ = self.wsgi("/limited-drops/42/orders", {"x-user-id": "8", "x-entry-token": token})
        self.assertEqual(status, "403 Forbidden")
        self.assertEqual(
            json.loads(body), {"code": "QUEUE_BYPASS_DENIED", "detail": "the entry token belongs to another user"}
        )
        status, body, _ = self.wsgi("/limited-drops/43/orders", {"x-user-id": "7", "x-entry-token": token})
        self.assertIn("not LIMITED_DROP:43", json.loads(body)["detail"])
        status, body, _ = self.wsgi("/limited-drops/4x/orders", {"x-user-id": "7", "x-entry-token": token})
        self.assertEqual((status, json.loads(body)["code"]), ("400 Bad Request", "INVALID_REQUEST"))
        # A repeated header, joined by the WSGI server, is refused too.
        status, _, _ = self.wsgi("/limited-drops/42/orders", {"x-user-id": "7,7", "x-entry-token": token})
        self.assertEqual(status, "403 Forbidden")
        # An opaque user id, compared exactly: its upper case is another user.
        uuid = "3f2a9c1e-7b4d-4c1e-9a8f-2b6c1d0e9f3a"
        token = fresh_token(uuid)
        status, _, seen = self.wsgi("/limited-drops/42/orders", {"x-user-id": uuid, "x-entry-token": token})
        self.assertEqual((status, seen["claims"].user), ("200 OK", uuid))
        status, body, _ = self.wsgi("/limited-drops/42/orders", {"x-user-id": uuid.upper(), "x-entry-token": token})
        self.assertEqual(
            (status, json.loads(body)["detail"]), ("403 Forbidden", "the entry token belongs to another user")
        )
        status, _, seen = self.wsgi("/products", {})
        self.assertEqual((status, seen["claims"]), ("200 OK", None))

    def asgi(self, path, headers):
        sent, seen = [], {}

        async def app(scope, receive, send):
            seen["verdict"] = scope["state"]["vq_entry_token"]
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"bought"})

        async def send(msg):
            sent.append(msg)

        gate = ASGIGate(app, verifier_for(["current"]), lambda scope: drop_target(scope["path"]))
        scope = {"type": "http", "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers]}
        asyncio.run(gate(scope, None, send))
        return sent[0]["status"], sent[1]["body"], seen

    def test_asgi_passes_a_valid_token_and_refuses_as_vq_does(self):
        token = fresh_token()
        status, body, seen = self.asgi("/limited-drops/42/orders", [("x-user-id", "7"), ("x-entry-token", token)])
        self.assertEqual((status, body, seen["verdict"].key), (200, b"bought", "current"))
        status, body, _ = self.asgi("/limited-drops/42/orders", [("x-user-id", "7")])
        self.assertEqual((status, json.loads(body)["detail"]), (403, "no entry token: send the X-Entry-Token header"))
        twice = [("x-user-id", "7"), ("X-User-Id", "7"), ("x-entry-token", token)]
        status, body, _ = self.asgi("/limited-drops/42/orders", twice)
        self.assertEqual((status, json.loads(body)["code"]), (400, "INVALID_REQUEST"))


if __name__ == "__main__":
    unittest.main()
