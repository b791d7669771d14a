//! Tracks the live instances of one endpoint from discovery, shared by every client of
//! that endpoint in the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::component::{EndpointId, Instance};
use crate::discovery::WatchEvent;
use crate::error::Result;
use crate::runtime::DistributedRuntime;

/// How long an instance that refused a connection is skipped while discovery still lists it.
const DOWN_BACKOFF: Duration = Duration::from_secs(2);

/// The live instances of one endpoint.
pub struct InstanceWatcher {
    instances: watch::Receiver<Arc<Vec<Instance>>>,
    down: Mutex<HashMap<u64, Instant>>,
}

impl InstanceWatcher {
    pub(crate) async fn start(runtime: &DistributedRuntime, id: &EndpointId) -> Result<Arc<InstanceWatcher>> {
        let prefix = id.instances_prefix();
        let mut watch = runtime.discovery().watch_prefix(&prefix).await?;
        let mut by_key: BTreeMap<String, Instance> = BTreeMap::new();
        for kv in std::mem::take(&mut watch.initial) {
            if let Some(instance) = decode(&kv.key, &kv.value) {
                by_key.insert(kv.key, instance);
            }
        }
        let (tx, rx) = watch::channel(snapshot(&by_key));
        let cancel = runtime.cancel_token();
        let transport = runtime.transport().clone();
        let endpoint = id.to_string();
        runtime.tracker().spawn(async move {
            loop {
                let event = tokio::select! {
                    e = watch.events.recv() => e,
                    _ = cancel.cancelled() => return,
                };
                match event {
                    Some(WatchEvent::Put(kv)) => {
                        if let Some(instance) = decode(&kv.key, &kv.value) {
                            by_key.insert(kv.key, instance);
                        }
                    }
                    Some(WatchEvent::Delete(key)) => {
                        by_key.remove(&key);
                    }
                    None => {
                        if !transport.is_shutting_down() {
                            tracing::error!(endpoint, "instance watch ended; the instance list is frozen");
                        }
                        return;
                    }
                }
                tx.send_replace(snapshot(&by_key));
            }
        });
        Ok(Arc::new(InstanceWatcher { instances: rx, down: Mutex::new(HashMap::new()) }))
    }

    /// All registered instances, ordered by instance id.
    pub fn instances(&self) -> Arc<Vec<Instance>> {
        self.instances.borrow().clone()
    }

    /// Instances to route to: those not recently found unreachable (all, if every one was).
    pub fn routable(&self) -> Arc<Vec<Instance>> {
        let all = self.instances();
        let mut down = self.down.lock();
        if down.is_empty() {
            return all;
        }
        let now = Instant::now();
        down.retain(|_, until| *until > now);
        let up: Vec<Instance> = all.iter().filter(|i| !down.contains_key(&i.instance_id)).cloned().collect();
        if up.is_empty() {
            all
        } else {
            Arc::new(up)
        }
    }

    /// Skip `instance_id` for a while: it refused a connection or is shutting down.
    pub fn mark_down(&self, instance_id: u64) {
        self.down.lock().insert(instance_id, Instant::now() + DOWN_BACKOFF);
    }

    /// Wait until at least one instance is registered.
    pub async fn wait_for_any(&self) -> Arc<Vec<Instance>> {
        let mut rx = self.instances.clone();
        let found = match rx.wait_for(|v| !v.is_empty()).await {
            Ok(v) => v.clone(),
            Err(_) => self.instances(),
        };
        found
    }
}

fn decode(key: &str, value: &[u8]) -> Option<Instance> {
    match serde_json::from_slice::<Instance>(value) {
        Ok(i) => Some(i),
        Err(e) => {
            tracing::warn!(key, error = %e, "ignoring a malformed instance registration");
            None
        }
    }
}

fn snapshot(by_key: &BTreeMap<String, Instance>) -> Arc<Vec<Instance>> {
    let mut v: Vec<Instance> = by_key.values().cloned().collect();
    v.sort_by_key(|i| i.instance_id);
    Arc::new(v)
}
