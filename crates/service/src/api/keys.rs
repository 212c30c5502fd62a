//! `GET /v1/keys`: the owner's API keys by name, so that whoever shows a
//! run can say who created it and who decided, and a client can tell which
//! key is its own. Never a secret: only what `agent-runs keys list` shows.

use http::{Method, StatusCode};
use serde::Serialize;

use serde_json::{Value, json};

use super::openapi::{Parts, operation};
use super::query::no_query;
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{ApiError, ApiResponse};
use crate::auth::Principal;
use agent_runs_domain::Scope;
use agent_runs_ports::store::{KeyStore, StoredKey};

#[derive(Serialize)]
struct KeyView<'a> {
    id: String,
    name: Option<&'a str>,
    scopes: Vec<&'static str>,
    created_at: String,
    revoked_at: Option<String>,
    /// The key this request was made with.
    current: bool,
}

#[derive(Serialize)]
struct KeysView<'a> {
    data: Vec<KeyView<'a>>,
}

/// The owner's keys, and always the caller's own: a client learns from it
/// what its key may do, even where the list lags (a key made a moment ago
/// on DynamoDB) or stops short (past the first 1,000).
pub(super) async fn list(keys: &dyn KeyStore, by: &Principal, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    let found = keys.owner_keys(&by.owner).await?;
    let mut data: Vec<KeyView> = found.iter().map(|key| KeyView::of(key, by)).collect();
    if !data.iter().any(|key| key.current) {
        let own = KeyView {
            id: by.key_id.to_string(),
            name: by.key_name.as_deref(),
            scopes: by.scopes.names(),
            created_at: by.key_created_at.to_rfc3339(),
            revoked_at: None,
            current: true,
        };
        let position = found.partition_point(|key| key.id < by.key_id);
        data.insert(position, own);
    }
    Ok(json_response(StatusCode::OK, &KeysView { data }))
}

impl<'a> KeyView<'a> {
    fn of(key: &'a StoredKey, by: &Principal) -> Self {
        KeyView {
            id: key.id.to_string(),
            name: key.name.as_deref(),
            scopes: key.scopes.names(),
            created_at: key.created_at.to_rfc3339(),
            revoked_at: key.revoked_at.map(|at| at.to_rfc3339()),
            current: key.id == by.key_id,
        }
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::ListKeys,
    method: Method::GET,
    path: "/v1/keys",
    operation_id: "listKeys",
    function: "directory",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(list(api.auth.keys(), call.by, call.query())),
    },
    describe: Some(describe),
};

fn describe(route: &Route, _parts: &Parts<'_>) -> Value {
    operation(
        route.operation_id,
        "List the owner's API keys, oldest first",
        json!([]),
        None,
        json!({"200": {
            "description": "The owner's keys (the first 1,000, and always the caller's own), revoked ones too: ids, names and scopes, never a secret. On DynamoDB another key made a moment ago may take a second to appear.",
            "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyList"}}}
        }}),
    )
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use agent_runs_domain::{KeyId, Owner, Scope, Scopes, Timestamp};
    use agent_runs_ports::store::StoreError;

    /// A store whose owner lists lag: it lists none.
    struct Lagging;

    #[async_trait]
    impl KeyStore for Lagging {
        async fn put_key(&self, _key: &StoredKey) -> Result<(), StoreError> {
            Ok(())
        }
        async fn find_key(&self, _hash: &[u8; 32]) -> Result<Option<StoredKey>, StoreError> {
            Ok(None)
        }
        async fn list_keys(&self) -> Result<Vec<StoredKey>, StoreError> {
            Ok(Vec::new())
        }
        async fn owner_keys(&self, _owner: &Owner) -> Result<Vec<StoredKey>, StoreError> {
            Ok(Vec::new())
        }
        async fn revoke_key(&self, _id: KeyId, _at: Timestamp) -> Result<bool, StoreError> {
            Ok(false)
        }
    }

    #[tokio::test]
    async fn the_callers_own_key_is_listed_even_where_the_list_lags() {
        let by = Principal {
            owner: Owner::parse("acme").unwrap(),
            key_id: KeyId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 7)),
            scopes: Scopes::of([Scope::ApprovalsDecide]),
            key_name: Some("alice".into()),
            key_created_at: Timestamp::from_millis(1_795_303_478_123),
        };
        let response = list(&Lagging, &by, None).await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"data": [{
                "id": by.key_id.to_string(),
                "name": "alice",
                "scopes": ["approvals:decide"],
                "created_at": "2026-11-21T23:24:38.123Z",
                "revoked_at": null,
                "current": true
            }]})
        );
    }
}
