//! The addresses of the component model, as stored in discovery and used by clients:
//! [`EndpointId`] (`namespace.component.endpoint`) and [`Instance`] (one registered
//! instance of an endpoint and how it is reached).

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

/// Discovery prefix of instance registrations.
pub const INSTANCES_PREFIX: &str = "v1/instances/";

/// Escape a name so it is exactly one `/`-separated key segment.
pub(crate) fn key_segment(name: &str) -> String {
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
