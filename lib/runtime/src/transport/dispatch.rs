//! Frames of kinds another room owns (the event plane's Subscribe, Event, SubscribeSync
//! and Subscribed) reach it through a handler it registers here, so the transport never
//! imports that room.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::RwLock;

use super::frame::{Frame, FrameKind};
use super::link::Link;

/// Handles the frames of the kinds it was registered for.
pub(crate) trait FrameHandler: Send + Sync {
    /// One frame of a registered kind, read from `conn`.
    fn on_frame<'a>(&'a self, conn: &'a Arc<Link>, frame: Frame) -> BoxFuture<'a, ()>;
    /// The connection `conn_id` closed.
    fn connection_closed(&self, conn_id: u64);
}

/// The registered handlers, by frame kind.
#[derive(Default)]
pub(crate) struct FrameHandlers {
    by_kind: RwLock<HashMap<FrameKind, Arc<dyn FrameHandler>>>,
}

impl FrameHandlers {
    /// Route frames of `kinds` to `handler` (a later registration of a kind replaces it).
    pub(crate) fn register(&self, kinds: &[FrameKind], handler: Arc<dyn FrameHandler>) {
        let mut by_kind = self.by_kind.write();
        for kind in kinds {
            by_kind.insert(*kind, handler.clone());
        }
    }

    /// The handler of `kind`, if one was registered.
    pub(crate) fn get(&self, kind: FrameKind) -> Option<Arc<dyn FrameHandler>> {
        self.by_kind.read().get(&kind).cloned()
    }

    /// Tell every handler that `conn_id` closed.
    pub(crate) fn connection_closed(&self, conn_id: u64) {
        let handlers: Vec<Arc<dyn FrameHandler>> = self.by_kind.read().values().cloned().collect();
        let mut told: Vec<*const ()> = Vec::new();
        for handler in handlers {
            let key = Arc::as_ptr(&handler) as *const ();
            if !told.contains(&key) {
                told.push(key);
                handler.connection_closed(conn_id);
            }
        }
    }
}
