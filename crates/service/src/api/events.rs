//! `GET /v1/agent/runs/{run_id}/events`: a run's log a page at a time,
//! held open until something new is logged (`wait`), or, where the server
//! can stream, as Server-Sent Events.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use tokio::sync::watch;
use tokio::time::Instant;

use serde_json::{Value, json};

use super::holds::{Hold, KeyCheck};
use super::openapi::{Parts, operation};
use super::query::{page_size, parameters, whole_number};
use super::response::json_response;
use super::routes::{Handler, Operation, Route};
use super::{Api, ApiError, ApiResponse, parse_run_id};
use agent_runs_domain::{Owner, RunId, RunStatus, Scope};
use agent_runs_ports::store::{EventLog, EventPage, StoredEvent};
use agent_runs_ports::views::{EventPageView, EventView, ExtraFields};

// Named from here, beside this endpoint's other limits, by the API's
// re-exports and the OpenAPI document.
pub use super::holds::MAX_WAIT_SECS;

pub const DEFAULT_LIMIT: u32 = 100;
pub const MAX_LIMIT: u32 = 1_000;
const PARAMETERS: [&str; 3] = ["after", "limit", "wait"];
/// A stream sends a comment this often when nothing else, so proxies and
/// clients know it is alive.
pub const HEARTBEAT: Duration = Duration::from_secs(15);
/// Events a stream reads at a time: what it holds for a slow client.
const STREAM_PAGE: u32 = 100;
/// Waiting where the store cannot signal new events: re-read after this,
/// doubling up to [`POLL_MAX`].
const POLL_MIN: Duration = Duration::from_millis(100);
const POLL_MAX: Duration = Duration::from_secs(1);

/// Set on a request by a server that can stream a response (the embedded
/// one): `Accept: text/event-stream` is then answered with a stream. (The
/// server sets it only on requests that ask for one, sparing the others an
/// allocation.)
#[derive(Debug, Clone, Copy)]
pub struct CanStream;

/// On a response: the server streams the run's events, from `after` on, as
/// its body (see [`EventStream::frames`]).
#[derive(Clone)]
pub struct EventStream {
    log: Arc<dyn EventLog>,
    run_id: RunId,
    after: u64,
    /// The run had ended when the stream began: its log is complete.
    ended: bool,
    /// The stream ends then; the client resumes with its Last-Event-ID.
    ends_at: Instant,
    /// The stream ends when its key no longer stands.
    key: Option<KeyCheck>,
    /// The owner's share of held requests, given back with the stream.
    _hold: Option<Arc<Hold>>,
    shown: ExtraFields,
}

struct EventsQuery {
    after: Option<u64>,
    limit: u32,
    wait: Duration,
}

fn parse_query(query: Option<&str>) -> Result<EventsQuery, ApiError> {
    let [after, limit, wait] = parameters(query, PARAMETERS)?;
    let after = after
        .map(|text| {
            whole_number(&text).ok_or_else(|| {
                ApiError::invalid("after", "`after` must be the `seq` of an event: a whole number from 0.")
            })
        })
        .transpose()?;
    let limit = page_size(limit, DEFAULT_LIMIT, MAX_LIMIT)?;
    let wait = match wait {
        None => 0,
        Some(text) => whole_number(&text).filter(|secs| *secs <= MAX_WAIT_SECS).ok_or_else(|| {
            ApiError::invalid("wait", format!("`wait` must be a whole number of seconds from 0 to {MAX_WAIT_SECS}."))
        })?,
    };
    Ok(EventsQuery { after, limit, wait: Duration::from_secs(wait) })
}

/// Whether the request's `Accept` names `text/event-stream`.
pub fn asks_for_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|media| {
            media.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case("text/event-stream"))
        })
}

fn wants_stream<B>(request: &Request<B>) -> bool {
    request.extensions().get::<CanStream>().is_some() && asks_for_event_stream(request.headers())
}

pub(super) async fn handle(
    api: &Api,
    owner: &Owner,
    run_id: &str,
    request: &Request<Bytes>,
) -> Result<ApiResponse, ApiError> {
    let runs = &api.runs;
    let query = parse_query(request.uri().query())?;
    let run_id = parse_run_id(run_id)?;
    let run = runs.get(owner, run_id).await?.ok_or_else(ApiError::run_not_found)?;
    let stream = wants_stream(request);
    // A client resumes after the last event it saw (an SSE client sends it
    // on reconnecting; it wins over `after`).
    let last_event_id = request
        .headers()
        .get("last-event-id")
        .map(|value| {
            value.to_str().ok().and_then(whole_number).ok_or_else(|| {
                ApiError::invalid("Last-Event-ID", "`Last-Event-ID` must be the `seq` of an event: a whole number.")
            })
        })
        .transpose()?;
    let (after, param) = match (last_event_id, query.after) {
        (Some(after), _) => (after, "Last-Event-ID"),
        (None, after) => (after.unwrap_or(0), "after"),
    };
    if after > run.event_seq + 1 {
        return Err(ApiError::invalid(
            param,
            format!("`{param}` is beyond the end of this run's log, whose last event has `seq` {}.", run.event_seq),
        ));
    }
    let ended = run.status.is_terminal();
    if stream && ended && after >= run.event_seq {
        // Nothing will ever come: 204 tells an EventSource not to reconnect.
        let mut response = http::Response::new(Bytes::new());
        *response.status_mut() = StatusCode::NO_CONTENT;
        return Ok(response);
    }
    if stream {
        let hold = api.holds.take(owner)?;
        let mut response = http::Response::new(Bytes::new());
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        let ends_at = Instant::now() + api.holds.limits().stream_lifetime;
        let mut stream = EventStream::new(runs.clone(), run_id, after, ended, ends_at);
        stream.key = api.key_check(request);
        stream._hold = Some(Arc::new(hold));
        stream.shown = api.shown;
        response.extensions_mut().insert(stream);
        return Ok(response);
    }
    // Held only while the run can still log something, for at most what
    // this deployment allows.
    let wait = if ended { Duration::ZERO } else { query.wait.min(api.holds.limits().max_wait) };
    let deadline = Instant::now() + wait;
    let mut waiting = Waiting::new(runs.as_ref(), run_id);
    // Held (and counted as held) only once there is nothing to answer yet.
    let mut held: Option<(Hold, Option<KeyCheck>)> = None;
    let page = loop {
        waiting.mark_read();
        let page = runs.events(run_id, after, query.limit).await?;
        if !page.events.is_empty() || ended || Instant::now() >= deadline {
            break page;
        }
        if held.is_none() {
            held = Some((api.holds.take(owner)?, api.key_check(request)));
        }
        let mut wake = deadline;
        if let Some(key) = held.as_mut().and_then(|(_, key)| key.as_mut()) {
            if !key.still_valid().await? {
                return Err(ApiError::Unauthorized);
            }
            wake = key.due_at().min(deadline);
        }
        if !waiting.until(wake).await && Instant::now() >= deadline {
            break page;
        }
    };
    Ok(json_response(StatusCode::OK, &page_view(run_id, after, &page, api.shown)?))
}

fn event_view(run_id: RunId, event: &StoredEvent, shown: ExtraFields) -> Result<EventView<'_>, ApiError> {
    let data = event.data_json(shown).map_err(|error| ApiError::Internal(Box::new(error)))?;
    EventView::of(run_id, event.seq, &event.kind, event.at, &data)
        .map_err(|_| ApiError::Internal(format!("event {} of {run_id} has malformed data", event.seq).into()))
}

fn page_view(run_id: RunId, after: u64, page: &EventPage, shown: ExtraFields) -> Result<EventPageView<'_>, ApiError> {
    Ok(EventPageView {
        data: page.events.iter().map(|event| event_view(run_id, event, shown)).collect::<Result<_, _>>()?,
        next_after: page.events.last().map_or(after, |event| event.seq),
        has_more: page.has_more,
    })
}

/// Waiting for a run's next event: woken by the store's signal where it
/// has one, else re-reading ever less often.
struct Waiting {
    signal: Option<watch::Receiver<u64>>,
    poll: Duration,
}

impl Waiting {
    /// Taken before the first read, so no commit after it goes unseen.
    fn new(log: &dyn EventLog, run_id: RunId) -> Self {
        Waiting { signal: log.event_signal(run_id), poll: POLL_MIN }
    }

    /// Called right before each read: what it sees counts as seen.
    fn mark_read(&mut self) {
        if let Some(signal) = &mut self.signal {
            signal.borrow_and_update();
        }
    }

    /// Waits until new events may exist (`true`) or `deadline` (`false`).
    async fn until(&mut self, deadline: Instant) -> bool {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        match &mut self.signal {
            Some(signal) => match tokio::time::timeout_at(deadline, signal.changed()).await {
                Ok(Ok(())) => true,
                Ok(Err(_)) => {
                    // The store let go of the signal: poll from here on.
                    self.signal = None;
                    true
                }
                Err(_) => false,
            },
            None => {
                let wake = (now + self.poll).min(deadline);
                self.poll = (self.poll * 2).min(POLL_MAX);
                tokio::time::sleep_until(wake).await;
                wake < deadline
            }
        }
    }
}

fn frame(run_id: RunId, event: &StoredEvent, shown: ExtraFields) -> Result<Bytes, ApiError> {
    let json = serde_json::to_string(&event_view(run_id, event, shown)?)
        .map_err(|error| ApiError::Internal(Box::new(error)))?;
    Ok(Bytes::from(format!("id: {}\nevent: {}\ndata: {json}\n\n", event.seq, event.kind)))
}

/// Whether an event of this type ends its run's log: `run.<status>` for a
/// terminal status.
fn ends_the_run(kind: &str) -> bool {
    kind.strip_prefix("run.").and_then(RunStatus::parse).is_some_and(RunStatus::is_terminal)
}

impl EventStream {
    /// `run_id`'s events after `after`, until the run's last one or
    /// `ends_at`; `ended`: the run had ended when the stream began. No owner
    /// or key is checked here: the events operation does that first.
    #[doc(hidden)]
    pub fn new(log: Arc<dyn EventLog>, run_id: RunId, after: u64, ended: bool, ends_at: Instant) -> Self {
        EventStream { log, run_id, after, ended, ends_at, key: None, _hold: None, shown: ExtraFields::default() }
    }

    /// The stream's body: a message per event, a comment every
    /// [`HEARTBEAT`] when there is nothing else, ending after the run's
    /// last event. It reads a page only when the client has taken the
    /// last one, so a slow client holds at most a page; a client that goes
    /// away drops the stream, and nothing else waits on it.
    ///
    /// It also ends when `closing` turns true (the server is shutting down),
    /// at its `ends_at`, and when its key no longer stands; the client
    /// reconnects with its Last-Event-ID.
    pub fn frames(self, closing: watch::Receiver<bool>) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
        struct State {
            stream: EventStream,
            waiting: Waiting,
            closing: watch::Receiver<bool>,
            ready: VecDeque<Bytes>,
            done: bool,
            last_sent: Instant,
        }
        let waiting = Waiting::new(self.log.as_ref(), self.run_id);
        let state =
            State { stream: self, waiting, closing, ready: VecDeque::new(), done: false, last_sent: Instant::now() };
        futures_util::stream::unfold(state, |mut state| async move {
            loop {
                if *state.closing.borrow() || Instant::now() >= state.stream.ends_at {
                    return None;
                }
                if let Some(key) = &mut state.stream.key {
                    match key.still_valid().await {
                        Ok(true) => {}
                        Ok(false) => {
                            tracing::info!(run_id = %state.stream.run_id, "event stream ended: its API key no longer stands");
                            return None;
                        }
                        Err(error) => {
                            // The client reconnects, and its key is checked then.
                            tracing::warn!(run_id = %state.stream.run_id, error = %agent_runs_ports::error_chain(&error), "event stream ended: its key could not be checked");
                            return None;
                        }
                    }
                }
                if let Some(frame) = state.ready.pop_front() {
                    state.last_sent = Instant::now();
                    return Some((frame, state));
                }
                if state.done {
                    return None;
                }
                let EventStream { log, run_id, after, ended, shown, .. } = &mut state.stream;
                state.waiting.mark_read();
                let page = match log.events(*run_id, *after, STREAM_PAGE).await {
                    Ok(page) => page,
                    Err(error) => {
                        // The client reconnects with its Last-Event-ID.
                        tracing::warn!(run_id = %run_id, error = %agent_runs_ports::error_chain(&error), "event stream ended: the store failed");
                        return None;
                    }
                };
                for event in &page.events {
                    match frame(*run_id, event, *shown) {
                        Ok(frame) => state.ready.push_back(frame),
                        Err(error) => {
                            // Never skip one silently: end where it is.
                            tracing::error!(run_id = %run_id, seq = event.seq, error = %agent_runs_ports::error_chain(&error), "event stream ended at an unreadable event");
                            state.done = true;
                            break;
                        }
                    }
                    *after = event.seq;
                    if ends_the_run(&event.kind) {
                        state.done = true;
                        break;
                    }
                }
                if !page.events.is_empty() {
                    continue;
                }
                if *ended {
                    return None;
                }
                let heartbeat_at = state.last_sent + HEARTBEAT;
                // Woken for the key's next check and the stream's end too.
                let key_due = state.stream.key.as_ref().map_or(heartbeat_at, KeyCheck::due_at);
                let wake = heartbeat_at.min(key_due).min(state.stream.ends_at);
                let mut closing = state.closing.clone();
                tokio::select! {
                    woken = state.waiting.until(wake) => {
                        if !woken && Instant::now() >= heartbeat_at {
                            state.ready.push_back(Bytes::from_static(b": keep-alive\n\n"));
                        }
                    }
                    _ = closing.wait_for(|closing| *closing) => return None,
                }
            }
        })
    }
}

pub(super) const ROUTE: Route = Route {
    operation: Operation::Events,
    method: Method::GET,
    path: "/v1/agent/runs/{run_id}/events",
    operation_id: "listRunEvents",
    function: "events",
    handler: Handler::Keyed {
        scope: Scope::RunsRead,
        handle: |api, call| Box::pin(handle(api, call.owner(), call.param("run_id"), call.request)),
    },
    describe: Some(describe),
};

fn describe(route: &Route, parts: &Parts<'_>) -> Value {
    let Parts { run_id, not_found, .. } = parts;
    operation(
        route.operation_id,
        "List a run's events, oldest first; wait for new ones",
        json!([
            run_id,
            {"name": "after", "in": "query", "required": false, "description": "Only events with a higher seq; at most one past the run's last seq. Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 0}, {"const": ""}], "default": 0}},
            {"name": "limit", "in": "query", "required": false, "description": "Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}, {"const": ""}], "default": DEFAULT_LIMIT}},
            {"name": "wait", "in": "query", "required": false, "description": "Seconds to hold the request while nothing newer than `after` exists. Empty is the same as absent.", "schema": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_WAIT_SECS}, {"const": ""}], "default": 0}},
            {"name": "Last-Event-ID", "in": "header", "required": false, "description": "Resume after this seq, as an SSE client does on reconnecting; it wins over `after`.", "schema": {"type": "string", "pattern": "^[0-9]+$"}}
        ]),
        None,
        json!({
            "200": {
                "description": "A page of events; with Accept: text/event-stream on the embedded server, a stream of them (`id: <seq>`, `event: <type>`, `data: <event>`, a comment every 15 s, closed after the run's last event).",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}},
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/EventList"}},
                    "text/event-stream": {"schema": {"type": "string"}}
                }
            },
            "204": {
                "description": "With Accept: text/event-stream: the run has ended and its last event was seen; nothing will come (an EventSource stops reconnecting).",
                "headers": {"x-request-id": {"$ref": "#/components/headers/RequestId"}}
            },
            "404": not_found
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_rules() {
        let parsed = parse_query(Some("after=3&limit=1000&wait=20")).unwrap();
        assert_eq!((parsed.after, parsed.limit, parsed.wait), (Some(3), 1000, Duration::from_secs(20)));
        let defaults = parse_query(Some("after=&limit=&wait=")).unwrap();
        assert_eq!((defaults.after, defaults.limit, defaults.wait), (None, DEFAULT_LIMIT, Duration::ZERO));
        for bad in [
            "after=-1",
            "after=x",
            "after=1.5",
            "limit=0",
            "limit=1001",
            "wait=21",
            "wait=-1",
            "foo=1",
            "after=1&after=2",
        ] {
            assert!(parse_query(Some(bad)).is_err(), "{bad}");
        }
    }
}
