//! A real nats-server on a loopback port for the tests that need one. A missing binary is
//! a test failure, not a skip.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A nats-server on a fixed loopback port, killed -9 on drop.
pub struct Nats {
    child: Child,
    port: u16,
}

impl Nats {
    /// Start nats-server on `port`; panics when the binary is missing.
    pub fn start(port: u16) -> Nats {
        let binary = std::env::var("NATS_SERVER_BIN").unwrap_or_else(|_| "nats-server".to_string());
        let child = Command::new(&binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{binary}` ({e}): these tests need a real nats-server (or set NATS_SERVER_BIN)"));
        Nats { child, port }
    }

    /// Wait (bounded) until the server accepts connections.
    pub async fn wait_ready(&self) {
        let what = format!("nats-server accepts connections on port {}", self.port);
        crate::poll::eventually(&what, Duration::from_secs(10), async || {
            tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()
        })
        .await;
    }

    /// Kill the server (SIGKILL) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback port (bind and release).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Send `body` round-robin through `client` and count the items of the answer (the first
/// error ends it).
pub async fn count_items(client: &dynamo_runtime::Client, body: &'static [u8]) -> dynamo_runtime::Result<usize> {
    use futures::StreamExt;
    let mut stream = client.round_robin(bytes::Bytes::from_static(body)).await?;
    let mut n = 0;
    while let Some(item) = stream.next().await {
        item?;
        n += 1;
    }
    Ok(n)
}

/// A runtime on the NATS request and event planes of the nats-server at `port`, with
/// in-memory discovery and a short shutdown; tests set what else they need over it.
pub fn nats_planes(port: u16) -> dynamo_runtime::config::RuntimeConfig {
    use dynamo_runtime::config::{DiscoveryBackend, EventPlane, RequestPlane, RuntimeConfig};
    RuntimeConfig {
        discovery: DiscoveryBackend::Mem,
        request_plane: RequestPlane::Nats,
        event_plane: EventPlane::Nats,
        nats_server: format!("nats://127.0.0.1:{port}"),
        shutdown_timeout: Duration::from_secs(2),
        ..Default::default()
    }
}
