//! Durable storage of the Raft ledger.
//!
//! - **The log** ([`LogStore`]): entries, the vote, the committed id and the last purged id in
//!   one redb database (`<data-dir>/raft.redb`). Every write is one transaction committed with
//!   an fsync before openraft is told it is done, so a `kill -9` loses nothing acknowledged.
//! - **The state machine** ([`Machine`]): `core::ledger::State` in memory, applied with
//!   `State::apply`. Its durable point is the last snapshot (`<data-dir>/snapshot.json`:
//!   the state, the last applied log id and membership, written to a temporary file, fsync'd
//!   and renamed over the old one). A restarted node loads it and openraft replays the log
//!   after it; the log is purged only up to a snapshot, so nothing committed is lost.
//!
//! Records are the versioned encodings of [`crate::wire`] inside openraft's serde types.

use std::fmt::Debug;
use std::io::{Cursor, Write};
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use dovetail_core::ledger::State;
use openraft::storage::{LogFlushed, RaftLogStorage, RaftStateMachine};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, RaftLogReader, RaftSnapshotBuilder, Snapshot, StorageError,
    StorageIOError, Vote,
};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::lock;
use crate::types::{NodeId, SnapshotMeta, StoredMembership, TypeConfig};
use crate::wire::{WireOutcome, WireState};

type StorageResult<T> = Result<T, StorageError<NodeId>>;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const PURGED: &str = "purged";

/// The database file in a data dir.
pub const LOG_FILE: &str = "raft.redb";
/// The snapshot file in a data dir.
pub const SNAPSHOT_FILE: &str = "snapshot.json";

/// A storage failure, boxed (openraft's error types are large).
type Io<T> = Result<T, Box<AnyError>>;

fn any(e: impl std::error::Error + 'static) -> Box<AnyError> {
    Box::new(AnyError::new(&e))
}

/// The Raft log on disk. Cloning shares the database (a clone is the log reader openraft's
/// replication streams use).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// In memory (simulations): calls run inline, so nothing waits on a thread and tokio's
    /// paused time stays deterministic.
    inline: bool,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`.
    pub fn open(dir: &Path) -> Result<LogStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io { path: dir.to_path_buf(), source: e })?;
        let path = dir.join(LOG_FILE);
        let db =
            Database::create(&path).map_err(|e| StoreError::Database { path: path.clone(), reason: e.to_string() })?;
        let tx = db.begin_write().map_err(|e| StoreError::Database { path: path.clone(), reason: e.to_string() })?;
        {
            tx.open_table(LOG).map_err(|e| StoreError::Database { path: path.clone(), reason: e.to_string() })?;
            tx.open_table(META).map_err(|e| StoreError::Database { path: path.clone(), reason: e.to_string() })?;
        }
        tx.commit().map_err(|e| StoreError::Database { path, reason: e.to_string() })?;
        Ok(LogStore { db: Arc::new(db), inline: false })
    }

    /// A log kept in memory (simulations). A clone shares it: a
    /// node restarted on a clone finds what it wrote, as on disk.
    pub fn in_memory() -> Result<LogStore, StoreError> {
        let path = PathBuf::from("(memory)");
        let failed = |e: &dyn std::fmt::Display| StoreError::Database { path: path.clone(), reason: e.to_string() };
        let db =
            redb::Builder::new().create_with_backend(redb::backends::InMemoryBackend::new()).map_err(|e| failed(&e))?;
        let tx = db.begin_write().map_err(|e| failed(&e))?;
        {
            tx.open_table(LOG).map_err(|e| failed(&e))?;
            tx.open_table(META).map_err(|e| failed(&e))?;
        }
        tx.commit().map_err(|e| failed(&e))?;
        Ok(LogStore { db: Arc::new(db), inline: true })
    }

    /// Runs `f` on the blocking pool (redb reads and writes block; a commit waits for fsync);
    /// a failure becomes the storage error `err` makes of it.
    async fn blocking<T: Send + 'static>(
        &self,
        err: fn(AnyError) -> StorageIOError<NodeId>,
        f: impl FnOnce(&Database) -> Io<T> + Send + 'static,
    ) -> StorageResult<T> {
        if self.inline {
            return f(&self.db).map_err(|e| err(*e).into());
        }
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || f(&db)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(err(*e).into()),
            Err(e) => Err(err(*any(e)).into()),
        }
    }

    fn meta<T: for<'de> Deserialize<'de>>(db: &Database, key: &str) -> Io<Option<T>> {
        let tx = db.begin_read().map_err(any)?;
        let table = tx.open_table(META).map_err(any)?;
        match table.get(key).map_err(any)? {
            Some(v) => Ok(Some(serde_json::from_slice(v.value()).map_err(any)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(db: &Database, key: &str, value: &T) -> Io<()> {
        let bytes = serde_json::to_vec(value).map_err(any)?;
        let tx = db.begin_write().map_err(any)?;
        {
            let mut table = tx.open_table(META).map_err(any)?;
            table.insert(key, bytes.as_slice()).map_err(any)?;
        }
        tx.commit().map_err(any)
    }

    fn last_entry(db: &Database) -> Io<Option<LogId<NodeId>>> {
        let tx = db.begin_read().map_err(any)?;
        let table = tx.open_table(LOG).map_err(any)?;
        match table.last().map_err(any)? {
            Some((_, v)) => {
                let e: Entry<TypeConfig> = serde_json::from_slice(v.value()).map_err(any)?;
                Ok(Some(e.log_id))
            }
            None => Ok(None),
        }
    }
}

fn bounds(range: &impl RangeBounds<u64>) -> (Bound<u64>, Bound<u64>) {
    (range.start_bound().cloned(), range.end_bound().cloned())
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let range = bounds(&range);
        self.blocking(StorageIOError::read_logs, move |db| {
            let tx = db.begin_read().map_err(any)?;
            let table = tx.open_table(LOG).map_err(any)?;
            let mut out = Vec::new();
            for row in table.range::<u64>(range).map_err(any)? {
                let (_, v) = row.map_err(any)?;
                out.push(serde_json::from_slice(v.value()).map_err(any)?);
            }
            Ok(out)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        self.blocking(StorageIOError::read_logs, |db| {
            let purged: Option<LogId<NodeId>> = LogStore::meta(db, PURGED)?;
            let last = LogStore::last_entry(db)?.or(purged);
            Ok(LogState { last_purged_log_id: purged, last_log_id: last })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let vote = *vote;
        self.blocking(StorageIOError::write_vote, move |db| LogStore::put_meta(db, VOTE, &vote)).await
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        self.blocking(StorageIOError::read_vote, |db| LogStore::meta(db, VOTE)).await
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        self.blocking(StorageIOError::write_logs, move |db| LogStore::put_meta(db, COMMITTED, &committed)).await
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        self.blocking(StorageIOError::read_logs, |db| {
            let c: Option<Option<LogId<NodeId>>> = LogStore::meta(db, COMMITTED)?;
            Ok(c.flatten())
        })
        .await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut rows = Vec::new();
        for e in entries {
            let bytes = serde_json::to_vec(&e).map_err(|err| StorageIOError::write_log_entry(e.log_id, *any(err)))?;
            rows.push((e.log_id.index, bytes));
        }
        let written = self
            .blocking(StorageIOError::write_logs, move |db| {
                let tx = db.begin_write().map_err(any)?;
                {
                    let mut table = tx.open_table(LOG).map_err(any)?;
                    for (index, bytes) in &rows {
                        table.insert(*index, bytes.as_slice()).map_err(any)?;
                    }
                }
                tx.commit().map_err(any)
            })
            .await;
        // openraft counts an entry as persisted only once told so: after the fsync'd commit.
        match &written {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        written
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.blocking(StorageIOError::write_logs, move |db| {
            let tx = db.begin_write().map_err(any)?;
            {
                let mut table = tx.open_table(LOG).map_err(any)?;
                table.retain_in(log_id.index.., |_, _| false).map_err(any)?;
            }
            tx.commit().map_err(any)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        self.blocking(StorageIOError::write_logs, move |db| {
            let bytes = serde_json::to_vec(&Some(log_id)).map_err(any)?;
            let tx = db.begin_write().map_err(any)?;
            {
                // The purged id and the removal in one transaction: a crash leaves both or
                // neither.
                let mut meta = tx.open_table(META).map_err(any)?;
                meta.insert(PURGED, bytes.as_slice()).map_err(any)?;
                let mut table = tx.open_table(LOG).map_err(any)?;
                table.retain_in(..=log_id.index, |_, _| false).map_err(any)?;
            }
            tx.commit().map_err(any)
        })
        .await
    }
}

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data dir or a file in it could not be read or made.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The log database could not be opened or set up.
    #[error("opening the raft log {path}: {reason}")]
    Database { path: PathBuf, reason: String },
    /// The snapshot file is not one this version can read.
    #[error("{path}: not a snapshot this version can read: {reason}")]
    Snapshot { path: PathBuf, reason: String },
}

/// A snapshot's metadata with its bytes (the [`SnapshotFile`], encoded).
type StoredSnapshot = (SnapshotMeta, Arc<Vec<u8>>);

/// What a snapshot holds: the state with the log id and membership it includes.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    state: WireState,
}

/// The state machine's data, shared between openraft (which applies) and the ledger seam
/// (which reads).
pub struct Applied {
    /// The ledger's state after the last applied entry.
    pub state: State,
    /// The last entry applied (its state is `state`).
    pub last_applied: Option<LogId<NodeId>>,
    /// The membership as of the last applied membership entry.
    pub membership: StoredMembership,
}

/// The ledger's state machine over `core::ledger::State`.
#[derive(Clone)]
pub struct Machine {
    applied: Arc<Mutex<Applied>>,
    /// The last snapshot, with its bytes (what is sent to a follower that is behind).
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    /// Held while a snapshot is made current (file and memory together).
    persisting: Arc<tokio::sync::Mutex<()>>,
    /// Where the snapshot file is; none for a machine in memory.
    dir: Option<PathBuf>,
    built: Arc<std::sync::atomic::AtomicU64>,
}

impl Machine {
    /// Opens the state machine of `dir`: the last snapshot's state, or an empty one.
    pub fn open(dir: &Path) -> Result<Machine, StoreError> {
        let path = dir.join(SNAPSHOT_FILE);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(StoreError::Io { path, source: e }),
        };
        Machine::from_snapshot(Some(dir.to_path_buf()), &path, bytes)
    }

    /// A state machine in memory (simulations): its snapshots are kept in memory only.
    pub fn in_memory() -> Machine {
        let applied = Applied { state: State::default(), last_applied: None, membership: StoredMembership::default() };
        Machine::with(None, applied, None)
    }

    /// What a restart of this machine finds: its last snapshot (from its file, or from memory
    /// for one in memory), none of what it applied since.
    pub fn restarted(&self) -> Result<Machine, StoreError> {
        match &self.dir {
            Some(dir) => Machine::open(dir),
            None => {
                let bytes = lock(&self.snapshot).as_ref().map(|(_, b)| b.to_vec());
                Machine::from_snapshot(None, Path::new("(memory)"), bytes)
            }
        }
    }

    fn from_snapshot(dir: Option<PathBuf>, path: &Path, bytes: Option<Vec<u8>>) -> Result<Machine, StoreError> {
        let mut applied =
            Applied { state: State::default(), last_applied: None, membership: StoredMembership::default() };
        let mut current = None;
        if let Some(bytes) = bytes {
            let bad =
                |e: &dyn std::fmt::Display| StoreError::Snapshot { path: path.to_path_buf(), reason: e.to_string() };
            let file: SnapshotFile = serde_json::from_slice(&bytes).map_err(|e| bad(&e))?;
            applied.state = file.state.decode().map_err(|e| bad(&e))?;
            applied.last_applied = file.meta.last_log_id;
            applied.membership = file.meta.last_membership.clone();
            current = Some((file.meta, Arc::new(bytes)));
        }
        Ok(Machine::with(dir, applied, current))
    }

    fn with(dir: Option<PathBuf>, applied: Applied, current: Option<StoredSnapshot>) -> Machine {
        Machine {
            applied: Arc::new(Mutex::new(applied)),
            snapshot: Arc::new(Mutex::new(current)),
            persisting: Arc::new(tokio::sync::Mutex::new(())),
            dir,
            built: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    /// Runs `f` on the applied state.
    pub fn read<R>(&self, f: impl FnOnce(&Applied) -> R) -> R {
        f(&lock(&self.applied))
    }

    /// Writes `bytes` as the snapshot file: a temporary file, fsync'd, renamed over the old
    /// one, and the directory fsync'd, so a crash leaves the old snapshot or the new one.
    fn persist(dir: &Path, id: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = dir.join(format!("{SNAPSHOT_FILE}.{id}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(dir)?.sync_all()
    }

    /// Makes `meta`'s snapshot the current one, on disk and in memory, unless the current one
    /// is newer (a build that finished after an install of a later snapshot): one at a time,
    /// so the file and the memory always hold the same, newest snapshot. Returns whether it
    /// did.
    async fn keep(&self, meta: &SnapshotMeta, bytes: Arc<Vec<u8>>) -> Result<bool, AnyError> {
        let _one = self.persisting.lock().await;
        let newer = lock(&self.snapshot).as_ref().is_some_and(|(m, _)| m.last_log_id > meta.last_log_id);
        if newer {
            return Ok(false);
        }
        if let Some(dir) = self.dir.clone() {
            let (id, data) = (meta.snapshot_id.clone(), bytes.clone());
            match tokio::task::spawn_blocking(move || Machine::persist(&dir, &id, &data)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(*any(e)),
                Err(e) => return Err(*any(e)),
            }
        }
        *lock(&self.snapshot) = Some((meta.clone(), bytes));
        Ok(true)
    }
}

impl RaftSnapshotBuilder<TypeConfig> for Machine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let (state, last_applied, membership) = {
            let a = lock(&self.applied);
            (a.state.clone(), a.last_applied, a.membership.clone())
        };
        let n = self.built.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let snapshot_id = match last_applied {
            Some(id) => format!("{}-{}-{n}", id.leader_id, id.index),
            None => format!("none-{n}"),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership: membership, snapshot_id };
        // Encoded off the Raft thread: a ledger of 10,000 claims takes tens of milliseconds to
        // write, and the heartbeats (and the leader's lease) wait on that thread. The three
        // control nodes of a loadtest share it, so their snapshots, due at the same index,
        // came one after another and a lease lapsed (`ha-churn`).
        let file_meta = meta.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            serde_json::to_vec(&SnapshotFile { meta: file_meta, state: WireState::encode(state) })
        })
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, *any(e)))?
        .map_err(|e| StorageIOError::write_snapshot(None, *any(e)))?;
        let bytes = Arc::new(bytes);
        let kept = self.keep(&meta, bytes.clone()).await.map_err(|e| StorageIOError::write_snapshot(None, e))?;
        if !kept {
            tracing::debug!(snapshot = %meta.snapshot_id, "ledger.snapshot: a newer one was installed meanwhile");
        }
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes.to_vec())) })
    }
}

impl RaftStateMachine<TypeConfig> for Machine {
    type SnapshotBuilder = Machine;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership)> {
        let a = lock(&self.applied);
        Ok((a.last_applied, a.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<WireOutcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut out = Vec::new();
        let mut a = lock(&self.applied);
        for e in entries {
            let outcome = match e.payload {
                EntryPayload::Blank => dovetail_core::ledger::Outcome::Done,
                EntryPayload::Normal(wire) => match wire.decode() {
                    Ok(entry) => a.state.apply(&entry),
                    // An entry this version cannot read stops the node: skipping it would leave
                    // its state different from the nodes that can (a mixed-version group).
                    Err(err) => return Err(StorageIOError::apply(e.log_id, *any(err)).into()),
                },
                EntryPayload::Membership(m) => {
                    a.membership = StoredMembership::new(Some(e.log_id), m);
                    dovetail_core::ledger::Outcome::Done
                }
            };
            a.last_applied = Some(e.log_id);
            out.push(WireOutcome::encode(&outcome));
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<Cursor<Vec<u8>>>) -> StorageResult<()> {
        let bytes = snapshot.into_inner();
        let file: SnapshotFile = serde_json::from_slice(&bytes)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), *any(e)))?;
        let state = file.state.decode().map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), *any(e)))?;
        // The file carries the meta openraft gave: what a restart loads is what was installed.
        let file = SnapshotFile { meta: meta.clone(), state: file.state };
        let bytes =
            serde_json::to_vec(&file).map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), *any(e)))?;
        self.keep(meta, Arc::new(bytes))
            .await
            .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), e))?;
        let mut a = lock(&self.applied);
        a.state = state;
        a.last_applied = meta.last_log_id;
        a.membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        Ok(lock(&self.snapshot)
            .as_ref()
            .map(|(meta, bytes)| Snapshot { meta: meta.clone(), snapshot: Box::new(Cursor::new(bytes.to_vec())) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireEntry;
    use dovetail_core::ledger::{Command, Entry as LedgerEntry};
    use dovetail_core::resources::ResourceList;
    use openraft::storage::RaftLogStorageExt;
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, Membership};
    use std::collections::{BTreeMap, BTreeSet};

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, Machine, tempfile::TempDir> for Builder {
        async fn build(&self) -> StorageResult<(tempfile::TempDir, LogStore, Machine)> {
            let dir = tempfile::tempdir().map_err(|e| StorageIOError::write_logs(*any(e)))?;
            let log = LogStore::open(dir.path()).map_err(|e| StorageIOError::write_logs(*any(e)))?;
            let sm = Machine::open(dir.path()).map_err(|e| StorageIOError::read_state_machine(*any(e)))?;
            Ok((dir, log, sm))
        }
    }

    struct InMemory;

    impl StoreBuilder<TypeConfig, LogStore, Machine> for InMemory {
        async fn build(&self) -> StorageResult<((), LogStore, Machine)> {
            let log = LogStore::in_memory().map_err(|e| StorageIOError::write_logs(*any(e)))?;
            Ok(((), log, Machine::in_memory()))
        }
    }

    /// openraft's own storage test suite, on disk and in memory.
    #[test]
    fn the_stores_pass_openrafts_storage_suite() {
        if let Err(e) = Suite::test_all(Builder) {
            panic!("openraft's storage suite on disk: {e}");
        }
        if let Err(e) = Suite::test_all(InMemory) {
            panic!("openraft's storage suite in memory: {e}");
        }
    }

    /// A machine in memory restarts from its last snapshot, as one on disk does from its file.
    #[tokio::test]
    async fn a_machine_in_memory_restarts_from_its_last_snapshot_only() {
        let mut sm = Machine::in_memory();
        let entries = commands();
        sm.apply(entries[..10].to_vec()).await.expect("applied");
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("snapshot");
        let at_snapshot = sm.read(|a| a.state.clone());
        sm.apply(entries[10..].to_vec()).await.expect("applied");
        let mut back = sm.restarted().expect("restarted");
        assert_eq!(back.read(|a| a.state.clone()), at_snapshot);
        assert_eq!(back.applied_state().await.expect("applied").0, snap.meta.last_log_id);
        assert_ne!(
            back.read(|a| a.state.clone()),
            sm.read(|a| a.state.clone()),
            "what came after is replayed from the log"
        );
    }

    fn log_id(term: u64, index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn normal(term: u64, index: u64, command: Command) -> Entry<TypeConfig> {
        let e = LedgerEntry { term, at: 1_000 + index, command };
        Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(WireEntry::encode(&e)) }
    }

    fn membership(index: u64) -> Entry<TypeConfig> {
        let nodes: BTreeMap<NodeId, openraft::BasicNode> =
            (1..=3).map(|i| (i, openraft::BasicNode::new(format!("127.0.0.1:{}", 7000 + i)))).collect();
        let m = Membership::new(vec![(1..=3).collect::<BTreeSet<NodeId>>()], nodes);
        Entry { log_id: log_id(1, index), payload: EntryPayload::Membership(m) }
    }

    fn commands() -> Vec<Entry<TypeConfig>> {
        let mut entries = vec![membership(1), normal(1, 2, Command::Lead)];
        for i in 3..40 {
            let limits = ResourceList::cpu_mem(1000 * i as i64, 1 << 30);
            entries.push(normal(1, i, Command::SetPool { pool: format!("pool-{}", i % 5), limits }));
        }
        entries
    }

    async fn append(log: &mut LogStore, entries: Vec<Entry<TypeConfig>>) {
        log.blocking_append(entries).await.expect("appended and flushed");
    }

    /// What was appended, voted and applied survives closing the files (a `kill -9` after the
    /// calls returned): the log and vote as written, the state from the snapshot plus the log
    /// after it, equal to the state before.
    #[tokio::test]
    async fn a_reopened_store_has_every_entry_the_vote_and_the_state_replayed_from_its_snapshot() {
        let dir = tempfile::tempdir().expect("temp dir");
        let entries = commands();
        let (before, snapshot_at) = {
            let mut log = LogStore::open(dir.path()).expect("log");
            let mut sm = Machine::open(dir.path()).expect("machine");
            append(&mut log, entries.clone()).await;
            let vote = Vote::new_committed(1, 1);
            log.save_vote(&vote).await.expect("vote");
            log.save_committed(Some(log_id(1, 39))).await.expect("committed");
            // Apply the first 20, snapshot, apply the rest; purge up to the snapshot.
            let outcomes = sm.apply(entries[..20].to_vec()).await.expect("applied");
            assert_eq!(outcomes.len(), 20);
            let snap = sm.get_snapshot_builder().await.build_snapshot().await.expect("snapshot");
            assert_eq!(snap.meta.last_log_id, Some(log_id(1, 20)));
            sm.apply(entries[20..].to_vec()).await.expect("applied");
            log.purge(log_id(1, 20)).await.expect("purged");
            (sm.read(|a| a.state.clone()), snap.meta.last_log_id)
        };
        let mut log = LogStore::open(dir.path()).expect("log reopened");
        let mut sm = Machine::open(dir.path()).expect("machine reopened");
        assert_eq!(log.read_vote().await.expect("vote"), Some(Vote::new_committed(1, 1)));
        assert_eq!(log.read_committed().await.expect("committed"), Some(log_id(1, 39)));
        let state = log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 20)));
        assert_eq!(state.last_log_id, Some(log_id(1, 39)));
        let kept = log.try_get_log_entries(21..40).await.expect("entries");
        assert_eq!(kept, entries[20..].to_vec());
        assert!(log.try_get_log_entries(1..21).await.expect("entries").is_empty(), "purged");
        let (applied, m) = sm.applied_state().await.expect("applied state");
        assert_eq!(applied, snapshot_at);
        assert_eq!(m.membership().voter_ids().collect::<Vec<_>>(), vec![1, 2, 3]);
        // openraft replays the log after the snapshot: the state is what it was.
        sm.apply(kept).await.expect("replayed");
        assert_eq!(sm.read(|a| a.state.clone()), before);
        assert_eq!(before.pools().len(), 5);
    }

    /// A snapshot sent to a follower installs there, replaces its state, and is what a
    /// restart of that follower loads; an older snapshot made current afterwards replaces
    /// nothing; an entry this version cannot read stops the node and changes nothing.
    #[tokio::test]
    async fn an_installed_snapshot_replaces_the_state_and_survives_a_restart() {
        let (leader_dir, follower_dir) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
        let mut leader = Machine::open(leader_dir.path()).expect("machine");
        leader.apply(commands()).await.expect("applied");
        let snap = leader.get_snapshot_builder().await.build_snapshot().await.expect("snapshot");
        let mut follower = Machine::open(follower_dir.path()).expect("machine");
        follower
            .apply(vec![
                membership(1),
                normal(1, 2, Command::SetPool { pool: "stale".into(), limits: ResourceList::new() }),
            ])
            .await
            .expect("applied");
        let mut data = follower.begin_receiving_snapshot().await.expect("receiving");
        data.get_mut().extend_from_slice(snap.snapshot.get_ref());
        follower.install_snapshot(&snap.meta, data).await.expect("installed");
        let want = leader.read(|a| a.state.clone());
        assert_eq!(follower.read(|a| a.state.clone()), want);
        assert!(want.pool("stale").is_none());
        let current = follower.get_current_snapshot().await.expect("current").expect("a snapshot");
        assert_eq!(current.meta, snap.meta);
        // A build of an older state that finishes after the install replaces nothing.
        let older_dir = tempfile::tempdir().expect("dir");
        let mut older = Machine::open(older_dir.path()).expect("machine");
        older.apply(commands()[..5].to_vec()).await.expect("applied");
        let old = older.get_snapshot_builder().await.build_snapshot().await.expect("snapshot");
        let kept = follower.keep(&old.meta, Arc::new(old.snapshot.into_inner())).await.expect("kept");
        assert!(!kept, "an older snapshot does not replace a newer one");
        let current = follower.get_current_snapshot().await.expect("current").expect("a snapshot");
        assert_eq!(current.meta, snap.meta);
        drop(follower);
        let mut restarted = Machine::open(follower_dir.path()).expect("reopened");
        assert_eq!(restarted.read(|a| a.state.clone()), want);
        assert_eq!(restarted.applied_state().await.expect("applied").0, snap.meta.last_log_id);
        // A corrupt snapshot file is an error naming the file, not an empty ledger.
        std::fs::write(follower_dir.path().join(SNAPSHOT_FILE), b"{\"meta\": 1}").expect("written");
        match Machine::open(follower_dir.path()) {
            Err(e @ StoreError::Snapshot { .. }) => assert!(e.to_string().contains(SNAPSHOT_FILE), "{e}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a corrupt snapshot opened"),
        }
        let bad = serde_json::json!({"v1": {"term": 1, "at": 5, "command": {"mark_unavailable": {
            "offerings": [{"instance_type": "m5.large", "zone": "z", "capacity_type": "borrowed"}], "until": 9}}}});
        let bad: WireEntry = serde_json::from_value(bad).expect("well-formed");
        let before = leader.read(|a| (a.state.clone(), a.last_applied));
        let entry = Entry { log_id: log_id(1, 40), payload: EntryPayload::Normal(bad) };
        match leader.apply(vec![entry]).await {
            Err(e) => assert!(e.to_string().contains("borrowed"), "{e}"),
            Ok(out) => panic!("an undecodable entry applied: {out:?}"),
        }
        assert_eq!(leader.read(|a| (a.state.clone(), a.last_applied)), before, "nothing changed");
    }
}
