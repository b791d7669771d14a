//! The streams an endpoint serves now, so that a drain's deadline can end them
//! (`drain.rs`): each is ended with an `Unavailable` error frame, which a frontend
//! continues on another instance (migration), and its handler is told to stop.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::frame::{Frame, FrameKind};
use super::link::Link;
use crate::context::RequestContext;
use crate::error::ErrorKind;

/// One served stream: the link it answers on, its id there, its context.
struct Served {
    conn: Arc<Link>,
    stream: u64,
    context: RequestContext,
}

/// The streams of one endpoint in flight.
#[derive(Default)]
pub(crate) struct InflightStreams {
    next: AtomicU64,
    streams: Mutex<HashMap<u64, Served>>,
}

/// Keeps a stream in its endpoint's set; dropped with the stream's responder.
pub(crate) struct InflightEntry {
    set: Arc<InflightStreams>,
    key: u64,
}

impl Drop for InflightEntry {
    fn drop(&mut self) {
        self.set.streams.lock().remove(&self.key);
    }
}

impl InflightStreams {
    /// Track `stream` on `conn` until the returned entry is dropped.
    pub(crate) fn add(self: &Arc<Self>, conn: Arc<Link>, stream: u64, context: RequestContext) -> InflightEntry {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(key, Served { conn, stream, context });
        InflightEntry { set: self.clone(), key }
    }

    /// End every stream in flight with an `Unavailable` error saying `message`, and stop
    /// its handler (killed first, so that its responder sends nothing after the error);
    /// how many were ended.
    pub(crate) fn cut(&self, message: &str) -> usize {
        let served: Vec<Served> = self.streams.lock().drain().map(|(_, s)| s).collect();
        let header = serde_json::json!({"kind": ErrorKind::Unavailable.as_str(), "message": message});
        let header: Bytes = serde_json::to_vec(&header).unwrap_or_default().into();
        for s in &served {
            s.context.kill();
            s.conn.send_reliably(Frame::with_header(FrameKind::Error, s.stream, header.clone(), Bytes::new()));
        }
        served.len()
    }
}
