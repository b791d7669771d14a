//! The model card travels worker → frontend over the request plane, not through
//! discovery (a card with a real `tokenizer.json` is ~2 MB; etcd takes 1.5 MB at most):
//! the worker serves it on a second endpoint of the same component, `{endpoint}_card`,
//! whose handler answers any request with the card JSON as a single item.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{DistributedRuntime, Endpoint, RequestContext};

use super::error::ModelDiscoveryError;
use super::model_entry::ModelEntry;

/// How often a card fetch looks again for the worker's card endpoint.
const INSTANCE_POLL: Duration = Duration::from_millis(20);

/// The name of the endpoint that serves the card of the model served on `endpoint`.
pub fn card_endpoint_name(endpoint: &str) -> String {
    format!("{endpoint}_card")
}

/// Serve `card` on the card endpoint next to `endpoint`.
pub(crate) async fn serve_card(endpoint: &Endpoint, card: serde_json::Value) -> Result<(), ModelDiscoveryError> {
    let size = serde_json::to_vec(&card)?.len();
    let limit = endpoint.planes().config().max_message_size;
    // Leave room for the frame's header.
    if size + 1024 > limit {
        return Err(ModelDiscoveryError::Card(format!(
            "the card is {size} bytes; the request plane carries at most {limit} (DYN_TCP_MAX_MESSAGE_SIZE)"
        )));
    }
    let card = Arc::new(card);
    let handler = stream_handler(move |_: serde_json::Value, _: RequestContext| {
        let card = card.as_ref().clone();
        futures::stream::once(async move { Ok::<_, String>(card) })
    });
    let card_endpoint = endpoint.component().endpoint(card_endpoint_name(&endpoint.id().name))?;
    card_endpoint.start(handler).await?;
    Ok(())
}

/// Fetch the card of `entry` from its worker, within `timeout`.
pub async fn fetch_card(runtime: &DistributedRuntime, entry: &ModelEntry, timeout: Duration) -> Result<serde_json::Value, ModelDiscoveryError> {
    let name = card_endpoint_name(&entry.endpoint.name);
    let what = format!("the card of '{}' from {}.{}.{name}", entry.name, entry.endpoint.namespace, entry.endpoint.component);
    let fetch = async {
        let endpoint = runtime.namespace(entry.endpoint.namespace.clone())?.component(entry.endpoint.component.clone())?.endpoint(name)?;
        let client = endpoint.client().await?;
        let deadline = Instant::now() + timeout;
        // The card endpoint registers before the model entry, but this process's view of
        // discovery may lag behind the entry that brought us here.
        while !client.instance_ids().contains(&entry.instance_id) {
            if Instant::now() >= deadline {
                return Err(ModelDiscoveryError::Card(format!("instance {:x} serves no card endpoint", entry.instance_id)));
            }
            tokio::time::sleep(INSTANCE_POLL).await;
        }
        let mut stream = client.direct(Bytes::from_static(b"{}"), entry.instance_id).await?;
        match stream.next().await {
            Some(item) => Ok(serde_json::from_slice(&item?.body)?),
            None => Err(ModelDiscoveryError::Card("the worker sent no card".to_string())),
        }
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(result) => result.map_err(|e| match e {
            ModelDiscoveryError::Card(m) => ModelDiscoveryError::Card(format!("{what}: {m}")),
            other => ModelDiscoveryError::Card(format!("{what}: {other}")),
        }),
        Err(_) => Err(ModelDiscoveryError::Timeout(format!("fetching {what} took longer than {timeout:?}"))),
    }
}
