//! A response stream that tells the selector which picked its instance how it ended:
//! the one place a request's [`Selector::on_end`] is called once its stream runs.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;

use super::{Outcome, Pick, Selector};

/// Wraps the stream of a request sent to `pick`'s instance: times its items on the
/// pick's load, and calls [`Selector::on_end`] once — `Completed` at the stream's end,
/// `Failed` at its first error, `Cancelled` when it is dropped before either.
pub struct TrackedStream<S> {
    inner: S,
    selector: Arc<dyn Selector>,
    pick: Option<Pick>,
}

impl<S> TrackedStream<S> {
    /// Track `inner`, the stream of the request sent to `pick`'s instance.
    pub fn new(inner: S, selector: Arc<dyn Selector>, pick: Pick) -> Self {
        TrackedStream { inner, selector, pick: Some(pick) }
    }

    fn end(&mut self, outcome: Outcome) {
        if let Some(pick) = self.pick.take() {
            self.selector.on_end(pick, outcome);
        }
    }
}

impl<S, T, E> Stream for TrackedStream<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
{
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        match &polled {
            Poll::Ready(None) => self.end(Outcome::Completed),
            Poll::Ready(Some(item)) => {
                if let Some(load) = self.pick.as_mut().and_then(|p| p.load.as_mut()) {
                    load.observe_item();
                }
                if item.is_err() {
                    self.end(Outcome::Failed);
                }
            }
            Poll::Pending => {}
        }
        polled
    }
}

impl<S> Drop for TrackedStream<S> {
    fn drop(&mut self) {
        self.end(Outcome::Cancelled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use parking_lot::Mutex;

    use crate::routing::SelectError;

    /// Records each end it is told of.
    #[derive(Debug, Default)]
    struct Ends(Mutex<Vec<(u64, Outcome)>>);

    impl Selector for Ends {
        fn select(&self, _: &[u32], _: &[u64]) -> Result<Pick, SelectError> {
            Err(SelectError::NoCandidates)
        }

        fn on_end(&self, choice: Pick, outcome: Outcome) {
            self.0.lock().push((choice.instance, outcome));
        }
    }

    #[tokio::test]
    async fn each_stream_ends_once_with_how_it_ended() {
        let ends = Arc::new(Ends::default());
        let selector: Arc<dyn Selector> = ends.clone();
        let items = |v: Vec<Result<u32, ()>>| futures::stream::iter(v);

        let mut completed = TrackedStream::new(items(vec![Ok(1), Ok(2)]), selector.clone(), Pick::of(1));
        while completed.next().await.is_some() {}
        assert_eq!(completed.next().await, None);
        drop(completed);

        let mut failed = TrackedStream::new(items(vec![Ok(1), Err(()), Ok(3)]), selector.clone(), Pick::of(2));
        assert_eq!(failed.next().await, Some(Ok(1)));
        assert_eq!(*ends.0.lock(), vec![(1, Outcome::Completed)], "nothing ended before its end");
        assert_eq!(failed.next().await, Some(Err(())));
        drop(failed);

        let mut cancelled = TrackedStream::new(items(vec![Ok(1), Ok(2)]), selector, Pick::of(3));
        assert_eq!(cancelled.next().await, Some(Ok(1)));
        drop(cancelled);

        assert_eq!(*ends.0.lock(), vec![(1, Outcome::Completed), (2, Outcome::Failed), (3, Outcome::Cancelled)]);
    }
}
