"""Verifies an approval receipt as a tool would, with PyJWT (PyPI
`pyjwt[crypto]`) and the service's JWKS, then shows that a tampered
payload, another audience and an expired receipt are refused.

    python infra/receipt_check.py JWKS_URL RECEIPT AUDIENCE ISSUER

Prints one JSON object: {"claims": {...}, "tampered": "<error>",
"wrong_audience": "<error>", "expired": "<error>"}.
"""

import base64
import json
import sys

import jwt

jwks_url, receipt, audience, issuer = sys.argv[1:5]
keys = jwt.PyJWKClient(jwks_url)


def verify(token, audience=audience, later=0):
    """`later`: as checked that many seconds from now (a negative leeway;
    `iat` is then not held against it)."""
    key = keys.get_signing_key_from_jwt(token)
    return jwt.decode(
        token,
        key.key,
        algorithms=["ES256"],
        audience=audience,
        issuer=issuer,
        leeway=-later,
        options={"require": ["exp", "iat", "iss", "aud", "sub", "jti"], "verify_iat": later == 0},
    )


def refused(check):
    try:
        check()
    except jwt.PyJWTError as error:
        return type(error).__name__
    return "accepted"


def tamper(token):
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["arguments_sha256"] = "0" * 64
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return ".".join([header, forged, signature])


print(
    json.dumps(
        {
            "claims": verify(receipt),
            "tampered": refused(lambda: verify(tamper(receipt))),
            "wrong_audience": refused(lambda: verify(receipt, audience="https://another-tool.example/")),
            # As checked 400 seconds from now (a receipt lives 300).
            "expired": refused(lambda: verify(receipt, later=400)),
        }
    )
)
