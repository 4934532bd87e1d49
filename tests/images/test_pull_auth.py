"""Pulls from registries that want credentials: docker-registry with token
(bearer) auth, its tokens from a token server the test runs (JWTs signed
with a key made here by openssl), and with htpasswd (Basic) auth."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import subprocess
import time
import warnings
from collections.abc import Generator
from pathlib import Path

import pytest
from http_serving import serving

from sandbox.images import AuthError, ImageStore

from .image_helpers import TestImage, layer, member, push
from .registry_server import REGISTRY_BIN, start_registry

SERVICE, ISSUER = "test-registry", "test-issuer"
USER, PASSWORD = "alice", "s3cret"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """Issues RS256 JWTs the registry trusts; with `need_password`, only to alice."""

    def __init__(self, work: Path, need_password: bool) -> None:
        self.key, self.cert = work / "key.pem", work / "cert.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "1", "-subj", "/CN=token-issuer"],
                       check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.need_password = need_password
        self.scopes: list[str] = []

    def token(self, scope: str) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        access = []
        if scope:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 600, "nbf": now - 10, "iat": now,
                  "jti": str(now), "access": access}
        signing = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing.encode(),
                             check=True, capture_output=True).stdout
        return f"{signing}.{_b64url(sig)}"

    def serve(self) -> Generator[str, None, None]:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                from urllib.parse import parse_qs, urlsplit

                query = parse_qs(urlsplit(self.path).query)
                scope = query.get("scope", [""])[0]
                want = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if outer.need_password and self.headers.get("Authorization") != want:
                    self.send_response(401)
                    self.end_headers()
                    return
                outer.scopes.append(scope)
                body = json.dumps({"token": outer.token(scope)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        with serving(Handler) as port:
            yield f"http://127.0.0.1:{port}/token"


def _binary() -> str:
    binary = shutil.which(REGISTRY_BIN) or (f"/usr/bin/{REGISTRY_BIN}" if Path(f"/usr/bin/{REGISTRY_BIN}").exists()
                                            else None)
    if binary is None:
        pytest.skip("docker-registry is not installed (Debian: apt-get install docker-registry; CI installs it)")
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed: no key to sign tokens with")
    return binary


@pytest.mark.parametrize("need_password", [False, True], ids=["anonymous-token", "token-for-a-password"])
def test_bearer_token(tmp_path: Path, need_password: bool) -> None:
    tokens = TokenServer(tmp_path, need_password)
    served = tokens.serve()
    realm = next(served)
    try:
        extra = (f"auth:\n  token:\n    realm: {realm}\n    service: {SERVICE}\n    issuer: {ISSUER}\n"
                 f"    rootcertbundle: {tokens.cert}\n")
        with start_registry(_binary(), tmp_path, extra) as registry:
            image = TestImage([layer(member("secret", data=b"behind a token\n"))])
            push(registry, "test/private", "v1", image,
                 auth=f"Bearer {tokens.token('repository:test/private:pull,push')}")
            store = ImageStore(tmp_path / "store")
            if need_password:
                with pytest.raises(AuthError, match="token server answered HTTP 401"):
                    store.pull(f"{registry}/test/private:v1", insecure=True)
                with pytest.raises(AuthError):
                    store.pull(f"{registry}/test/private:v1", insecure=True, credentials=(USER, "wrong"))
            img = store.pull(f"{registry}/test/private:v1", insecure=True,
                             credentials=(USER, PASSWORD) if need_password else None)
            assert Path(img.layers[0].path, "secret").read_text() == "behind a token\n"
            assert "repository:test/private:pull" in tokens.scopes
    finally:
        served.close()


def test_token_realm_over_plain_http_needs_insecure(tmp_path: Path) -> None:
    """A registry (behind TLS or not) whose realm is http:// is refused without insecure=True: the
    realm is checked before any credential is sent. Shown with the Registry client directly."""
    from sandbox.images.reference import parse
    from sandbox.images.registry import Registry

    reg = Registry(parse("example.org/x:1"), credentials=(USER, PASSWORD))
    with pytest.raises(AuthError, match="not https"):
        reg._answer('Bearer realm="http://127.0.0.1:1/token",service="s"', "https://example.org/v2/x")


def test_basic_auth_htpasswd(tmp_path: Path) -> None:
    binary = _binary()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
    hashed = crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))
    if not hashed or not hashed.startswith("$2"):
        pytest.skip("this libcrypt makes no bcrypt hashes, which htpasswd auth needs")
    (tmp_path / "htpasswd").write_text(f"{USER}:{hashed}\n")
    extra = f"auth:\n  htpasswd:\n    realm: test\n    path: {tmp_path / 'htpasswd'}\n"
    with start_registry(binary, tmp_path, extra) as registry:
        basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        push(registry, "test/basic", "v1", TestImage([layer(member("b", data=b"basic\n"))]), auth=basic)
        store = ImageStore(tmp_path / "store")
        with pytest.raises(AuthError, match="wants a user and password"):
            store.pull(f"{registry}/test/basic:v1", insecure=True)
        with pytest.raises(AuthError, match="HTTP 401"):
            store.pull(f"{registry}/test/basic:v1", insecure=True, credentials=(USER, "wrong"))
        img = store.pull(f"{registry}/test/basic:v1", insecure=True, credentials=(USER, PASSWORD))
        assert Path(img.layers[0].path, "b").read_text() == "basic\n"
