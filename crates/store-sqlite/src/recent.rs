//! What the serving process keeps of its own writes: runs as last written,
//! and pages of lists read since their owner's last write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use agent_runs_shared::domain::{Owner, RunId};
use agent_runs_shared::store::{ListRequest, Run, StoreError, ViewPage, run_view_json};
use agent_runs_shared::views::Shown;

/// Runs as this process last wrote them, so a get or a worker's read needs
/// neither SQLite nor a JSON decode, and the pages of lists read since
/// their owner's runs last changed. Only writes fill the runs and only
/// writes invalidate the pages, each on the writer's thread right after its
/// commit (in commit order) and before it is answered, so neither misses an
/// answered write: sound only while no other process writes runs, which
/// [`SqliteStore::open_for_serving`](crate::SqliteStore::open_for_serving)
/// ensures with a lock file (the admin commands write keys and agents,
/// never runs).
#[derive(Default)]
pub(crate) struct RecentRuns {
    /// By id alone (ids are unique across owners), so a lookup makes no key.
    runs: Mutex<HashMap<RunId, Arc<CachedRun>>>,
    pages: Mutex<ListPages>,
}

/// A run as last written, and its JSON as clients see it, made when first
/// asked for (a list splices it in as it is) and kept if it is no larger
/// than the largest run kept.
pub(crate) struct CachedRun {
    pub(crate) run: Run,
    view: OnceLock<Arc<str>>,
}

impl CachedRun {
    pub(crate) fn view(&self, shown: Shown) -> Result<Arc<str>, StoreError> {
        if let Some(view) = self.view.get() {
            return Ok(view.clone());
        }
        let view = run_view_json(&self.run, shown)?;
        if view.len() <= RECENT_RUN_MAX_BYTES {
            let _ = self.view.set(view.clone());
        }
        Ok(view)
    }
}

/// Entries, and the largest run (encoded, and its JSON for clients) worth
/// keeping: about 200 MB at most.
const RECENT_RUNS: usize = 16_384;
const RECENT_RUN_MAX_BYTES: usize = 6 * 1024;

/// Pages of lists, per owner, each kept with the generation of the owner's
/// runs it was read at. A write of any of the owner's runs gives the owner
/// a new generation and drops their pages; a page read while a write was
/// committed is kept only if no write came between the start of its read
/// and its keeping, so a kept page is never older than the last answered write.
#[derive(Default)]
struct ListPages {
    owners: HashMap<Owner, OwnerPages>,
    /// The last generation given: unique across owners and time, so an
    /// owner forgotten and listed again never matches a read begun before.
    last_generation: u64,
    /// The JSON kept in pages (runs shared with `runs` counted again).
    bytes: usize,
}

struct OwnerPages {
    generation: u64,
    pages: HashMap<ListRequest, ViewPage>,
}

/// What pages may hold, and the owners whose generations are kept; past
/// either, everything is forgotten (a forgotten page is read from SQLite).
const LIST_PAGES_MAX_BYTES: usize = 32 * 1024 * 1024;
const LIST_PAGE_OWNERS: usize = 16_384;

impl ListPages {
    fn next_generation(&mut self) -> u64 {
        self.last_generation += 1;
        self.last_generation
    }
}

impl RecentRuns {
    pub(crate) fn get(&self, owner: &Owner, run_id: RunId) -> Option<Arc<CachedRun>> {
        crate::lock(&self.runs).get(&run_id).filter(|cached| cached.run.owner == *owner).cloned()
    }

    /// Called on the writer's thread, after the commit, in commit order.
    pub(crate) fn written(&self, run: Run, encoded_len: usize) {
        self.owner_wrote(&run.owner);
        let mut runs = crate::lock(&self.runs);
        let key = run.id;
        if encoded_len > RECENT_RUN_MAX_BYTES {
            runs.remove(&key);
            return;
        }
        if runs.len() >= RECENT_RUNS && !runs.contains_key(&key) {
            // Forget an arbitrary eighth; a forgotten run is read from SQLite.
            let mut to_forget = RECENT_RUNS / 8;
            runs.retain(|_, _| {
                if to_forget == 0 {
                    return true;
                }
                to_forget -= 1;
                false
            });
        }
        runs.insert(key, Arc::new(CachedRun { run, view: OnceLock::new() }));
    }

    /// Called on the writer's thread, after the commit of a removal.
    pub(crate) fn removed(&self, owner: &Owner, run_id: RunId) {
        self.owner_wrote(owner);
        let mut runs = crate::lock(&self.runs);
        if runs.get(&run_id).is_some_and(|cached| cached.run.owner == *owner) {
            runs.remove(&run_id);
        }
    }

    fn owner_wrote(&self, owner: &Owner) {
        let mut guard = crate::lock(&self.pages);
        let pages = &mut *guard;
        let generation = pages.next_generation();
        if let Some(kept) = pages.owners.get_mut(owner) {
            kept.generation = generation;
            let freed: usize = kept.pages.drain().map(|(_, page)| page_bytes(&page)).sum();
            pages.bytes -= freed;
        }
    }

    /// The page as kept since the owner's last write, or the generation
    /// to read it at and hand back to [`RecentRuns::keep_page`].
    pub(crate) fn page(&self, owner: &Owner, request: &ListRequest) -> Result<ViewPage, u64> {
        let mut pages = crate::lock(&self.pages);
        if let Some(kept) = pages.owners.get(owner) {
            return kept.pages.get(request).cloned().ok_or(kept.generation);
        }
        if pages.owners.len() >= LIST_PAGE_OWNERS {
            pages.owners.clear();
            pages.bytes = 0;
        }
        let generation = pages.next_generation();
        pages.owners.insert(owner.clone(), OwnerPages { generation, pages: HashMap::new() });
        Err(generation)
    }

    /// Keeps a page read at `generation`, unless a write of the owner's
    /// runs came since.
    pub(crate) fn keep_page(&self, owner: &Owner, request: ListRequest, generation: u64, page: &ViewPage) {
        let bytes = page_bytes(page);
        let mut guard = crate::lock(&self.pages);
        let pages = &mut *guard;
        if pages.bytes + bytes > LIST_PAGES_MAX_BYTES {
            pages.owners.values_mut().for_each(|kept| kept.pages.clear());
            pages.bytes = 0;
        }
        let Some(kept) = pages.owners.get_mut(owner).filter(|kept| kept.generation == generation) else {
            return;
        };
        if let Some(replaced) = kept.pages.insert(request, page.clone()) {
            pages.bytes -= page_bytes(&replaced);
        }
        pages.bytes += bytes;
    }
}

fn page_bytes(page: &ViewPage) -> usize {
    page.views.iter().map(|view| view.len()).sum()
}
