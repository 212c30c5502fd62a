//! An event stream as the embedded server sends it, on the SQLite store:
//! it keeps alive, wakes on a commit, ends with its run or when the server
//! shuts down.

use std::sync::Arc;
use std::time::Duration;

use agent_runs_domain::{ExecutionPolicy, Owner, Run, RunId, Timestamp};
use agent_runs_embedded::{Durability, SqliteStore};
use agent_runs_ports::store::RunStore;
use agent_runs_service::api::EventStream;
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

/// With nothing to send the stream sends a comment every 15 s; a
/// commit wakes it at once; it ends after the run's last event.
#[tokio::test(start_paused = true)]
async fn a_stream_keeps_alive_wakes_on_a_commit_and_ends_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("runs.db"), Durability::Process).unwrap());
    let id = RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 1));
    let owner = Owner::parse("acme").unwrap();
    let mut run = Run::new(id, owner, "echo".into(), "hi".into(), Default::default(), &ExecutionPolicy::default());
    store.insert(&mut run, None, 10).await.unwrap();
    let ends_at = Instant::now() + Duration::from_secs(3600);
    let stream = EventStream::new(store.clone(), id, 0, false, ends_at);
    let (close, closing) = watch::channel(false);
    let mut frames = Box::pin(stream.clone().frames(closing.clone()));
    let first = String::from_utf8(frames.next().await.unwrap().to_vec()).unwrap();
    assert!(first.starts_with("id: 1\nevent: run.created\ndata: {"), "{first}");
    let waited = Instant::now();
    assert_eq!(&frames.next().await.unwrap()[..], b": keep-alive\n\n");
    assert!(waited.elapsed() >= Duration::from_secs(15), "the comment comes after 15 s of silence");

    let waiting = tokio::spawn(async move {
        // The paused clock runs on while the write waits for the
        // store's writer thread: keep-alives may come first.
        loop {
            let frame = String::from_utf8(frames.next().await.unwrap().to_vec()).unwrap();
            if frame != ": keep-alive\n\n" {
                return (frame, frames.next().await.is_none());
            }
        }
    });
    tokio::task::yield_now().await;
    run.cancel(Timestamp::from_millis(1_795_303_479_000)).unwrap();
    store.update(&mut run).await.unwrap();
    let (canceled, ended) = waiting.await.unwrap();
    assert!(canceled.starts_with("id: 2\nevent: run.canceled\n"), "{canceled}");
    assert!(ended, "the stream ends after the run's last event");

    // A server shutting down ends the streams that wait.
    let mut other = Run::new(
        RunId::from_ulid(ulid::Ulid::from_parts(1_795_303_478_123, 2)),
        Owner::parse("acme").unwrap(),
        "echo".into(),
        "hi".into(),
        Default::default(),
        &ExecutionPolicy::default(),
    );
    store.insert(&mut other, None, 10).await.unwrap();
    let mut waiting = Box::pin(EventStream::new(store.clone(), other.id, 0, false, ends_at).frames(closing));
    assert!(waiting.next().await.is_some(), "run.created");
    let next = tokio::spawn(async move { waiting.next().await });
    tokio::task::yield_now().await;
    close.send(true).unwrap();
    assert!(next.await.unwrap().is_none());
}
