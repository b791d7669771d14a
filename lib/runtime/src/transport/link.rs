//! A connection as the transport owns it: the framed socket, the streams bound to it in
//! either role (served here as a worker, awaited here as a caller), and the peer's
//! instance id from its Hello. `reader.rs` opens and closes links; the pool, the worker
//! role, the caller role and the event plane hold them.

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::connection::Connection;
use crate::context::RequestContext;
use crate::error::Result;

/// A live connection and the streams on it. Derefs to its [`Connection`] for sending.
pub(crate) struct Link {
    conn: Connection,
    /// Streams this side serves on this link (worker role); `None` once closed.
    running: Mutex<Option<HashMap<u64, RequestContext>>>,
    /// Streams this side awaits on this link (caller role); `None` once closed.
    bound: Mutex<Option<HashSet<u64>>>,
    /// The peer's instance id, from its Hello (inbound links only).
    peer_instance: OnceLock<u64>,
}

/// What a closing link had bound to it: the awaited stream ids and the served streams.
pub(super) struct BoundStreams {
    pub awaited: HashSet<u64>,
    pub served: HashMap<u64, RequestContext>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.conn.fmt(f)
    }
}

impl std::ops::Deref for Link {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl Link {
    pub(super) fn new(conn: Connection) -> Self {
        Link {
            conn,
            running: Mutex::new(Some(HashMap::new())),
            bound: Mutex::new(Some(HashSet::new())),
            peer_instance: OnceLock::new(),
        }
    }

    /// The peer's instance id, known on an inbound link once its Hello arrived.
    pub(crate) fn peer_instance(&self) -> Option<u64> {
        self.peer_instance.get().copied()
    }

    pub(super) fn set_peer_instance(&self, instance: u64) {
        let _ = self.peer_instance.set(instance);
    }

    /// Record that stream `id` (awaited by this side) arrives on this link.
    /// Fails if the link is already closed.
    pub(crate) fn bind(&self, id: u64) -> Result<()> {
        match self.bound.lock().as_mut() {
            Some(set) => {
                set.insert(id);
                Ok(())
            }
            None => Err(self.closed_error()),
        }
    }

    pub(crate) fn unbind(&self, id: u64) {
        if let Some(set) = self.bound.lock().as_mut() {
            set.remove(&id);
        }
    }

    /// Record a stream this side serves; fails if the link is closed.
    pub(crate) fn add_running(&self, id: u64, ctx: RequestContext) -> Result<()> {
        match self.running.lock().as_mut() {
            Some(map) => {
                map.insert(id, ctx);
                Ok(())
            }
            None => Err(self.closed_error()),
        }
    }

    pub(crate) fn remove_running(&self, id: u64) {
        if let Some(map) = self.running.lock().as_mut() {
            map.remove(&id);
        }
    }

    pub(crate) fn running(&self, id: u64) -> Option<RequestContext> {
        self.running.lock().as_ref().and_then(|m| m.get(&id).cloned())
    }

    /// Take every stream bound to the link, which is closing: later binds fail.
    pub(super) fn take_streams(&self) -> BoundStreams {
        BoundStreams {
            awaited: self.bound.lock().take().unwrap_or_default(),
            served: self.running.lock().take().unwrap_or_default(),
        }
    }
}
