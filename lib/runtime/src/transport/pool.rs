//! The outbound connection pool: one connection per peer address, opened on first use
//! (bounded by the connect timeout) and forgotten when it closes.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::link::Link;
use super::Transport;
use crate::error::{Error, ErrorKind, Result};

/// Links by peer address; a cell is initialized by the first caller that needs it.
#[derive(Default)]
pub(super) struct ConnectionPool {
    by_address: Mutex<HashMap<String, Arc<OnceCell<Arc<Link>>>>>,
}

impl Transport {
    /// A pooled connection to `address`, opened (bounded by the connect timeout) if needed.
    pub(crate) async fn connection(self: &Arc<Self>, address: &str) -> Result<Arc<Link>> {
        for _ in 0..2 {
            let cell = self.pool.by_address.lock().entry(address.to_string()).or_default().clone();
            let conn = cell
                .get_or_try_init(|| async {
                    let connect = tokio::net::TcpStream::connect(address);
                    let bounded = tokio::time::timeout(self.config.connect_timeout, connect);
                    let socket = tokio::select! {
                        r = bounded => r,
                        _ = self.cancel.cancelled() => return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down")),
                    }
                        .map_err(|_| {
                            Error::new(ErrorKind::Unavailable, format!("connecting to {address} timed out after {:?}", self.config.connect_timeout))
                        })?
                        .map_err(|e| Error::with_source(ErrorKind::Unavailable, format!("cannot connect to {address}"), e))?;
                    Ok::<_, Error>(self.attach(socket, address.to_string(), true))
                })
                .await;
            match conn {
                Ok(c) if !c.is_closed() => return Ok(c.clone()),
                Ok(c) => {
                    let c = c.clone();
                    self.forget_connection(&c);
                }
                Err(e) => {
                    self.forget_address(address, &cell);
                    if e.kind() == ErrorKind::Unavailable {
                        self.mark_address_down(address, &e.full_message());
                    }
                    return Err(e);
                }
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("connection to {address} keeps closing")))
    }

    fn forget_address(&self, address: &str, cell: &Arc<OnceCell<Arc<Link>>>) {
        let mut pool = self.pool.by_address.lock();
        if pool.get(address).map(|c| Arc::ptr_eq(c, cell)).unwrap_or(false) {
            pool.remove(address);
        }
    }

    pub(crate) fn forget_connection(&self, conn: &Link) {
        let mut pool = self.pool.by_address.lock();
        let same = pool.get(conn.peer()).and_then(|c| c.get()).map(|c| c.id() == conn.id()).unwrap_or(false);
        if same {
            pool.remove(conn.peer());
        }
    }
}
