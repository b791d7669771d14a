//! What the NATS connection's state does to the transport: transitions logged once each,
//! and callers' requests not yet taken by a worker failed fast when the connection drops
//! (they cannot be taken any more). The client itself is `crate::nats`.

use std::sync::Arc;
use std::time::Duration;

use super::Transport;
use crate::error::{Error, ErrorKind};
use crate::nats::NatsEvents;

/// After a disconnect, requests published but not yet taken by a worker get this long
/// (a worker that had them may still connect back over TCP) before they fail.
const UNTAKEN_GRACE: Duration = Duration::from_secs(1);

/// Log connection state transitions (once each, not every reconnect attempt) and fail
/// the requests no worker took when the connection dropped.
pub(crate) fn spawn_state_watch(mut events: NatsEvents, client: async_nats::Client, transport: &Arc<Transport>, server: String) {
    let transport = transport.clone();
    let cancel = transport.cancel.clone();
    transport.tracker.clone().spawn(async move {
        let mut connected = true;
        loop {
            let event = tokio::select! {
                e = events.recv() => e,
                _ = cancel.cancelled() => return,
            };
            let Some(event) = event else { return };
            match event {
                async_nats::Event::Disconnected if connected => {
                    connected = false;
                    tracing::warn!(server, "NATS connection lost; reconnecting (requests over NATS fail with `unavailable` meanwhile)");
                    tokio::select! {
                        _ = tokio::time::sleep(UNTAKEN_GRACE) => {}
                        _ = cancel.cancelled() => return,
                    }
                    if client.connection_state() != async_nats::connection::State::Connected {
                        transport.fail_unbound(Error::new(
                            ErrorKind::Unavailable,
                            format!("NATS at {server} disconnected before a worker took the request"),
                        ));
                    }
                }
                async_nats::Event::Connected if !connected => {
                    connected = true;
                    tracing::info!(server, "NATS connection restored");
                }
                async_nats::Event::Connected | async_nats::Event::Disconnected => {}
                other => tracing::debug!(server, event = %other, "NATS connection event"),
            }
        }
    });
}
