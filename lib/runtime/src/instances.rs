//! Tracks the live instances of one endpoint from discovery, shared by every client of
//! that endpoint in the process.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::watch;

use crate::discovery::{Discovery, WatchEvent};
use crate::error::Result;
use crate::instance::{EndpointId, Instance, InstanceTransport};
use crate::transport::Transport;

/// The live instances of one endpoint.
pub struct InstanceWatcher {
    instances: watch::Receiver<Arc<Vec<Instance>>>,
    /// Holds the process-wide down marks every watcher consults.
    transport: Arc<Transport>,
}

impl InstanceWatcher {
    pub(crate) async fn start(discovery: &Arc<dyn Discovery>, transport: &Arc<Transport>, id: &EndpointId) -> Result<Arc<InstanceWatcher>> {
        let prefix = id.instances_prefix();
        let mut watch = discovery.watch_prefix(&prefix).await?;
        let mut by_key: BTreeMap<String, Instance> = BTreeMap::new();
        for kv in std::mem::take(&mut watch.initial) {
            if let Some(instance) = decode(&kv.key, &kv.value) {
                by_key.insert(kv.key, instance);
            }
        }
        let (tx, rx) = watch::channel(snapshot(&by_key));
        let cancel = transport.cancel.clone();
        let watcher_transport = transport.clone();
        let transport = transport.clone();
        let endpoint = id.to_string();
        watcher_transport.tracker.spawn(async move {
            loop {
                let event = tokio::select! {
                    e = watch.events.recv() => e,
                    _ = cancel.cancelled() => return,
                };
                match event {
                    Some(WatchEvent::Put(kv)) => {
                        if let Some(instance) = decode(&kv.key, &kv.value) {
                            // A registration that is new (not an update) at a down address
                            // is a new process there: let it be tried at once.
                            if let (false, InstanceTransport::Tcp(address)) = (by_key.contains_key(&kv.key), &instance.transport) {
                                transport.clear_address(address);
                            }
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
        Ok(Arc::new(InstanceWatcher { instances: rx, transport: watcher_transport }))
    }

    /// All registered instances, ordered by instance id.
    pub fn instances(&self) -> Arc<Vec<Instance>> {
        self.instances.borrow().clone()
    }

    /// Instances to route to: the registered ones not marked down in this process. Empty
    /// when every one is down, so that requests fail fast with `NoInstances` rather than
    /// go into a black hole.
    pub fn routable(&self) -> Arc<Vec<Instance>> {
        let all = self.instances();
        if all.iter().all(|i| !self.is_down(i)) {
            return all;
        }
        Arc::new(all.iter().filter(|i| !self.is_down(i)).cloned().collect())
    }

    /// Whether `instance` is marked down: its address stopped answering or it did not take
    /// a request in time (until it answers a ping again), or it refused a request or broke
    /// a stream a moment ago.
    pub fn is_down(&self, instance: &Instance) -> bool {
        let address_down = match &instance.transport {
            InstanceTransport::Tcp(address) => self.transport.is_address_down(address),
            InstanceTransport::Nats(_) => false,
        };
        address_down
            || self.transport.is_unresponsive(instance.instance_id)
            || self.transport.is_instance_down(instance.instance_id)
    }

    /// Skip `instance_id` for a couple of seconds in every client of this process: it
    /// refused a request (shutting down) or its stream broke before the first item.
    pub fn mark_down(&self, instance_id: u64) {
        self.transport.mark_instance_down(instance_id);
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
