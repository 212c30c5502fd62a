//! What tests ask of a store beyond its ports.

use async_trait::async_trait;

use agent_runs_aws::DynamoStore;
use agent_runs_domain::Owner;
use agent_runs_embedded::SqliteStore;
use agent_runs_ports::store::{Hooks, Layered, Store, StoreError};

/// How many of an owner's runs a store counts as active: what tests check
/// every write path kept right. Not a port: the service reads the count
/// only inside a create's write.
#[async_trait]
pub trait ActiveRuns: Send + Sync {
    async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError>;
}

#[async_trait]
impl ActiveRuns for SqliteStore {
    async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError> {
        SqliteStore::active_runs(self, owner).await
    }
}

#[async_trait]
impl ActiveRuns for DynamoStore {
    async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError> {
        DynamoStore::active_runs(self, owner).await
    }
}

#[async_trait]
impl<S: ActiveRuns + ?Sized, H: Hooks> ActiveRuns for Layered<S, H> {
    async fn active_runs(&self, owner: &Owner) -> Result<i64, StoreError> {
        self.inner().active_runs(owner).await
    }
}

/// A store as the contract tests take it.
pub trait TestStore: Store + ActiveRuns {}

impl<T: Store + ActiveRuns> TestStore for T {}
