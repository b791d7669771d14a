//! The prefill queue on NATS JetStream: a durable stream `{namespace}_prefill_queue`
//! (subjects `{stream}.*`, jobs published to `{stream}.queue`, kept 10 minutes) with one
//! durable pull consumer, `worker-group`, shared by all prefill workers: each job goes
//! to exactly one of them. A job carries the NATS inbox its answer goes to.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt;

use super::handoff::{KvTransferDescriptor, PrefillEvent, PrefillJob};
use crate::engine::EngineError;

/// Name of the durable consumer all prefill workers pull from.
pub(crate) const CONSUMER_NAME: &str = "worker-group";
/// How long an unconsumed job stays in the stream.
const MAX_AGE: Duration = Duration::from_secs(600);

/// The JetStream stream name for a namespace (`/` and `\` and `.` become `_`).
pub(crate) fn stream_name(namespace: &str) -> String {
    format!("{namespace}_prefill_queue").replace(['/', '\\', '.'], "_")
}

/// An open prefill queue (both sides use it).
#[derive(Clone)]
pub(crate) struct JetStreamQueue {
    nats: async_nats::Client,
    js: jetstream::Context,
    subject: String,
    consumer: PullConsumer,
}

fn queue_error(what: &str, e: impl std::fmt::Display) -> dynamo_runtime::Error {
    dynamo_runtime::Error::new(
        dynamo_runtime::ErrorKind::Unavailable,
        format!("prefill queue on NATS JetStream: {what}: {e} (is JetStream enabled on the NATS server? nats-server -js)"),
    )
}

impl JetStreamQueue {
    /// Create (or open) the stream and its consumer.
    pub(crate) async fn open(nats: async_nats::Client, namespace: &str) -> dynamo_runtime::Result<Self> {
        let js = jetstream::new(nats.clone());
        let name = stream_name(namespace);
        let stream = js
            .get_or_create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{name}.*")],
                max_age: MAX_AGE,
                ..Default::default()
            })
            .await
            .map_err(|e| queue_error(&format!("cannot open stream {name}"), e))?;
        let consumer = stream
            .get_or_create_consumer(
                CONSUMER_NAME,
                jetstream::consumer::pull::Config { durable_name: Some(CONSUMER_NAME.to_string()), ..Default::default() },
            )
            .await
            .map_err(|e| queue_error(&format!("cannot open consumer {CONSUMER_NAME}"), e))?;
        Ok(JetStreamQueue { nats, js, subject: format!("{name}.queue"), consumer })
    }

    /// Jobs not yet pulled by any prefill worker.
    pub(crate) async fn pending(&self) -> Result<usize, EngineError> {
        let info = self.consumer.get_info().await.map_err(|e| EngineError::Unavailable(format!("prefill queue: {e}")))?;
        Ok(info.num_pending as usize)
    }

    /// Publish `job` (with a fresh reply inbox) and wait for its descriptor. The caller
    /// bounds the wait.
    pub(crate) async fn submit(&self, mut job: PrefillJob) -> Result<KvTransferDescriptor, EngineError> {
        let unavailable = |what: &str, e: &dyn std::fmt::Display| EngineError::Unavailable(format!("prefill queue: {what}: {e}"));
        let inbox = self.nats.new_inbox();
        let mut answers = self.nats.subscribe(inbox.clone()).await.map_err(|e| unavailable("subscribe", &e))?;
        job.reply_subject = Some(inbox);
        let payload = serde_json::to_vec(&job).map_err(|e| EngineError::Internal(format!("prefill job: {e}")))?;
        let ack = self.js.publish(self.subject.clone(), payload.into()).await.map_err(|e| unavailable("publish", &e))?;
        ack.await.map_err(|e| unavailable("publish", &e))?;
        while let Some(message) = answers.next().await {
            let event: PrefillEvent = serde_json::from_slice(&message.payload)
                .map_err(|e| EngineError::Internal(format!("prefill answer: {e}")))?;
            match event {
                PrefillEvent::Started { .. } => {}
                PrefillEvent::Done(descriptor) => return Ok(descriptor),
                PrefillEvent::Failed { message } => return Err(EngineError::Unavailable(message)),
            }
        }
        Err(EngineError::Unavailable("prefill queue: the NATS connection closed".to_string()))
    }

    /// Prefill side: the next job, waiting at most `wait`; `Ok(None)` when none came.
    /// The job is acknowledged at once (a worker that dies after this loses it; the
    /// decode worker's timeout covers that).
    pub(crate) async fn pull(&self, wait: Duration) -> Result<Option<PrefillJob>, EngineError> {
        let unavailable = |e: &dyn std::fmt::Display| EngineError::Unavailable(format!("prefill queue: pull: {e}"));
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(1)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| unavailable(&e))?;
        let Some(message) = batch.next().await else { return Ok(None) };
        let message = message.map_err(|e| unavailable(&e))?;
        message.ack().await.map_err(|e| unavailable(&e))?;
        match serde_json::from_slice(&message.payload) {
            Ok(job) => Ok(Some(job)),
            Err(e) => {
                tracing::warn!(error = %e, "dropping a malformed prefill job");
                Ok(None)
            }
        }
    }

    /// Prefill side: send `event` to the job's reply subject.
    pub(crate) async fn answer(&self, job: &PrefillJob, event: &PrefillEvent) {
        let Some(subject) = &job.reply_subject else {
            tracing::warn!(request = %job.request_id, "prefill job without a reply subject");
            return;
        };
        let payload = match serde_json::to_vec(event) {
            Ok(p) => p,
            Err(e) => return tracing::error!(error = %e, "cannot encode a prefill answer"),
        };
        if let Err(e) = self.nats.publish(subject.clone(), payload.into()).await {
            tracing::warn!(error = %e, request = %job.request_id, "cannot answer a prefill job");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_names_are_valid_subject_tokens() {
        assert_eq!(stream_name("dynamo"), "dynamo_prefill_queue");
        assert_eq!(stream_name("a/b.c"), "a_b_c_prefill_queue");
    }
}
