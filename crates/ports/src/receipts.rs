//! Approval receipts: every tool call an approval allowed carries
//! `Agent-Runs-Approval: <compact JWS>` (ES256), so the tool can check for
//! itself that a person, a policy or a veto window's end allowed exactly
//! these arguments, for exactly it, moments ago. The public keys are served
//! as a JWKS (RFC 7517) at `/.well-known/jwks.json`.
//!
//! Where the key lives is an adapter's: a file beside the embedded
//! database (`agent_runs_embedded::LocalKey`), or KMS on AWS.

use std::sync::Arc;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;
use sha2::{Digest, Sha256};

use agent_runs_domain::{Approval, Timestamp, canonical_json};

/// Where the keys are served, to anyone.
pub const JWKS_PATH: &str = "/.well-known/jwks.json";
/// The header a tool call carries its receipt in.
pub const RECEIPT_HEADER: &str = "Agent-Runs-Approval";
/// A receipt is good for this long after it is issued.
pub const RECEIPT_LIFETIME_SECS: i64 = 300;

/// A receipt could not be signed: the call is not made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SignError(pub String);

/// A P-256 public key, named by its RFC 7638 thumbprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub kid: String,
    x: Vec<u8>,
    y: Vec<u8>,
}

impl PublicKey {
    /// From an uncompressed point (`04 || x || y`).
    pub fn from_point(point: &[u8]) -> Option<Self> {
        if point.len() != 65 || point[0] != 4 {
            return None;
        }
        let (x, y) = (point[1..33].to_vec(), point[33..].to_vec());
        // RFC 7638: the required members, sorted, no whitespace.
        let members = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            URL_SAFE_NO_PAD.encode(&x),
            URL_SAFE_NO_PAD.encode(&y)
        );
        let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(members.as_bytes()));
        Some(PublicKey { kid, x, y })
    }

    /// As a JWK (RFC 7517).
    pub fn jwk(&self) -> serde_json::Value {
        serde_json::json!({
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&self.x),
            "y": URL_SAFE_NO_PAD.encode(&self.y),
            "kid": self.kid,
            "use": "sig",
            "alg": "ES256",
        })
    }
}

/// The JWKS document of these keys.
pub fn jwks(keys: &[PublicKey]) -> serde_json::Value {
    serde_json::json!({"keys": keys.iter().map(PublicKey::jwk).collect::<Vec<_>>()})
}

/// Where receipts are signed: the key never leaves it.
#[async_trait]
pub trait Signer: Send + Sync {
    /// The key signing now.
    async fn public_key(&self) -> Result<PublicKey, SignError>;
    /// The ES256 signature of `message`: `r || s`, 64 bytes.
    async fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError>;
}

/// The keys a JWKS shows: the one signing now and those retired lately.
#[async_trait]
pub trait PublishedKeys: Send + Sync {
    async fn keys(&self) -> Result<Vec<PublicKey>, SignError>;
}

/// Where a signing key's public half is published for the JWKS.
#[async_trait]
pub trait KeyPublisher: Send + Sync {
    async fn publish(&self, key: &PublicKey) -> Result<(), SignError>;
}

/// What issues receipts: the key, and the issuer they name.
#[derive(Clone)]
pub struct Receipts {
    pub signer: Arc<dyn Signer>,
    /// `iss`: `AGENT_RUNS_ISSUER`, else the deployment's base URL.
    pub issuer: String,
}

/// The claims of one receipt.
#[derive(Debug, Serialize)]
pub struct Claims<'a> {
    pub iss: &'a str,
    pub aud: &'a str,
    pub sub: String,
    pub run_id: String,
    pub tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp_server: Option<&'a str>,
    pub arguments_sha256: String,
    pub decision: &'static str,
    pub decided_by: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
}

/// What one tool call is: where it goes, what it is called there, and the
/// arguments it sends.
pub struct Call<'a> {
    /// The tool's URL (an MCP server's) exactly as the definition has it.
    pub audience: &'a str,
    pub tool: &'a str,
    pub mcp_server: Option<&'a str>,
    pub arguments: &'a serde_json::Value,
}

impl Receipts {
    /// The receipt of `call`, which `approval` (decided) allowed.
    pub async fn issue(
        &self,
        run_id: &str,
        approval: &Approval,
        call: &Call<'_>,
        now: Timestamp,
    ) -> Result<String, SignError> {
        let decision = approval.decision().unwrap_or("approve");
        let iat = now.millis().div_euclid(1_000);
        let claims = Claims {
            iss: &self.issuer,
            aud: call.audience,
            sub: approval.id.to_string(),
            run_id: run_id.to_owned(),
            tool: call.tool,
            mcp_server: call.mcp_server,
            arguments_sha256: hex::encode(Sha256::digest(canonical_json(call.arguments).as_bytes())),
            decision,
            decided_by: approval.resolved_by.as_ref().map(ToString::to_string).unwrap_or_default(),
            iat,
            exp: iat + RECEIPT_LIFETIME_SECS,
            jti: approval.id.to_string(),
        };
        let key = self.signer.public_key().await?;
        let header = serde_json::json!({"alg": "ES256", "kid": key.kid, "typ": "JWT"});
        let payload = serde_json::to_vec(&claims).map_err(|_| SignError("the claims could not be encoded".into()))?;
        let input = format!("{}.{}", URL_SAFE_NO_PAD.encode(header.to_string()), URL_SAFE_NO_PAD.encode(payload));
        let signature = self.signer.sign(input.as_bytes()).await?;
        if signature.len() != 64 {
            return Err(SignError("the signature is not an ES256 one".into()));
        }
        Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}
