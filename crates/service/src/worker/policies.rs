//! Owners' approval policies as this process last read them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agent_runs_domain::{Owner, Policy};
use agent_runs_ports::store::{PolicyStore, StoreError};

/// Owners whose documents are kept; past this the memory starts afresh.
const MAX_OWNERS: usize = 1024;

/// Each step reads the policy in force (one read of the store), but the
/// document is decoded, its patterns compiled, only when its version
/// changed since this process last read it.
pub(super) struct PolicyCache {
    store: Arc<dyn PolicyStore>,
    read: Mutex<HashMap<Owner, Arc<Policy>>>,
}

impl PolicyCache {
    pub(super) fn new(store: Arc<dyn PolicyStore>) -> PolicyCache {
        PolicyCache { store, read: Mutex::default() }
    }

    pub(super) async fn in_force(&self, owner: &Owner) -> Result<Arc<Policy>, StoreError> {
        let known = self.read.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(owner).cloned();
        let policy = match known {
            None => Arc::new(self.store.policy(owner).await?),
            Some(known) => match self.store.policy_unless(owner, known.version).await? {
                None => return Ok(known),
                Some(changed) => Arc::new(changed),
            },
        };
        let mut cached = self.read.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cached.len() >= MAX_OWNERS && !cached.contains_key(owner) {
            cached.clear();
        }
        // Two claims may read at once: the newer document stays.
        if cached.get(owner).is_none_or(|known| known.version < policy.version) {
            cached.insert(owner.clone(), policy.clone());
        }
        Ok(policy)
    }
}
