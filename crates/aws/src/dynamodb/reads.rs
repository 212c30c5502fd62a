//! Lists and events.

use async_trait::async_trait;

use super::items::{
    InboxIndexEntry, RUN_SK, decode_event_item, decode_inbox_entry, decode_run, defect, event_sk, following_on,
    inbox_sort_key, owners_run, run_pk, run_sk, status_pk, text, thread_pk, unavailable,
};
use super::{
    APPROVALS_INDEX, DynamoStore, INBOX_FILTERED_READ, Item, KIND_FILTERED_READ, OWNER_SHARDS, STATUS_INDEX, s,
};
use agent_runs_domain::{Approval, ApprovalId, InboxPosition, Owner, RunId, Timestamp};
use agent_runs_ports::store::{
    EventLog, EventPage, InboxEntry, InboxPage, InboxRequest, ListPage, ListRequest, Run, RunLists, StoreError,
    StoredEvent, ViewPage, run_view_json, views_of,
};

#[async_trait]
impl RunLists for DynamoStore {
    async fn list(&self, owner: &Owner, request: ListRequest) -> Result<ListPage, StoreError> {
        if let Some(thread) = request.thread {
            return self.thread_list(owner, thread, request).await;
        }
        let fetch = request.limit as usize + 1;
        let (index, partition, sort) = match request.status {
            // The entries, read consistently, then their runs.
            None => (None, "pk", "sk"),
            // The status index holds whole runs.
            Some(_) => (Some(STATUS_INDEX), "gsi1pk", "gsi1sk"),
        };
        let queries = (0..OWNER_SHARDS).map(|shard| {
            let value = match request.status {
                None => format!("OWNER#{owner}#{shard}"),
                Some(status) => status_pk(owner, status, shard),
            };
            let query = self
                .client
                .query()
                .table_name(&self.table)
                .set_index_name(index.map(str::to_owned))
                .expression_attribute_names("#p", partition)
                .expression_attribute_names("#s", sort)
                .expression_attribute_values(":p", s(value))
                .scan_index_forward(false)
                .set_consistent_read(index.is_none().then_some(true));
            match request.before {
                None => query
                    .key_condition_expression("#p = :p AND begins_with(#s, :run)")
                    .expression_attribute_values(":run", s("RUN#")),
                Some(before) => query
                    .key_condition_expression("#p = :p AND #s < :before")
                    .expression_attribute_values(":before", s(run_sk(before))),
            }
        });
        let newest = self.newest_across(queries.collect(), sort, fetch).await?;
        // Decided by what was read: a run left out below (being undone)
        // does not hide the pages after it.
        let has_more = newest.len() > request.limit as usize;
        let mut runs = match request.status {
            Some(_) => newest.into_iter().map(decode_run).collect::<Result<Vec<_>, _>>()?,
            None => {
                let ids = entry_run_ids(&newest)?;
                let mut found = self.get_runs(owner, ids.iter().copied()).await?;
                // An entry without its run is a create being undone.
                ids.iter().filter_map(|id| found.remove(id)).collect()
            }
        };
        runs.truncate(request.limit as usize);
        Ok(ListPage { runs, has_more, resume_after: None })
    }

    async fn inbox(&self, owner: &Owner, request: InboxRequest) -> Result<InboxPage, StoreError> {
        let mut query = self
            .client
            .query()
            .table_name(&self.table)
            .index_name(APPROVALS_INDEX)
            .expression_attribute_values(":p", s(format!("APR#{owner}#{}", request.status.as_str())))
            .scan_index_forward(false);
        // The agent filter reads the owner's entries of that status and
        // keeps the agent's: one index serves both (docs/design.md).
        if let Some(agent) = &request.agent {
            query = query
                .filter_expression("#agent = :agent")
                .expression_attribute_names("#agent", "agent")
                .expression_attribute_values(":agent", s(agent));
        }
        // From the cursor's entry on (its run's entry holds the approvals
        // after it too); entries at or above the cursor are left out below.
        let query = match &request.after {
            None => query.key_condition_expression("gsi3pk = :p"),
            Some(after) => {
                query.key_condition_expression("gsi3pk = :p AND gsi3sk <= :last").expression_attribute_values(
                    ":last",
                    s(inbox_sort_key(after.requested_at, after.run_id, Some(after.approval_id))),
                )
            }
        };
        let wanted = request.limit as usize + 1;
        // Filtered, a Query reads past other agents' entries (small: keys
        // and agent), so each reads many; unfiltered, what the page needs.
        // The kind is not in the index: a kind filter reads the runs of
        // every entry it passes, so it reads a bounded number of them per
        // request and says where it stopped.
        let read_per_query = match (&request.agent, request.kind) {
            (_, Some(_)) => KIND_FILTERED_READ.min(self.kind_filter_budget),
            (Some(_), None) => INBOX_FILTERED_READ,
            (None, None) => wanted,
        };
        let mut entries = Vec::new();
        let mut start = None;
        let mut examined = 0;
        let mut resume_after: Option<InboxPosition> = None;
        loop {
            let output = query
                .clone()
                .set_exclusive_start_key(start)
                .limit(read_per_query as i32)
                .send()
                .await
                .map_err(unavailable)?;
            let mut items = output.items.unwrap_or_default();
            start = output.last_evaluated_key;
            // Only the runs of as many entries as the page still needs are
            // read; the next round resumes after the last of them. (Not so
            // with a kind filter: an entry may hold none of the page.)
            let needed = wanted.saturating_sub(entries.len()).max(1);
            if request.kind.is_none() && items.len() > needed {
                items.truncate(needed);
                let keys = ["pk", "sk", "gsi3pk", "gsi3sk"];
                let last = items.last().map(|item| {
                    item.iter().filter(|(name, _)| keys.contains(&name.as_str())).map(|(n, v)| (n.clone(), v.clone()))
                });
                start = last.map(Item::from_iter);
            }
            examined += items.len();
            let found: Vec<InboxIndexEntry> = items
                .iter()
                .filter_map(|item| {
                    decode_inbox_entry(item)
                        .inspect_err(|error| tracing::error!(%error, "an inbox index entry is malformed; left out"))
                        .ok()
                })
                .collect();
            let runs = self.get_runs(owner, found.iter().map(|entry| entry.run_id)).await?;
            for entry in &found {
                // The index lags behind the runs: what no longer matches is
                // left out (a run's entry names the park it was made for).
                let Some(run) = runs.get(&entry.run_id) else { continue };
                let ids = entry.approval.map_or_else(
                    || {
                        let parked_then = |a: &&Approval| a.requested_at.millis() == entry.requested_at;
                        run.approvals.iter().filter(parked_then).map(|a| a.id).collect()
                    },
                    |id| vec![id],
                );
                let mut of_run: Vec<InboxEntry> = ids
                    .into_iter()
                    .filter_map(|id| InboxEntry::of(run, id, request.status, request.after.as_ref()))
                    // A run's entry may hold approvals of several kinds.
                    .filter(|entry| request.kind.is_none_or(|kind| entry.approval.kind() == kind))
                    .collect();
                of_run.sort_by_key(|entry| std::cmp::Reverse(entry.position()));
                entries.extend(of_run);
            }
            if entries.len() >= wanted || start.is_none() {
                break;
            }
            if request.kind.is_some() && examined >= self.kind_filter_budget {
                // Past everything examined: a run's entry all of it (no
                // approval sorts below the nil id), an approval's itself.
                resume_after = found.last().map(|entry| InboxPosition {
                    requested_at: Timestamp::from_millis(entry.requested_at),
                    run_id: entry.run_id,
                    approval_id: entry.approval.unwrap_or_else(|| ApprovalId::from_ulid(ulid::Ulid::nil())),
                });
                break;
            }
        }
        // More may match past where the read stopped.
        let has_more = entries.len() > request.limit as usize || resume_after.is_some();
        // (Stopped early, the page holds every match of what was examined.)
        entries.truncate(request.limit as usize);
        Ok(InboxPage { entries, has_more, resume_after })
    }

    async fn list_views(&self, owner: &Owner, request: ListRequest) -> Result<ViewPage, StoreError> {
        views_of(self.list(owner, request).await?, self.shown)
    }

    /// The run's item alone: clients never see a checkpoint kept apart.
    async fn run_json(&self, owner: &Owner, run_id: RunId) -> Result<Option<std::sync::Arc<str>>, StoreError> {
        let item = self.get_item(run_pk(run_id), RUN_SK.into()).await?;
        owners_run(item, owner)?.map(|(run, _)| run_view_json(&run, self.shown)).transpose()
    }
}

#[async_trait]
impl EventLog for DynamoStore {
    async fn events(&self, run_id: RunId, after: u64, limit: u32) -> Result<EventPage, StoreError> {
        let query = self
            .client
            .query()
            .table_name(&self.table)
            // The run and its checkpoint share the partition: only events.
            .key_condition_expression("pk = :pk AND sk BETWEEN :first AND :last")
            .expression_attribute_values(":pk", s(run_pk(run_id)))
            .expression_attribute_values(":first", s(event_sk(after + 1)))
            .expression_attribute_values(":last", s("EV#~"))
            .consistent_read(true);
        let mut events = self.query_up_to(query, None, limit as usize + 1, |item| decode_event_item(&item)).await?;
        let mut has_more = events.len() > limit as usize;
        events.truncate(limit as usize);
        // A Query is read-committed item by item: it can see part of a
        // transaction being applied, a later event without an earlier one.
        // Only the events that follow on from `after` are answered; the rest
        // are read again (and complete) next time.
        let following_on = following_on(after, &events);
        if following_on < events.len() {
            events.truncate(following_on);
            has_more = true;
        }
        Ok(EventPage { events, has_more })
    }

    async fn event(&self, run_id: RunId, seq: u64) -> Result<Option<StoredEvent>, StoreError> {
        self.get_item(run_pk(run_id), event_sk(seq)).await?.as_ref().map(decode_event_item).transpose()
    }

    fn event_signal(&self, _run_id: RunId) -> Option<tokio::sync::watch::Receiver<u64>> {
        // Another process may write the run: a reader polls.
        None
    }
}

/// The runs of list or thread entries (`sk` = `RUN#<run_id>`), in order.
fn entry_run_ids(entries: &[Item]) -> Result<Vec<RunId>, StoreError> {
    entries
        .iter()
        .map(|entry| {
            text(entry, "sk")?
                .strip_prefix("RUN#")
                .and_then(|id| id.parse().ok())
                .ok_or_else(|| defect("malformed list entry"))
        })
        .collect()
}

/// The most thread entries one filtered request reads.
const THREAD_READS: usize = 1_000;

impl DynamoStore {
    /// A thread's runs, newest first: the entries of its continuations
    /// (read consistently, a page at a time), their runs, and last the
    /// thread's first run, older than all of them; a status filter is
    /// applied to the runs read (a thread is one conversation, not a
    /// tenant's history), at most [`THREAD_READS`] entries a request: a
    /// page that stops there short says where the next one resumes.
    async fn thread_list(&self, owner: &Owner, thread: RunId, request: ListRequest) -> Result<ListPage, StoreError> {
        let fetch = request.limit as usize + 1;
        let page_size = if request.status.is_some() { 100 } else { fetch as i32 };
        let wanted = |run: &Run| request.status.is_none_or(|status| run.status == status);
        let upper = request.before.map_or_else(|| "RUN#~".to_owned(), run_sk);
        let mut runs = Vec::with_capacity(fetch);
        let mut start = None;
        let mut read = 0;
        loop {
            let output = self
                .client
                .query()
                .table_name(&self.table)
                // The partition holds entries only.
                .key_condition_expression("pk = :p AND sk < :upper")
                .expression_attribute_values(":p", s(thread_pk(owner, thread)))
                .expression_attribute_values(":upper", s(&upper))
                .scan_index_forward(false)
                .consistent_read(true)
                .limit(page_size)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(unavailable)?;
            let mut ids = entry_run_ids(output.items())?;
            start = output.last_evaluated_key;
            read += ids.len();
            let examined = ids.last().copied();
            // The first run, with the last page of entries.
            if start.is_none() && request.before.is_none_or(|before| thread < before) {
                ids.push(thread);
            }
            let mut found = self.get_runs(owner, ids.iter().copied()).await?;
            for id in ids {
                // An entry without its run is a create being undone; the
                // first run is one only if it started the thread.
                match found.remove(&id) {
                    Some(run) if wanted(&run) && (id != thread || run.thread.is_none()) => runs.push(run),
                    _ => {}
                }
            }
            if runs.len() >= fetch || start.is_none() {
                break;
            }
            if read >= THREAD_READS {
                runs.truncate(request.limit as usize);
                return Ok(ListPage { runs, has_more: true, resume_after: examined });
            }
        }
        let has_more = runs.len() > request.limit as usize;
        runs.truncate(request.limit as usize);
        Ok(ListPage { runs, has_more, resume_after: None })
    }
}
