"""A client of the OCI distribution API (the registry HTTP API v2), with urllib.

Manifests and blobs by GET; a 401 answer's WWW-Authenticate challenge is
met with a bearer token from the realm it names (anonymous, or with the
given user and password), or with Basic credentials when that is what the
registry asks for. HTTPS always, unless the caller asks for plain HTTP
(`insecure=True`). The Authorization header is never sent on to a redirect
target (a blob store's signed URL).
"""

from __future__ import annotations

import base64
import json
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPResponse
from typing import IO

from .errors import AuthError, ImageNotFoundError, RegistryError
from .media import DOCKER_LIST, DOCKER_MANIFEST, MAX_JSON, OCI_INDEX, OCI_MANIFEST, verify
from .reference import DIGEST, Reference

ACCEPT = ", ".join((OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST))
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
HOSTS = {"docker.io": "registry-1.docker.io"}


class Registry:
    """One registry, for one repository's pulls."""

    def __init__(self, ref: Reference, *, insecure: bool = False, credentials: tuple[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        host = HOSTS.get(ref.registry, ref.registry)
        self.base = f"{'http' if insecure else 'https'}://{host}/v2/{ref.repository}"
        self.ref = ref
        self.insecure = insecure
        self.credentials = credentials
        self.timeout = timeout
        self.auth: str | None = None  # the Authorization header, once a challenge was met

    def manifest(self, reference: str) -> tuple[bytes, str | None]:
        """A manifest or index by tag or digest, and its Content-Type."""
        url = f"{self.base}/manifests/{reference}"
        with self._get(url, {"Accept": ACCEPT}, f"{self.ref.name}:{reference}") as resp:
            data = _read_all(resp, MAX_JSON, url)
            media = resp.headers.get_content_type() if resp.headers.get("Content-Type") else None
            served = resp.headers.get("Docker-Content-Digest", "")
        if DIGEST.fullmatch(served):  # what the registry says it sent: checked when it says
            verify(url, data, served)
        return data, media

    def blob(self, digest: str) -> HTTPResponse:
        """A blob's response, to be read as a stream (the caller closes it)."""
        return self._get(f"{self.base}/blobs/{digest}", {}, f"{self.ref.name}@{digest}")

    def _get(self, url: str, headers: dict[str, str], what: str) -> HTTPResponse:
        for attempt in range(2):
            req = urllib.request.Request(url, headers=headers)
            if self.auth:
                req.add_unredirected_header("Authorization", self.auth)
            try:
                resp: HTTPResponse = urllib.request.urlopen(req, timeout=self.timeout)  # noqa: S310 - http(s) only
                return resp
            except urllib.error.HTTPError as exc:
                body = exc.read(2000).decode("utf-8", "replace")
                exc.close()
                if exc.code == 401 and attempt == 0:
                    self._answer(exc.headers.get("WWW-Authenticate", ""), url)
                    continue
                if exc.code == 404:
                    raise ImageNotFoundError(what, f"at {url} (HTTP 404: {_message(body)})") from None
                if exc.code in (401, 403):
                    raise AuthError(url, f"HTTP {exc.code}: {_message(body)}", exc.code) from None
                raise RegistryError(url, f"HTTP {exc.code}: {_message(body)}", exc.code) from None
            except urllib.error.URLError as exc:
                raise RegistryError(url, _reason(exc.reason, self.insecure)) from None
            except (OSError, ValueError) as exc:
                raise RegistryError(url, _reason(exc, self.insecure)) from None
        raise AuthError(url, "still refused after authenticating", 401)

    def _answer(self, challenge: str, url: str) -> None:
        """Meet a 401's challenge: fetch a bearer token, or use Basic credentials."""
        scheme, _, rest = challenge.partition(" ")
        params = dict(_CHALLENGE.findall(rest))
        if scheme.lower() == "basic":
            if not self.credentials:
                raise AuthError(url, "the registry wants a user and password (credentials=(user, password))", 401)
            self.auth = "Basic " + _basic(self.credentials)
            return
        if scheme.lower() != "bearer" or "realm" not in params:
            raise AuthError(url, f"an authentication challenge this client cannot meet: {challenge!r:.200}", 401)
        query = {k: params[k] for k in ("service", "scope") if k in params}
        query.setdefault("scope", f"repository:{self.ref.repository}:pull")
        realm = params["realm"]
        if urllib.parse.urlsplit(realm).scheme not in ("https", "http") or (
                realm.startswith("http:") and not self.insecure):
            raise AuthError(url, f"token realm {realm!r} is not https (plain HTTP only with insecure=True)", 401)
        token_url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(query)
        req = urllib.request.Request(token_url)
        if self.credentials:
            req.add_unredirected_header("Authorization", "Basic " + _basic(self.credentials))
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                doc = json.loads(_read_all(resp, 1 << 20, token_url))
        except urllib.error.HTTPError as exc:
            raise AuthError(token_url, f"the token server answered HTTP {exc.code}", exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AuthError(token_url, f"no token: {exc}") from None
        token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
        if not isinstance(token, str) or not token:
            raise AuthError(token_url, "the token server's answer holds no token")
        self.auth = f"Bearer {token}"


def _basic(credentials: tuple[str, str]) -> str:
    return base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()


def _read_all(resp: IO[bytes], limit: int, url: str) -> bytes:
    try:
        data = resp.read(limit + 1)
    except OSError as exc:
        raise RegistryError(url, f"the answer was cut short: {exc}") from None
    if len(data) > limit:
        raise RegistryError(url, f"the answer is larger than {limit} bytes")
    return data


def _message(body: str) -> str:
    try:
        errors = json.loads(body).get("errors") or []
        return "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors) or body[:200]
    except (ValueError, AttributeError):
        return body[:200] or "no details"


def _reason(reason: object, insecure: bool) -> str:
    text = str(reason)
    if isinstance(reason, ssl.SSLError) and not insecure:
        text += " (a registry that speaks plain HTTP is used only with insecure=True)"
    return text
