//! A thread of Raft's own: a current-thread tokio runtime that runs the openraft core, its
//! leadership watch, its HTTP server and the connections it dials, and nothing else.
//!
//! A control node's main runtime also runs every Kubernetes watch and hands out snapshots of
//! what they cache; a burst of pod events there, or a slow lock, delays whatever shares its
//! thread. Heartbeats are due every few tens of milliseconds, and a leader that misses its
//! lease stops acting (and a follower that misses heartbeats starts an election), so Raft gets
//! a thread where nothing else waits. The proposals, reads and leadership watch of
//! [`crate::replicated::RaftLedger`] cross runtimes through channels, so callers on any
//! runtime use it as before.

use std::future::Future;

/// The thread and its runtime; stopped and joined when dropped.
pub struct RaftRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RaftRuntime {
    /// Starts the thread (named `raft`).
    pub fn start() -> std::io::Result<RaftRuntime> {
        // One message: the runtime's handle, or why there is none.
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new().name("raft".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    if tx.send(Err(e)).is_err() {
                        tracing::error!("ledger.runtime: the starter went away before the runtime failed");
                    }
                    return;
                }
            };
            if tx.send(Ok(runtime.handle().clone())).is_err() {
                return;
            }
            // Runs its tasks until stopped (or its owner is gone).
            runtime.block_on(async {
                if stopped.await.is_err() {
                    tracing::debug!("ledger.runtime: its owner went away");
                }
            });
        })?;
        let handle =
            rx.recv().map_err(|_| std::io::Error::other("the raft thread ended before its runtime started"))??;
        Ok(RaftRuntime { handle, stop: Some(stop), thread: Some(thread) })
    }

    /// The runtime's handle (spawn Raft's tasks there).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }

    /// Runs `f` on the Raft thread and waits for its output from wherever the caller runs:
    /// whatever `f` spawns (openraft's core, the server's connections) runs there too.
    pub async fn run<F>(&self, f: F) -> Result<F::Output, String>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.handle.spawn(f).await.map_err(|e| format!("the raft thread's task failed: {e}"))
    }
}

impl Drop for RaftRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take()
            && stop.send(()).is_err()
        {
            tracing::debug!("ledger.runtime: stopped already");
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("ledger.runtime: the raft thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What runs there runs on the `raft` thread, even when the caller's own thread is busy:
    /// a heartbeat-like tick keeps its pace while the caller's runtime is blocked.
    #[test]
    fn its_tasks_keep_their_pace_while_the_callers_thread_is_blocked() {
        let raft = RaftRuntime::start().expect("started");
        let main = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counter = ticks.clone();
        let name = main.block_on(raft.run(async move {
            tokio::spawn(async move {
                for _ in 0..1_000 {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
            std::thread::current().name().map(String::from)
        }));
        assert_eq!(name.expect("ran").as_deref(), Some("raft"));
        // The caller's thread blocked for half a second (a slow lock, a large snapshot).
        std::thread::sleep(std::time::Duration::from_millis(500));
        let n = ticks.load(std::sync::atomic::Ordering::Relaxed);
        assert!(n >= 10, "the raft thread ticked {n} times while the caller was blocked");
        drop(raft);
    }
}
