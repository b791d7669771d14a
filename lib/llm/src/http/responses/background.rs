//! Background responses (`background: true`): each generates on a task owned by
//! [`BackgroundRuns`], without a client, saving its progress to the store as it goes
//! (at most every [`SAVE_EVERY`]), until it ends or is cancelled.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::generation::Generation;

/// How often a background response's progress is written to the store.
pub(crate) const SAVE_EVERY: Duration = Duration::from_millis(200);
/// Bound on waiting for a cancelled response to stop and be saved.
pub(crate) const CANCEL_BOUND: Duration = Duration::from_secs(5);

struct Run {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

/// The background responses this frontend generates. Dropping it aborts them.
#[derive(Default)]
pub(crate) struct BackgroundRuns {
    runs: Arc<Mutex<HashMap<String, Run>>>,
}

impl BackgroundRuns {
    /// Generate `generation` on a task of its own.
    pub(crate) fn start(&self, generation: Generation) {
        let id = generation.response().id.clone();
        let cancel = CancellationToken::new();
        let runs = self.runs.clone();
        // The entry is inserted under the lock before the task can remove it.
        let mut guard = self.runs.lock();
        let task = tokio::spawn({
            let cancel = cancel.clone();
            let id = id.clone();
            async move {
                drive(generation, cancel).await;
                runs.lock().remove(&id);
            }
        });
        guard.insert(id, Run { cancel, task });
    }

    /// Cancel response `id` if this frontend generates it, and wait (bounded) until it
    /// is saved as cancelled; whether it was generating here.
    pub(crate) async fn cancel(&self, id: &str) -> bool {
        let Some(run) = self.runs.lock().remove(id) else { return false };
        run.cancel.cancel();
        let abort = run.task.abort_handle();
        if tokio::time::timeout(CANCEL_BOUND, run.task).await.is_err() {
            tracing::warn!(response = id, "a cancelled background response did not stop in time");
            abort.abort();
        }
        true
    }
}

impl Drop for BackgroundRuns {
    fn drop(&mut self) {
        for (_, run) in self.runs.lock().drain() {
            run.task.abort();
        }
    }
}

async fn drive(mut generation: Generation, cancel: CancellationToken) {
    let mut last_save = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                generation.cancel().await;
                return;
            }
            events = generation.next() => {
                if events.is_none() {
                    return;
                }
                if last_save.elapsed() >= SAVE_EVERY {
                    last_save = Instant::now();
                    if let Err(e) = generation.save().await {
                        tracing::warn!(response = %generation.response().id, error = %e, "cannot save progress");
                    }
                }
            }
        }
    }
}
