//! The process's one NATS client, shared by the request plane (`transport::nats`), the
//! event plane (`events::nats`) and the planes' health: unlimited reconnects with a
//! bounded backoff, and subscriptions confirmed by the server before they are handed out.
//! What a dropped connection does to requests in flight is the transport's
//! (`transport::nats_connection::spawn_state_watch`, fed this client's events).

use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;

use crate::config::RuntimeConfig;
use crate::error::{Error, ErrorKind, Result};

/// Longest wait between reconnect attempts.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How often the client pings the server (a partitioned server is noticed within ~2×).
const SERVER_PING_INTERVAL: Duration = Duration::from_secs(5);

/// Connection events, for `transport::nats_connection::spawn_state_watch`.
pub(crate) type NatsEvents = mpsc::UnboundedReceiver<async_nats::Event>;

/// Connect to `NATS_SERVER`, waiting (bounded by the connect timeout) for the first
/// connection so that a wrong address fails here with a clear message.
pub(crate) async fn connect(config: &RuntimeConfig) -> Result<(async_nats::Client, NatsEvents)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let options = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .ping_interval(SERVER_PING_INTERVAL)
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(100u64.saturating_mul(1 << attempts.min(5))).min(RECONNECT_BACKOFF_MAX)
        })
        // Not `no_echo`: [`round_trip`] needs this client's own messages back.
        .event_callback(move |event| {
            let _ = tx.send(event);
            async {}
        });
    let client = options
        .connect(&config.nats_server)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("cannot connect to NATS at {}", config.nats_server), e))?;
    let deadline = Instant::now() + config.connect_timeout;
    while client.connection_state() != async_nats::connection::State::Connected {
        if Instant::now() >= deadline {
            return Err(Error::new(
                ErrorKind::Nats,
                format!("cannot connect to NATS at {} within {:?} (NATS_SERVER)", config.nats_server, config.connect_timeout),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((client, rx))
}

/// Bound on the server confirming a new subscription ([`subscribe_confirmed`]).
const SUBSCRIBE_CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);

/// Subscribe to `subject` and return once nats-server has the SUB (bounded by
/// [`SUBSCRIBE_CONFIRM_TIMEOUT`]): every message published after this returns, from any
/// connection, reaches the subscription. What the event plane's `subscribe` and the
/// request plane's `serve` (before the instance is registered) both need.
pub(crate) async fn subscribe_confirmed(client: &async_nats::Client, subject: &str) -> Result<async_nats::Subscriber> {
    let sub = client
        .subscribe(subject.to_string())
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("subscribe to {subject} failed"), e))?;
    round_trip(client, SUBSCRIBE_CONFIRM_TIMEOUT)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("subscribe to {subject}: the server did not confirm"), e))?;
    Ok(sub)
}

/// Wait (bounded) until nats-server has handled everything this client sent before the
/// call, a SUB above all.
///
/// `Client::flush` does not do this: in async-nats it only writes the client's buffer to
/// the socket (no PING/PONG, unlike the Go client's `Flush`). nats-server reads each
/// connection on its own, so a SUB flushed on this connection may still be unread while
/// a PUB another connection sent later is routed, and that message misses the new
/// subscription. The server handles one connection's operations in order, so a message
/// this client publishes to a fresh inbox of its own and receives back shows that every
/// SUB sent before it is in place: a PUB from any connection routed after that reaches it.
async fn round_trip(client: &async_nats::Client, bound: Duration) -> Result<()> {
    let inbox = client.new_inbox();
    let probe = async {
        let mut probe = client
            .subscribe(inbox.clone())
            .await
            .map_err(|e| Error::with_source(ErrorKind::Nats, "subscribing to the round-trip inbox failed", e))?;
        client
            .publish(inbox, bytes::Bytes::new())
            .await
            .map_err(|e| Error::with_source(ErrorKind::Nats, "publishing the round-trip probe failed", e))?;
        client
            .flush()
            .await
            .map_err(|e| Error::with_source(ErrorKind::Nats, "flushing the round-trip probe failed", e))?;
        match probe.next().await {
            // Dropping `probe` unsubscribes.
            Some(_) => Ok(()),
            None => Err(Error::new(ErrorKind::Nats, "the NATS connection closed during a round trip to the server")),
        }
    };
    match tokio::time::timeout(bound, probe).await {
        Ok(result) => result,
        Err(_) => Err(Error::new(ErrorKind::Nats, format!("the NATS server did not answer a round trip within {bound:?}"))),
    }
}

/// Whether the NATS request plane can take a request now; `Unavailable` at once if not.
pub(crate) fn check_connected(client: &async_nats::Client, server: &str) -> Result<()> {
    match client.connection_state() {
        async_nats::connection::State::Connected => Ok(()),
        state => Err(Error::new(ErrorKind::Unavailable, format!("NATS at {server} is {}", state_name(&state)))),
    }
}

pub(crate) fn state_name(state: &async_nats::connection::State) -> &'static str {
    match state {
        async_nats::connection::State::Connected => "connected",
        async_nats::connection::State::Disconnected => "disconnected",
        async_nats::connection::State::Pending => "not connected yet",
    }
}
