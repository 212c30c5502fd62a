// Verifies an approval receipt as a tool would, with the `jose` package
// (npm) and the service's JWKS, then shows that a tampered payload,
// another audience and an expired receipt are refused.
//
//   node receipt_check.mjs JWKS_URL RECEIPT AUDIENCE ISSUER
//
// Prints {"claims": {...}, "tampered": "<code>", "wrong_audience": "<code>", "expired": "<code>"}.
import { createRemoteJWKSet, jwtVerify } from "jose";

const [jwksUrl, receipt, audience, issuer] = process.argv.slice(2);
const keys = createRemoteJWKSet(new URL(jwksUrl));

const verify = (token, options = {}) =>
  jwtVerify(token, keys, { algorithms: ["ES256"], audience, issuer, ...options });

async function refused(check) {
  try {
    await check();
    return "accepted";
  } catch (error) {
    return error.code || error.name;
  }
}

function tamper(token) {
  const [header, payload, signature] = token.split(".");
  const claims = JSON.parse(Buffer.from(payload, "base64url").toString());
  claims.arguments_sha256 = "0".repeat(64);
  return [header, Buffer.from(JSON.stringify(claims)).toString("base64url"), signature].join(".");
}

const { payload } = await verify(receipt);
console.log(JSON.stringify({
  claims: payload,
  tampered: await refused(() => verify(tamper(receipt))),
  wrong_audience: await refused(() => verify(receipt, { audience: "https://another-tool.example/" })),
  // As checked 400 seconds from now (a receipt lives 300).
  expired: await refused(() => verify(receipt, { currentDate: new Date(Date.now() + 400_000) })),
}));
