//! The NATS backend of the event plane: core pub/sub.

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

use super::{Event, Subscription, SUBSCRIPTION_BUFFER};
use crate::error::{Error, ErrorKind, Result};

pub(super) async fn publish(client: &async_nats::Client, subject: &str, payload: Bytes) -> Result<()> {
    client
        .publish(subject.to_string(), payload)
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("publish on {subject} failed"), e))
}

pub(super) async fn subscribe(client: &async_nats::Client, subject: &str) -> Result<Subscription> {
    // Confirmed by the server, so every event published after this returns is delivered
    // (async-nats's own `subscribe` returns once the SUB is written, not read).
    let mut sub = crate::nats::subscribe_confirmed(client, subject).await?;
    let (tx, rx) = mpsc::channel(SUBSCRIPTION_BUFFER);
    // The forwarding task ends when the subscription's receiver is dropped. A NATS outage
    // does not end it: the client reconnects by itself and re-sends every subscription,
    // so the stream only pauses (events published meanwhile are lost, as with core NATS).
    let task = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let event = Event { subject: msg.subject.to_string(), payload: msg.payload };
            if tx.send(event).await.is_err() {
                break;
            }
        }
        let _ = sub.unsubscribe().await;
    });
    Ok(Subscription::new(rx, AbortOnDrop(task.abort_handle())))
}

struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
