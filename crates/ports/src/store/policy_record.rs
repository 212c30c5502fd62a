//! An owner's policy as both stores keep it: the rules as the API shows
//! them (every field present), when and by whom it was put. The version
//! is kept beside it, for conditional writes. A document that does not
//! read back is a [`StoreError::Defect`].

use serde::{Deserialize, Serialize};

use super::StoreError;
use agent_runs_domain::{Policy, Rule, Timestamp, rules_from_json, rules_json};

#[derive(Debug, Serialize, Deserialize)]
struct StoredPolicy {
    rules: serde_json::Value,
    updated_at: i64,
    updated_by: String,
}

fn malformed(what: &str) -> StoreError {
    StoreError::Defect(format!("stored policy: malformed {what}"))
}

/// The stored text of a document of `rules`, put `at` by `by`.
pub fn encode_policy(rules: &[Rule], at: Timestamp, by: agent_runs_domain::KeyId) -> String {
    let stored = StoredPolicy { rules: rules_json(rules), updated_at: at.millis(), updated_by: by.to_string() };
    serde_json::to_string(&stored).unwrap_or_else(|_| unreachable!("a policy is plain JSON"))
}

/// The document of version `version` stored as `text`.
pub fn decode_policy(version: u64, text: &str) -> Result<Policy, StoreError> {
    let stored: StoredPolicy = serde_json::from_str(text).map_err(|_| malformed("document"))?;
    Ok(Policy {
        version,
        rules: rules_from_json(&stored.rules).map_err(|_| malformed("rules"))?,
        updated_at: Some(Timestamp::from_millis(stored.updated_at)),
        updated_by: Some(stored.updated_by.parse().map_err(|_| malformed("updated_by"))?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_runs_domain::{KeyId, parse_rules};

    #[test]
    fn a_policy_reads_back_as_put_and_its_stored_form_is_fixed() {
        let rules =
            parse_rules(&serde_json::json!({"rules": [{"id": "a", "tool": "delete_*", "effect": "deny"}]})).unwrap();
        let by = KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 7));
        let text = encode_policy(&rules, Timestamp::from_millis(1_795_303_478_123), by);
        assert_eq!(
            text,
            r#"{"rules":[{"id":"a","agent":"*","tool":"delete_*","effect":"deny","mode":"enforce","reason":null,"when":[]}],"updated_at":1795303478123,"updated_by":"key_01M806T4VB0000000000000007"}"#
        );
        let policy = decode_policy(3, &text).unwrap();
        assert_eq!((policy.version, policy.rules, policy.updated_by), (3, rules, Some(by)));
        let broken = text.replace("\"deny\"", "\"never\"");
        assert!(matches!(decode_policy(3, &broken), Err(StoreError::Defect(_))));
    }
}
