//! Receipts signed by an AWS KMS key (`ECC_NIST_P256`, `SIGN_VERIFY`): the
//! private key never leaves KMS. Its public key is read once per process
//! (`kms:GetPublicKey`) and published where the API's JWKS reads it, again
//! each [`REPUBLISH_AFTER`] (the worker signs; the sweeper only publishes).

use std::time::{Duration, SystemTime};

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::{MessageType, SigningAlgorithmSpec};

use agent_runs_ports::receipts::{KeyPublisher, PublicKey, SignError, Signer};

pub struct KmsKey {
    client: aws_sdk_kms::Client,
    key_id: String,
    publisher: Arc<dyn KeyPublisher>,
    public: tokio::sync::OnceCell<PublicKey>,
    /// When this process last published the key.
    published_at: std::sync::Mutex<Option<SystemTime>>,
}

/// A process publishes its key again after this: the JWKS shows a key for
/// 7 days after its last publication, and lists the latest published
/// first, so a long-lived process keeps its key there, and after a
/// rotation the key signing now is back in front within this time. (Wall
/// time: a frozen Lambda's monotonic clock may not move.)
const REPUBLISH_AFTER: Duration = Duration::from_secs(3600);

fn publication_due(last: Option<SystemTime>, now: SystemTime) -> bool {
    // A clock set back counts as due: a publication too many is harmless.
    last.is_none_or(|at| now.duration_since(at).map_or(true, |since| since >= REPUBLISH_AFTER))
}

const MAX_RAW_MESSAGE_BYTES: usize = 4_096;

/// The DER prefix of a P-256 SubjectPublicKeyInfo (RFC 5480) before its
/// 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce,
    0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn point_of_spki(der: &[u8]) -> Option<PublicKey> {
    der.strip_prefix(&P256_SPKI_PREFIX[..]).and_then(PublicKey::from_point)
}

/// An ECDSA signature as KMS gives it (DER: `SEQUENCE { r INTEGER, s
/// INTEGER }`) as JWS wants it: `r || s`, 32 bytes each.
pub fn raw_signature(der: &[u8]) -> Option<Vec<u8>> {
    fn integer(der: &[u8]) -> Option<(&[u8], &[u8])> {
        let (&tag, rest) = der.split_first()?;
        let (&length, rest) = rest.split_first()?;
        if tag != 0x02 || usize::from(length) > rest.len() || length > 33 {
            return None;
        }
        Some(rest.split_at(usize::from(length)))
    }
    let (&tag, rest) = der.split_first()?;
    let (&length, body) = rest.split_first()?;
    if tag != 0x30 || usize::from(length) != body.len() {
        return None;
    }
    let (r, rest) = integer(body)?;
    let (s, rest) = integer(rest)?;
    if !rest.is_empty() {
        return None;
    }
    let mut raw = Vec::with_capacity(64);
    for number in [r, s] {
        let digits = &number[number.iter().take_while(|byte| **byte == 0).count()..];
        if digits.len() > 32 {
            return None;
        }
        raw.extend(std::iter::repeat_n(0, 32 - digits.len()));
        raw.extend_from_slice(digits);
    }
    Some(raw)
}

impl KmsKey {
    pub fn new(client: aws_sdk_kms::Client, key_id: String, publisher: Arc<dyn KeyPublisher>) -> Self {
        KmsKey { client, key_id, publisher, public: tokio::sync::OnceCell::new(), published_at: Default::default() }
    }
}

fn kms_failed(what: &str, error: impl std::error::Error) -> SignError {
    tracing::error!(error = %agent_runs_ports::error_chain(&error), "KMS {what} failed");
    SignError(format!("KMS {what} failed"))
}

#[async_trait]
impl Signer for KmsKey {
    /// The key, published before it is first given (a receipt is never
    /// signed by a key the JWKS does not show), then again when due.
    async fn public_key(&self) -> Result<PublicKey, SignError> {
        let key = self
            .public
            .get_or_try_init(|| async {
                let output = self
                    .client
                    .get_public_key()
                    .key_id(&self.key_id)
                    .send()
                    .await
                    .map_err(|error| kms_failed("GetPublicKey", error))?;
                let der = output.public_key.ok_or_else(|| SignError("KMS gave no public key".into()))?;
                point_of_spki(der.as_ref()).ok_or_else(|| SignError("the KMS key is not an ECC_NIST_P256 key".into()))
            })
            .await?;
        let last = *agent_runs_ports::lock(&self.published_at);
        if publication_due(last, SystemTime::now()) {
            match self.publisher.publish(key).await {
                Ok(()) => *agent_runs_ports::lock(&self.published_at) = Some(SystemTime::now()),
                // Shown for days since its last publication: signing goes on.
                Err(error) if last.is_some() => tracing::warn!(%error, "the receipt key could not be published again"),
                Err(error) => return Err(error),
            }
        }
        Ok(key.clone())
    }

    async fn sign(&self, message: &[u8]) -> Result<Vec<u8>, SignError> {
        // KMS signs at most 4 KiB of message (a receipt is far less unless
        // a tool's URL nears its 2 KiB limit). The digest could be sent
        // instead; the emulator the tests use hashes it again, though.
        if message.len() > MAX_RAW_MESSAGE_BYTES {
            return Err(SignError("the receipt is too long for KMS to sign (the tool's URL is too long)".into()));
        }
        let output = self
            .client
            .sign()
            .key_id(&self.key_id)
            .message(Blob::new(message))
            .message_type(MessageType::Raw)
            .signing_algorithm(SigningAlgorithmSpec::EcdsaSha256)
            .send()
            .await
            .map_err(|error| kms_failed("Sign", error))?;
        let der = output.signature.ok_or_else(|| SignError("KMS gave no signature".into()))?;
        raw_signature(der.as_ref()).ok_or_else(|| SignError("KMS gave a malformed signature".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_published_first_then_again_each_hour() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert!(publication_due(None, at));
        assert!(!publication_due(Some(at), at + Duration::from_secs(3599)));
        assert!(publication_due(Some(at), at + REPUBLISH_AFTER));
        assert!(publication_due(Some(at + Duration::from_secs(60)), at), "a clock set back");
    }

    #[test]
    fn der_signatures_become_fixed_width_and_malformed_ones_are_refused() {
        // r with a leading zero (its high bit set), s short.
        let mut r = vec![0u8];
        r.extend([0x80; 32]);
        let s = [0x01; 31];
        let mut der = vec![0x30, (2 + r.len() + 2 + s.len()) as u8, 0x02, r.len() as u8];
        der.extend(&r);
        der.extend([0x02, s.len() as u8]);
        der.extend(s);
        let raw = raw_signature(&der).unwrap();
        assert_eq!(raw.len(), 64);
        assert_eq!(&raw[..32], &[0x80; 32]);
        assert_eq!((raw[32], &raw[33..]), (0, &[0x01; 31][..]));
        for broken in [&der[..der.len() - 1], &[0x30, 0x00][..], &[][..]] {
            assert_eq!(raw_signature(broken), None);
        }
    }
}
