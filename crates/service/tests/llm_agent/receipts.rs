//! Approval receipts on the calls an approval allowed (a person, a rule, a
//! veto window's end), none on the others, and no call at all when the
//! receipt cannot be signed.

use agent_runs_domain::{KeyId, parse_rules};
use agent_runs_ports::receipts::{PublicKey, SignError};
use agent_runs_ports::store::PolicyStore;
use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::*;

/// The claims of a receipt (its signature is PyJWT's and jose's to check:
/// `crates/cli/tests/receipts.rs`).
pub(super) fn claims(receipt: &str) -> Value {
    let payload = receipt.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

#[tokio::test]
async fn a_call_a_rule_allowed_carries_a_receipt_naming_the_rule_and_an_ungated_one_none() {
    let fixture = Fixture::new().await;
    let rules =
        parse_rules(&json!({"rules": [{"id": "old-branches", "tool": "delete_branch", "effect": "allow"}]})).unwrap();
    let key = KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    fixture.store.put_policy(&Owner::parse("acme").unwrap(), None, &rules, fixture.clock.now(), key).await.unwrap();
    fixture.stand_in.script(vec![
        tool_call("call_1", "lookup", r#"{"id":"T-1"}"#),
        tool_call("call_2", "delete_branch", r#"{"branch":"old"}"#),
        text("Done."),
    ]);
    let message = fixture.create("Tidy").await;
    assert_eq!(fixture.process(&message).await, Outcome::Succeeded);
    let calls = fixture.stand_in.tool_calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].receipt, None, "no approval, no receipt");
    let claims = claims(calls[1].receipt.as_deref().unwrap());
    let run = fixture.run(&message).await;
    assert_eq!(claims["decision"], "approve");
    assert_eq!(claims["decided_by"], "policy:old-branches");
    assert_eq!(claims["sub"], run.approvals[0].id.to_string());
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["aud"], format!("{}/tools/delete", fixture.stand_in.url));
    assert_eq!(claims["arguments_sha256"], run.approvals[0].arguments_sha256().unwrap());
    assert!(claims.get("mcp_server").is_none());
}

struct Broken;

#[async_trait]
impl Signer for Broken {
    async fn public_key(&self) -> Result<PublicKey, SignError> {
        Err(SignError("the key store is down".into()))
    }

    async fn sign(&self, _message: &[u8]) -> Result<Vec<u8>, SignError> {
        Err(SignError("the key store is down".into()))
    }
}

#[tokio::test]
async fn a_call_whose_receipt_cannot_be_signed_is_not_made_and_the_run_says_why() {
    let fixture = Fixture::signing_with(|_| {}, 256 * 1024, Arc::new(Broken)).await;
    fixture.stand_in.script(vec![tool_call("call_1", "delete_branch", r#"{"branch":"old"}"#), text("Done.")]);
    let message = fixture.create("Delete old").await;
    assert_eq!(fixture.process(&message).await, Outcome::AwaitingApproval);
    fixture.decide(&message, Decision::Approve, None).await;
    assert_eq!(fixture.process(&message).await, Outcome::Failed);
    assert!(fixture.stand_in.tool_calls().is_empty(), "never without its receipt");
    let error = fixture.run(&message).await.error.unwrap();
    assert!(error.contains("receipt") && !error.contains("key store"), "{error}");
}
