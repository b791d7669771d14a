//! A real single-node `etcd` for the discovery tests: started on free loopback ports
//! with a data directory the test owns, so it can be killed (SIGKILL) and started again
//! on the same ports with the same data, or on another client port that the clients
//! under test do not know.
//!
//! When the `etcd` binary is missing, [`Etcd::start`] fails the test under `CI=true`;
//! elsewhere it prints why and returns `None`, and the test returns early (skipped).

#![allow(dead_code)]

use std::fs::OpenOptions;
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dynamo_runtime::config::{DiscoveryBackend, LeaseLossPolicy, RuntimeConfig};
use dynamo_runtime::discovery::{EtcdDiscovery, PrefixWatch, WatchEvent};
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::CancellationToken;

/// Bound on etcd becoming ready after it is started.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A single-node etcd in a temp dir, killed on drop.
pub struct Etcd {
    binary: String,
    child: Option<Child>,
    client_port: u16,
    peer_port: u16,
    /// The client URL the clients under test use.
    pub endpoint: String,
    log: PathBuf,
    dir: tempfile::TempDir,
}

pub fn free_port() -> u16 {
    // Bind-and-release: the port could in theory be taken again before etcd binds it,
    // which start() reports through the log.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local address").port()
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

impl Etcd {
    /// Start etcd. When the binary is missing: panic under `CI=true`, else print why and
    /// return `None`.
    pub async fn start() -> Option<Etcd> {
        let binary = std::env::var("ETCD_BIN").unwrap_or_else(|_| "etcd".to_string());
        let dir = tempfile::tempdir().expect("temp dir");
        let (client_port, peer_port) = (free_port(), free_port());
        let log = dir.path().join("etcd.log");
        let mut etcd = Etcd {
            binary,
            child: None,
            client_port,
            peer_port,
            endpoint: url(client_port),
            log,
            dir,
        };
        match etcd.spawn(client_port) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let why = format!(
                    "no `{}` binary ({e}); install etcd (e.g. `apt-get install etcd-server`) or set ETCD_BIN",
                    etcd.binary
                );
                if std::env::var("CI").is_ok_and(|v| v == "true") {
                    panic!("{why} (CI=true: a missing etcd fails the test instead of skipping it)");
                }
                eprintln!("skipping: {why}");
                return None;
            }
            Err(e) => panic!("cannot start `{}`: {e}", etcd.binary),
        }
        etcd.wait_ready(client_port).await;
        Some(etcd)
    }

    fn spawn(&mut self, client_port: u16) -> std::io::Result<()> {
        let client_url = url(client_port);
        let peer_url = url(self.peer_port);
        let log_file = OpenOptions::new().create(true).append(true).open(&self.log)?;
        let child = Command::new(&self.binary)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, port: u16) {
        let endpoint = url(port);
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("etcd exited during startup ({status}); log:\n{}", self.log_text());
                }
            }
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                let probe = async {
                    let mut client = etcd_client::Client::connect([&endpoint], None).await?;
                    client.get("probe", None).await
                };
                if let Ok(Ok(_)) = timeout(Duration::from_secs(1), probe).await {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!("etcd not ready within {STARTUP_TIMEOUT:?}; log:\n{}", self.log_text());
            }
            sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL etcd (the data directory stays).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start etcd again on its ports with its data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn(self.client_port).expect("restart etcd");
        self.wait_ready(self.client_port).await;
    }

    /// Start etcd again on its ports with an empty data directory (all data lost).
    pub async fn restart_wiped(&mut self) {
        self.kill();
        std::fs::remove_dir_all(self.dir.path().join("data")).expect("wipe etcd data");
        self.spawn(self.client_port).expect("restart etcd");
        self.wait_ready(self.client_port).await;
    }

    /// Start etcd again with its data, but on a client port nobody under test knows;
    /// returns that port's endpoint.
    pub async fn restart_aside(&mut self) -> String {
        self.kill();
        let port = free_port();
        self.spawn(port).expect("start etcd aside");
        self.wait_ready(port).await;
        url(port)
    }

    pub fn config(&self, lease_ttl: Duration, lease_loss: LeaseLossPolicy) -> RuntimeConfig {
        RuntimeConfig {
            discovery: DiscoveryBackend::Etcd,
            etcd_endpoints: vec![self.endpoint.clone()],
            lease_ttl,
            lease_loss,
            ..RuntimeConfig::default()
        }
    }

    /// A discovery client with the `reregister` policy, and its root token.
    pub async fn client(&self, lease_ttl: Duration) -> (EtcdDiscovery, CancellationToken) {
        let cancel = CancellationToken::new();
        let config = self.config(lease_ttl, LeaseLossPolicy::Reregister);
        let d = EtcdDiscovery::connect(&config, cancel.clone()).await.expect("connect to etcd");
        (d, cancel)
    }

    /// A plain etcd client (for acting behind the backend's back).
    pub async fn raw(&self) -> etcd_client::Client {
        raw(&self.endpoint).await
    }

    /// Revoke `lease` behind the client's back, as if etcd had expired it.
    pub async fn revoke(&self, lease: i64) {
        self.raw().await.lease_revoke(lease).await.expect("revoke");
    }
}

/// A plain etcd client on `endpoint`.
pub async fn raw(endpoint: &str) -> etcd_client::Client {
    etcd_client::Client::connect([endpoint], None).await.expect("raw etcd client")
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The next event of `watch`, failing the test if none arrives `within`.
pub async fn next(watch: &mut PrefixWatch, within: Duration) -> WatchEvent {
    timeout(within, watch.events.recv())
        .await
        .expect("no watch event in time")
        .expect("watch ended")
}
