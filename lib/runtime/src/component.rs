//! The component model: namespace → component → endpoint. An endpoint is served by
//! registering a handler; it is called through a [`crate::client::Client`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;

use crate::client::Client;
use crate::config::RequestPlane;
use crate::error::{Error, ErrorKind, Result};
use crate::events::Subscription;
use crate::instance::key_segment;
pub use crate::instance::{EndpointId, Instance, InstanceTransport, INSTANCES_PREFIX};
use crate::planes::{Planes, Registration};
use crate::transport::responder::RequestHandler;
use crate::transport::{nats, ServedEndpoint};

fn check_name(what: &str, name: &str) -> Result<()> {
    if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::new(ErrorKind::Config, format!("invalid {what} name '{name}': must be non-empty, without spaces")));
    }
    Ok(())
}

/// A namespace: a group of components, and an event scope.
#[derive(Debug, Clone)]
pub struct Namespace {
    planes: Planes,
    name: String,
}

impl Planes {
    /// A namespace handle.
    pub fn namespace(&self, name: impl Into<String>) -> Result<Namespace> {
        let name = name.into();
        check_name("namespace", &name)?;
        Ok(Namespace { planes: self.clone(), name })
    }
}

impl Namespace {

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime's planes.
    pub fn planes(&self) -> &Planes {
        &self.planes
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
        self.planes.events().publish(&self.event_subject(event), payload).await
    }

    /// Subscribe to an event of this namespace.
    pub async fn subscribe(&self, event: &str) -> Result<Subscription> {
        self.planes.events().subscribe(&self.event_subject(event)).await
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

    /// The runtime's planes.
    pub fn planes(&self) -> &Planes {
        &self.namespace.planes
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
        self.planes().events().publish(&self.event_subject(event), payload).await
    }

    /// Subscribe to an event of this component.
    pub async fn subscribe(&self, event: &str) -> Result<Subscription> {
        self.planes().events().subscribe(&self.event_subject(event)).await
    }

    /// Instances of any endpoint of this component, from discovery.
    pub async fn list_instances(&self) -> Result<Vec<Instance>> {
        let prefix = format!(
            "{INSTANCES_PREFIX}{}/{}/",
            key_segment(&self.namespace.name),
            key_segment(&self.name)
        );
        let kvs = self.planes().discovery().get_prefix(&prefix).await?;
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

    /// The runtime's planes.
    pub fn planes(&self) -> &Planes {
        self.component.planes()
    }

    /// Start serving: make `handler` reachable on the request plane and register this
    /// instance in discovery. Returns once the instance is discoverable.
    pub async fn start(&self, handler: Arc<dyn RequestHandler>) -> Result<()> {
        let rt = self.planes();
        let transport = rt.transport();
        let path = self.id.path();
        let metrics = rt.metrics().endpoint(&self.id.namespace, &self.id.component, &self.id.name);
        let served = Arc::new(ServedEndpoint { handler, metrics, draining: AtomicBool::new(false), inflight: Default::default() });
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
        let value = bytes::Bytes::from(serde_json::to_vec_pretty(&instance)?);
        if let Err(e) = rt.discovery().create_leased(&key, value.clone()).await {
            cancel.cancel();
            transport.remove_endpoint(&path);
            return Err(e);
        }
        rt.register(Registration { path, key, value, endpoint: served, cancel })?;
        tracing::info!(endpoint = %self.id, instance = %format_args!("{instance_id:x}"), "serving");
        Ok(())
    }

    /// Serve until the runtime shuts down and this endpoint has drained.
    pub async fn serve(&self, handler: Arc<dyn RequestHandler>) -> Result<()> {
        self.start(handler).await?;
        self.planes().drained().await;
        Ok(())
    }

    /// A client of this endpoint.
    pub async fn client(&self) -> Result<Client> {
        Client::new(self.planes().clone(), self.id.clone()).await
    }
}
