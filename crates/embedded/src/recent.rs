//! What the serving process keeps of its own writes: runs as last written,
//! and pages of lists and of the approvals inbox read since their owner's
//! last write.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use agent_runs_domain::{InboxPosition, Owner, RunId};
use agent_runs_ports::store::{InboxRequest, InboxViewPage, ListRequest, Run, StoreError, ViewPage, run_view_json};
use agent_runs_ports::views::ExtraFields;

/// Runs as this process last wrote them, so a get or a worker's read needs
/// neither SQLite nor a JSON decode, and the pages of lists and of the
/// inbox read since their owner's runs last changed (approvals change only
/// with their run). Only writes fill the runs and only
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
    pages: Mutex<KeptPages<ListRequest, RunId>>,
    inbox: Mutex<KeptPages<InboxRequest, InboxPosition>>,
}

/// A run as last written, and its JSON as clients see it, made when first
/// asked for (a list splices it in as it is) and kept if it is no larger
/// than the largest run kept.
pub(crate) struct CachedRun {
    pub(crate) run: Run,
    view: OnceLock<Arc<str>>,
}

impl CachedRun {
    pub(crate) fn view(&self, shown: ExtraFields) -> Result<Arc<str>, StoreError> {
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

/// Pages of one kind, per owner and request, each kept with the generation
/// of the owner's runs it was read at. A write of any of the owner's runs
/// gives the owner a new generation and drops their pages; a page read
/// while a write was committed is kept only if no write came between the
/// start of its read and its keeping, so a kept page is never older than
/// the last answered write.
struct KeptPages<R, L> {
    owners: HashMap<Owner, OwnerPages<R, L>>,
    /// The last generation given: unique across owners and time, so an
    /// owner forgotten and listed again never matches a read begun before.
    last_generation: u64,
    /// What the kept pages take, as [`page_bytes`] counts them.
    bytes: usize,
    limits: PageLimits,
}

impl<R, L> Default for KeptPages<R, L> {
    fn default() -> Self {
        KeptPages { owners: HashMap::new(), last_generation: 0, bytes: 0, limits: PageLimits::default() }
    }
}

struct OwnerPages<R, L> {
    generation: u64,
    /// Each page with the bytes it is counted as.
    pages: HashMap<R, (ViewPage<L>, usize)>,
}

impl<R, L> OwnerPages<R, L> {
    /// Takes every page (the map's memory with them, not only emptying it)
    /// and says how many bytes they were counted as.
    fn take_pages(&mut self) -> (HashMap<R, (ViewPage<L>, usize)>, usize) {
        let pages = std::mem::take(&mut self.pages);
        let bytes = pages.values().map(|(_, bytes)| bytes).sum();
        (pages, bytes)
    }
}

/// Past `bytes` or `owners`, every page and generation is forgotten (a
/// forgotten page is read from SQLite); past `pages_per_owner`, the owner's.
#[derive(Clone, Copy)]
struct PageLimits {
    bytes: usize,
    owners: usize,
    pages_per_owner: usize,
}

impl Default for PageLimits {
    fn default() -> Self {
        PageLimits { bytes: 32 * 1024 * 1024, owners: 16_384, pages_per_owner: 64 }
    }
}

/// What a kept page is counted as beyond its JSON: its key, its entry and
/// the vector of its items, so that empty pages count too.
const PAGE_OVERHEAD_BYTES: usize = 256;

fn page_bytes<L>(page: &ViewPage<L>) -> usize {
    PAGE_OVERHEAD_BYTES + page.views.iter().map(|view| view.len() + 16).sum::<usize>()
}

impl<R: std::hash::Hash + Eq, L: Clone> KeptPages<R, L> {
    fn next_generation(&mut self) -> u64 {
        self.last_generation += 1;
        self.last_generation
    }

    fn forget_everything(&mut self) {
        self.owners = HashMap::new();
        self.bytes = 0;
    }

    /// Gives back the owner's pages, for the caller to free outside the lock.
    fn owner_wrote(&mut self, owner: &Owner) -> HashMap<R, (ViewPage<L>, usize)> {
        let generation = self.next_generation();
        let Some(kept) = self.owners.get_mut(owner) else {
            return HashMap::new();
        };
        kept.generation = generation;
        let (pages, bytes) = kept.take_pages();
        self.bytes -= bytes;
        pages
    }

    fn page(&mut self, owner: &Owner, request: &R) -> Result<ViewPage<L>, u64> {
        if let Some(kept) = self.owners.get(owner) {
            return kept.pages.get(request).map(|(page, _)| page.clone()).ok_or(kept.generation);
        }
        if self.owners.len() >= self.limits.owners {
            self.forget_everything();
        }
        let generation = self.next_generation();
        self.owners.insert(owner.clone(), OwnerPages { generation, pages: HashMap::new() });
        Err(generation)
    }

    /// Keeps a page read at `generation`, or gives back the page another
    /// read kept first at the same generation, so that every reader until
    /// the owner's next write answers one page and one copy is held. (Two
    /// reads at one generation may differ only by a write committed but
    /// not yet answered, which either may show.)
    fn keep_page(&mut self, owner: &Owner, request: R, generation: u64, page: &ViewPage<L>) -> Option<ViewPage<L>> {
        let bytes = page_bytes(page);
        // A page larger than an eighth of the whole is read each time.
        if bytes > self.limits.bytes / 8 {
            return None;
        }
        let kept = self.owners.get_mut(owner).filter(|kept| kept.generation == generation)?;
        if let Some((first, _)) = kept.pages.get(&request) {
            return Some(first.clone());
        }
        if kept.pages.len() >= self.limits.pages_per_owner {
            self.bytes -= kept.take_pages().1;
        }
        kept.pages.insert(request, (page.clone(), bytes));
        self.bytes += bytes;
        if self.bytes > self.limits.bytes {
            self.forget_everything();
        }
        None
    }
}

impl RecentRuns {
    pub(crate) fn get(&self, owner: &Owner, run_id: RunId) -> Option<Arc<CachedRun>> {
        agent_runs_ports::lock(&self.runs).get(&run_id).filter(|cached| cached.run.owner == *owner).cloned()
    }

    /// Called on the writer's thread, after the commit, in commit order.
    pub(crate) fn written(&self, run: Run, encoded_len: usize) {
        self.owner_wrote(&run.owner);
        let mut runs = agent_runs_ports::lock(&self.runs);
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
        let mut runs = agent_runs_ports::lock(&self.runs);
        if runs.get(&run_id).is_some_and(|cached| cached.run.owner == *owner) {
            runs.remove(&run_id);
        }
    }

    fn owner_wrote(&self, owner: &Owner) {
        let pages = agent_runs_ports::lock(&self.pages).owner_wrote(owner);
        let inbox = agent_runs_ports::lock(&self.inbox).owner_wrote(owner);
        // Freed with neither lock held, so reads are not held up by it.
        drop((pages, inbox));
    }

    /// The page as kept since the owner's last write, or the generation
    /// to read it at and hand back to [`RecentRuns::keep_page`].
    pub(crate) fn page(&self, owner: &Owner, request: &ListRequest) -> Result<ViewPage, u64> {
        agent_runs_ports::lock(&self.pages).page(owner, request)
    }

    /// Keeps a page read at `generation`, unless a write of the owner's
    /// runs came since, and gives back the page to answer: this one, or
    /// the one another read kept first at the same generation.
    pub(crate) fn keep_page(&self, owner: &Owner, request: ListRequest, generation: u64, page: ViewPage) -> ViewPage {
        let first = agent_runs_ports::lock(&self.pages).keep_page(owner, request, generation, &page);
        first.unwrap_or(page)
    }

    /// As [`RecentRuns::page`], for the inbox.
    pub(crate) fn inbox_page(&self, owner: &Owner, request: &InboxRequest) -> Result<InboxViewPage, u64> {
        agent_runs_ports::lock(&self.inbox).page(owner, request)
    }

    /// As [`RecentRuns::keep_page`], for the inbox.
    pub(crate) fn keep_inbox_page(
        &self,
        owner: &Owner,
        request: InboxRequest,
        generation: u64,
        page: InboxViewPage,
    ) -> InboxViewPage {
        let first = agent_runs_ports::lock(&self.inbox).keep_page(owner, request, generation, &page);
        first.unwrap_or(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type ListPages = KeptPages<ListRequest, RunId>;

    fn owner(name: &str) -> Owner {
        Owner::parse(name).unwrap()
    }

    fn request(limit: u32) -> ListRequest {
        ListRequest { status: None, thread: None, before: None, limit }
    }

    fn page(text: &str) -> ViewPage {
        ViewPage { views: vec![Arc::from(text)], last: None, has_more: false }
    }

    fn shown(found: Result<ViewPage, u64>) -> Result<String, u64> {
        found.map(|page| page.views.concat())
    }

    #[test]
    fn a_page_is_answered_until_its_owners_next_write_and_never_kept_across_one() {
        let mut pages = ListPages::default();
        let (ada, bob) = (owner("ada"), owner("bob"));
        let read_at = pages.page(&ada, &request(20)).unwrap_err();
        pages.keep_page(&ada, request(20), read_at, &page("one"));
        assert_eq!(shown(pages.page(&ada, &request(20))), Ok("one".into()));
        assert!(pages.page(&ada, &request(5)).is_err(), "another request is another page");
        pages.owner_wrote(&bob);
        assert_eq!(shown(pages.page(&ada, &request(20))), Ok("one".into()), "another owner's write");
        pages.owner_wrote(&ada);
        let read_at = pages.page(&ada, &request(20)).unwrap_err();
        // A write between the start of a read and its keeping: not kept.
        pages.owner_wrote(&ada);
        pages.keep_page(&ada, request(20), read_at, &page("stale"));
        assert!(pages.page(&ada, &request(20)).is_err());
        assert_eq!(pages.bytes, 0);
        // Two reads at one generation: the first kept is the one answered.
        let (one, two) = (pages.page(&ada, &request(20)).unwrap_err(), pages.page(&ada, &request(20)).unwrap_err());
        assert!(pages.keep_page(&ada, request(20), one, &page("first")).is_none());
        let answered = pages.keep_page(&ada, request(20), two, &page("second")).unwrap();
        assert_eq!(answered.views.concat(), "first");
        assert_eq!(shown(pages.page(&ada, &request(20))), Ok("first".into()));
        assert_eq!(pages.bytes, page_bytes(&page("first")));
    }

    #[test]
    fn an_owner_forgotten_and_listed_again_never_takes_a_page_read_before() {
        let mut pages = ListPages { limits: PageLimits { owners: 2, ..PageLimits::default() }, ..Default::default() };
        let ada = owner("ada");
        let read_at = pages.page(&ada, &request(20)).unwrap_err();
        // Two more owners forget every generation; ada's write then finds
        // no entry, and ada is listed again.
        pages.page(&owner("bob"), &request(20)).unwrap_err();
        pages.page(&owner("cy"), &request(20)).unwrap_err();
        pages.owner_wrote(&ada);
        let again = pages.page(&ada, &request(5)).unwrap_err();
        assert_ne!(again, read_at);
        pages.keep_page(&ada, request(20), read_at, &page("stale"));
        assert!(pages.page(&ada, &request(20)).is_err(), "the read begun before is not kept");
    }

    #[test]
    fn kept_pages_stay_within_their_limits() {
        let limits = PageLimits { bytes: 8 * 1024, owners: 16, pages_per_owner: 4 };
        let mut pages = ListPages { limits, ..Default::default() };
        let ada = owner("ada");
        for limit in 1..=10 {
            let read_at = pages.page(&ada, &request(limit)).unwrap_err();
            pages.keep_page(&ada, request(limit), read_at, &page(""));
            assert!(pages.owners[&ada].pages.len() <= 4, "empty pages count too");
        }
        let counted: usize =
            pages.owners.values().flat_map(|kept| kept.pages.values()).map(|(page, _)| page_bytes(page)).sum();
        assert_eq!(pages.bytes, counted);
        // Too large for an eighth of the whole: read each time.
        let read_at = pages.page(&ada, &request(50)).unwrap_err();
        pages.keep_page(&ada, request(50), read_at, &page(&"x".repeat(2 * 1024)));
        assert!(pages.page(&ada, &request(50)).is_err());
        // Past the bytes, everything is forgotten, generations included.
        for (index, name) in ["b", "c", "d", "e", "f", "g", "h", "i"].iter().enumerate() {
            let who = owner(name);
            let read_at = pages.page(&who, &request(20)).unwrap_err();
            pages.keep_page(&who, request(20), read_at, &page(&"y".repeat(700)));
            assert!(pages.bytes <= limits.bytes, "after owner {index}");
        }
        assert!(pages.owners.len() < 9);
    }
}
