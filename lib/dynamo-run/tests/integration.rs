//! Every integration test of dynamo-run in one binary (`autotests = false` in Cargo.toml):
//! one link instead of one per file, and the files' tests run side by side.

mod common;

mod batch;
mod cli;
mod http;
