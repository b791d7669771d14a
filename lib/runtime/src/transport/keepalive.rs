//! Application-level keepalive of a connection: ping it whenever either direction has
//! been quiet for the ping interval, and close it once the peer has been silent for the
//! peer timeout (see `liveness.rs` for why). Detection takes at most timeout + one
//! interval.

use std::sync::Arc;

use super::frame::{Frame, FrameKind};
use super::link::Link;
use super::Transport;

/// Watch `link` until it closes; a silent peer closes it (and marks the address down
/// when this side opened it).
pub(super) fn spawn(transport: &Arc<Transport>, link: &Arc<Link>) {
    let interval = transport.config.ping_interval;
    let timeout = transport.config.peer_timeout;
    let transport = transport.clone();
    let link = link.clone();
    transport.tracker.clone().spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = link.closed_token().cancelled() => return,
            }
            let live = link.liveness();
            let silent = live.silent_for();
            if silent >= timeout && !live.is_reader_busy() {
                let reason = format!("no answer from {} for {} s", link.peer(), timeout.as_secs_f64());
                if link.is_outbound() {
                    transport.mark_address_down(link.peer(), &reason);
                }
                transport.close_link(&link, &reason);
                return;
            }
            if silent >= interval || live.idle_for() >= interval {
                // A full write queue means frames are going out anyway.
                let _ = link.try_send(Frame::control(FrameKind::Ping, 0));
            }
        }
    });
}
