//! Stops a request's engine when the HTTP side lets go of it early: the client
//! disconnected (the SSE body or the handler future was dropped) or the server gave up.

use crate::engine::RequestContext;

/// Dropped before [`CancelOnDrop::completed`]: stops, then kills, the request's context.
pub(crate) struct CancelOnDrop {
    ctx: RequestContext,
    completed: bool,
}

impl CancelOnDrop {
    /// Guard `ctx`.
    pub(crate) fn new(ctx: RequestContext) -> Self {
        CancelOnDrop { ctx, completed: false }
    }

    /// The response completed normally; dropping the guard does nothing.
    pub(crate) fn completed(&mut self) {
        self.completed = true;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.completed && !self.ctx.is_killed() {
            tracing::debug!(request = self.ctx.id(), "response abandoned; stopping the engine");
            self.ctx.stop_generating();
            self.ctx.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_kills_unless_completed() {
        let ctx = RequestContext::new("a");
        drop(CancelOnDrop::new(ctx.clone()));
        assert!(ctx.is_killed());

        let ctx = RequestContext::new("b");
        let mut guard = CancelOnDrop::new(ctx.clone());
        guard.completed();
        drop(guard);
        assert!(!ctx.is_stopped());
    }
}
