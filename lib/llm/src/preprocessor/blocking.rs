//! A bounded pool for CPU-heavy request work (template rendering, tokenization), so a
//! big prompt never holds an async worker thread: `/health`, `/metrics` and small
//! requests are answered while it is tokenized. Small inputs are done inline, where a
//! thread hand-off would cost more than the work.

use std::sync::OnceLock;

use tokio::sync::Semaphore;

use crate::engine::EngineError;

/// Inputs up to this many bytes are preprocessed on the calling (async) thread.
pub const INLINE_BYTES: usize = 16 * 1024;

/// One permit per CPU: at most that many big prompts are tokenized at once; more wait
/// (asynchronously) for a permit.
fn permits() -> &'static Semaphore {
    static PERMITS: OnceLock<Semaphore> = OnceLock::new();
    PERMITS.get_or_init(|| Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get())))
}

/// Run `work` inline when `input_bytes` is small, else on tokio's blocking threads
/// behind the per-CPU semaphore.
pub async fn run<T, F>(input_bytes: usize, work: F) -> Result<T, EngineError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, EngineError> + Send + 'static,
{
    if input_bytes <= INLINE_BYTES {
        return work();
    }
    let _permit = permits()
        .acquire()
        .await
        .map_err(|_| EngineError::Internal("the preprocessing pool is closed".to_string()))?;
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| EngineError::Internal(format!("preprocessing failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn big_work_leaves_the_async_thread_free() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        // On a one-thread runtime a task spawned before the work can only run during
        // it if the work is off that thread.
        let ticked = Arc::new(AtomicBool::new(false));
        let t = ticked.clone();
        let ticker = tokio::spawn(async move { t.store(true, Ordering::SeqCst) });
        let seen = run(INLINE_BYTES + 1, move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !ticked.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok(ticked.load(Ordering::SeqCst))
        })
        .await
        .unwrap();
        assert!(seen, "the async thread was blocked by the work");
        ticker.await.unwrap();
        let inline = run(1, || Err::<(), _>(EngineError::BadRequest("x".into()))).await;
        assert_eq!(inline, Err(EngineError::BadRequest("x".into())));
    }
}
