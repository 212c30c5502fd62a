//! `GET /v1/keys`: the owner's API keys by name, so that whoever shows a
//! run can say who created it and who decided, and a client can tell which
//! key is its own. Never a secret: only what `agent-runs keys list` shows.

use http::StatusCode;
use serde::Serialize;

use super::query::no_query;
use super::response::json_response;
use super::{ApiError, ApiResponse};
use crate::auth::Principal;
use crate::store::{KeyStore, StoredKey};

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

pub(super) async fn list(keys: &dyn KeyStore, by: &Principal, query: Option<&str>) -> Result<ApiResponse, ApiError> {
    no_query(query)?;
    let found = keys.owner_keys(&by.owner).await?;
    Ok(json_response(StatusCode::OK, &KeysView { data: found.iter().map(|key| KeyView::of(key, by)).collect() }))
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
