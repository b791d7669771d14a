//! The component model: namespace → component → endpoint. An endpoint is served by
//! registering a handler; it is called through a [`crate::client::Client`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::client::Client;
use crate::config::RequestPlane;
use crate::error::{Error, ErrorKind, Result};
use crate::events::Subscription;
use crate::transport::responder::RequestHandler;
use crate::runtime::{DistributedRuntime, Registration};
use crate::transport::{nats, ServedEndpoint};

/// Discovery prefix of instance registrations.
pub const INSTANCES_PREFIX: &str = "v1/instances/";

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::new(ErrorKind::Config, format!("invalid {what} name '{name}': must be non-empty, without spaces")));
    }
    Ok(())
}

/// Escape a name so it is exactly one `/`-separated key segment.
fn key_segment(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// `namespace.component.endpoint`, the address of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct EndpointId {
    /// Namespace name.
    pub namespace: String,
    /// Component name.
    pub component: String,
    /// Endpoint name.
    pub name: String,
}

impl EndpointId {
    /// Parse `ns.comp.ep` (or `dyn://ns.comp.ep`, or `ns/comp/ep`). With `.` separators
    /// the endpoint name may contain `/` (`dynamo.Processor.chat/completions`).
    pub fn parse(s: &str) -> Result<EndpointId> {
        let s = s.strip_prefix("dyn://").unwrap_or(s);
        let parts: Vec<&str> = if s.contains('.') { s.splitn(3, '.').collect() } else { s.split('/').collect() };
        let bad_head = parts.iter().take(2).any(|p| p.contains('/'));
        if parts.len() != 3 || parts.iter().any(|p| p.is_empty()) || bad_head || parts[2].contains('.') {
            return Err(Error::new(ErrorKind::Config, format!("'{s}' is not an endpoint path: expected namespace.component.endpoint")));
        }
        Ok(EndpointId { namespace: parts[0].into(), component: parts[1].into(), name: parts[2].into() })
    }

    /// `ns/comp/ep`: the key the request plane uses.
    pub fn path(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.component, self.name)
    }

    /// The discovery prefix under which this endpoint's instances register.
    pub fn instances_prefix(&self) -> String {
        format!(
            "{INSTANCES_PREFIX}{}/{}/{}/",
            key_segment(&self.namespace),
            key_segment(&self.component),
            key_segment(&self.name)
        )
    }
}

impl std::fmt::Display for EndpointId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.namespace, self.component, self.name)
    }
}

/// How an instance is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceTransport {
    /// `host:port` of the instance's TCP server.
    Tcp(String),
    /// The instance's NATS subject.
    Nats(String),
}

/// One registered instance of an endpoint, as stored in discovery (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// Namespace name.
    pub namespace: String,
    /// Component name.
    pub component: String,
    /// Endpoint name.
    pub endpoint: String,
    /// The serving process's instance id.
    pub instance_id: u64,
    /// Where requests go.
    pub transport: InstanceTransport,
}

/// A namespace: a group of components, and an event scope.
#[derive(Debug, Clone)]
pub struct Namespace {
    runtime: DistributedRuntime,
    name: String,
}

impl Namespace {
    pub(crate) fn new(runtime: DistributedRuntime, name: String) -> Result<Self> {
        check_name("namespace", &name)?;
        Ok(Namespace { runtime, name })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime.
    pub fn runtime(&self) -> &DistributedRuntime {
        &self.runtime
    }

    /// A component of this namespace.
    pub fn component(&self, name: impl Into<String>) -> Result<Component> {
        let name = name.into();
        check_name("component", &name)?;
        Ok(Component { namespace: self.clone(), name })
    }

    /// The event subject of `event` in this namespace.
    pub fn event_subject(&self, event: &str) -> String {
        format!("namespace.{}.{event}", nats::subject_token(&self.name))
    }

    /// Publish an event in this namespace.
    pub async fn publish(&self, event: &str, payload: Bytes) -> Result<()> {
        self.runtime.events().publish(&self.event_subject(event), payload).await
    }

    /// Subscribe to an event of this namespace.
    pub async fn subscribe(&self, event: &str) -> Result<Subscription> {
        self.runtime.events().subscribe(&self.event_subject(event)).await
    }
}

/// A component: a kind of worker, with endpoints.
#[derive(Debug, Clone)]
pub struct Component {
    namespace: Namespace,
    name: String,
}

impl Component {
    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The runtime.
    pub fn runtime(&self) -> &DistributedRuntime {
        &self.namespace.runtime
    }

    /// An endpoint of this component.
    pub fn endpoint(&self, name: impl Into<String>) -> Result<Endpoint> {
        let name = name.into();
        check_name("endpoint", &name)?;
        Ok(Endpoint {
            component: self.clone(),
            id: EndpointId { namespace: self.namespace.name.clone(), component: self.name.clone(), name },
        })
    }

    /// The event subject of `event` on this component.
    pub fn event_subject(&self, event: &str) -> String {
        format!(
            "namespace.{}.component.{}.{event}",
            nats::subject_token(&self.namespace.name),
            nats::subject_token(&self.name)
        )
    }

    /// Publish an event on this component.
    pub async fn publish(&self, event: &str, payload: Bytes) -> Result<()> {
        self.runtime().events().publish(&self.event_subject(event), payload).await
    }

    /// Subscribe to an event of this component.
    pub async fn subscribe(&self, event: &str) -> Result<Subscription> {
        self.runtime().events().subscribe(&self.event_subject(event)).await
    }

    /// Instances of any endpoint of this component, from discovery.
    pub async fn list_instances(&self) -> Result<Vec<Instance>> {
        let prefix = format!(
            "{INSTANCES_PREFIX}{}/{}/",
            key_segment(&self.namespace.name),
            key_segment(&self.name)
        );
        let kvs = self.runtime().discovery().get_prefix(&prefix).await?;
        Ok(kvs.iter().filter_map(|kv| serde_json::from_slice(&kv.value).ok()).collect())
    }
}

/// An endpoint: a named streaming request handler of a component.
#[derive(Debug, Clone)]
pub struct Endpoint {
    component: Component,
    id: EndpointId,
}

impl Endpoint {
    /// Its address.
    pub fn id(&self) -> &EndpointId {
        &self.id
    }

    /// Its component.
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// The runtime.
    pub fn runtime(&self) -> &DistributedRuntime {
        self.component.runtime()
    }

    /// Start serving: make `handler` reachable on the request plane and register this
    /// instance in discovery. Returns once the instance is discoverable.
    pub async fn start(&self, handler: Arc<dyn RequestHandler>) -> Result<()> {
        let rt = self.runtime();
        let transport = rt.transport();
        let path = self.id.path();
        let metrics = rt.metrics().endpoint(&self.id.namespace, &self.id.component, &self.id.name);
        let served = Arc::new(ServedEndpoint { handler, metrics, draining: AtomicBool::new(false) });
        transport.add_endpoint(&path, served.clone())?;
        let cancel = rt.child_token();
        let instance_id = rt.instance_id();
        let instance_transport = match rt.config().request_plane {
            RequestPlane::Tcp => InstanceTransport::Tcp(transport.address().to_string()),
            RequestPlane::Nats => {
                let subject = nats::instance_subject(&self.id.namespace, &self.id.component, &self.id.name, instance_id);
                let client = rt.nats().cloned().ok_or_else(|| Error::new(ErrorKind::Config, "NATS request plane without a NATS client"))?;
                if let Err(e) = nats::serve(client, transport.clone(), subject.clone(), cancel.clone()).await {
                    transport.remove_endpoint(&path);
                    return Err(e);
                }
                InstanceTransport::Nats(subject)
            }
        };
        let instance = Instance {
            namespace: self.id.namespace.clone(),
            component: self.id.component.clone(),
            endpoint: self.id.name.clone(),
            instance_id,
            transport: instance_transport,
        };
        let key = format!("{}{instance_id:x}", self.id.instances_prefix());
        let value = serde_json::to_vec_pretty(&instance)?;
        if let Err(e) = rt.discovery().create_leased(&key, value.into()).await {
            cancel.cancel();
            transport.remove_endpoint(&path);
            return Err(e);
        }
        rt.register(Registration { id: self.id.clone(), key, endpoint: served, cancel })?;
        tracing::info!(endpoint = %self.id, instance = %format_args!("{instance_id:x}"), "serving");
        Ok(())
    }

    /// Serve until the runtime shuts down and this endpoint has drained.
    pub async fn serve(&self, handler: Arc<dyn RequestHandler>) -> Result<()> {
        self.start(handler).await?;
        self.runtime().drained().await;
        Ok(())
    }

    /// A client of this endpoint.
    pub async fn client(&self) -> Result<Client> {
        Client::new(self.runtime().clone(), self.id.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_paths() {
        let id = EndpointId::parse("dyn://ns.backend.generate").unwrap();
        assert_eq!(id.path(), "ns/backend/generate");
        assert_eq!(id.to_string(), "ns.backend.generate");
        assert_eq!(EndpointId::parse("a/b/c").unwrap(), EndpointId::parse("a.b.c").unwrap());
        assert!(EndpointId::parse("a.b").is_err());
        assert!(EndpointId::parse("a..c").is_err());
        let slashed = EndpointId::parse("dynamo.Processor.chat/completions").unwrap();
        assert_eq!((slashed.component.as_str(), slashed.name.as_str()), ("Processor", "chat/completions"));
        assert!(EndpointId::parse("a.b/c.d").is_err());
        assert!(EndpointId::parse("a/b/c/d").is_err());
    }

    #[test]
    fn prefixes_do_not_collide() {
        let a = EndpointId { namespace: "n".into(), component: "c".into(), name: "generate".into() };
        let b = EndpointId { namespace: "n".into(), component: "c".into(), name: "generate_v2".into() };
        assert!(!b.instances_prefix().starts_with(&a.instances_prefix()));
        let slash = EndpointId { namespace: "n/x".into(), component: "c".into(), name: "e".into() };
        assert_eq!(slash.instances_prefix(), "v1/instances/n%2Fx/c/e/");
    }
}
