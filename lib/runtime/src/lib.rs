//! Dynamo's distributed runtime: discovery, the request/response/event planes and the
//! component model (namespace → component → endpoint) that workers and clients use.
//!
//! ```no_run
//! # async fn demo() -> dynamo_runtime::Result<()> {
//! use dynamo_runtime::DistributedRuntime;
//! let rt = DistributedRuntime::from_env().await?;
//! let endpoint = rt.namespace("ns")?.component("backend")?.endpoint("generate")?;
//! let client = endpoint.client().await?;
//! client.wait_for_instances(None).await?;
//! let mut stream = client.round_robin(bytes::Bytes::from_static(b"\"hi\"")).await?;
//! while let Some(item) = futures::StreamExt::next(&mut stream).await { let _ = item?; }
//! # Ok(()) }
//! ```

pub mod client;
pub mod component;
pub mod config;
pub mod context;
pub mod discovery;
pub mod drain;
pub mod error;
pub mod events;
mod instance;
pub mod instances;
pub mod logging;
pub mod metrics;
mod nats;
pub mod planes;
pub mod readiness;
pub mod runtime;
mod system_server;
pub mod transport;
pub mod typed;

pub use client::{Client, RouterMode, SendOptions};
pub use component::{Component, Endpoint, EndpointId, Instance, InstanceTransport, Namespace};
pub use config::RuntimeConfig;
pub use context::{RequestContext, StreamState};
pub use discovery::DiscoveryHealth;
pub use readiness::NotReady;
pub use drain::{DrainStatus, ServingState};
pub use error::{Error, ErrorKind, Result};
pub use transport::responder::{IncomingRequest, RequestHandler, Responder};
pub use planes::Planes;
pub use runtime::DistributedRuntime;
pub use transport::response_stream::{ResponseItem, ResponseStream};
