//! Group commit: one thread owns the write connection and commits every
//! write waiting for it in one transaction, then answers them all.
//!
//! SQLite has one writer at a time; with one transaction per write, each
//! write paid a commit (the WAL append of every page it touched, and with
//! `synchronous=FULL` an fsync) and a hand-off to a blocking thread. Writes
//! that arrive while a group is being written form the next group, so a
//! lone write waits for nothing, and under load the pages that every
//! create touches (the newest leaf of each index, the owner's count) are
//! appended to the WAL once per group. Each write runs in a savepoint of
//! its own: one whose condition fails is rolled back alone. A write is
//! answered only after its group committed, so an answer still means it
//! is durable.
//!
//! Checkpoints (copying the WAL's pages back into the database file, each
//! with an fsync) are not the writer's: SQLite's own runs inside the commit
//! that crossed its threshold and held every write behind it for the
//! fsync's time (a fifth of the writer's time under creates). A thread of
//! its own checkpoints once the WAL holds [`CHECKPOINT_AFTER_PAGES`]; the
//! writer checkpoints only past [`WRITER_CHECKPOINTS_PAST_PAGES`], between
//! groups, because the WAL starts over from its beginning only at a write
//! that finds every frame copied back, which a checkpoint racing a steady
//! stream of groups never leaves: the WAL's size stays bounded.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, mpsc};

use rusqlite::Connection;
use tokio::sync::oneshot;

use agent_runs_ports::store::StoreError;

/// The most writes committed together.
const MAX_GROUP: usize = 256;

/// SQLite's own threshold (`wal_autocheckpoint`'s default).
const CHECKPOINT_AFTER_PAGES: i32 = 1000;
/// About 8 MB of WAL with 4 KiB pages. Each checkpoint the writer runs
/// holds up the writes behind it; at 10,000 pages the create p99 rose by a
/// third (docs/benchmarks.md).
const WRITER_CHECKPOINTS_PAST_PAGES: i32 = 2 * CHECKPOINT_AFTER_PAGES;

thread_local! {
    /// The WAL's pages after the last commit on this thread (the writer's).
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

fn checkpoint(connection: &Connection) {
    // PASSIVE: copies what no reader still needs, never waits for anyone.
    if let Err(error) = connection.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %agent_runs_ports::error_chain(&error), "a checkpoint of the WAL failed");
    }
}

/// The checkpoint thread, as the writer sees it.
struct Checkpoints {
    wake: Option<mpsc::SyncSender<()>>,
    /// Held by whoever checkpoints: the writer past its threshold waits for
    /// the thread's checkpoint rather than be refused as busy and go on
    /// growing the WAL.
    running: Arc<Mutex<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The WAL's pages when a checkpoint was last asked for: one is asked
    /// for each CHECKPOINT_AFTER_PAGES more, as SQLite's own would run
    /// (more often copies the pages every group changes more often).
    asked_at: i32,
}

impl Checkpoints {
    fn start(connection: Connection) -> std::io::Result<Checkpoints> {
        let (wake, woken) = mpsc::sync_channel::<()>(1);
        let running = Arc::new(Mutex::new(()));
        let held = running.clone();
        let thread = std::thread::Builder::new().name("sqlite-checkpoint".into()).spawn(move || {
            while woken.recv().is_ok() {
                let _running = agent_runs_ports::lock(&held);
                checkpoint(&connection);
            }
        })?;
        Ok(Checkpoints { wake: Some(wake), running, thread: Some(thread), asked_at: 0 })
    }

    /// After a commit that left the WAL with `pages`.
    fn committed(&mut self, writer: &Connection, pages: i32) {
        if pages < self.asked_at {
            // The WAL started over.
            self.asked_at = 0;
        }
        if pages >= WRITER_CHECKPOINTS_PAST_PAGES {
            let _running = agent_runs_ports::lock(&self.running);
            checkpoint(writer);
        } else if pages - self.asked_at >= CHECKPOINT_AFTER_PAGES {
            match self.wake.as_ref().map(|wake| wake.try_send(())) {
                Some(Err(mpsc::TrySendError::Full(()))) => {}
                Some(Ok(())) => self.asked_at = pages,
                // The thread is gone: the writer checkpoints as SQLite would.
                Some(Err(mpsc::TrySendError::Disconnected(()))) | None => {
                    checkpoint(writer);
                    self.asked_at = pages;
                }
            }
        }
    }
}

impl Drop for Checkpoints {
    /// Ends the thread (its checkpoint in flight done) before the writer's
    /// connection closes.
    fn drop(&mut self) {
        self.wake.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What a write does once its group committed, in commit order (cache
/// updates, wake-ups): never for a write that was not committed.
#[derive(Default)]
pub(super) struct Committed(Vec<Box<dyn FnOnce() + Send>>);

impl Committed {
    pub(super) fn then(&mut self, effect: impl FnOnce() + Send + 'static) {
        self.0.push(Box::new(effect));
    }
}

trait Job: Send {
    /// Runs the write in the group's transaction: `true` when it succeeded
    /// and its changes are to be kept.
    fn run(&mut self, connection: &Connection) -> bool;
    /// Settles the write's outcome once the group's commit is known: a
    /// committed write's effects run here.
    fn settle(&mut self, group: Result<(), &rusqlite::Error>);
    /// Answers the caller, after every write of the group is settled (so
    /// no caller can read a later write of its group before its effects).
    fn answer(self: Box<Self>);
}

struct Write<T, F> {
    work: Option<F>,
    outcome: Option<Result<T, StoreError>>,
    committed: Committed,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<T, F> Job for Write<T, F>
where
    T: Send,
    F: FnOnce(&Connection, &mut Committed) -> Result<T, StoreError> + Send,
{
    fn run(&mut self, connection: &Connection) -> bool {
        let Some(work) = self.work.take() else {
            return false;
        };
        let committed = &mut self.committed;
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| work(connection, committed)))
            .unwrap_or_else(|_| Err(StoreError::Defect("a store write panicked".into())));
        let succeeded = outcome.is_ok();
        self.outcome = Some(outcome);
        succeeded
    }

    fn settle(&mut self, group: Result<(), &rusqlite::Error>) {
        let outcome = match (self.outcome.take(), group) {
            (Some(Ok(value)), Ok(())) => {
                for effect in std::mem::take(&mut self.committed.0) {
                    // The write is committed whatever an effect does: it is
                    // answered, and the thread goes on.
                    if std::panic::catch_unwind(AssertUnwindSafe(effect)).is_err() {
                        tracing::error!("an effect of a committed write panicked");
                    }
                }
                Ok(value)
            }
            (Some(Err(error)), Ok(())) => Err(error),
            // Not committed, whatever the write found: what it found may
            // have rested on a write of its group that was rolled back too.
            (_, Err(error)) => Err(StoreError::Unavailable(Box::new(std::io::Error::other(format!(
                "the write's transaction was not committed: {error}"
            ))))),
            (None, Ok(())) => Err(StoreError::Defect("a store write was not run".into())),
        };
        self.outcome = Some(outcome);
    }

    fn answer(self: Box<Self>) {
        let outcome = self.outcome.unwrap_or_else(|| Err(StoreError::Defect("a store write was not settled".into())));
        // The caller may have gone (its request was dropped): the write
        // stands all the same, as it would have after an answer.
        let _ = self.reply.send(outcome);
    }
}

/// The sending end; the thread ends when the last one is dropped.
pub(super) struct Writer {
    jobs: mpsc::Sender<Box<dyn Job>>,
}

fn stopped() -> StoreError {
    StoreError::Defect("the store's writer stopped".into())
}

impl Writer {
    /// Starts the writer on `connection` and the checkpoints on
    /// `checkpoints` (another connection to the same file).
    pub(super) fn start(connection: Connection, checkpoints: Connection) -> std::io::Result<Writer> {
        // Replaces SQLite's automatic checkpoints (themselves a WAL hook).
        connection.wal_hook(Some(note_wal_pages));
        let checkpoints = Checkpoints::start(checkpoints)?;
        let (jobs, queue) = mpsc::channel();
        std::thread::Builder::new().name("sqlite-writer".into()).spawn(move || {
            write_groups(&connection, queue, checkpoints);
            drop(connection);
        })?;
        Ok(Writer { jobs })
    }

    /// Runs `work` in a transaction (shared with the writes waiting beside
    /// it) and answers once it is committed; `work` leaves in `Committed`
    /// what to do then.
    pub(super) async fn write<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &mut Committed) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Write { work: Some(work), outcome: None, committed: Committed::default(), reply };
        self.jobs.send(Box::new(job)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

fn write_groups(connection: &Connection, queue: mpsc::Receiver<Box<dyn Job>>, mut checkpoints: Checkpoints) {
    while let Ok(first) = queue.recv() {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match queue.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let written = write_group(connection, &mut group);
        if let Err(error) = &written {
            tracing::error!(error = %agent_runs_ports::error_chain(error), writes = group.len(), "a group of writes was not committed");
            if !connection.is_autocommit() {
                let _ = connection.execute_batch("ROLLBACK");
            }
        }
        for job in &mut group {
            job.settle(written.as_ref().map(|_| ()));
        }
        for job in group {
            job.answer();
        }
        checkpoints.committed(connection, WAL_PAGES.get());
    }
}

/// Runs the group's writes in one transaction and commits it. Any failure
/// of the transaction itself fails the whole group: some errors (a full
/// disk, an I/O error) make SQLite roll the transaction back at once, and
/// the writes after would otherwise each commit on their own.
fn write_group(connection: &Connection, group: &mut [Box<dyn Job>]) -> Result<(), rusqlite::Error> {
    connection.execute_batch("BEGIN IMMEDIATE")?;
    for job in group {
        connection.execute_batch("SAVEPOINT write")?;
        let kept = job.run(connection);
        // Writes never end the transaction themselves; SQLite does, on some
        // errors, and takes the savepoint with it.
        if connection.is_autocommit() {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                Some("the group's transaction ended under a write".into()),
            ));
        }
        connection.execute_batch(if kept { "RELEASE write" } else { "ROLLBACK TO write; RELEASE write" })?;
    }
    connection.execute_batch("COMMIT")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unavailable;

    fn writer() -> (tempfile::TempDir, Writer, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let connection = Connection::open(&path).unwrap();
        connection.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)").unwrap();
        let reader = Connection::open(&path).unwrap();
        (dir, Writer::start(connection, Connection::open(&path).unwrap()).unwrap(), reader)
    }

    fn insert(k: String) -> impl FnOnce(&Connection, &mut Committed) -> Result<(), StoreError> + Send {
        move |connection, _| {
            connection.execute("INSERT INTO t (k, v) VALUES (?1, 1)", [k]).map_err(unavailable)?;
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failed_write_is_rolled_back_alone_and_the_others_of_its_group_commit() {
        let (_dir, writer, reader) = writer();
        let writer = std::sync::Arc::new(writer);
        let mut writes = Vec::new();
        for i in 0..200 {
            let writer = writer.clone();
            writes.push(tokio::spawn(async move {
                if i % 10 == 3 {
                    // Writes a row, then fails: the row must not stay.
                    writer
                        .write(move |connection, _| {
                            connection
                                .execute("INSERT INTO t (k, v) VALUES (?1, 2)", [format!("bad{i}")])
                                .map_err(unavailable)?;
                            Err::<(), _>(StoreError::Conflict)
                        })
                        .await
                } else {
                    writer.write(insert(format!("good{i}"))).await
                }
            }));
        }
        let (mut failed, mut succeeded) = (0, 0);
        for write in writes {
            match write.await.unwrap() {
                Ok(()) => succeeded += 1,
                Err(StoreError::Conflict) => failed += 1,
                Err(other) => panic!("{other}"),
            }
        }
        assert_eq!((succeeded, failed), (180, 20));
        let rows: i64 = reader.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0)).unwrap();
        let bad: i64 = reader.query_row("SELECT COUNT(*) FROM t WHERE k LIKE 'bad%'", [], |row| row.get(0)).unwrap();
        assert_eq!((rows, bad), (180, 0), "every answered write is committed, no failed one is");
    }

    #[tokio::test]
    async fn effects_run_after_the_commit_and_a_panicking_write_is_an_error() {
        let (_dir, writer, reader) = writer();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let effect_saw = seen.clone();
        let reader = std::sync::Arc::new(std::sync::Mutex::new(reader));
        let reading = reader.clone();
        writer
            .write(move |connection, committed| {
                connection.execute("INSERT INTO t (k, v) VALUES ('a', 1)", []).map_err(unavailable)?;
                committed.then(move || {
                    let count: i64 =
                        reading.lock().unwrap().query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0)).unwrap();
                    *effect_saw.lock().unwrap() = Some(count);
                });
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), Some(1), "the effect saw the write committed");
        let panicked = writer.write(|_, _| -> Result<(), StoreError> { panic!("boom") }).await;
        assert!(matches!(panicked, Err(StoreError::Defect(_))));
        writer.write(insert("b".into())).await.expect("the writer goes on after a panicking write");
        let effect_panics = writer
            .write(|connection, committed| {
                connection.execute("INSERT INTO t (k, v) VALUES ('c', 1)", []).map_err(unavailable)?;
                committed.then(|| panic!("effect"));
                Ok(())
            })
            .await;
        assert!(effect_panics.is_ok(), "committed, so answered Ok");
        writer.write(insert("d".into())).await.expect("the writer goes on after a panicking effect");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checkpoints_run_beside_the_writer_and_the_wal_stays_bounded_under_steady_writes() {
        let (dir, writer, _reader) = writer();
        let writer = std::sync::Arc::new(writer);
        writer
            .write(|connection, _| {
                connection.execute_batch("CREATE TABLE b (k INTEGER PRIMARY KEY, v BLOB)").map_err(unavailable)
            })
            .await
            .unwrap();
        let (wal, database) = (dir.path().join("w.db-wal"), dir.path().join("w.db"));
        let size = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |metadata| metadata.len());
        // 16 pages a write, from 8 writers at once: groups back to back.
        let write_all = |from: i64, to: i64| {
            let writers: Vec<_> = (0..8)
                .map(|lane| {
                    let writer = writer.clone();
                    tokio::spawn(async move {
                        for k in (from..to).filter(|k| k % 8 == lane) {
                            writer
                                .write(move |connection, _| {
                                    connection
                                        .execute("INSERT INTO b (k, v) VALUES (?1, zeroblob(65536))", [k])
                                        .map_err(unavailable)?;
                                    Ok(())
                                })
                                .await
                                .unwrap();
                        }
                    })
                })
                .collect();
            futures_join(writers)
        };
        // About 1,400 pages: over the checkpoint's threshold, under the writer's.
        write_all(0, 80).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while size(&database) <= 2 << 20 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert!(size(&database) > 2 << 20, "pages were copied into the database file: {} bytes", size(&database));
        // About 48,000 pages more.
        write_all(80, 3080).await;
        // A frame is a page and its 24-byte header; the writer may pass its
        // threshold by the group that crossed it (8 writes of 16 pages and
        // the b-tree pages they change).
        let bound = (WRITER_CHECKPOINTS_PAST_PAGES as u64 + 8 * 20) * (4096 + 24) + 32;
        assert!(size(&wal) <= bound, "the WAL is {} bytes, over {bound}", size(&wal));
    }

    async fn futures_join(tasks: Vec<tokio::task::JoinHandle<()>>) {
        for task in tasks {
            task.await.unwrap();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_whose_transaction_is_gone_answers_every_write_not_committed() {
        let (_dir, writer, reader) = writer();
        let writer = std::sync::Arc::new(writer);
        // A first write holds the thread until the next two are queued, so
        // that those two make one group.
        let (release, held) = mpsc::channel::<()>();
        let holding = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write(move |_, _| Ok(held.recv().ok())).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        // A write that ends the group's transaction under the others (as
        // SQLite does itself on a full disk): the write after it must not
        // commit on its own, and nobody is told Ok.
        let ending = tokio::spawn({
            let writer = writer.clone();
            async move {
                writer
                    .write(|connection, _| {
                        connection.execute("INSERT INTO t (k, v) VALUES ('x', 1)", []).map_err(unavailable)?;
                        connection.execute_batch("ROLLBACK").map_err(unavailable)?;
                        Ok(())
                    })
                    .await
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let after = tokio::spawn({
            let writer = writer.clone();
            async move { writer.write(insert("y".into())).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        release.send(()).unwrap();
        assert!(holding.await.unwrap().is_ok());
        let (ending, after) = (ending.await.unwrap(), after.await.unwrap());
        assert!(matches!(ending, Err(StoreError::Unavailable(_))), "{ending:?}");
        assert!(matches!(after, Err(StoreError::Unavailable(_))), "{after:?}");
        let rows: i64 = reader.query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0)).unwrap();
        assert_eq!(rows, 0, "neither is stored");
        writer.write(insert("z".into())).await.expect("the next group starts afresh");
    }
}
