//! `DistributedRuntime::health()` — what a worker's and a frontend's `/health` report:
//! healthy while discovery works, still healthy while discovery is degraded for less
//! than `DYN_DISCOVERY_HEALTH_GRACE` (serving on what it last knew), unhealthy past it,
//! healthy again once discovery recovers, and unhealthy once the runtime shut down.

use crate::poll;

use std::fs;
use std::path::Path;
use std::time::Duration;

use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::DistributedRuntime;
use poll::wait_until;

/// Replace `dir/name` by a plain file (root ignores permissions, so `chmod` would not
/// do); the returned closure puts the directory back.
fn break_dir(dir: &Path, name: &str) -> impl FnOnce() {
    let (path, away) = (dir.join(name), dir.join(format!("{name}.away")));
    fs::rename(&path, &away).unwrap();
    fs::write(&path, b"not a directory").unwrap();
    move || {
        fs::remove_file(&path).unwrap();
        fs::rename(&away, &path).unwrap();
    }
}


#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_discovery_past_its_grace_and_the_runtime_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        discovery: DiscoveryBackend::File,
        file_kv_dir: dir.path().to_path_buf(),
        lease_ttl: Duration::from_secs(1),
        discovery_health_grace: Duration::from_millis(1500),
        shutdown_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let rt = DistributedRuntime::new(config).await.unwrap();
    assert_eq!(rt.health(), Ok(()));

    let restore = break_dir(dir.path(), "leases");
    wait_until("discovery degraded", Duration::from_secs(3), || !rt.discovery_health().is_healthy()).await;
    assert_eq!(rt.health(), Ok(()), "within the grace the process still serves on what it knew");
    wait_until("unhealthy past the grace", Duration::from_secs(5), || rt.health().is_err()).await;
    let reason = rt.health().unwrap_err();
    assert!(reason.contains("DYN_DISCOVERY_HEALTH_GRACE") && reason.contains("file"), "{reason}");
    assert!(!rt.cancel_token().is_cancelled(), "a degraded store never shuts the process down");

    restore();
    wait_until("healthy again", Duration::from_secs(10), || rt.health().is_ok()).await;

    rt.shutdown().await;
    let reason = rt.health().unwrap_err();
    assert!(reason.contains("shutting down"), "{reason}");
}
