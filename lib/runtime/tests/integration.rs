//! Every integration test of dynamo-runtime in one binary (`autotests = false` in Cargo.toml):
//! one link instead of one per file, and the files' tests run side by side.

mod discovery_support;
mod nats_support;
mod poll;

mod discovery_etcd_outage;
mod etcd_discovery;
mod events_nats;
mod liveness_ping;
mod logging_exit;
mod planes;
mod runtime_health;
mod transport_nats_new_worker;
mod transport_nats_outage;
mod transport_resend;
mod transport_stream_bounds;
