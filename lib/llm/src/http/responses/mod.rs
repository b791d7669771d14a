//! `/v1/responses`, OpenAI's Responses API, over the chat pipeline: a request becomes a
//! chat request ([`convert`]; its input items [`input`], its function [`tools`]), the
//! chat chunks become the Response object and its events ([`events`], driven by
//! [`generation`]), kept in a [`store`] (in memory, or in
//! discovery for a fleet of frontends) for `GET`, `DELETE`, `previous_response_id` and
//! [`background`] responses and the [`input_items`] list. The routes are in [`handlers`].

pub(crate) mod background;
pub(crate) mod convert;
mod discovery_store;
pub(crate) mod events;
pub(crate) mod generation;
pub(crate) mod handlers;
pub(crate) mod input;
pub(crate) mod input_items;
mod memory;
pub(crate) mod protocol;
pub(crate) mod store;
pub(crate) mod tools;

use std::sync::Arc;
use std::time::Duration;

use dynamo_runtime::discovery::Discovery;

pub use discovery_store::{INDEX_PREFIX, RESPONSES_PREFIX};
pub use store::{ResponseStore, SharedResponseStore, StoreError, StoreErrorKind, StoredResponse};

/// Default bound on the responses a store keeps.
pub const DEFAULT_RESPONSES_MAX: usize = 10_000;
/// Default time a stored response is kept.
pub const DEFAULT_RESPONSES_TTL: Duration = Duration::from_secs(3600);

/// The in-memory store: at most `max` responses, each kept for `ttl`.
pub fn memory_store(max: usize, ttl: Duration) -> SharedResponseStore {
    Arc::new(memory::MemoryStore::new(max, ttl))
}

/// The store in `discovery` (keys under [`RESPONSES_PREFIX`], counted by the keys under
/// [`INDEX_PREFIX`]): about `max` responses (the oldest go first), each kept for `ttl`;
/// every frontend on the same discovery answers for every response.
pub fn discovery_store(discovery: Arc<dyn Discovery>, ttl: Duration, max: usize) -> SharedResponseStore {
    Arc::new(discovery_store::DiscoveryStore::new(discovery, ttl, max))
}
