//! Typed Rust handlers and responses on top of the byte-level planes: requests and
//! items are JSON, (de)serialized with serde.

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::context::RequestContext;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::responder::{IncomingRequest, RequestHandler, Responder};
use crate::transport::response_stream::ResponseItem;

/// A handler from an async stream function: `f(request, context)` yields items or an
/// error message. Each request runs in its own task; a killed stream stops being polled.
pub fn stream_handler<Req, Resp, F, S>(f: F) -> Arc<dyn RequestHandler>
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + 'static,
    F: Fn(Req, RequestContext) -> S + Send + Sync + 'static,
    S: Stream<Item = std::result::Result<Resp, String>> + Send + 'static,
{
    Arc::new(move |request: IncomingRequest, responder: Responder| {
        let parsed = serde_json::from_slice::<Req>(&request.body);
        let stream = match parsed {
            Ok(req) => f(req, request.context.clone()),
            Err(e) => return responder.error(ErrorKind::Serialization, &format!("invalid request: {e}")),
        };
        tokio::spawn(drive(stream, responder));
    })
}

async fn drive<Resp: Serialize, S: Stream<Item = std::result::Result<Resp, String>>>(stream: S, responder: Responder) {
    let mut stream = std::pin::pin!(stream);
    let ctx = responder.context().clone();
    loop {
        let next = tokio::select! {
            n = stream.next() => n,
            _ = ctx.killed() => return,
        };
        match next {
            None => return responder.finish(),
            Some(Err(message)) => return responder.error(ErrorKind::Handler, &message),
            Some(Ok(item)) => {
                let body = match serde_json::to_vec(&item) {
                    Ok(b) => Bytes::from(b),
                    Err(e) => return responder.error(ErrorKind::Serialization, &format!("cannot serialize a response item: {e}")),
                };
                if responder.send(Bytes::new(), body).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Decode a response item's data as `T`.
pub fn decode_item<T: DeserializeOwned>(item: &ResponseItem) -> Result<T> {
    serde_json::from_slice(&item.body)
        .map_err(|e| Error::with_source(ErrorKind::Serialization, "cannot decode a response item", e))
}
